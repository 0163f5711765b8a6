"""The fa2 and fa3 kernels' own source, compiled for the CPU (csrc/common/emulate.h), against naive float64 attention.

Runs without a GPU: every CUDA thread is a fiber and the warp-collective instructions are emulated lane by lane, so
these tests check the kernels' index math, tile schedules, masks, fragment layouts and GQA/varlen addressing on any
machine with a C++ compiler, and races between warps: blocks run lockstep or warp by warp, and cp.async copies
poison their destination until their wait (csrc/common/emulate.h); timing is left to tests/attention/test_fa2.py
on a GPU. The cases are small and chosen to reach every instantiation: the plain and general (softcap, dilation,
layout) kernels, the forward's rescale (rows whose max moves in late tiles, in some lanes only), one and two row
tiles per warp, a softmax scale <= 0, both backward layouts (two-level at d64 and d128, one-level with the dK/dV
columns split over d128), the global keys' tiles split over blocks (one and two split tiles), the deterministic dQ
pass. The fa3 kernels (Hopper, wgmma: csrc/sm90) run the same way, their warpgroup MMAs emulated from the swizzled
shared memory their descriptors address (FA3_CASES and the fa3 variants below).
"""

from __future__ import annotations

import itertools
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
import torch
from attention_helpers import (
    assert_documents_stay_apart,
    assert_flash_attn_rule,
    assert_fp8_kernel_computes_reference,
    assert_fused_quantization_is_quantize,
    assert_fused_quantization_keeps_special_values,
    assert_fused_quantization_rotates,
    fp8_quantize_inputs,
    fused_quantize,
    naive_attention,
    rising_scores,
    use_emulated_kernels,
)
from torch.utils.cpp_extension import is_ninja_available

from legalpt.attention import build, flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, fp8, kernels
from legalpt.attention.backends import AttentionBatch, cuda
from legalpt.attention.masks import MaskSpec

pytestmark = pytest.mark.skipif(
    shutil.which("c++") is None or not is_ninja_available(), reason="building the emulation needs c++ and ninja"
)

CASES = {  # name: (head_dim, dtype, (Sq, Sk), (heads, kv heads), mask keyword arguments)
    "causal-d64-gqa": (64, torch.bfloat16, (130, 130), (4, 2), {"causal": True}),
    "global-window-d128-unequal": (
        128, torch.float16, (113, 203), (2, 1), {"window_size": (32, 17), "global_tokens": 5},
    ),
    "causal-rows-without-keys-d128": (128, torch.bfloat16, (150, 90), (2, 2), {"causal": True}),
    "dilation-d128": (128, torch.bfloat16, (200, 200), (2, 2), {"causal": True, "window_size": (96, 0), "dilation": 3}),
    "layout-d64": (
        64, torch.bfloat16, (150, 150), (2, 2), {"causal": True, "block_layout": True, "block_size": (48, 80)},
    ),
    "softcap-d128": (128, torch.bfloat16, (129, 129), (2, 1), {"causal": True, "softcap": 30.0, "softmax_scale": 0.5}),
    "dense-d256": (256, torch.bfloat16, (100, 100), (2, 2), {}),
    "dense-d96-mqa": (96, torch.float16, (70, 70), (3, 1), {}),
    "causal-d128-deterministic": (128, torch.float16, (140, 140), (2, 2), {"causal": True, "deterministic": True}),
    # a scale <= 0 turns the max into a min: the scores become logits before it (raw and to_log2 in fwd.cuh)
    "negative-scale-d64": (64, torch.bfloat16, (70, 70), (2, 2), {"causal": True, "softmax_scale": -0.125}),
    "zero-scale-dilation-d128": (
        128, torch.float16, (90, 90), (2, 1), {"window_size": (32, 0), "dilation": 2, "softmax_scale": 0.0},
    ),
}  # fmt: skip
# The fa3 kernels' instantiations (d64, d128; plain and general; both dtypes) and paths: GQA and MQA, rows without
# keys, unequal lengths, the deterministic dQ pass (fa2's), dQ by D's halves, query tiles no key tile visits (dQ
# zero); sliding windows run the persistent forward and backward (three emulated processors, each block taking
# several items: query tiles, and key tiles whose K, V and dK, dV buffers each item reuses).
FA3_CASES = {
    "fa3-causal-d64-gqa": (64, torch.bfloat16, (130, 130), (4, 2), {"causal": True}),
    "fa3-global-window-d128-unequal": (
        128, torch.float16, (113, 203), (2, 1), {"window_size": (32, 17), "global_tokens": 5},
    ),
    "fa3-causal-rows-without-keys-d128": (128, torch.bfloat16, (150, 90), (2, 2), {"causal": True}),
    # whole tiles (every row of the tile in its document): the plain kernels' tiles without the element rule
    "fa3-causal-full-tiles-d64": (64, torch.bfloat16, (384, 384), (2, 1), {"causal": True}),
    "fa3-dense-full-tiles-d128": (128, torch.float16, (256, 300), (1, 1), {}),
    "fa3-softcap-dilation-d128": (
        128, torch.bfloat16, (140, 140), (2, 1),
        {"causal": True, "window_size": (96, 0), "dilation": 3, "softcap": 30.0, "softmax_scale": 0.5},
    ),
    "fa3-dense-d64-fp16-deterministic": (64, torch.float16, (70, 150), (2, 2), {"deterministic": True}),
    "fa3-causal-d100-padded": (100, torch.bfloat16, (70, 70), (2, 1), {"causal": True}),  # zero-padded to 128
    "fa3-window-d64-persistent": (64, torch.bfloat16, (300, 300), (2, 1), {"causal": True, "window_size": (100, 0)}),
    "fa3-window-d128-persistent-gqa": (
        128, torch.float16, (400, 400), (4, 2), {"causal": True, "window_size": (150, 0)},
    ),
    "fa3-window-d64-persistent-deterministic": (
        64, torch.bfloat16, (300, 300), (2, 1), {"causal": True, "window_size": (100, 0), "deterministic": True},
    ),
    # bottom-right causal: the 60 rows see keys 290-399 only, so key tiles 0 and 1 visit no query tile (dK, dV zero)
    "fa3-window-d128-persistent-unvisited-key-tiles": (
        128, torch.bfloat16, (60, 400), (2, 1), {"causal": True, "window_size": (50, 0)},
    ),
    # bottom-right causal: the first 140 rows see no key, so no key tile visits query tiles 0 and 1
    "fa3-causal-unvisited-query-tiles-d64": (64, torch.bfloat16, (200, 60), (2, 1), {"causal": True}),
    # the d64 forward's 192-row tiles: the first 250 rows see no key, so its query tile 0 visits no key tile (causal),
    # and in a persistent window each emulated block takes such items between others (the consumers' ring)
    "fa3-causal-unvisited-192-row-tile-d64": (64, torch.bfloat16, (450, 200), (2, 1), {"causal": True}),
    "fa3-window-d64-persistent-unvisited-tiles": (
        64, torch.float16, (450, 200), (2, 1), {"causal": True, "window_size": (80, 0)},
    ),
    # persistent windows at unequal lengths: a non-causal window (key tile 0 reaches query tile 0 alone), and a causal
    # one whose first 130 rows see no key (query tiles 0 and 1 get dQ from no key tile)
    "fa3-window-d64-persistent-unequal": (64, torch.bfloat16, (200, 330), (2, 1), {"window_size": (60, 40)}),
    "fa3-window-d128-persistent-rows-without-keys": (
        128, torch.float16, (330, 200), (2, 2), {"causal": True, "window_size": (80, 0)},
    ),
}  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def _compiled_side_by_side(request):
    """Compiles the emulation of each head dim the selected tests use at once, a compiler per core, instead of one
    after another. A build that fails here is left for its tests to raise."""
    items = [item for item in request.session.items if getattr(item, "module", None) is request.module]
    dims = sorted({kernels.padded_head_dim(_head_dim(item), build.HEAD_DIMS) for item in items})
    with ThreadPoolExecutor(max_workers=max(1, min(len(dims), len(os.sched_getaffinity(0))))) as pool:
        for build_of_dim in [pool.submit(kernels.emulated, d) for d in dims]:
            build_of_dim.exception()  # waits; a failure is raised again by its tests' own kernels.emulated call


def _head_dim(item: pytest.Item) -> int:
    """The head dim a test of this module runs at: its parameter, its case's, else 64 (what the rest use)."""
    params = item.callspec.params if hasattr(item, "callspec") else {}
    case = CASES.get(params.get("case")) or FA3_CASES.get(params.get("case"))
    if params.get("case") in FP8_CASES or params.get("case") in QUANTIZE_CASES:
        return fp8.KERNEL_HEAD_DIM
    return params.get("head_dim") or (case[0] if case else 64)


@pytest.fixture(autouse=True)
def _emulated_kernels(monkeypatch):
    """The fa2 and fa3 backends with their kernels' CPU build: the device and build checks are the GPU's, so only
    the input checks stay. torch.empty fills floating tensors with NaN, as the GPU's reused memory would hold
    anything."""
    use_emulated_kernels(monkeypatch)
    monkeypatch.setattr(fp8, "_fa3_unavailable", lambda q: None)
    for name in ("empty", "empty_like"):  # every word the kernels leave unwritten shows as NaN
        monkeypatch.setattr(torch, name, _poisoned(getattr(torch, name)))
    monkeypatch.setattr(torch.Tensor, "new_empty", _poisoned(torch.Tensor.new_empty))


def _poisoned(make):
    def poisoned(*args, **kwargs):
        t = make(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    return poisoned


def _check(q, k, v, kw: dict, cu: tuple | None = None, backend: str = "fa2", lse_grad: bool = False) -> None:
    """out, lse, dq, dk, dv of `backend` by flash-attn's rule against float64 (2x, 3x for gradients, the error of
    plain PyTorch in the same precision); rows that see no key: out 0 and lse -inf. `lse_grad`: the loss weighs the
    logsumexp too (its rows that see a key), so that the backward gets dlse != 0."""
    if cu is None:
        out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, backend=backend, **kw)
    else:
        out, lse, _ = flash_attn_varlen_func(q, k, v, *cu, return_attn_probs=True, backend=backend, **kw)
    naive = {("window" if key == "window_size" else key): value for key, value in kw.items() if key != "deterministic"}
    if cu is not None:
        naive.update(cu_seqlens_q=cu[0], cu_seqlens_k=cu[1])
    exact_out, exact_lse = naive_attention(q, k, v, **naive)
    plain_out, plain_lse = naive_attention(q, k, v, dtype=q.dtype, **naive)
    seen = torch.isfinite(exact_lse)
    assert torch.equal(torch.isneginf(lse), ~seen), "lse must be -inf exactly on the rows that see no key"
    assert (out[(~seen).transpose(-1, -2)] == 0).all(), "rows that see no key must be 0"
    assert_flash_attn_rule("out", out, exact_out, plain_out, ratio=2, atol=1e-5)
    assert (lse[seen] - exact_lse[seen]).abs().max() < 1e-4
    g, g_lse = torch.randn_like(exact_out), torch.randn_like(exact_lse) * lse_grad

    def loss(out, lse):  # unseen rows' -inf left out
        return (out.double() * g).sum() + (torch.where(seen, lse.double(), 0.0) * g_lse).sum()

    grads = torch.autograd.grad(loss(out, lse), (q, k, v))
    exact = torch.autograd.grad(loss(exact_out, exact_lse), (q, k, v))
    plain = torch.autograd.grad(loss(plain_out, plain_lse), (q, k, v))
    for name, *triple in zip("qkv", grads, exact, plain, strict=True):
        assert_flash_attn_rule(f"d{name}", *triple, ratio=3, atol=3e-5)


def _qkv(q_shape: tuple, kv_shape: tuple, dtype: torch.dtype) -> tuple:
    return tuple(torch.randn(s, dtype=dtype).requires_grad_() for s in (q_shape, kv_shape, kv_shape))


@pytest.mark.parametrize("case", [*CASES, *FA3_CASES])
def test_emulated_kernels_match_naive(case: str, rng):
    head_dim, dtype, (sq, sk), (heads, kv_heads), kw = CASES.get(case) or FA3_CASES[case]
    kw = dict(kw)
    q, k, v = _qkv((2, sq, heads, head_dim), (2, sk, kv_heads, head_dim), dtype)
    if kw.pop("block_layout", False):
        bq, bk = kw["block_size"]
        kw["block_layout"] = torch.rand(heads, -(-sq // bq), -(-sk // bk)) < 0.6
    _check(q, k, v, kw, backend="fa3" if case in FA3_CASES else "fa2")


def _check_split(kw: dict, head_dim: int, heads: tuple, varlen: bool, backend: str) -> tuple[torch.Tensor, ...]:
    """_check of a split backward's case: two rows of 200 tokens (bf16), or varlen documents of 200, 9 and 150 tokens
    (fp16: one shorter than a key tile, the others at offsets inside one); returns its q, k, v."""
    if varlen:
        lens = [200, 9, 150]
        cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
        q, k, v = _qkv((sum(lens), heads[0], head_dim), (sum(lens), heads[1], head_dim), torch.float16)
        _check(q, k, v, kw, (cu, cu, max(lens), max(lens)), backend)
    else:
        q, k, v = _qkv((2, 200, heads[0], head_dim), (2, 200, heads[1], head_dim), torch.bfloat16)
        _check(q, k, v, kw, backend=backend)
    return q, k, v


@pytest.mark.parametrize(
    ("head_dim", "heads", "varlen", "global_tokens", "split_tiles", "backend"),
    [
        (64, (4, 2), False, 6, 1, "fa2"),
        (96, (3, 1), True, 6, 1, "fa2"),
        (64, (2, 1), False, 140, 2, "fa2"),
        (128, (4, 2), True, 6, 1, "fa3"),
        (64, (2, 1), False, 140, 2, "fa3"),
    ],
    ids=["d64-two-level", "d96-varlen", "d64-two-split-tiles", "fa3-d128-varlen", "fa3-d64-two-split-tiles"],
)
def test_emulated_split_global_key_tiles(
    head_dim: int, heads: tuple, varlen: bool, global_tokens: int, split_tiles: int, backend: str, monkeypatch, rng
):
    """The backward of the global keys' tiles split over blocks of one query tile each (cuda._split), their dK and
    dV added in float32 (split_dkv_kernel): two-level and one-level layouts, batch and varlen, one and two split
    key tiles (140 global keys over 128-key tiles)."""
    monkeypatch.setattr(cuda, "SPLIT_VISITS", 1)
    kw = {"causal": True, "window_size": (40, 0), "global_tokens": global_tokens}
    q, k, v = _check_split(kw, head_dim, heads, varlen, backend)
    _, tile = kernels.emulated(head_dim).tiles(head_dim, backend == "fa3")  # (query rows, keys) of the backward's
    batch = AttentionBatch(q, k, v, None, None, 200, 200, MaskSpec(global_tokens=global_tokens), 1.0)
    # one block per query tile of the 200 rows
    assert cuda._split(batch, tile, head_dim) == (split_tiles, -(-200 // tile[0]), 0)


@pytest.mark.parametrize(
    ("head_dim", "heads", "part", "varlen", "backend"),
    [
        (64, (4, 1), 1, False, "fa2"),
        (96, (6, 2), 1, True, "fa2"),
        (128, (4, 1), 2, True, "fa3"),
        (64, (4, 2), 1, False, "fa3"),
    ],
    ids=["d64-one-head", "d96-varlen", "fa3-d128-two-heads-varlen", "fa3-d64-one-head"],
)
def test_emulated_split_gqa_groups(
    head_dim: int, heads: tuple, part: int, varlen: bool, backend: str, monkeypatch, rng
):
    """The causal backward with each GQA group's query heads split over blocks of `part` heads (cuda.GQA_PART),
    every key tile's dK and dV added in float32 (split_dkv_kernel) in a buffer laid out like dK: batch and varlen
    (documents at their offsets, one shorter than a key tile), two-level and one-level layouts, both paths."""
    monkeypatch.setattr(cuda, "GQA_PART", part)
    q, k, v = _check_split({"causal": True}, head_dim, heads, varlen, backend)
    _, tile = kernels.emulated(head_dim).tiles(head_dim, backend == "fa3")
    batch = AttentionBatch(q, k, v, None, None, 200, 200, MaskSpec(causal=True), 1.0)
    assert cuda._split(batch, tile, head_dim) == (-(-200 // tile[1]), heads[0] // heads[1] // part, part)
    assert cuda._split(replace(batch, mask=MaskSpec()), tile, head_dim) == (0, 1, 0)  # dense: a block per group
    assert cuda._split(replace(batch, deterministic=True), tile, head_dim) == (0, 1, 0)


@pytest.mark.parametrize(
    ("head_dim", "dtype", "seqlens", "kw", "backend"),
    [
        (128, torch.float16, (200, 200), {"causal": True}, "fa2"),
        (64, torch.bfloat16, (70, 260), {}, "fa2"),
        (128, torch.float16, (200, 300), {}, "fa3"),
    ],
    ids=["d128-causal-fp16", "d64-unequal-bf16", "fa3-d128-unequal-fp16"],
)
def test_emulated_rescale_when_the_max_moves(
    head_dim: int, dtype: torch.dtype, seqlens: tuple, kw: dict, backend: str, rng
):
    """Scores that rise along the keys in some rows: the forward's rescale (O and the row sum, skipped while no row
    of a warp moves its max) runs in every late key tile with large corrections, which random scores never
    exercise, and the warp's vote must count the lanes whose rows move."""
    (sq, sk) = seqlens
    q, k, v = (torch.randn(2, s, 2, head_dim, dtype=dtype) for s in (sq, sk, sk))
    rising_scores(q, k)
    _check(q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), kw, backend=backend)


def test_emulated_fa3_size_one_dimensions_with_any_stride(rng):
    """A batch of one and a single head whose strides are not multiples of 16 bytes: PyTorch calls such tensors
    contiguous and keeps the strides, which TMA's tensor maps refuse (api.h's describe replaces them)."""
    q, k, v = (
        torch.randn(70 * 64, dtype=torch.bfloat16).as_strided((1, 70, 1, 64), (3, 64, 5, 1)).requires_grad_()
        for _ in range(3)
    )
    assert q.is_contiguous()
    _check(q, k, v, {"causal": True}, backend="fa3")


@pytest.mark.parametrize("head_dim", [64, 128])
def test_emulated_forward_tiles_follow_the_mask(head_dim: int):
    """The fa3 forward at d64 runs 192-row query tiles (three consumers) in its plain kernel and 128-row ones in the
    kernel of general masks (softcap, dilation, block layout, scale <= 0); at d128 both run 128; fa2's tiles are its
    own. The schedule is built for the call's (backends/cuda.py)."""
    ext = kernels.emulated(head_dim)
    assert ext.tiles(head_dim, True)[0] == (192 if head_dim == 64 else 128, 128)
    for general in ({"softcap": 30.0}, {"dilation": 2}, {"layout": True}, {"scale": 0.0}, {"scale": -0.125}):
        assert ext.tiles(head_dim, True, **general)[0] == (128, 128), general
    assert ext.tiles(head_dim, False)[0] == ext.tiles(head_dim, False, softcap=30.0)[0] == (128, 64)


@pytest.mark.parametrize(("seqlen", "tiles"), [(384, 3), (200, 2)])  # 200: as many 128-row tiles as 192-row ones
def test_emulated_forward_refuses_a_schedule_of_other_tiles(seqlen: int, tiles: int, monkeypatch):
    """A schedule built for other query tiles than the kernel's is refused before the launch, naming counts."""
    kernel_tiles = cuda._tiles
    monkeypatch.setattr(cuda, "_tiles", lambda *args: ((128, 128), kernel_tiles(*args)[1]))
    q, k, v = _qkv((1, seqlen, 2, 64), (1, seqlen, 2, 64), torch.bfloat16)
    expected = f"counts holds a schedule of {tiles} query tiles of 128 rows; this kernel runs 2 tiles of 192 rows"
    with pytest.raises(ValueError, match=expected):
        flash_attn_func(q, k, v, causal=True, backend="fa3")


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_emulated_varlen_with_an_empty_document(backend: str, rng):
    """Documents of 0 and 1 rows, and a last one whose whole query tiles (192 rows in fa3's d64 forward) start off
    the tiles' grid (fa3 stores those by TMA, the partial ones row by row)."""
    lens_q, lens_k = [70, 1, 0, 260], [90, 1, 40, 260]
    cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32) for n in (lens_q, lens_k))
    q, k, v = _qkv((sum(lens_q), 4, 64), (sum(lens_k), 2, 64), torch.bfloat16)
    _check(q, k, v, {"causal": True, "window_size": (48, 0)}, (cu_q, cu_k, max(lens_q), max(lens_k)), backend)


@pytest.mark.parametrize(
    ("head_dim", "varlen", "deterministic", "backend"),
    [(64, False, False, "fa3"), (128, True, False, "fa3"), (64, True, True, "fa3"), (64, True, False, "fa2")],
    ids=["fa3-d64", "fa3-d128-varlen", "fa3-d64-varlen-deterministic", "fa2-d64-varlen"],
)
def test_emulated_logsumexp_gradient(head_dim: int, varlen: bool, deterministic: bool, backend: str, rng):
    """A loss on the logsumexp as well as the output (as a z-loss has): delta = rowsum(dO * O) - dlse, from the
    preprocessing pass, through fa3's and fa2's backwards and the deterministic dQ pass. Varlen: documents of 100, 90
    and 70 rows, so that each document's last 64-row query tile reaches into the next one (or past the tensor), whose
    rows must not count (that they are not read either, with NaN in them, is
    test_emulated_varlen_documents_stay_apart's)."""
    kw = {"causal": True, "window_size": (80, 0), "deterministic": deterministic}
    if varlen:
        lens = [100, 90, 70]
        cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
        q, k, v = _qkv((sum(lens), 4, head_dim), (sum(lens), 2, head_dim), torch.bfloat16)
        _check(q, k, v, kw, (cu, cu, max(lens), max(lens)), backend, lse_grad=True)
    else:
        q, k, v = _qkv((2, 150, 2, head_dim), (2, 150, 1, head_dim), torch.float16)
        _check(q, k, v, kw, backend=backend, lse_grad=True)


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_emulated_varlen_documents_stay_apart(backend: str, rng):
    assert_documents_stay_apart(backend, 64, "cpu")


def test_emulation_synchronizes_as_the_hardware():
    """The emulation's named barriers and counted mbarriers (the warp-specialized fa3 kernels' synchronization):
    a waiter sees what was written before the arrivals it waited for, under every schedule; an arrival nobody waits
    for, one more arrival than an mbarrier's count, and a thread arriving twice in one phase of a named barrier raise
    instead of passing silently."""
    ext = kernels.emulated(64)
    assert ext.check_emulation("named_barrier").tolist() == [1, 1, 1, 1]
    assert ext.check_emulation("mbarrier_arrivals").tolist() == [1, 1, 1, 1]
    with pytest.raises(RuntimeError, match="named barrier with unmatched arrivals"):
        ext.check_emulation("named_barrier_left_over")
    with pytest.raises(RuntimeError, match="arrived at an mbarrier again"):
        ext.check_emulation("mbarrier_extra_arrival")
    with pytest.raises(RuntimeError, match="arrived twice in one phase"):
        ext.check_emulation("named_barrier_arrived_twice")


def test_plain_mask_bits_follow_the_element_rule():
    """The partial tiles' one-bit tests (csrc/common/mask.cuh: seen_keys in the forward, seen_queries in the
    backward's transposed tiles) against the per-key rule `allowed`, over causal and not, windows bounded and not
    on each side, global tokens, unequal lengths and rows or keys past the document."""
    ext = kernels.emulated(64)
    configs = [
        (lq, lk, causal, left, right, global_tokens)
        for lq, lk in ((1, 1), (37, 100), (100, 37), (130, 130))
        for causal in (False, True)
        for left in (-1, 0, 5, 40)
        for right in (-1, 0, 9)
        for global_tokens in (0, 1, 16)
    ]
    wrong = {c: ext.mask_bit_mismatches(*c) for c in configs}
    assert {c: n for c, n in wrong.items() if n} == {}


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_emulated_gradients_contiguous_for_permuted_inputs(backend: str, rng):
    """Dense inputs in another order of dimensions ((B, H, S, D) transposed) reach the kernels as they are; their
    gradients still come back contiguous, as the custom op's fake promises."""
    q, k, v = (
        torch.randn(2, 2, 70, 64, dtype=torch.bfloat16).transpose(1, 2).detach().requires_grad_() for _ in range(3)
    )
    out = flash_attn_func(q, k, v, causal=True, backend=backend)
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert all(g.is_contiguous() for g in grads), [g.stride() for g in grads]


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
@pytest.mark.parametrize(
    ("rows", "seqlen_q", "head_major", "num_splits"),
    [("leftpad", 1, False, 0), ("increasing_idx", 3, False, 0), ("leftpad", 1, True, 1), ("leftpad", 1, True, 3)],
)
def test_emulated_kernels_read_a_kv_cache_where_it_lies(
    backend: str, rows: str, seqlen_q: int, head_major: bool, num_splits: int, rng
):
    """flash_attn_with_kvcache on the kernels over the cache itself: documents without queries between the entries'
    slots (left padding, unused rows and tails, all NaN), GQA, new keys appended in place; decoding over
    transformers' head-major layout, each key head a document queried by its group, its keys whole or in parts
    merged by their logsumexp; against float64."""
    from test_kvcache import assert_same_cache, expected, make_inputs

    kw = {"heads": 4, "kv_heads": 2, "dtype": torch.bfloat16, "head_dim": 64, "head_major": head_major}
    args = make_inputs(seqlen_q, 1, rows, **kw)
    out_want, lse_want, k_want, v_want = expected(args, causal=True)
    out, lse = flash_attn_with_kvcache(
        **args, causal=True, num_splits=num_splits, return_softmax_lse=True, backend=backend
    )
    torch.testing.assert_close(out.double(), out_want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), lse_want, atol=1e-2, rtol=1e-3)
    assert_same_cache(args["k_cache"], k_want)
    assert_same_cache(args["v_cache"], v_want)


# The FP8 forward (fa3 with e4m3 inputs, head dim 128): dtype, (Sq, Sk), (heads, kv heads), mask keyword arguments
FP8_CASES = {
    "causal-gqa-unequal": (torch.bfloat16, (113, 300), (4, 2), {"causal": True}),
    "causal-rows-without-keys": (torch.bfloat16, (260, 130), (2, 2), {"causal": True}),
    "window": (torch.bfloat16, (200, 200), (2, 1), {"window_size": (64, 0)}),
    "dense-fp16": (torch.float16, (129, 257), (2, 2), {}),
}


@pytest.mark.parametrize("incoherent", [False, True])
@pytest.mark.parametrize("case", FP8_CASES)
def test_emulated_fp8_forward_computes_its_reference(case, incoherent, monkeypatch):
    """flash_attn_fp8_func's fa3 path, the fused quantization (kernel_quantize) and the kernel, computes the
    reference backend's numerics (assert_fp8_kernel_computes_reference). Without the rotation the two quantize alike
    bit for bit; with it, a few values of the fused quantization lie one e4m3 step from quantize's (float32 sums in
    another order), each moving its row's logsumexp past the check's float32 bound, so there the reference backend
    gets the fused quantization's inputs (fused_quantize)."""
    dtype, (seqlen_q, seqlen_k), (heads, kv_heads), mask = FP8_CASES[case]
    q = torch.randn(2, seqlen_q, heads, 128, dtype=dtype)
    k, v = (torch.randn(2, seqlen_k, kv_heads, 128, dtype=dtype) for _ in range(2))
    kw = {"return_attn_probs": True, "incoherent": incoherent, **mask}
    out, lse, _ = fp8.flash_attn_fp8_func(q, k, v, backend="fa3", **kw)
    if incoherent:
        monkeypatch.setattr(fp8, "quantize", fused_quantize(fp8.quantize))
    ref, ref_lse, _ = fp8.flash_attn_fp8_func(q, k, v, backend="reference", **kw)
    assert_fp8_kernel_computes_reference(out, lse, ref, ref_lse, q, k)


# The FP8 quantization kernels (csrc/sm90/quantize.cuh) against fp8.quantize: dtype, (Sq, Sk), (heads, kv heads),
# batch, and the inputs' layout (fp8_quantize_inputs; "misaligned" ones kernel_quantize copies)
QUANTIZE_CASES = {
    "quantize-one-row-misaligned": (torch.bfloat16, (1, 1), (2, 2), 1, "misaligned"),
    "quantize-partial-blocks-gqa": (torch.bfloat16, (113, 300), (4, 2), 2, "contiguous"),
    "quantize-packed-fp16": (torch.float16, (200, 200), (4, 4), 2, "packed"),
    "quantize-heads-first-gqa-fp16": (torch.float16, (300, 113), (4, 2), 3, "heads-first"),
}


@pytest.mark.parametrize("case", QUANTIZE_CASES)
def test_emulated_fp8_quantize_is_quantize_without_rotation(case, rng):
    """assert_fused_quantization_is_quantize, into outputs poisoned with NaN (_emulated_kernels); a block holding a
    NaN, and one of zeros, get scale 1 there, as in quantize."""
    q, k, v = fp8_quantize_inputs(*QUANTIZE_CASES[case])
    q[-1, -1, 0, 5] = float("nan")
    k[0, : fp8.BLOCK_ROWS, -1] = 0  # the first block of the last key head
    got, _ = assert_fused_quantization_is_quantize(q, k, v)
    assert got.q_scale[-1, 0, -1] == 1 and got.q[-1, -1, 0, 5].isnan()
    assert got.k_scale[0, -1, 0] == 1 and (got.k[0, : fp8.BLOCK_ROWS, -1].float() == 0).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_emulated_fp8_quantize_keeps_special_values(dtype):
    """assert_fused_quantization_keeps_special_values, into outputs poisoned with NaN."""
    assert_fused_quantization_keeps_special_values(*fp8_quantize_inputs(dtype, (300, 200), (4, 2), 2, "contiguous"))


@pytest.mark.parametrize("case", QUANTIZE_CASES)
def test_emulated_fp8_quantize_rotates_by_the_incoherence_matrix(case, rng):
    """assert_fused_quantization_rotates, into outputs poisoned with NaN."""
    assert_fused_quantization_rotates(*fp8_quantize_inputs(*QUANTIZE_CASES[case]), seed=rng.randrange(2**63))
