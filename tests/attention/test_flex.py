"""The flex backend and the BlockMask bridge: the mask_mod against the dense masks of masks.py, flex attention
against the reference backend (every mask kind, varlen, GQA, softcap), and schedules against create_block_mask."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention

from legalpt.attention import blocks, flash_attn_func, flash_attn_varlen_func
from legalpt.attention.backends import AttentionBatch, flex
from legalpt.attention.masks import Documents, MaskSpec, batch_mask, packed_mask

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def _cu(lens: list[int], device: str = "cpu") -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=device)


def _spec(kw: dict) -> MaskSpec:
    """Public keyword arguments -> the MaskSpec the API would build."""
    return MaskSpec(
        kw.get("causal", False), kw.get("window_size", (-1, -1)), kw.get("global_tokens", 0), kw.get("dilation", 1),
        kw.get("block_layout"), kw.get("block_size", (128, 128)),
    )  # fmt: skip


def _layout(kind: str | None, batch: int, heads: int, blocks_qk: tuple[int, int]) -> torch.Tensor | None:
    """A random block layout shared by all ("2d"), per head ("3d") or per row/document ("4d")."""
    if kind is None:
        return None
    shape = {"2d": blocks_qk, "3d": (heads, *blocks_qk), "4d": (batch, heads, *blocks_qk)}[kind]
    layout = torch.rand(shape) < 0.6
    layout[..., 0, :] = False  # the first query block sees nothing: out 0, lse -inf
    return layout


# (batch, seqlen_q, seqlen_k, heads, kv_heads, block_size, layout, softcap, mask keyword arguments)
BATCH_CASES = {
    "full": (2, 113, 113, 4, 4, (16, 16), None, 0.0, {}),
    "causal": (2, 113, 113, 4, 4, (16, 16), None, 0.0, {"causal": True}),
    "causal-q<k": (2, 77, 203, 4, 2, (32, 16), None, 0.0, {"causal": True}),
    "causal-q>k": (1, 203, 77, 4, 2, (16, 32), None, 0.0, {"causal": True}),  # rows that see no key
    "window-both": (2, 113, 150, 4, 4, (16, 16), None, 0.0, {"window_size": (20, 5)}),
    "causal-window": (2, 150, 113, 4, 1, (32, 16), None, 0.0, {"causal": True, "window_size": (30, 0)}),
    "causal-global": (1, 113, 150, 4, 2, (16, 16), None, 0.0, {"causal": True, "window_size": (8, 0), "global_tokens": 5}),  # noqa: E501
    "window-dilation": (2, 113, 113, 4, 4, (16, 16), None, 0.0, {"window_size": (24, 24), "dilation": 4}),
    "layout-2d": (2, 113, 150, 4, 2, (32, 16), "2d", 0.0, {"causal": True}),
    "layout-3d-global": (2, 113, 150, 4, 2, (32, 16), "3d", 0.0, {"window_size": (20, 0), "global_tokens": 5}),
    "layout-4d": (2, 113, 150, 4, 2, (32, 16), "4d", 0.0, {"window_size": (30, 30), "dilation": 2}),
    "gqa-softcap": (2, 113, 113, 6, 2, (16, 16), None, 2.0, {"causal": True, "window_size": (50, 0)}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BATCH_CASES))
def test_mask_mod_matches_batch_mask(case, rng):
    batch, sq, sk, heads, _, block_size, layout_kind, _, kw = BATCH_CASES[case]
    layout = _layout(layout_kind, batch, heads, (-(-sq // block_size[0]), -(-sk // block_size[1])))
    spec = _spec({**kw, "block_size": block_size, "block_layout": layout})
    dense = create_mask(flex.mask_mod(spec, None, None, sq, sk), batch, heads, sq, sk, "cpu")
    assert torch.equal(dense, batch_mask(spec, sq, sk, torch.device("cpu")).expand(batch, heads, sq, sk))


@pytest.mark.parametrize("layout_kind", [None, "3d", "4d"])
def test_mask_mod_matches_packed_mask(layout_kind, rng):
    lens_q, lens_k = [5, 0, 70, 1, 33, 7], [5, 3, 70, 40, 50, 0]  # empty sides, Sq < Sk, Sq > Sk
    heads, block_size = 3, (16, 32)
    layout = _layout(layout_kind, len(lens_q), heads, (-(-max(lens_q) // 16), -(-max(lens_k) // 32)))
    spec = MaskSpec(True, (20, 0), 2, 1, layout, block_size)
    rule = flex.mask_mod(spec, _cu(lens_q), _cu(lens_k), sum(lens_q), sum(lens_k))
    dense = create_mask(rule, 1, heads, sum(lens_q), sum(lens_k), "cpu")[0]
    docs = Documents.from_cu_seqlens(_cu(lens_q), _cu(lens_k), sum(lens_q), sum(lens_k), 70, 70)
    expected = packed_mask(spec, docs, torch.device("cpu")).expand(heads, -1, -1)
    assert torch.equal(dense, expected)


def test_mask_mod_compiles_into_flex_kernels(rng):
    """Inductor lowers the mask_mod into flex's fused kernel (it refuses in-place ops there): every mask feature at
    once, compiled on the CPU against the eager result."""
    lens = [50, 100, 106]
    layout = _layout("4d", len(lens), 2, (4, 4))
    spec = MaskSpec(True, (40, 0), 3, 2, layout, (32, 32))
    mask = flex.block_mask(spec, 1, 2, 256, 256, "cpu", _cu(lens), _cu(lens))
    q, k, v = (torch.randn(1, 2, 256, 16) for _ in range(3))
    compiled = torch.compile(flex_attention, dynamic=False)(q, k, v, block_mask=mask)
    torch.testing.assert_close(compiled, flex_attention(q, k, v, block_mask=mask))


def _assert_matches_reference(out, lse, ref_out, ref_lse):
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape and lse.dtype == torch.float32
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), "rows that see no key differ"
    assert (out[ref_lse.isneginf().transpose(-1, -2)] == 0).all(), "a row that sees no key has output != 0"
    torch.testing.assert_close(out, ref_out, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(lse, ref_lse, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("case", list(BATCH_CASES))
def test_batch_matches_reference(case, rng):
    batch, sq, sk, heads, kv_heads, block_size, layout_kind, softcap, kw = BATCH_CASES[case]
    layout = _layout(layout_kind, batch, heads, (-(-sq // block_size[0]), -(-sk // block_size[1])))
    kw = {**kw, "block_size": block_size, "block_layout": layout}
    q = torch.randn(batch, sq, heads, 16)
    k, v = torch.randn(batch, sk, kv_heads, 16), torch.randn(batch, sk, kv_heads, 16)
    ref_out, ref_lse, _ = flash_attn_func(
        q, k, v, softcap=softcap, softmax_scale=0.3, return_attn_probs=True, backend="reference", **kw
    )
    out, lse = flex.attention(AttentionBatch(q, k, v, None, None, sq, sk, _spec(kw), 0.3, softcap))
    assert out.is_contiguous()
    _assert_matches_reference(out, lse, ref_out, ref_lse)


VARLEN_KWARGS = {
    "causal": {"causal": True},
    "window-global": {"window_size": (7, 3), "global_tokens": 2},
    "causal-window-dilation-gqa": {"causal": True, "window_size": (33, 0), "dilation": 2},
    "layout-per-doc-softcap": {"causal": True, "global_tokens": 4, "block_layout": "4d"},
}


@pytest.mark.parametrize("case", list(VARLEN_KWARGS))
def test_varlen_matches_reference(case, rng):
    lens_q = [rng.randint(0, 90) for _ in range(5)]
    lens_k = [n + rng.randint(-5, 30) if n > 5 else rng.randint(0, 5) for n in lens_q]
    heads, kv_heads, block_size, max_q, max_k = 4, 2 if "gqa" in case else 4, (32, 16), max(lens_q), max(lens_k)
    kw = dict(VARLEN_KWARGS[case], block_size=block_size)
    kw["block_layout"] = _layout(kw.get("block_layout"), len(lens_q), heads, (-(-max_q // 32), -(-max_k // 16)))
    softcap = 3.0 if "softcap" in case else 0.0
    q = torch.randn(sum(lens_q), heads, 32)
    k, v = torch.randn(sum(lens_k), kv_heads, 32), torch.randn(sum(lens_k), kv_heads, 32)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    ref_out, ref_lse, _ = flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max_q, max_k, softcap=softcap, return_attn_probs=True, backend="reference", **kw
    )
    out, lse = flex.attention(AttentionBatch(q, k, v, cu_q, cu_k, max_q, max_k, _spec(kw), 32**-0.5, softcap))
    _assert_matches_reference(out, lse, ref_out, ref_lse)


def test_block_mask_broadcasts_axes_the_mask_ignores():
    spec = MaskSpec(causal=True, block_size=(16, 16))
    assert flex.block_mask(spec, 3, 4, 40, 40, "cpu", block_size=16).kv_num_blocks.shape == (1, 1, 3)
    per_head = MaskSpec(block_layout=torch.rand(4, 3, 3) < 0.5, block_size=(16, 16))
    assert flex.block_mask(per_head, 3, 4, 40, 40, "cpu", block_size=16).kv_num_blocks.shape == (1, 4, 3)
    per_row = MaskSpec(block_layout=torch.rand(3, 4, 3, 3) < 0.5, block_size=(16, 16))
    assert flex.block_mask(per_row, 3, 4, 40, 40, "cpu", block_size=16).kv_num_blocks.shape == (3, 4, 3)


def test_bad_input_raises():
    cu = _cu([3, 4])
    with pytest.raises(ValueError, match="batch"):
        flex.block_mask(MaskSpec(), 2, 1, 7, 7, "cpu", cu, cu)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        flex.mask_mod(MaskSpec(), cu, None, 7, 7)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        flex.mask_mod(MaskSpec(), cu, _cu([3, 2, 2]), 7, 7)
    schedule = blocks.schedule_for(MaskSpec(causal=True), None, None, 40, 40, (16, 16), False, torch.device("cpu"))
    with pytest.raises(ValueError, match="schedule"):
        flex.to_block_mask(schedule, flex.mask_mod(MaskSpec(), None, None, 80, 40), 80, 40)


def _schedule_states(schedule: blocks.BlockSchedule) -> torch.Tensor:
    """Tile states (Bs, Hs, rows, cols) read entry by entry from the schedule's lists (rows as it has them)."""
    counts, indices = schedule.counts.tolist(), schedule.indices.tolist()
    states = torch.zeros(schedule.indices.shape, dtype=torch.uint8)
    for b, h, r in itertools.product(*(range(n) for n in schedule.indices.shape[:3])):
        total, partial = counts[b][h][r]
        for slot, col in enumerate(indices[b][h][r][:total]):
            states[b, h, r, col] = blocks.PARTIAL if slot < partial else blocks.FULL
    return states


def _block_mask_states(mask) -> torch.Tensor:
    """Tile states (B, H, nqt, nkt) read entry by entry from a BlockMask's kv lists."""
    states = torch.zeros(mask.kv_indices.shape, dtype=torch.uint8)
    for nums, indices, state in (
        (mask.kv_num_blocks, mask.kv_indices, blocks.PARTIAL),
        (mask.full_kv_num_blocks, mask.full_kv_indices, blocks.FULL),
    ):
        for b, h, r in itertools.product(*(range(n) for n in indices.shape[:3])):
            for col in indices[b, h, r, : nums[b, h, r]].tolist():
                states[b, h, r, col] = state
    return states


# (seqlen_q, seqlen_k, tile, MaskSpec keyword arguments): the masks the kernels serve, ragged sizes included
SCHEDULE_CASES = {
    "causal": (200, 200, (32, 32), {"causal": True}),
    "causal-q<k": (130, 200, (32, 16), {"causal": True}),
    "window": (256, 256, (32, 32), {"causal": True, "window": (63, 0)}),
    "window-both": (200, 170, (16, 32), {"window": (40, 20)}),
    "global-window": (256, 256, (32, 32), {"causal": True, "window": (47, 0), "global_tokens": 8}),
    "global-window-big": (300, 300, (64, 32), {"causal": True, "window": (90, 0), "global_tokens": 64}),
}


@pytest.mark.parametrize("case", list(SCHEDULE_CASES))
def test_schedule_sees_the_tiles_create_block_mask_sees(case, rng):
    sq, sk, tile, kw = SCHEDULE_CASES[case]
    spec = MaskSpec(**kw)
    rule = flex.mask_mod(spec, None, None, sq, sk)
    theirs = create_block_mask(rule, 1, 1, sq, sk, "cpu", BLOCK_SIZE=tile)
    ours = blocks.schedule_for(spec, None, None, sq, sk, tile, False, torch.device("cpu"))
    our_states, their_states = _schedule_states(ours), _block_mask_states(theirs)
    assert torch.equal(our_states != blocks.EMPTY, their_states != blocks.EMPTY), "visible tiles differ"
    assert not ((our_states == blocks.FULL) & (their_states == blocks.PARTIAL)).any(), "a partial tile called full"
    # the converted schedule drives flex to the same result as flex's own BlockMask
    q, k, v = torch.randn(1, 2, sq, 16), torch.randn(1, 2, sk, 16), torch.randn(1, 2, sk, 16)
    converted = flex.to_block_mask(ours, rule, sq, sk)
    expected = flex_attention(q, k, v, block_mask=theirs)
    torch.testing.assert_close(flex_attention(q, k, v, block_mask=converted), expected)


@pytest.mark.parametrize("case", [*SCHEDULE_CASES, "layout-4d"])
def test_round_trips_are_the_identity(case, rng):
    sq, sk, tile, kw = SCHEDULE_CASES.get(case, (130, 200, (32, 16), {"window": (30, 30)}))
    layout = torch.rand(2, 3, -(-sq // 16), -(-sk // 16)) < 0.5 if case == "layout-4d" else None
    spec = MaskSpec(**kw, block_layout=layout, block_size=(16, 16))
    rule = flex.mask_mod(spec, None, None, sq, sk)
    cpu = torch.device("cpu")
    schedule = blocks.schedule_for(spec, None, None, sq, sk, tile, False, cpu)
    back = flex.from_block_mask(flex.to_block_mask(schedule, rule, sq, sk))
    assert back.tile == schedule.tile and not back.transposed
    assert torch.equal(back.counts, schedule.counts) and torch.equal(back.indices, schedule.indices)
    transposed = blocks.schedule_for(spec, None, None, sq, sk, tile, True, cpu)
    assert torch.equal(flex.from_block_mask(flex.to_block_mask(transposed, rule, sq, sk)).indices, schedule.indices)
    mask = flex.block_mask(spec, 2, 3, sq, sk, "cpu", block_size=tile)
    again = flex.to_block_mask(flex.from_block_mask(mask), rule, sq, sk)
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices"):
        assert torch.equal(getattr(again, name), getattr(mask, name)), name
    assert again.BLOCK_SIZE == mask.BLOCK_SIZE and again.seq_lengths == mask.seq_lengths


@pytest.mark.cuda
@pytest.mark.parametrize("varlen", [False, True])
def test_cuda_gradients_match_reference(varlen, rng):
    """Compiled flex on the GPU: output, logsumexp and gradients against the reference backend, in float32."""
    kw = {"causal": True, "window_size": (40, 0), "global_tokens": 3, "softcap": 5.0}
    lens = [rng.randint(1, 200) for _ in range(4)]
    shape_q, shape_k = ((sum(lens), 4), (sum(lens), 2)) if varlen else ((2, 203, 4), (2, 203, 2))
    q = torch.randn(*shape_q, 64, device="cuda", requires_grad=True)
    k, v = (torch.randn(*shape_k, 64, device="cuda", requires_grad=True) for _ in range(2))
    cu = _cu(lens, "cuda")
    lead = (cu, cu, max(lens), max(lens)) if varlen else ()
    fn = flash_attn_varlen_func if varlen else flash_attn_func
    ref_out, ref_lse, _ = fn(q, k, v, *lead, return_attn_probs=True, backend="reference", **kw)
    spec = _spec(kw)
    args = (cu, cu, max(lens), max(lens)) if varlen else (None, None, 203, 203)
    out, lse = flex.attention(AttentionBatch(q, k, v, *args, spec, 64**-0.5, kw["softcap"]))
    torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-3)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-3)
    g = torch.randn_like(out)
    grads = torch.autograd.grad((out * g).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref_out * g).sum(), (q, k, v))
    for name, grad, ref in zip("qkv", grads, ref_grads, strict=True):
        torch.testing.assert_close(grad, ref, atol=1e-3, rtol=1e-3, msg=f"d{name}")
