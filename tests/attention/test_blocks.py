"""Block-sparse schedules (legalpt/attention/blocks.py) against a brute-force classification of every tile."""

from __future__ import annotations

import random

import torch
from attention_helpers import rule_mask

from legalpt.attention.backends import AttentionBatch, cuda
from legalpt.attention.blocks import EMPTY, FULL, PARTIAL, build_schedule, schedule_for, tile_states
from legalpt.attention.masks import MaskSpec


def brute_force_states(spec: MaskSpec, seqlen_q: int, seqlen_k: int, tile: tuple[int, int]) -> torch.Tensor:
    """uint8 (H or 1, nqt, nkt): empty, partial or full from the dense mask of the test oracle."""
    layout = None if spec.block_layout is None else spec.layout4d()[0]
    mask = rule_mask(
        seqlen_q, seqlen_k, causal=spec.causal, window=spec.window, global_tokens=spec.global_tokens,
        dilation=spec.dilation, layout=layout, block_size=spec.block_size,
    )  # fmt: skip
    tq, tk = tile
    nqt, nkt = -(-seqlen_q // tq), -(-seqlen_k // tk)
    states = torch.zeros(mask.shape[0], nqt, nkt, dtype=torch.uint8)
    for a in range(nqt):
        for b in range(nkt):
            block = mask[:, a * tq : (a + 1) * tq, b * tk : (b + 1) * tk]
            whole = (a + 1) * tq <= seqlen_q and (b + 1) * tk <= seqlen_k  # a tile cut by the document end is partial
            states[:, a, b] = block.flatten(1).any(1).to(torch.uint8) * (1 + (block.flatten(1).all(1) & whole))
    return states


def random_spec(draw: random.Random, heads: int, seqlen_q: int, seqlen_k: int) -> MaskSpec:
    block_size = (draw.choice([4, 7, 16]), draw.choice([5, 8, 16]))
    layout = None
    if draw.random() < 0.4:
        shape = (heads, -(-seqlen_q // block_size[0]), -(-seqlen_k // block_size[1]))
        layout = torch.rand(shape, generator=torch.Generator().manual_seed(draw.randrange(1 << 30))) < 0.6
    window = (draw.choice([-1, 0, 5, 17]), draw.choice([-1, 0, 3, 20]))
    return MaskSpec(draw.random() < 0.5, window, draw.choice([0, 3, 9]), draw.choice([1, 2, 3]), layout, block_size)


def test_tiles_are_never_missed_and_never_called_full_wrongly(rng):
    draw = random.Random(rng.randrange(1 << 30))
    for _ in range(150):
        heads, seqlen_q, seqlen_k = draw.choice([1, 2]), draw.randint(1, 70), draw.randint(1, 70)
        spec = random_spec(draw, heads, seqlen_q, seqlen_k)
        tile = (draw.choice([4, 8, 16]), draw.choice([4, 8, 16]))
        got = tile_states(spec, torch.tensor([seqlen_q]), torch.tensor([seqlen_k]), seqlen_q, seqlen_k, tile)[0]
        exact = brute_force_states(spec, seqlen_q, seqlen_k, tile)
        got = got.expand_as(exact)
        assert ((exact != EMPTY) <= (got != EMPTY)).all(), (spec, seqlen_q, seqlen_k, tile)  # visible: a superset
        assert ((got == FULL) <= (exact == FULL)).all(), (spec, seqlen_q, seqlen_k, tile)  # full: never wrongly


def test_plain_causal_and_window_masks_are_classified_exactly(rng):
    for causal, window in ((True, (-1, -1)), (False, (40, 13)), (True, (100, 0)), (False, (-1, -1))):
        spec = MaskSpec(causal, window)
        seqlen_q, seqlen_k = rng.randint(100, 300), rng.randint(100, 300)
        got = tile_states(spec, torch.tensor([seqlen_q]), torch.tensor([seqlen_k]), seqlen_q, seqlen_k, (32, 16))
        assert torch.equal(got[0], brute_force_states(spec, seqlen_q, seqlen_k, (32, 16)))


def test_visit_lists_hold_partial_tiles_first_then_full_ones_in_order(rng):
    states = torch.tensor(rng.choices([EMPTY, PARTIAL, FULL], k=6 * 9), dtype=torch.uint8).view(1, 2, 3, 9)
    for transposed in (False, True):
        schedule = build_schedule(states, (16, 16), transposed)
        table = states.transpose(-1, -2) if transposed else states
        for row, counts, indices in zip(
            table.flatten(0, 2), schedule.counts.flatten(0, 2), schedule.indices.flatten(0, 2), strict=True
        ):
            partial = [i for i, s in enumerate(row.tolist()) if s == PARTIAL]
            full = [i for i, s in enumerate(row.tolist()) if s == FULL]
            assert counts.tolist() == [len(partial) + len(full), len(partial)]
            assert indices[: counts[0]].tolist() == partial + full


def test_schedules_are_cached_per_shape_and_rebuilt_for_new_documents():
    spec = MaskSpec(causal=True)
    cu = torch.tensor([0, 50, 130], dtype=torch.int32)
    first = schedule_for(spec, cu, cu, 80, 80, (16, 16), False, torch.device("cpu"))
    assert schedule_for(spec, cu, cu, 80, 80, (16, 16), False, torch.device("cpu")) is first
    other = torch.tensor([0, 80, 130], dtype=torch.int32)
    rebuilt = schedule_for(spec, other, other, 80, 80, (16, 16), False, torch.device("cpu"))
    assert rebuilt is not first and not torch.equal(rebuilt.counts, first.counts)
    cu[1] = 80  # an in-place edit bumps the version: the cached schedule is not reused
    assert torch.equal(schedule_for(spec, cu, cu, 80, 80, (16, 16), False, torch.device("cpu")).counts, rebuilt.counts)


def _shaped(*shape: int) -> torch.Tensor:
    """A tensor of `shape` without its memory (one element, expanded): _split reads shapes only."""
    return torch.empty(()).expand(shape)


def test_the_backward_splits_the_key_tiles_of_global_tokens(monkeypatch):
    """cuda._split: the tiles holding the global keys (which every query tile visits) go to enough blocks that none
    visits more than SPLIT_VISITS query tiles; not under `deterministic` (float32 sums in no fixed order), or where
    one block's visits already fit. Global tokens take precedence over the causal GQA split."""
    monkeypatch.setattr(cuda, "SPLIT_VISITS", 32)
    monkeypatch.setattr(cuda, "GQA_PART", 1)
    tile = (64, 128)  # (query rows, keys) of a backward tile

    def split(global_tokens: int, max_q: int, max_k: int, deterministic: bool, causal: bool = False) -> tuple:
        q, k = _shaped(1, max_q, 8, 64), _shaped(1, max_k, 2, 64)  # GQA 8/2
        mask = MaskSpec(causal=causal, global_tokens=global_tokens)
        return cuda._split(AttentionBatch(q, k, k, None, None, max_q, max_k, mask, 1.0, 0.0, deterministic), tile, 64)

    assert split(64, 65536, 65536, deterministic=False) == (1, 32, 0)  # 1024 query tiles, 32 per block
    assert split(129, 65536, 65536, deterministic=False) == (2, 32, 0)  # 129 global keys span two tiles
    assert split(300, 3000, 100, deterministic=False) == (1, 2, 0)  # no more tiles than the keys have
    assert split(64, 65536, 65536, deterministic=True) == (0, 1, 0)
    assert split(0, 65536, 65536, deterministic=False) == (0, 1, 0)
    assert split(64, 2048, 2048, deterministic=False) == (0, 1, 0)  # 32 query tiles: one block
    assert split(64, 65536, 65536, deterministic=False, causal=True) == (1, 32, 0)
    assert split(64, 2048, 2048, deterministic=False, causal=True) == (0, 1, 0)  # no GQA split beside global keys


def test_a_causal_gqa_backward_splits_each_groups_heads(monkeypatch):
    """cuda._split without global tokens: a plainly causal GQA backward gives every key tile to group / GQA_PART
    blocks; not dense, windowed, dilated or block-sparse masks, not MHA or a group GQA_PART does not divide, not
    `deterministic`, and not past GQA_SPLIT_MAX_BYTES of float32 dK and dV parts."""
    monkeypatch.setattr(cuda, "GQA_PART", 1)
    tile = (64, 128)

    def split(heads: tuple[int, int] = (8, 2), seqlen: int = 1000, deterministic: bool = False, **mask) -> tuple:
        q, k = _shaped(2, seqlen, heads[0], 64), _shaped(2, seqlen, heads[1], 64)
        spec = MaskSpec(**{"causal": True, **mask})
        return cuda._split(AttentionBatch(q, k, k, None, None, seqlen, seqlen, spec, 1.0, 0.0, deterministic), tile, 64)

    assert split() == (8, 4, 1)  # 8 key tiles of 128 over 1000 keys, each over the group's 4 heads
    assert split(causal=False) == (0, 1, 0)
    assert split(window=(256, 0)) == (0, 1, 0)
    assert split(window=(-1, 0)) == (8, 4, 1)  # flash-attn's causal window: plainly causal
    assert split(dilation=2) == (0, 1, 0)
    assert split(block_layout=torch.ones(8, 8, dtype=torch.bool)) == (0, 1, 0)
    assert split(deterministic=True) == (0, 1, 0)
    assert split(heads=(4, 4)) == (0, 1, 0)
    monkeypatch.setattr(cuda, "GQA_PART", 2)
    assert split() == (8, 2, 2)
    assert split(heads=(6, 2)) == (0, 1, 0)  # 2 does not divide a group of 3
    assert split(heads=(4, 2)) == (0, 1, 0)  # a group of 2 is one part already
    monkeypatch.setattr(cuda, "GQA_PART", 1)
    limit = cuda.GQA_SPLIT_MAX_BYTES // (2 * 2 * 64 * 4)  # key rows x heads at the limit: 2 rows x 2 key heads here
    assert split(seqlen=limit // 2)[2] == 1
    assert split(seqlen=limit // 2 + 1) == (0, 1, 0)
