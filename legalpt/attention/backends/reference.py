"""The `reference` backend: exact block-sparse attention in plain PyTorch, forward and backward, CPU and GPU.

Every document (a batch row or a `cu_seqlens` segment) is cut into query tiles of Bq rows and key tiles of Bk keys
(`block_size`, shrunk to the longest document when there is no block layout; a document's last tile is padded).
`masks.block_visible` and the block layout decide which tile pairs hold any visible element; only those are
computed. Query tiles are sorted by how many key tiles they visit, so at step s the tiles still working are a
prefix: one batched matmul per step and chunk of query tiles serves all of them, with Python overhead per step
rather than per tile pair.

Forward keeps a running max and sum per row (online softmax) and writes the output and the logsumexp (natural log,
float32). Backward recomputes the probabilities from q, k and the logsumexp: dS = P * (dP - rowsum(dO * O) + dLSE).
All arithmetic is float32 whatever the input dtype. Memory is O(N): the tiled copies of the inputs plus scores of at
most `_CHUNK_ELEMENTS` per step. A row that sees no key gets output 0, logsumexp -inf and zero gradients.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from legalpt.attention.backends.base import AttentionBatch
from legalpt.attention.masks import Documents, MaskSpec, block_visible, element_mask
from legalpt.attention.ops import KernelBackend

_CHUNK_ELEMENTS = 1 << 22  # scores per step and chunk of query tiles (16 MiB in float32): bounds the workspace


@dataclass
class _Plan:
    """Tiling of the packed axes and the block-sparse schedule, on the compute device.

    Query tiles are numbered in processing order (descending number of key tiles visited); key tiles in packed order.
    """

    q_index: Tensor  # (nqt, Bq) packed row of each tile slot; padding slots repeat a row of the same document
    q_valid: Tensor  # (nqt, Bq) bool, False on padding slots
    q_pos: Tensor  # (nqt, Bq, 1) position within the document
    q_offset: Tensor  # (nqt, 1, 1) Sk - Sq of the tile's document
    q_unpack: tuple[Tensor, Tensor]  # (tile, slot) of every packed query row
    k_index: Tensor  # (nkt, Bk)
    k_pos: Tensor  # (nkt, 1, Bk)
    k_valid: Tensor | None  # (nkt, 1, Bk) bool, None when no key tile is padded
    k_unpack: tuple[Tensor, Tensor]
    schedule: Tensor  # (steps, nqt) key tile visited by each query tile at each step
    active: list[int]  # number of query tiles (a prefix) still working at each step
    head_bits: Tensor | None  # (steps, nqt, H, 1, 1) block layout per head, None when it does not differ by head


def _float32(fn: Callable) -> Callable:
    """Run `fn` with autocast off: the reference does its own float32 arithmetic, which autocast would undo."""

    @functools.wraps(fn)
    def wrapper(batch: AttentionBatch, *args, **kwargs):
        with torch.autocast(batch.q.device.type, enabled=False):
            return fn(batch, *args, **kwargs)

    return wrapper


class Reference(KernelBackend):
    """The reference behind the custom ops; runs anywhere."""

    name = "reference"

    def check(self, batch: AttentionBatch) -> None:
        """Runs on any device and dtype."""

    def forward(self, batch: AttentionBatch) -> tuple[Tensor, Tensor]:
        return forward(batch)

    def backward(
        self, batch: AttentionBatch, out: Tensor, lse: Tensor, dout: Tensor, dlse: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        return backward(batch, out, lse, dout, dlse)


@_float32
def forward(batch: AttentionBatch) -> tuple[Tensor, Tensor]:
    """out like q; logsumexp float32 (B, H, Sq) for a batch, (H, total_q) for a varlen batch."""
    q, spec, softmax_scale, softcap = batch.q, batch.mask, batch.softmax_scale, batch.softcap
    qp, kp, vp, docs = _packed(batch)
    spec = _fit_tiles(spec, docs)
    plan = _plan(spec, docs, qp.shape[1], qp.device)
    heads, kv_heads, dim = qp.shape[1], kp.shape[1], qp.shape[2]
    bq = spec.block_size[0]
    qt = _tile(qp, plan.q_index).mul_(softmax_scale)  # (nqt, H, Bq, D)
    kt, vt = _tile(kp, plan.k_index), _tile(vp, plan.k_index)  # (nkt, Hk, Bk, D)
    nqt = qt.shape[0]
    row_max = qt.new_full((nqt, heads, bq), float("-inf"))
    row_sum = qt.new_zeros((nqt, heads, bq))
    acc = qt.new_zeros((nqt, heads, bq, dim))
    for lo, hi, step in _steps(plan, spec, heads):
        ids = plan.schedule[step, lo:hi]
        p = _scores(qt[lo:hi], kt[ids], softcap)[0]
        _apply_mask(p, plan, spec, lo, hi, step, ids)
        m_old = row_max[lo:hi]
        m_new = torch.maximum(m_old, p.amax(-1))
        m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0)  # a row with nothing seen yet stays at 0
        p.sub_(m_safe[..., None]).exp_()
        alpha = (m_old - m_safe).exp_()
        row_sum[lo:hi].mul_(alpha).add_(p.sum(-1))
        acc[lo:hi].mul_(alpha[..., None])
        _grouped(acc[lo:hi], kv_heads).baddbmm_(_grouped(p, kv_heads), vt[ids].flatten(0, 1))
        m_old.copy_(m_new)
    seen = row_sum > 0
    lse = torch.where(seen, row_max + row_sum.log(), float("-inf"))
    out = acc / torch.where(seen, row_sum, 1.0)[..., None]
    return _unpack_out(out, lse, plan, q)


@_float32
def backward(
    batch: AttentionBatch, out: Tensor, lse: Tensor, dout: Tensor, dlse: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of `forward`, given dout (like out) and the gradient of the logsumexp (None = 0).

    Deterministic whatever `batch.deterministic` says (no atomics).
    """
    q, k, v, spec, softmax_scale, softcap = batch.q, batch.k, batch.v, batch.mask, batch.softmax_scale, batch.softcap
    qp, kp, vp, docs = _packed(batch)
    dop, outp = _packed_rows(dout), _packed_rows(out)
    lsep = _packed_lse(lse, q)  # (total_q, H)
    delta = (dop.float() * outp.float()).sum(-1)  # (total_q, H): rowsum(dO * O)
    if dlse is not None:
        delta = delta - _packed_lse(dlse, q)
    spec = _fit_tiles(spec, docs)
    plan = _plan(spec, docs, qp.shape[1], qp.device)
    kv_heads = kp.shape[1]
    qt = _tile(qp, plan.q_index).mul_(softmax_scale)  # (nqt, H, Bq, D)
    kt, vt = _tile(kp, plan.k_index), _tile(vp, plan.k_index)  # (nkt, Hk, Bk, D)
    # Padding slots repeat a real row: a zero dO and delta there keep them out of dk and dv.
    dot = _tile(dop, plan.q_index, plan.q_valid)
    delta_t = _tile(delta, plan.q_index, plan.q_valid)  # (nqt, H, Bq)
    lse_t = _tile(lsep, plan.q_index)
    lse_t.masked_fill_(lse_t == float("-inf"), float("inf"))  # P = exp(s - inf) = 0 on rows that see no key
    dq = torch.zeros_like(qt)
    dk = torch.zeros_like(kt)
    dv = torch.zeros_like(vt)
    for lo, hi, step in _steps(plan, spec, qp.shape[1]):
        ids = plan.schedule[step, lo:hi]
        k_ids, v_ids = kt[ids], vt[ids]
        p, tanh = _scores(qt[lo:hi], k_ids, softcap)
        _apply_mask(p, plan, spec, lo, hi, step, ids)
        p.sub_(lse_t[lo:hi, ..., None]).exp_()  # (n, H, Bq, Bk)
        p3, do3 = _grouped(p, kv_heads), _grouped(dot[lo:hi], kv_heads)
        _accumulate(dv, ids, torch.bmm(p3.transpose(1, 2), do3).view_as(v_ids))
        ds = torch.bmm(do3, v_ids.flatten(0, 1).transpose(1, 2)).view_as(p)  # dP
        ds.sub_(delta_t[lo:hi, ..., None]).mul_(p)
        if tanh is not None:
            ds.mul_(tanh.square_().neg_().add_(1.0))  # d softcap*tanh(x/softcap) / dx
        ds3 = _grouped(ds, kv_heads)
        _grouped(dq[lo:hi], kv_heads).baddbmm_(ds3, k_ids.flatten(0, 1))
        _accumulate(dk, ids, torch.bmm(ds3.transpose(1, 2), _grouped(qt[lo:hi], kv_heads)).view_as(k_ids))
    dq_p = _untile(dq, plan.q_unpack).mul_(softmax_scale)
    return (
        dq_p.to(q.dtype).view_as(q),
        _untile(dk, plan.k_unpack).to(k.dtype).view_as(k),
        _untile(dv, plan.k_unpack).to(v.dtype).view_as(v),
    )


def _packed(batch: AttentionBatch) -> tuple[Tensor, Tensor, Tensor, Documents]:
    """Views of q, k, v on packed token axes (total, H, D) and the documents along them."""
    q, k, v = batch.q, batch.k, batch.v
    if batch.cu_seqlens_q is None or batch.cu_seqlens_k is None:
        docs = Documents.uniform(q.shape[0], q.shape[1], k.shape[1])
    else:
        docs = Documents.from_cu_seqlens(
            batch.cu_seqlens_q, batch.cu_seqlens_k, q.shape[0], k.shape[0], batch.max_seqlen_q, batch.max_seqlen_k
        )
    return _packed_rows(q), _packed_rows(k), _packed_rows(v), docs


def _fit_tiles(spec: MaskSpec, docs: Documents) -> MaskSpec:
    """Without a block layout the tile size is free: no larger than the longest document (decoding: one row)."""
    if spec.block_layout is not None:
        return spec
    bq = min(spec.block_size[0], max(max(docs.q_lens, default=1), 1))
    bk = min(spec.block_size[1], max(max(docs.k_lens, default=1), 1))
    return replace(spec, block_size=(bq, bk))


def _packed_rows(x: Tensor) -> Tensor:
    return x.flatten(0, 1) if x.dim() == 4 else x


def _packed_lse(lse: Tensor, q: Tensor) -> Tensor:
    """(B, H, Sq) or (H, total_q) -> (total_q, H)."""
    return lse.transpose(1, 2).flatten(0, 1) if q.dim() == 4 else lse.t()


def _unpack_out(out: Tensor, lse: Tensor, plan: _Plan, q: Tensor) -> tuple[Tensor, Tensor]:
    """Tiles back to the caller's layout: out like q, lse (B, H, Sq) or (H, total_q)."""
    out_p = _untile(out, plan.q_unpack).to(q.dtype)  # (total_q, H, D)
    lse_p = _untile(lse, plan.q_unpack)  # (total_q, H)
    if q.dim() == 4:
        batch, seqlen = q.shape[:2]
        return out_p.view_as(q), lse_p.view(batch, seqlen, -1).transpose(1, 2).contiguous()
    return out_p, lse_p.t().contiguous()


def _tile(x: Tensor, index: Tensor, valid: Tensor | None = None) -> Tensor:
    """(total, H, ...) -> float32 (ntiles, H, B, ...), contiguous; zero on padding slots when `valid` is given."""
    tiles = x[index].transpose(1, 2).float()
    if valid is not None:
        tiles = tiles.masked_fill(~valid.view(valid.shape[0], 1, valid.shape[1], *([1] * (x.dim() - 2))), 0.0)
    return tiles.contiguous()


def _untile(tiles: Tensor, unpack: tuple[Tensor, Tensor]) -> Tensor:
    """(ntiles, H, B, ...) -> (total, H, ...)."""
    tile, slot = unpack
    return tiles[tile, :, slot]


def _grouped(x: Tensor, kv_heads: int) -> Tensor:
    """(n, H, rows, cols) -> (n * Hk, G * rows, cols): the query heads sharing a key head become extra rows."""
    return x.view(x.shape[0] * kv_heads, -1, x.shape[-1])


def _scores(q: Tensor, k: Tensor, softcap: float) -> tuple[Tensor, Tensor | None]:
    """Scores of query tiles (n, H, Bq, D), already scaled, against key tiles (n, Hk, Bk, D) -> (n, H, Bq, Bk).

    With softcap also returns tanh(scores / softcap), which the backward needs.
    """
    n, heads, bq, _ = q.shape
    s = torch.bmm(_grouped(q, k.shape[1]), k.flatten(0, 1).transpose(1, 2)).view(n, heads, bq, -1)
    if softcap <= 0:
        return s, None
    tanh = s.div_(softcap).tanh_()
    return tanh * softcap, tanh


def _apply_mask(s: Tensor, plan: _Plan, spec: MaskSpec, lo: int, hi: int, step: int, ids: Tensor) -> None:
    """Set scores of elements the rule hides to -inf, in place."""
    allowed = None
    if spec.limits_positions:
        allowed = element_mask(spec, plan.q_pos[lo:hi], plan.k_pos[ids], plan.q_offset[lo:hi])  # (n, Bq, Bk)
    if plan.k_valid is not None:
        allowed = plan.k_valid[ids] if allowed is None else allowed & plan.k_valid[ids]
    if allowed is not None:
        allowed = allowed[:, None]
    if plan.head_bits is not None:
        bits = plan.head_bits[step, lo:hi]  # (n, H, 1, 1)
        allowed = bits if allowed is None else allowed & bits
    if allowed is not None:
        s.masked_fill_(~allowed, float("-inf"))


def _steps(plan: _Plan, spec: MaskSpec, heads: int) -> Iterator[tuple[int, int, int]]:
    """(lo, hi, step): the query tiles [lo, hi) that visit a key tile at `step`, in chunks bounding the workspace."""
    bq, bk = spec.block_size
    chunk = max(1, _CHUNK_ELEMENTS // (heads * bq * bk))
    for lo in range(0, plan.q_index.shape[0], chunk):
        for step, active in enumerate(plan.active):
            hi = min(lo + chunk, active)
            if hi <= lo:
                break
            yield lo, hi, step


def _accumulate(dst: Tensor, ids: Tensor, src: Tensor) -> None:
    """dst[ids] += src with repeated ids, deterministically: index_add_ is on CPU, the sorted index_put_ on CUDA."""
    if dst.is_cuda:
        dst.index_put_((ids,), src, accumulate=True)
    else:
        dst.index_add_(0, ids, src)


def _plan(spec: MaskSpec, docs: Documents, heads: int, device: torch.device) -> _Plan:
    """Tiles of every document and the tile pairs to visit, built on the host and moved to `device`."""
    bq, bk = spec.block_size
    q_lens = torch.tensor(docs.q_lens, dtype=torch.long)
    k_lens = torch.tensor(docs.k_lens, dtype=torch.long)
    q_doc, q_blk = _tiles(q_lens, bq)
    k_doc, k_blk = _tiles(k_lens, bk)
    pair_q, pair_k, bits = _visible_pairs(spec, q_lens, k_lens, q_doc, q_blk, k_doc, k_blk)
    order, schedule, active, step, rank = _schedule(pair_q, pair_k, q_doc.numel())
    head_bits = None
    if bits is not None and not bits.all():  # the layout differs by head inside visited blocks
        head_bits = torch.zeros((*schedule.shape, heads), dtype=torch.bool)
        head_bits[step, rank] = bits.expand(-1, heads)
        head_bits = head_bits[..., None, None].to(device)
    q_index, q_valid, q_pos, q_unpack = _slots(q_doc[order], q_blk[order], docs.q_starts, q_lens, bq)
    k_index, k_valid, k_pos, k_unpack = _slots(k_doc, k_blk, docs.k_starts, k_lens, bk)
    q_offset = (k_lens - q_lens)[q_doc[order]]
    return _Plan(
        q_index=q_index.to(device),
        q_valid=q_valid.to(device),
        q_pos=q_pos[:, :, None].to(device),
        q_offset=q_offset[:, None, None].to(device, torch.int32),
        q_unpack=(q_unpack[0].to(device), q_unpack[1].to(device)),
        k_index=k_index.to(device),
        k_pos=k_pos[:, None, :].to(device),
        k_valid=None if k_valid.all() else k_valid[:, None, :].to(device),
        k_unpack=(k_unpack[0].to(device), k_unpack[1].to(device)),
        schedule=schedule.to(device),
        active=active,
        head_bits=head_bits,
    )


def _visible_pairs(
    spec: MaskSpec, q_lens: Tensor, k_lens: Tensor, q_doc: Tensor, q_blk: Tensor, k_doc: Tensor, k_blk: Tensor
) -> tuple[Tensor, Tensor, Tensor | None]:
    """(query tile, key tile) pairs of the same document holding a visible element, ordered by query tile, and the
    block layout's bits of each pair (pairs, H or 1), if there is a layout."""
    bq, bk = spec.block_size
    k_count = torch.bincount(k_doc, minlength=q_lens.numel())
    k_first = torch.cumsum(k_count, 0) - k_count
    # Candidates: every query tile with every key tile of its document.
    pair_q = torch.repeat_interleave(torch.arange(q_doc.numel()), k_count[q_doc])
    pair_doc = q_doc[pair_q]
    pair_k = k_first[pair_doc] + _ranks_in_groups(k_count[q_doc])
    i0, j0 = q_blk[pair_q] * bq, k_blk[pair_k] * bk
    i1 = torch.minimum(i0 + bq, q_lens[pair_doc]) - 1
    j1 = torch.minimum(j0 + bk, k_lens[pair_doc]) - 1
    visible = block_visible(spec, i0, i1, j0, j1, k_lens[pair_doc] - q_lens[pair_doc])
    layout = spec.layout4d()
    if layout is None:
        return pair_q[visible], pair_k[visible], None
    layout = layout.cpu()
    layout_doc = pair_doc if layout.shape[0] > 1 else torch.zeros_like(pair_doc)
    bits = layout[layout_doc, :, q_blk[pair_q], k_blk[pair_k]]  # (pairs, H or 1)
    visible &= bits.any(1)
    return pair_q[visible], pair_k[visible], bits[visible]


def _schedule(pair_q: Tensor, pair_k: Tensor, nqt: int) -> tuple[Tensor, Tensor, list[int], Tensor, Tensor]:
    """Sort query tiles by visit count (descending) so the tiles active at each step form a prefix.

    Returns the order of the query tiles, the (steps, nqt) table of key tiles, the active count per step, and for
    every pair its step and its query tile's rank (to place per-pair data in the table).
    """
    count = torch.bincount(pair_q, minlength=nqt)
    order = torch.argsort(count, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(nqt)
    pair_rank = rank[pair_q]
    by_rank = torch.argsort(pair_rank, stable=True)
    step = torch.empty_like(pair_rank)
    step[by_rank] = _ranks_in_groups(count[order])
    steps = int(count.max()) if nqt else 0
    schedule = torch.zeros((steps, nqt), dtype=torch.long)
    schedule[step, pair_rank] = pair_k
    active = (count[order][None, :] > torch.arange(steps)[:, None]).sum(1).tolist()
    return order, schedule, active, step, pair_rank


def _tiles(lens: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """Document and block index within it of every tile of `size` that covers documents of lengths `lens`."""
    count = (lens + size - 1) // size
    return torch.repeat_interleave(torch.arange(lens.numel()), count), _ranks_in_groups(count)


def _ranks_in_groups(sizes: Tensor) -> Tensor:
    """0, 1, ..., sizes[0] - 1, 0, 1, ..., sizes[1] - 1, ..."""
    starts = torch.cumsum(sizes, 0) - sizes
    return torch.arange(int(sizes.sum())) - torch.repeat_interleave(starts, sizes)


def _slots(
    doc: Tensor, blk: Tensor, starts: tuple[int, ...], lens: Tensor, size: int
) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor]]:
    """Packed row, validity and position of every slot of the given tiles, and the (tile, slot) of every row."""
    pos = blk[:, None] * size + torch.arange(size)  # (ntiles, size)
    valid = pos < lens[doc][:, None]
    last = torch.clamp(lens[doc] - 1, min=0)[:, None]
    index = torch.tensor(starts, dtype=torch.long)[doc][:, None] + torch.minimum(pos, last)
    tile, slot = torch.nonzero(valid, as_tuple=True)
    order = torch.argsort(index[tile, slot])
    return index, valid, pos.to(torch.int32), (tile[order], slot[order])


REFERENCE = Reference()
