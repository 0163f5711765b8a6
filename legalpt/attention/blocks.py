"""Block-sparse schedules: which key tiles each query tile visits (and, transposed, which query tiles each key tile).

A kernel cuts every document into query tiles of Tq rows and key tiles of Tk keys. For each pair the mask makes the
tile pair one of three states: empty (never loaded), partial (the element rule is applied inside) or full (every
element visible: no masking math). A `BlockSchedule` lists, per row tile, the column tiles to visit, partial ones
first. It is built on the device of the documents with a few vectorized torch ops (no host sync) from the same
rule as everything else (`masks.block_visible`, `masks.block_full`), and the block layout is folded in through a
summed-area table, so any layout block size works with any tile size. `schedule_for` caches schedules per shape.

FlexAttention's `BlockMask` holds the same information (partial and full lists, both directions); `backends/flex.py`
converts between the two.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from legalpt.attention.masks import MaskSpec, block_full, block_visible
from legalpt.attention.tensor_cache import TensorCache

EMPTY, PARTIAL, FULL = 0, 1, 2  # tile states
_CACHE_SIZE = 16  # schedules kept by `schedule_for`: a model's layers share a handful of shapes


@dataclass(frozen=True)
class BlockSchedule:
    """The tiles each row tile visits. Rows are query tiles, or key tiles when `transposed`."""

    tile: tuple[int, int]  # (Tq, Tk): tile size in query rows and keys
    counts: Tensor  # int32 (Bs, Hs, rows, 2): [tiles to visit, of which partial]; Bs, Hs are 1 when shared
    indices: Tensor  # int32 (Bs, Hs, rows, cols): the tiles to visit, partial ones first, each group ascending
    transposed: bool  # rows are key tiles and indices name query tiles (the backward's order)


def tile_states(
    spec: MaskSpec, lens_q: Tensor, lens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int, tile: tuple[int, int]
) -> Tensor:
    """uint8 (Bs, Hs, nqt, nkt) state of every tile pair of every document.

    lens_q, lens_k: (Bd,) document lengths on the schedule's device (Bd = 1 for a batch of equal rows without a
    per-batch block layout). Bs is Bd, or the layout's batch size; Hs is the layout's head count, else 1.
    """
    tq, tk = tile
    nqt, nkt = -(-max_seqlen_q // tq), -(-max_seqlen_k // tk)
    device = lens_q.device
    lq, lk = lens_q.long()[:, None, None], lens_k.long()[:, None, None]  # (Bd, 1, 1)
    i0 = torch.arange(nqt, device=device)[None, :, None] * tq  # (1, nqt, 1)
    j0 = torch.arange(nkt, device=device)[None, None, :] * tk  # (1, 1, nkt)
    i1 = torch.minimum(i0 + tq, lq) - 1  # last row of the tile inside the document
    j1 = torch.minimum(j0 + tk, lk) - 1
    i0, i1, j0, j1, offset = torch.broadcast_tensors(i0, i1, j0, j1, lk - lq)  # (Bd, nqt, nkt)
    exists = (i0 < lq) & (j0 < lk)
    visible = exists & block_visible(spec, i0, i1, j0, j1, offset)  # (Bd, nqt, nkt)
    full = visible & (i0 + tq <= lq) & (j0 + tk <= lk) & block_full(spec, i0, i1, j0, j1, offset)
    visible, full = visible[:, None], full[:, None]  # (Bd, 1, nqt, nkt)
    if spec.block_layout is not None:
        i1, j1 = torch.maximum(i1, i0), torch.maximum(j1, j0)  # tiles outside a short document are empty anyway
        allowed = _layout_counts(spec, i0, i1, j0, j1, visible.shape[0])
        visible = visible & (allowed > 0)
        full = full & (allowed == _area(spec, i0, i1, j0, j1)[:, None])
    return visible.to(torch.uint8) + full.to(torch.uint8)


def _layout_blocks(spec: MaskSpec, i0: Tensor, i1: Tensor, j0: Tensor, j1: Tensor) -> tuple[Tensor, ...]:
    """First and last layout block row and column that each tile touches."""
    bq, bk = spec.block_size
    return i0 // bq, i1 // bq, j0 // bk, j1 // bk


def _area(spec: MaskSpec, i0: Tensor, i1: Tensor, j0: Tensor, j1: Tensor) -> Tensor:
    a0, a1, c0, c1 = _layout_blocks(spec, i0, i1, j0, j1)
    return (a1 - a0 + 1) * (c1 - c0 + 1)  # (Bd, nqt, nkt)


def _layout_counts(spec: MaskSpec, i0: Tensor, i1: Tensor, j0: Tensor, j1: Tensor, docs: int) -> Tensor:
    """Number of allowed layout blocks under each tile: (Bs, Hs, nqt, nkt)."""
    layout = spec.layout4d()  # (Lb, Lh, nq, nk)
    sat = torch.zeros(*layout.shape[:2], layout.shape[2] + 1, layout.shape[3] + 1, device=i0.device, dtype=torch.int32)
    sat[..., 1:, 1:] = layout.to(device=i0.device, dtype=torch.int32).cumsum(2).cumsum(3)
    a0, a1, c0, c1 = _layout_blocks(spec, i0, i1, j0, j1)  # (Bd, nqt, nkt)
    batch = max(docs, layout.shape[0])
    b = torch.arange(batch, device=i0.device) if layout.shape[0] > 1 else i0.new_zeros(batch)
    b, a1, c1 = b[:, None, None], a1 + 1, c1 + 1
    count = sat[b, :, a1, c1] - sat[b, :, a0, c1] - sat[b, :, a1, c0] + sat[b, :, a0, c0]  # (Bs, nqt, nkt, Lh)
    return count.permute(0, 3, 1, 2)


def build_schedule(states: Tensor, tile: tuple[int, int], transposed: bool = False) -> BlockSchedule:
    """The visit lists of `tile_states` output: per row tile, partial tiles first, then full, each ascending."""
    if transposed:
        states = states.transpose(-1, -2)
    order_key = torch.where(states == PARTIAL, 0, torch.where(states == FULL, 1, 2)).to(torch.uint8)
    indices = torch.argsort(order_key, dim=-1, stable=True).to(torch.int32)
    counts = torch.stack([(states != EMPTY).sum(-1), (states == PARTIAL).sum(-1)], dim=-1).to(torch.int32)
    return BlockSchedule(tile, counts.contiguous(), indices.contiguous(), transposed)


_schedules: TensorCache[BlockSchedule] = TensorCache(_CACHE_SIZE)


def schedule_for(
    spec: MaskSpec,
    cu_seqlens_q: Tensor | None,
    cu_seqlens_k: Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    tile: tuple[int, int],
    transposed: bool,
    device: torch.device,
) -> BlockSchedule:
    """The schedule of a batch of equal rows (cu_seqlens None) or of packed documents, cached.

    Keyed by the tensors' identity and version (tensor_cache.py), so the layers of one step, which share
    `cu_seqlens` and the layout, build the schedule once.
    """
    tensors = [t for t in (cu_seqlens_q, cu_seqlens_k, spec.block_layout) if t is not None]
    extra = (spec.causal, spec.window, spec.global_tokens, spec.dilation, spec.block_size, max_seqlen_q, max_seqlen_k,
             tile, transposed, device)  # fmt: skip

    def make() -> BlockSchedule:
        if cu_seqlens_q is None or cu_seqlens_k is None:
            lens_q = torch.tensor([max_seqlen_q], device=device)
            lens_k = torch.tensor([max_seqlen_k], device=device)
        else:
            lens_q, lens_k = cu_seqlens_q.diff(), cu_seqlens_k.diff()
        return build_schedule(tile_states(spec, lens_q, lens_k, max_seqlen_q, max_seqlen_k, tile), tile, transposed)

    return _schedules.get(tensors, extra, make)
