"""The attention mask: the element rule, written once, and everything derived from it.

Element rule (DESIGN.md). Positions are within a document (a batch row, or a `cu_seqlens` segment): query i in
[0, Sq), key j in [0, Sk); i' = i + (Sk - Sq) is the query's position in key coordinates (bottom-right aligned, as in
flash-attn >= 2.1). Query i may see key j when they are in the same document and

    (not causal or j <= i')
    and (  (i' - left <= j <= i' + right  and  (i' - j) % dilation == 0)      # window; -1 = unbounded side
         or 0 <= i' < global_tokens or j < global_tokens )                    # global tokens
    and block_layout[..., i // Bq, j // Bk]                                   # block layout, if given

How the extras interact:
- global tokens are the first `global_tokens` positions of each document, in key coordinates (for Sq == Sk simply
  the first tokens). A global key is seen by every query, a global query sees every key; both bypass the window and
  the dilation, never causality, the document boundary or the block layout. A query with i' < 0 (only when
  Sq > Sk) stands before the document's first key and is not global: DESIGN.md's "i' < global_tokens" read
  literally would make such rows global even for global_tokens = 0.
- dilation thins the window only: of the keys inside [i' - left, i' + right] those at a distance from i' that is a
  multiple of `dilation` remain (the diagonal always does). With an unbounded window it thins the whole row.
- block_layout is a bool tensor of shape (nq, nk), (H, nq, nk) or (B, H, nq, nk) with nq = ceil(Sq / Bq) and
  nk = ceil(Sk / Bk) (varlen: of max_seqlen_q / max_seqlen_k, and B = number of documents). Its block indices use
  the unshifted query position i and the key position j, both within the document. It is a final AND: a block it
  rules out is invisible even to global tokens.

This module holds the rule (`element_mask`), its block-level forms (`block_visible` and `block_full`, used to skip
work and masking math), dense masks for comparison backends (`batch_mask`, `packed_mask`) and the document
structure read from `cu_seqlens`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True, eq=False)
class MaskSpec:
    """Everything that decides which key a query may see, besides the documents."""

    causal: bool = False
    window: tuple[int, int] = (-1, -1)  # (left, right); -1 = unbounded
    global_tokens: int = 0
    dilation: int = 1
    block_layout: Tensor | None = None  # bool (nq, nk) | (H, nq, nk) | (B, H, nq, nk)
    block_size: tuple[int, int] = (128, 128)  # (Bq, Bk): the unit of block_layout, and the reference's tile

    @property
    def limits_positions(self) -> bool:
        """Whether `element_mask` can refuse a key of the same document (else only documents and layout matter)."""
        return self.causal or max(self.window) >= 0 or self.dilation > 1

    def ints(self) -> list[int]:
        """The mask without its layout, flattened once for the custom ops and the kernels (csrc/api.h reads it):
        [causal, left, right, global_tokens, dilation, block_q, block_k]."""
        return [int(self.causal), *self.window, self.global_tokens, self.dilation, *self.block_size]

    @classmethod
    def from_ints(cls, ints: list[int], block_layout: Tensor | None) -> MaskSpec:
        """The inverse of `ints`."""
        causal, left, right, global_tokens, dilation, block_q, block_k = ints
        return cls(bool(causal), (left, right), global_tokens, dilation, block_layout, (block_q, block_k))

    def layout4d(self) -> Tensor | None:
        """block_layout as (B or 1, H or 1, nq, nk), a view."""
        layout = self.block_layout
        if layout is None:
            return None
        return layout.reshape((1,) * (4 - layout.dim()) + tuple(layout.shape))


@dataclass(frozen=True)
class Documents:
    """Start and length of every document on the packed query and key axes (host integers)."""

    q_starts: tuple[int, ...]
    q_lens: tuple[int, ...]
    k_starts: tuple[int, ...]
    k_lens: tuple[int, ...]

    @classmethod
    def uniform(cls, batch: int, seqlen_q: int, seqlen_k: int) -> Documents:
        """The rows of a (B, S, H, D) batch, laid end to end."""
        return cls(
            tuple(b * seqlen_q for b in range(batch)),
            (seqlen_q,) * batch,
            tuple(b * seqlen_k for b in range(batch)),
            (seqlen_k,) * batch,
        )

    @classmethod
    def from_cu_seqlens(
        cls,
        cu_seqlens_q: Tensor,
        cu_seqlens_k: Tensor,
        total_q: int,
        total_k: int,
        max_seqlen_q: int,
        max_seqlen_k: int,
    ) -> Documents:
        """Read and check the values of `cu_seqlens_*` (a host sync); raise ValueError naming the bad argument."""
        docs = []
        for name, cu, total, max_seqlen in (
            ("cu_seqlens_q", cu_seqlens_q, total_q, max_seqlen_q),
            ("cu_seqlens_k", cu_seqlens_k, total_k, max_seqlen_k),
        ):
            values = cu.tolist()
            lens = [b - a for a, b in itertools.pairwise(values)]
            if values[0] != 0:
                raise ValueError(f"{name}: expected to start at 0, got {values[0]}")
            if min(lens, default=0) < 0:
                raise ValueError(f"{name}: expected non-decreasing values, got {values}")
            if values[-1] != total:
                raise ValueError(f"{name}: expected last value == number of tokens ({total}), got {values[-1]}")
            if max(lens, default=0) > max_seqlen:
                raise ValueError(
                    f"max_seqlen_{name[-1]}: expected >= the longest document ({max(lens)}), got {max_seqlen}"
                )
            docs += [tuple(values[:-1]), tuple(lens)]
        return cls(*docs)

    @property
    def count(self) -> int:
        return len(self.q_lens)


def element_mask(spec: MaskSpec, i: Tensor, j: Tensor, offset: Tensor | int) -> Tensor:
    """The element rule without documents and block layout: may query position i see key position j?

    i, j (and offset = Sk - Sq of the document) are integer tensors that broadcast against each other.
    """
    left, right = spec.window
    ip = i + offset  # query position in key coordinates
    distance = ip - j  # >= 0 when the key is at or before the query
    allowed = torch.ones_like(distance, dtype=torch.bool)
    if left >= 0:
        allowed &= distance <= left
    if right >= 0:
        allowed &= distance >= -right
    if spec.dilation > 1:
        allowed &= distance % spec.dilation == 0
    if spec.global_tokens > 0:
        allowed |= ((ip >= 0) & (ip < spec.global_tokens)) | (j < spec.global_tokens)
    if spec.causal:
        allowed &= distance >= 0
    return allowed


def block_visible(spec: MaskSpec, i0: Tensor, i1: Tensor, j0: Tensor, j1: Tensor, offset: Tensor) -> Tensor:
    """Whether `element_mask` allows any pair of query positions [i0, i1] and key positions [j0, j1] (inclusive).

    Exact for causal, window and global tokens; dilation is ignored, so with dilation > 1 it may keep a block whose
    elements are all thinned out (the element mask still applies inside). Rows of i0..j1 are per candidate block.
    """
    left, right = spec.window
    p0, p1 = i0 + offset, i1 + offset  # first and last query, in key coordinates
    # Each row sees a window [i' - left, i' + right'] of constant width that moves by one per row, so the rows of a
    # block together see the contiguous range [p0 - left, p1 + right'].
    right_eff = 0 if spec.causal else right
    visible = torch.ones_like(p0, dtype=torch.bool)
    if left >= 0:
        visible &= p0 - left <= j1
    if right_eff >= 0:
        visible &= p1 + right_eff >= j0
    g = spec.global_tokens
    if g > 0:
        has_global_row = (p0 < g) & (p1 >= 0)  # global queries are those with 0 <= i' < g
        if spec.causal:
            has_global_row &= j0 <= torch.clamp(p1, max=g - 1)
        global_keys = (j0 < g) & (j0 <= p1) if spec.causal else j0 < g
        visible |= has_global_row | global_keys
    return visible


def block_full(spec: MaskSpec, i0: Tensor, i1: Tensor, j0: Tensor, j1: Tensor, offset: Tensor) -> Tensor:
    """Whether `element_mask` allows every pair of query positions [i0, i1] and key positions [j0, j1] (inclusive).

    May answer False for a full block (never True for one that is not): the kernels then apply the element rule
    to it, which costs time, not correctness. With dilation > 1 a block is full only when global tokens make it so.
    """
    left, right = spec.window
    p0, p1 = i0 + offset, i1 + offset
    g = spec.global_tokens
    j0_local = torch.clamp(j0, min=g)  # global keys are visible whatever the window; the others must be inside it
    full = torch.full_like(p0, spec.dilation == 1, dtype=torch.bool)
    if left >= 0:
        full &= p1 - j0_local <= left  # the farthest pair (last query, first non-global key) is inside the window
    if right >= 0:
        full &= j1 - p0 <= right
    if g > 0:
        full |= (j1 < g) | ((p0 >= 0) & (p1 < g))  # every key global, or every query global
    if spec.causal:
        full &= j1 <= p0
    return full


def batch_mask(spec: MaskSpec, seqlen_q: int, seqlen_k: int, device: torch.device) -> Tensor:
    """Dense mask of a (B, S, H, D) batch: bool (B or 1, H or 1, Sq, Sk)."""
    i = torch.arange(seqlen_q, device=device)[:, None]
    j = torch.arange(seqlen_k, device=device)[None, :]
    mask = element_mask(spec, i, j, seqlen_k - seqlen_q)
    layout = spec.layout4d()
    if layout is None:
        return mask[None, None]
    bq, bk = spec.block_size
    return mask & layout[:, :, i // bq, j // bk]


def packed_mask(spec: MaskSpec, docs: Documents, device: torch.device) -> Tensor:
    """Dense mask over the packed token axes of a varlen batch: bool (H or 1, total_q, total_k)."""
    q_doc, q_pos = _token_coordinates(docs.q_starts, docs.q_lens, device)
    k_doc, k_pos = _token_coordinates(docs.k_starts, docs.k_lens, device)
    offset = torch.tensor(docs.k_lens, device=device) - torch.tensor(docs.q_lens, device=device)
    mask = (q_doc[:, None] == k_doc[None, :]) & element_mask(spec, q_pos[:, None], k_pos[None, :], offset[q_doc, None])
    layout = spec.layout4d()
    if layout is None:
        return mask[None]
    bq, bk = spec.block_size
    doc = q_doc if layout.shape[0] > 1 else torch.zeros_like(q_doc)
    # (total_q, total_k, H): a key of another document reads a valid but irrelevant layout entry, masked above
    allowed = layout[doc[:, None], :, (q_pos // bq)[:, None], (k_pos // bk)[None, :]]
    return mask & allowed.permute(2, 0, 1)


def _token_coordinates(starts: tuple[int, ...], lens: tuple[int, ...], device: torch.device) -> tuple[Tensor, Tensor]:
    """Document index and position within the document of every token on a packed axis."""
    lens_t = torch.tensor(lens, device=device, dtype=torch.long)
    doc = torch.repeat_interleave(torch.arange(len(lens), device=device), lens_t)
    pos = torch.arange(doc.numel(), device=device) - torch.tensor(starts, device=device, dtype=torch.long)[doc]
    return doc, pos
