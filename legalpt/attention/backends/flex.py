"""The `flex` backend: PyTorch FlexAttention running our element rule; conversion between BlockMask and BlockSchedule.

`mask_mod` writes the element rule of masks.py (documents and block layout included) as a FlexAttention mask_mod
(in out-of-place ops that Inductor can compile into flex's kernels; the tests hold it to masks.element_mask),
so FlexAttention serves as a comparison backend (`attention`, same signature and layouts as the other backends) and
as an independent reference for our block schedules (`to_block_mask`, `from_block_mask`). On CUDA, flex_attention and
create_block_mask run compiled (compiled once, lazily, on first use); on CPU they run eagerly, which materializes the
scores and has no backward: enough for tests on small shapes. BlockMasks built by `attention` are cached per shape.
"""

from __future__ import annotations

import functools
import operator
import warnings
from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, create_block_mask, flex_attention

from legalpt.attention.backends.base import AttentionBatch
from legalpt.attention.blocks import EMPTY, FULL, PARTIAL, BlockSchedule, build_schedule
from legalpt.attention.masks import MaskSpec
from legalpt.attention.tensor_cache import TensorCache

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]  # (b, h, q_idx, kv_idx) -> bool
_CACHE_SIZE = 16  # BlockMasks kept by `attention`: a model's layers share a handful of shapes


def mask_mod(
    spec: MaskSpec, cu_seqlens_q: Tensor | None, cu_seqlens_k: Tensor | None, seqlen_q: int, seqlen_k: int
) -> MaskMod:
    """The element rule as a FlexAttention mask_mod.

    cu_seqlens None: a (B, S, H, D) batch, each row one document of seqlen_q queries and seqlen_k keys; b indexes a
    per-batch block layout. Else packed documents in one row of seqlen_q = total_q queries and seqlen_k = total_k
    keys: every packed position maps to (document, position in it) through tensors precomputed on the device of
    `cu_seqlens_*` (no host sync).
    """
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cu_seqlens_k: expected a tensor exactly when cu_seqlens_q is one (packed documents)")
    layout = spec.layout4d()  # (Lb, Lh, nq, nk) or None
    bq, bk = spec.block_size

    def layout_allows(row: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return layout[row if layout.shape[0] > 1 else 0, h if layout.shape[1] > 1 else 0, i // bq, j // bk]

    if cu_seqlens_q is None:
        offset = seqlen_k - seqlen_q

        def batch_rule(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            allowed = _element_rule(spec, q_idx, kv_idx, offset)
            return allowed if layout is None else allowed & layout_allows(b, h, q_idx, kv_idx)

        return batch_rule

    if cu_seqlens_k.shape != cu_seqlens_q.shape:
        raise ValueError(
            f"cu_seqlens_k: expected shape {tuple(cu_seqlens_q.shape)} (one document per query document), "
            f"got {tuple(cu_seqlens_k.shape)}"
        )
    doc_q, pos_q = _coordinates(cu_seqlens_q, seqlen_q)
    doc_k, pos_k = _coordinates(cu_seqlens_k, seqlen_k)
    offset_q = (cu_seqlens_k.diff() - cu_seqlens_q.diff()).long()[doc_q]  # (total_q,) Sk - Sq of the query's document

    def packed_rule(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        doc, i, j = doc_q[q_idx], pos_q[q_idx], pos_k[kv_idx]
        allowed = (doc == doc_k[kv_idx]) & _element_rule(spec, i, j, offset_q[q_idx])
        return allowed if layout is None else allowed & layout_allows(doc, h, i, j)

    return packed_rule


def _element_rule(spec: MaskSpec, i: Tensor, j: Tensor, offset: Tensor | int) -> Tensor:
    """masks.element_mask written without in-place ops: Inductor cannot lower those inside flex's mask subgraph."""
    left, right = spec.window
    ip = i + offset  # query position in key coordinates
    distance = ip - j
    window = [distance <= left] if left >= 0 else []
    window += [distance >= -right] if right >= 0 else []
    window += [distance % spec.dilation == 0] if spec.dilation > 1 else []
    allowed = functools.reduce(operator.and_, window) if window else None
    if spec.global_tokens > 0 and allowed is not None:
        allowed = allowed | ((ip >= 0) & (ip < spec.global_tokens)) | (j < spec.global_tokens)
    if spec.causal:
        allowed = distance >= 0 if allowed is None else allowed & (distance >= 0)
    return torch.ones_like(distance, dtype=torch.bool) if allowed is None else allowed


def _coordinates(cu_seqlens: Tensor, total: int) -> tuple[Tensor, Tensor]:
    """Document index and position within the document of every token on a packed axis: two (total,) int64."""
    token = torch.arange(total, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    doc = torch.searchsorted(cu_seqlens[1:].contiguous(), token, right=True)  # empty documents are skipped
    return doc, (token - cu_seqlens[doc]).long()


def block_mask(
    spec: MaskSpec,
    batch: int,
    heads: int,
    seqlen_q: int,
    seqlen_k: int,
    device: torch.device | str,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    block_size: int | tuple[int, int] = 128,
) -> BlockMask:
    """FlexAttention's BlockMask of the mask (create_block_mask of `mask_mod`; compiled on CUDA).

    batch and heads are q's (varlen: batch 1 and seqlen_q/k the packed totals). The BlockMask has size 1 on an axis
    the mask does not depend on (flex broadcasts it): batch unless a batch has a per-row block layout, heads unless
    the layout differs by head. Eager create_block_mask holds dense (Sq, Sk) intermediates; compiled (CUDA) it
    built the benchmark's 64k-token masks on an H200.
    """
    if cu_seqlens_q is not None and batch != 1:
        raise ValueError(f"batch: packed documents are one row, expected 1, got {batch}")
    layout = spec.layout4d()
    per_row = layout is not None and layout.shape[0] > 1 and cu_seqlens_q is None
    per_head = layout is not None and layout.shape[1] > 1
    create = _compiled_create_block_mask() if torch.device(device).type == "cuda" else create_block_mask
    rule = mask_mod(spec, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k)
    shape = (batch if per_row else 1, heads if per_head else 1, seqlen_q, seqlen_k)
    return create(rule, *shape, device=device, BLOCK_SIZE=block_size)


@functools.cache
def _compiled_create_block_mask() -> Callable[..., BlockMask]:
    return torch.compile(create_block_mask, dynamic=False)


def _eager_flex_attention(*args, **kwargs) -> tuple[Tensor, object]:
    """flex_attention on the CPU, where its unfused form is the intended one: without the warning that says so."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(*args, **kwargs)


@functools.cache
def _compiled_flex_attention() -> Callable[..., tuple[Tensor, object]]:
    # Static shapes: kernels specialized to each shape (as a benchmark wants), one compile per shape and mask;
    # a training loop whose packed lengths change every step would recompile every step.
    return torch.compile(flex_attention, dynamic=False)


class Flex:
    """FlexAttention on our element rule (compiled on CUDA; eager and forward-only on CPU)."""

    name = "flex"
    returns_lse = True

    def check(self, batch: AttentionBatch) -> None:
        """Runs wherever torch does."""

    def attention(self, batch: AttentionBatch) -> tuple[Tensor, Tensor]:
        return attention(batch)


def attention(batch: AttentionBatch) -> tuple[Tensor, Tensor]:
    """out like q: (B, Sq, H, D), or (total_q, H, D) for a varlen batch; logsumexp float32 (B, H, Sq) or (H, total_q).

    Rows that see no key get output 0 and logsumexp -inf (flex's own convention). `deterministic` needs nothing:
    flex's Triton backward writes dQ, dK and dV without atomics. max_seqlen_* are not needed (the mask_mod reads
    the documents from cu_seqlens_*). Differentiable on CUDA; FlexAttention has no backward on CPU.
    """
    q, k, v, spec, softcap = batch.q, batch.k, batch.v, batch.mask, batch.softcap
    cu_seqlens_q, cu_seqlens_k = batch.cu_seqlens_q, batch.cu_seqlens_k
    if q.dim() == 4:
        qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))  # (B, H, S, D) views
    else:
        qh, kh, vh = (x.transpose(0, 1)[None] for x in (q, k, v))  # (1, H, total, D) views
    mask = _cached_block_mask(
        spec, qh.shape[0], qh.shape[1], qh.shape[2], kh.shape[2], q.device, cu_seqlens_q, cu_seqlens_k
    )
    run = _compiled_flex_attention() if q.is_cuda else _eager_flex_attention
    out, aux = run(
        qh, kh, vh, score_mod=_softcap_mod(softcap), block_mask=mask, scale=batch.softmax_scale,
        enable_gqa=qh.shape[1] != kh.shape[1], return_aux=AuxRequest(lse=True),
    )  # fmt: skip
    lse = aux.lse.float()  # natural log: flex converts its base-2 statistics
    # flex lays the output out like q, so these transposes give back contiguous tensors without a copy
    if q.dim() == 4:
        return out.transpose(1, 2).contiguous(), lse
    return out[0].transpose(0, 1).contiguous(), lse[0]


def _softcap_mod(softcap: float) -> Callable | None:
    if softcap <= 0:
        return None

    def capped(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return softcap * torch.tanh(score / softcap)

    return capped


_masks: TensorCache[BlockMask] = TensorCache(_CACHE_SIZE)


def _cached_block_mask(
    spec: MaskSpec,
    batch: int,
    heads: int,
    seqlen_q: int,
    seqlen_k: int,
    device: torch.device,
    cu_seqlens_q: Tensor | None,
    cu_seqlens_k: Tensor | None,
) -> BlockMask:
    """`block_mask`, cached by the tensors' identity and version (tensor_cache.py)."""
    tensors = [t for t in (cu_seqlens_q, cu_seqlens_k, spec.block_layout) if t is not None]
    extra = (spec.causal, spec.window, spec.global_tokens, spec.dilation, spec.block_size, batch, heads, seqlen_q,
             seqlen_k, device)  # fmt: skip
    return _masks.get(
        tensors, extra, lambda: block_mask(spec, batch, heads, seqlen_q, seqlen_k, device, cu_seqlens_q, cu_seqlens_k)
    )


def to_block_mask(schedule: BlockSchedule, mask_mod: MaskMod, seqlen_q: int, seqlen_k: int) -> BlockMask:
    """The BlockMask visiting the tiles of `schedule` (either direction), with `mask_mod` applied on partial tiles.

    The schedule is that of a batch of rows of seqlen_q queries and seqlen_k keys; its tiles become the BlockMask's
    BLOCK_SIZE. (A varlen schedule tiles each document from its start, so it converts as a batch of documents
    padded to the longest, not as flex's packed row.)
    """
    states = _schedule_states(schedule, seqlen_q, seqlen_k)  # (Bs, Hs, nqt, nkt)
    return BlockMask.from_kv_blocks(
        *_ordered(states == PARTIAL), *_ordered(states == FULL), BLOCK_SIZE=schedule.tile, mask_mod=mask_mod,
        seq_lengths=(seqlen_q, seqlen_k),
    )  # fmt: skip


def from_block_mask(block_mask: BlockMask) -> BlockSchedule:
    """The schedule (query tiles as rows) that visits the tiles of `block_mask`, partial and full as flex has them."""
    tile = tuple(block_mask.BLOCK_SIZE)
    cols = -(-block_mask.seq_lengths[1] // tile[1])
    partial = _dense(block_mask.kv_indices, 0, block_mask.kv_num_blocks, cols)
    states = torch.where(partial, PARTIAL, EMPTY)
    if block_mask.full_kv_num_blocks is not None:
        full = _dense(block_mask.full_kv_indices, 0, block_mask.full_kv_num_blocks, cols)
        states = torch.where(full & ~partial, FULL, states)  # a tile listed twice is visited as partial
    return build_schedule(states.to(torch.uint8), tile, transposed=False)


def _schedule_states(schedule: BlockSchedule, seqlen_q: int, seqlen_k: int) -> Tensor:
    """uint8 (Bs, Hs, nqt, nkt) tile states of a schedule, query tiles as rows whatever its direction."""
    tq, tk = schedule.tile
    nqt, nkt = -(-seqlen_q // tq), -(-seqlen_k // tk)
    rows, cols = (nkt, nqt) if schedule.transposed else (nqt, nkt)
    if schedule.counts.shape[2] != rows:
        raise ValueError(
            f"schedule: expected {rows} row tiles for seqlen_q={seqlen_q}, seqlen_k={seqlen_k} and tiles "
            f"{schedule.tile}, got {schedule.counts.shape[2]}"
        )
    total, partial = schedule.counts[..., 0], schedule.counts[..., 1]  # (Bs, Hs, rows)
    states = torch.where(_dense(schedule.indices, 0, partial, cols), PARTIAL, EMPTY)
    states = torch.where(_dense(schedule.indices, partial, total, cols), FULL, states).to(torch.uint8)
    return states.transpose(-1, -2) if schedule.transposed else states


def _dense(indices: Tensor, start: Tensor | int, stop: Tensor, size: int) -> Tensor:
    """bool (..., rows, size): True at the columns named by indices[..., start:stop] (per row)."""
    slot = torch.arange(indices.shape[-1], device=indices.device)
    listed = (slot >= torch.as_tensor(start, device=indices.device)[..., None]) & (slot < stop[..., None])
    hits = torch.zeros(*indices.shape[:-1], size, dtype=torch.int32, device=indices.device)
    return hits.scatter_add_(-1, indices.long(), listed.int()) > 0


def _ordered(dense: Tensor) -> tuple[Tensor, Tensor]:
    """Flex's ordered form of a bool (..., rows, cols) tile set: int32 counts (..., rows) and the listed columns
    first, ascending, in int32 (..., rows, cols)."""
    indices = torch.argsort((~dense).to(torch.uint8), dim=-1, stable=True)
    return dense.sum(-1, dtype=torch.int32), indices.to(torch.int32).contiguous()


FLEX = Flex()
