"""Block sparsity against the element rule: a block is visited exactly when some element in it is visible, so the
reference's cost follows the mask (causal, window, global tokens, documents, block layout)."""

from __future__ import annotations

import itertools

import pytest
import torch
from attention_helpers import rule_mask

from legalpt.attention.backends import reference
from legalpt.attention.masks import Documents, MaskSpec, block_visible

POSITION_MASKS = {
    "full": {},
    "causal": {"causal": True},
    "window": {"window": (9, 4)},
    "causal-window": {"causal": True, "window": (20, 0)},
    "causal-window-right": {"causal": True, "window": (5, 7)},
    "global": {"window": (3, 3), "global_tokens": 5},
    "causal-global": {"causal": True, "window": (6, 0), "global_tokens": 9},
    "dilation": {"window": (12, 12), "dilation": 5},
    "causal-global-dilation": {"causal": True, "window": (30, 0), "global_tokens": 4, "dilation": 3},
}


def _block_any(mask: torch.Tensor, bq: int, bk: int) -> torch.Tensor:
    """(Sq, Sk) bool -> (nq, nk): does the block hold any visible element?"""
    sq, sk = mask.shape
    nq, nk = -(-sq // bq), -(-sk // bk)
    padded = torch.zeros(nq * bq, nk * bk, dtype=torch.bool)
    padded[:sq, :sk] = mask
    return padded.view(nq, bq, nk, bk).any(3).any(1)


@pytest.mark.parametrize("sizes", [(61, 61), (40, 97), (97, 40), (1, 50)], ids=str)
@pytest.mark.parametrize("case", list(POSITION_MASKS))
def test_block_visible_is_exact(case, sizes):
    """Exact without dilation; with dilation a superset (it may keep blocks the dilation empties)."""
    kw = POSITION_MASKS[case]
    sq, sk = sizes
    bq, bk = 8, 16
    truth = _block_any(rule_mask(sq, sk, **kw)[0], bq, bk)
    a, b = torch.meshgrid(torch.arange(truth.shape[0]), torch.arange(truth.shape[1]), indexing="ij")
    i0, j0 = a * bq, b * bk
    i1, j1 = torch.clamp(i0 + bq, max=sq) - 1, torch.clamp(j0 + bk, max=sk) - 1
    spec = MaskSpec(**kw)
    visible = block_visible(spec, i0, i1, j0, j1, torch.full_like(i0, sk - sq))
    if spec.dilation == 1:
        assert torch.equal(visible, truth)
    else:
        assert (visible | ~truth).all()


def _visited_pairs(spec: MaskSpec, docs: Documents, heads: int) -> int:
    return sum(reference._plan(spec, docs, heads, torch.device("cpu")).active)


def _needed_pairs(spec: MaskSpec, docs: Documents) -> int:
    """Block pairs of the same document that hold a visible element for some head, from the naive rule."""
    bq, bk = spec.block_size
    kw = {"causal": spec.causal, "window": spec.window, "global_tokens": spec.global_tokens}
    total = 0
    for d, (sq, sk) in enumerate(zip(docs.q_lens, docs.k_lens, strict=True)):
        layout = spec.layout4d()
        layout = None if layout is None else layout[d if layout.shape[0] > 1 else 0]
        mask = rule_mask(sq, sk, layout=layout, block_size=spec.block_size, **kw).any(0)
        total += int(_block_any(mask, bq, bk).sum())
    return total


LENS = ([100, 1, 0, 64, 250, 33], [100, 17, 5, 64, 250, 70])


@pytest.mark.parametrize("case", [c for c in POSITION_MASKS if "dilation" not in c])
def test_reference_visits_exactly_the_needed_blocks(case):
    kw = POSITION_MASKS[case]
    docs = Documents(tuple(itertools.accumulate([0, *LENS[0][:-1]])), tuple(LENS[0]), (0,) * 6, tuple(LENS[1]))
    spec = MaskSpec(**kw, block_size=(16, 32))
    assert _visited_pairs(spec, docs, heads=2) == _needed_pairs(spec, docs)


@pytest.mark.parametrize("layout_dims", [2, 3, 4])
def test_reference_visits_only_blocks_the_layout_allows(layout_dims):
    docs = Documents((0, 100, 101), (100, 1, 250), (0, 100, 117), (100, 17, 250))
    spec_shape = (3, 2, 16, 8)[4 - layout_dims :]
    layout = torch.rand(spec_shape) < 0.3
    spec = MaskSpec(causal=True, global_tokens=3, block_layout=layout, block_size=(16, 32))
    assert _visited_pairs(spec, docs, heads=2) == _needed_pairs(spec, docs)


def test_causal_cost_is_half_and_documents_cost_nothing_across():
    """One causal document of 8 blocks visits 8 * 9 / 2 pairs; four documents of 2 blocks visit 4 * 3."""
    spec = MaskSpec(causal=True, block_size=(32, 32))
    assert _visited_pairs(spec, Documents.uniform(1, 256, 256), heads=1) == 36
    assert _visited_pairs(spec, Documents.uniform(4, 64, 64), heads=1) == 12
