"""Block-sparse schedules (legalpt/attention/blocks.py) against a brute-force classification of every tile."""

from __future__ import annotations

import random

import pytest
import torch
from attention_helpers import rule_mask

from legalpt.attention import fa2
from legalpt.attention.blocks import (
    EMPTY,
    FULL,
    HALVES_SHIFT,
    PARTIAL,
    build_schedule,
    empty_halves,
    schedule_for,
    tile_states,
)
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


def _halves_schedule(spec: MaskSpec, seqlen_q: int, seqlen_k: int, tile: tuple[int, int]):
    return schedule_for(spec, None, None, seqlen_q, seqlen_k, tile, True, torch.device("cpu"), halves=True)


def _marked_halves(spec: MaskSpec, seqlen_q: int, seqlen_k: int, tile: tuple[int, int]):
    """(key tile, query tile, half, marked empty) of every visit of a halves schedule, which must list the same tiles
    as the plain one."""
    schedule = _halves_schedule(spec, seqlen_q, seqlen_k, tile)
    plain = schedule_for(spec, None, None, seqlen_q, seqlen_k, tile, True, torch.device("cpu"))
    assert schedule.halves and torch.equal(schedule.counts, plain.counts)
    assert torch.equal(schedule.indices & ((1 << HALVES_SHIFT) - 1), plain.indices)
    for kt, (counts, indices) in enumerate(zip(schedule.counts[0, 0], schedule.indices[0, 0], strict=True)):
        for entry in indices[: counts[0]].tolist():
            qt = entry & ((1 << HALVES_SHIFT) - 1)
            for half in (0, 1):
                yield kt, qt, half, bool(entry >> (HALVES_SHIFT + half) & 1)


def test_halves_marked_empty_see_no_query_of_the_tile(rng):
    """fa3's backward skips a warpgroup's half of a key tile that a halves schedule marks: it must be empty."""
    draw = random.Random(rng.randrange(1 << 30))
    for _ in range(60):
        seqlen_q, seqlen_k = draw.randint(1, 90), draw.randint(1, 90)
        spec = random_spec(draw, 1, seqlen_q, seqlen_k)
        tq, tk = draw.choice([4, 8]), draw.choice([8, 16])
        exact = brute_force_states(spec, seqlen_q, seqlen_k, (tq, tk // 2))[0]  # (nqt, key halves)
        for kt, qt, half, marked in _marked_halves(spec, seqlen_q, seqlen_k, (tq, tk)):
            column = 2 * kt + half
            truly_empty = column >= exact.shape[1] or exact[qt, column] == EMPTY
            assert not marked or truly_empty, (spec, seqlen_q, seqlen_k, (tq, tk), kt, qt, half)


def test_halves_of_causal_and_window_masks_are_marked_exactly():
    """On the plain masks every empty half is marked: a 1024-key window's key tile has one at each end."""
    for spec, seqlen in ((MaskSpec(True), 300), (MaskSpec(True, (1023, 0)), 2048), (MaskSpec(False, (40, 13)), 250)):
        tile = (64, 128) if seqlen > 1000 else (16, 32)
        exact = brute_force_states(spec, seqlen, seqlen, (tile[0], tile[1] // 2))[0]
        marks = list(_marked_halves(spec, seqlen, seqlen, tile))
        for kt, qt, half, marked in marks:
            column = 2 * kt + half  # past the keys' end: empty
            assert marked == (column >= exact.shape[1] or exact[qt, column].item() == EMPTY), (spec, kt, qt, half)
        assert any(marked for *_, marked in marks)
    window = list(_marked_halves(MaskSpec(True, (1023, 0)), 2048, 2048, (64, 128)))
    assert [(qt, half) for kt, qt, half, marked in window if marked and kt == 4] == [(8, 1), (25, 0)]


def test_halves_need_a_transposed_schedule():
    states = torch.full((1, 1, 2, 2), FULL, dtype=torch.uint8)
    halves = empty_halves(torch.full((1, 1, 2, 4), FULL, dtype=torch.uint8), 2)
    assert not halves.any()
    with pytest.raises(ValueError, match="transposed"):
        build_schedule(states, (16, 16), False, halves)


def test_a_last_key_tile_of_one_half_marks_the_missing_half_empty():
    states = torch.full((1, 1, 1, 3), FULL, dtype=torch.uint8)  # 3 half-width key tiles: the second tile's half 1
    assert empty_halves(states, 2).tolist() == [[[[0, 2]]]]  # lies past the keys' end


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


def test_the_backward_splits_only_the_key_tiles_of_global_tokens(monkeypatch):
    """fa2._split: the tiles holding the global keys (which every query tile visits) go to enough blocks that none
    visits more than SPLIT_VISITS query tiles; nothing splits without global tokens, under `deterministic` (float32
    sums in no fixed order), or where one block's visits already fit."""
    monkeypatch.setattr(fa2, "SPLIT_VISITS", 32)
    tile = (64, 128)  # (query rows, keys) of a backward tile
    assert fa2._split(64, 65536, 65536, tile, deterministic=False) == (1, 32)  # 1024 query tiles, 32 per block
    assert fa2._split(129, 65536, 65536, tile, deterministic=False) == (2, 32)  # 129 global keys span two tiles
    assert fa2._split(300, 3000, 100, tile, deterministic=False) == (1, 2)  # no more tiles than the keys have
    assert fa2._split(64, 65536, 65536, tile, deterministic=True) == (0, 1)
    assert fa2._split(0, 65536, 65536, tile, deterministic=False) == (0, 1)
    assert fa2._split(64, 2048, 2048, tile, deterministic=False) == (0, 1)  # 32 query tiles: one block
