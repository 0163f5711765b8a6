"""The `fa2` and `fa3` backends: our CUDA kernels (csrc/) behind the attention custom ops.

fa2 runs the FA2 path (mma.sync, sm80+, every head dim up to 256). fa3 runs the FA3 path (wgmma and TMA, Hopper) at
head dims 64 and 128, and so at the head dims zero-padded to them (33-63, 97-127); at the others (up to 32, 65-96,
129-256) it runs the FA2 path, as does its deterministic backward's dQ pass. Both come from one extension
(kernels.py).

`check` tests what only the kernels need (dtype, head dim, grid limits) and whether the machine can run them (decided
once per device, head dim, dtype and path: kernels.unavailable_reason). `forward` and `backward` pad head dims that
have no instantiation, build the block-sparse schedules (blocks.py, cached per shape) and launch. The backward runs
a preprocessing kernel (delta = rowsum(dO * O) - dlse, the logsumexp in log2), accumulates dQ in float32 (atomics,
or a separate dQ pass when deterministic) and converts it. The key tiles of global tokens, which every query tile
visits, have their backward split over several blocks (`_split`), so that one block does not hold up the whole pass;
under GQA a causal backward splits each group's query heads over blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from legalpt.attention import build, kernels
from legalpt.attention.backends.base import AttentionBatch
from legalpt.attention.blocks import BlockSchedule, schedule_for
from legalpt.attention.ops import KernelBackend

DTYPES = (torch.bfloat16, torch.float16)
MAX_GRID_YZ = 65535  # CUDA's limit on a launch grid's y and z sizes: the FA2 path puts documents on y, heads on z
# Query tiles of each query head one backward block visits at most in a split key tile (a GQA group's block visits
# that many per head of the group; the fa3 backward's tiles hold 64 query rows at d128, 128 at d64): at 64k tokens
# the global keys' tile would otherwise visit 1024 query tiles (d128) in one block, as long as all other blocks of
# an SM together (global + window 1024 took 14.3 ms fwd+bwd against 8.7 for the window alone; 9.4 with the split).
SPLIT_VISITS = 32
# Query heads of a GQA group per block of a causal backward. A block per group walks all the group's Q, dO and dQ
# tiles for its key tile (at d128 16/2, eight heads' worth per block: past L2), and in a causal pass the blocks of
# the first key tiles, which every later query tile visits, run group times a head's work and finish the pass alone.
# Split, each key tile goes to group / GQA_PART blocks that add their dK and dV parts in float32. Dense masks lost to
# the extra adds and keep a block per group, as do windows, dilation and block layouts (not measured; their first
# key tiles are not seen by every later query tile). Figures: docs/kernels.md (`bwd_kernel`).
GQA_PART = 1
# The float32 dK and dV parts take twice the bytes of dK and dV; past this size (the 1b preset: 128k tokens a call,
# all rows of a packed batch together) a GQA backward does not split: the buffer grows with the call's tokens, while
# the gain measured fell with the row's length.
GQA_SPLIT_MAX_BYTES = 256 * 2**20


class CudaBackend(KernelBackend):
    """Our kernels on the FA2 path (sm90=False) or the FA3 path where it has them (sm90=True)."""

    def __init__(self, name: str, sm90: bool) -> None:
        self.name, self.sm90 = name, sm90

    def check(self, batch: AttentionBatch) -> None:
        """ValueError naming what keeps these kernels from running `batch` here (before any launch)."""
        q = batch.q
        if q.device.type != "cuda":  # said first: the inputs' other properties matter only on a GPU
            raise ValueError(
                f"backend: {self.name} cannot run here: it needs a CUDA device and the inputs are on {q.device.type}"
            )
        check_inputs(batch, self.name)
        reason = kernels.unavailable_reason(q.device, q.shape[-1], q.dtype, self.sm90)
        if reason is not None:
            raise ValueError(f"backend: {self.name} cannot run here: {reason}")

    def forward(self, batch: AttentionBatch) -> tuple[Tensor, Tensor]:
        self.check(batch)
        q, mask = batch.q, batch.mask
        ext, head_dim = kernels.extension(), q.shape[-1]
        padded = kernels.padded_head_dim(head_dim, ext.head_dims)
        tile, _ = _tiles(ext, padded, batch, self.sm90)
        qk, kk, vk = (_kernel_layout(x, padded) for x in (batch.q, batch.k, batch.v))
        schedule = _schedule(batch, tile, transposed=False)
        out, lse = self._launch(ext, qk, kk, vk, batch, schedule, _layout(batch), mask.ints())
        return _unpad(out, head_dim), lse

    def forward_like(self, batch: AttentionBatch) -> Callable[[AttentionBatch], tuple[Tensor, Tensor]]:
        """`forward` without its per-call work (the checks, the head dim and tile, the schedule's lookup) for
        batches laid out like `batch`, when the kernels take them as they are (no padded head dim, no copy)."""
        ext, head_dim = kernels.extension(), batch.q.shape[-1]
        padded = kernels.padded_head_dim(head_dim, ext.head_dims)
        if padded != head_dim or any(_kernel_layout(x, padded) is not x for x in (batch.q, batch.k, batch.v)):
            return self.forward
        schedule = _schedule(batch, _tiles(ext, padded, batch, self.sm90)[0], transposed=False)
        layout, mask = _layout(batch), batch.mask.ints()

        def forward(call: AttentionBatch) -> tuple[Tensor, Tensor]:
            q, k, v = call.q, call.k, call.v
            if (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16:  # strides are alike, starts may not be aligned
                return self.forward(call)
            return self._launch(ext, q, k, v, call, schedule, layout, mask)

        return forward

    def _launch(
        self, ext, q: Tensor, k: Tensor, v: Tensor, batch: AttentionBatch, schedule: BlockSchedule,
        layout: Tensor | None, mask: list[int],
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        """One forward launch on q, k, v as the kernels take them (the rest of the call from `batch`): out like q
        (the kernels' head dim) and the logsumexp."""
        out = torch.empty_like(q)
        lse = q.new_empty(_lse_shape(q), dtype=torch.float32)
        ext.forward(
            q, k, v, out, lse, batch.cu_seqlens_q, batch.cu_seqlens_k, batch.max_seqlen_q, batch.max_seqlen_k,
            schedule.counts, schedule.indices, schedule.tile[0], layout, mask, batch.softmax_scale, batch.softcap,
            self.sm90,
        )  # fmt: skip
        return out, lse

    def backward(
        self, batch: AttentionBatch, out: Tensor, lse: Tensor, dout: Tensor, dlse: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        self.check(batch)
        q = batch.q
        ext, head_dim = kernels.extension(), q.shape[-1]
        padded = kernels.padded_head_dim(head_dim, ext.head_dims)
        _, tile = _tiles(ext, padded, batch, self.sm90)  # the backward's
        qk, kk, vk, dok = (_kernel_layout(x, padded) for x in (batch.q, batch.k, batch.v, dout))
        lse = lse.contiguous()
        delta, lse_log2 = torch.empty_like(lse), torch.empty_like(lse)  # laid out like lse
        dq_accum = torch.empty(qk.shape, device=q.device, dtype=torch.float32)  # zeroed by prepare
        ext.prepare(_last_contiguous(out), _last_contiguous(dout), lse, _contiguous(dlse), lse_log2, delta, dq_accum)
        dk, dv = (torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (kk, vk))  # contiguous, as ops promise
        split_tiles, split_chunks, split_heads = _split(batch, tile, padded)
        if split_heads:
            shape = _heads_parts_shape(kk, padded)
        else:  # (documents, the split tiles' rows, key heads, dK and dV)
            shape = (batch.documents, split_tiles * tile[1], kk.shape[-2], 2 * padded)
        dkv_split = torch.zeros(shape, device=q.device, dtype=torch.float32)
        by_key_tile = _schedule(batch, tile, transposed=True)
        by_query_tile = by_key_tile  # deterministic: dQ gets its own pass over the FA2 forward's tiles
        if batch.deterministic:
            by_query_tile = _schedule(batch, _tiles(ext, padded, batch, False)[0], transposed=False)
        ext.backward(
            dok, qk, kk, vk, lse_log2, delta, dq_accum, dk, dv, batch.cu_seqlens_q, batch.cu_seqlens_k,
            batch.max_seqlen_q, batch.max_seqlen_k, by_key_tile.counts, by_key_tile.indices, _layout(batch),
            batch.mask.ints(), batch.softmax_scale, batch.softcap, by_query_tile.counts, by_query_tile.indices,
            batch.deterministic, split_tiles, split_chunks, split_heads, dkv_split, self.sm90,
        )  # fmt: skip
        return _unpad(dq_accum.to(q.dtype), head_dim), _unpad(dk, head_dim), _unpad(dv, head_dim)


def check_inputs(batch: AttentionBatch, backend: str) -> None:
    """The part of `CudaBackend.check` about the inputs alone (dtype, head dim, grid limits), whatever the device."""
    q = batch.q
    if q.dtype not in DTYPES:
        raise ValueError(f"q: the {backend} backend supports bfloat16 and float16, got {q.dtype}")
    if kernels.padded_head_dim(q.shape[-1]) is None:
        raise ValueError(f"q: the {backend} backend supports head_dim <= {build.HEAD_DIMS[-1]}, got {q.shape[-1]}")
    if batch.documents > MAX_GRID_YZ:
        name = "cu_seqlens_q" if batch.varlen else "q"
        raise ValueError(
            f"{name}: the {backend} kernels take at most {MAX_GRID_YZ} documents (batch rows) per call, got "
            f"{batch.documents}; split the batch"
        )
    if q.shape[-2] > MAX_GRID_YZ:
        raise ValueError(f"q: the {backend} kernels take at most {MAX_GRID_YZ} heads, got {q.shape[-2]}")


def _tiles(ext, padded: int, batch: AttentionBatch, sm90: bool) -> tuple[tuple[int, int], tuple[int, int]]:
    """((query rows, keys) of the forward's tiles, those of the backward's) of the kernels that run `batch`: the fa3
    forward's tile depends on whether the batch takes the kernel of general masks (csrc/api.h, `tiles`)."""
    mask = batch.mask
    return ext.tiles(
        padded, sm90, batch.softcap, mask.dilation, mask.block_layout is not None, batch.softmax_scale
    )  # fmt: skip


def _schedule(batch: AttentionBatch, tile: tuple[int, int], transposed: bool) -> BlockSchedule:
    return schedule_for(
        batch.mask, batch.cu_seqlens_q, batch.cu_seqlens_k, batch.max_seqlen_q, batch.max_seqlen_k, tile,
        transposed=transposed, device=batch.q.device,
    )  # fmt: skip


def _split(batch: AttentionBatch, tile: tuple[int, int], padded: int) -> tuple[int, int, int]:
    """(key tiles, blocks each, query heads each) of the backward's split, at head dim `padded`. With global keys
    (whatever else the mask holds): the tiles holding them, each over enough blocks that none visits more than
    SPLIT_VISITS query tiles per query head (0 heads: every block takes a share of each head's rows), if that is
    more than one block. Else a plainly causal GQA backward: every key tile, over blocks of GQA_PART query heads
    each, up to GQA_SPLIT_MAX_BYTES. The parts of dK/dV are added in float32, in no fixed order, so `deterministic`
    never splits. (0, 1, 0): no split."""
    tq, tk = tile
    mask = batch.mask
    if batch.deterministic:
        return 0, 1, 0
    if mask.global_tokens:
        chunks = -(-batch.max_seqlen_q // (tq * SPLIT_VISITS))  # ceil(query tiles / SPLIT_VISITS)
        tiles = min(-(-mask.global_tokens // tk), -(-batch.max_seqlen_k // tk))
        return (tiles, chunks, 0) if chunks >= 2 else (0, 1, 0)
    # a right window changes nothing under causal; a left one hides the first key tiles from later query tiles
    plainly_causal = mask.causal and mask.window[0] < 0 and mask.dilation == 1 and mask.block_layout is None
    heads, kv_heads = batch.q.shape[-2], batch.k.shape[-2]
    group = heads // kv_heads
    parts_bytes = math.prod(_heads_parts_shape(batch.k, padded)) * 4  # float32
    if plainly_causal and group > GQA_PART and group % GQA_PART == 0 and parts_bytes <= GQA_SPLIT_MAX_BYTES:
        return -(-batch.max_seqlen_k // tk), group // GQA_PART, GQA_PART
    return 0, 1, 0


def _heads_parts_shape(k: Tensor, padded: int) -> tuple[int, ...]:
    """The shape of the float32 dK and dV parts of a split by heads: laid out like K, dK then dV in each row."""
    return (*k.shape[:-1], 2 * padded)


def _unpad(x: Tensor, head_dim: int) -> Tensor:
    """The first head_dim columns, contiguous as the custom ops promise (a copy only for padded head dims)."""
    return x if x.shape[-1] == head_dim else x[..., :head_dim].contiguous()


def _last_contiguous(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _contiguous(x: Tensor | None) -> Tensor | None:
    return None if x is None else x.contiguous()


def _kernel_layout(x: Tensor, head_dim: int) -> Tensor:
    """x zero-padded to the kernel's head dim, with what the kernels need: a contiguous last dimension, strides and
    a start aligned to 16 bytes (a copy only when the input lacks them)."""
    if x.shape[-1] != head_dim:
        return F.pad(x, (0, head_dim - x.shape[-1]))
    aligned = x.stride(-1) == 1 and all(s % 8 == 0 for s in x.stride()[:-1]) and x.data_ptr() % 16 == 0
    return x if aligned else x.clone(memory_format=torch.contiguous_format)  # new memory: contiguous() may be x


def _lse_shape(q: Tensor) -> tuple[int, ...]:
    return (q.shape[0], q.shape[2], q.shape[1]) if q.dim() == 4 else (q.shape[1], q.shape[0])


def _layout(batch: AttentionBatch) -> Tensor | None:
    layout = batch.mask.layout4d()
    return None if layout is None else layout.to(torch.uint8).contiguous()


FA2 = CudaBackend("fa2", sm90=False)
FA3 = CudaBackend("fa3", sm90=True)
