"""The `fa2` backend: our FlashAttention-2 CUDA kernels (csrc/fa2) behind the attention custom ops.

`forward` and `backward` have the signatures of the reference backend's (ops.py looks them up by name). They check
what only the kernels need (device, dtype, head dim, alignment), pad head dims that have no instantiation, build
the block-sparse schedules (blocks.py, cached per shape) and launch. The backward runs a preprocessing kernel
(delta = rowsum(dO * O) - dlse, the logsumexp in log2), accumulates dQ in float32 (atomics, or a separate dQ pass
when deterministic) and converts it. The key tiles of global tokens, which every query tile visits, have their
backward split over several blocks (`_split`), so that one block does not hold up the whole pass.
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor

from legalpt.attention import kernels
from legalpt.attention.blocks import schedule_for
from legalpt.attention.masks import MaskSpec

DTYPES = (torch.bfloat16, torch.float16)
MAX_GRID_YZ = 65535  # CUDA's limit on a launch grid's y and z sizes: the kernels put documents on y, heads on z
# Query tiles of each query head one backward block visits at most in a split key tile (a GQA group's block visits
# that many per head of the group): at 64k tokens the global keys' tile would otherwise visit 1024 query tiles in
# one block, as long as all other blocks of an SM together (measured: global + window 1024 took 14.3 ms fwd+bwd
# against 8.7 for the window alone; 9.4 with the split).
SPLIT_VISITS = 32


def check(q: Tensor, backend: str = "fa2") -> None:
    """ValueError naming what keeps the `backend` kernels (fa2, or fa3: fa2's and the Hopper ones) from running on
    these inputs (called before any launch).

    Outside torch.compile this also builds (or loads) the kernels for the head dim, so that a failed build is
    reported here, and `auto` can fall back, rather than inside the op. While torch.compile traces, only the inputs
    and fa3's GPU generation are checked: the machine checks read files, which would break the graph; the op checks
    them when it runs.
    """
    if q.device.type != "cuda":
        raise ValueError(
            f"backend: {backend} cannot run here: it needs a CUDA device and the inputs are on {q.device.type}"
        )
    check_inputs(q, backend)
    reason = kernels.hopper_unavailable_reason(q.device) if backend == "fa3" else None
    if reason is None and torch.compiler.is_compiling():
        return
    reason = kernels.unavailable_reason(q.device) or reason
    if reason is not None:
        raise ValueError(f"backend: {backend} cannot run here: {reason}")
    try:
        kernels.fa2(kernels.padded_head_dim(q.shape[-1]))
    except RuntimeError as error:
        raise ValueError(f"backend: {backend} cannot run here: {error}") from error


def check_inputs(q: Tensor, backend: str = "fa2") -> None:
    """The part of `check` about the inputs alone (dtype, head dim), whatever the device."""
    if q.dtype not in DTYPES:
        raise ValueError(f"q: the {backend} backend supports bfloat16 and float16, got {q.dtype}")
    if kernels.padded_head_dim(q.shape[-1]) is None:
        raise ValueError(f"q: the {backend} backend supports head_dim <= {kernels.HEAD_DIMS[-1]}, got {q.shape[-1]}")


def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor | None,
    cu_seqlens_k: Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    spec: MaskSpec,
    softmax_scale: float,
    softcap: float,
    hopper: bool = False,
) -> tuple[Tensor, Tensor]:
    """out like q; logsumexp float32 (B, H, Sq) for a batch, (H, total_q) for a varlen batch. `hopper`: the fa3
    backend's forward (csrc/fa3) where the extension has one for this head dim, with its own tiles."""
    _check_grid(q, cu_seqlens_q)
    ext, head_dim = _extension(q, hopper), q.shape[-1]
    launch, tile = (ext.forward_fa3, ext.fa3_fwd_tile) if hopper else (ext.forward, ext.fwd_tile)
    qk, kk, vk = (_kernel_layout(x, ext.head_dim) for x in (q, k, v))
    out = torch.empty_like(qk)
    lse = q.new_empty(_lse_shape(q), dtype=torch.float32)
    schedule = schedule_for(
        spec, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, tile, transposed=False, device=q.device
    )
    launch(
        qk, kk, vk, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, schedule.counts,
        schedule.indices, _layout(spec), _mask_ints(spec), softmax_scale, softcap,
    )  # fmt: skip
    return _unpad(out, head_dim), lse


def backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    dlse: Tensor | None,
    cu_seqlens_q: Tensor | None,
    cu_seqlens_k: Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    spec: MaskSpec,
    softmax_scale: float,
    softcap: float,
    deterministic: bool = False,
    hopper: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of `forward`. `hopper`: the fa3 backend's backward (csrc/fa3) where the extension has one, with its
    tiles; the deterministic dQ pass is fa2's either way."""
    _check_grid(q, cu_seqlens_q)
    ext, head_dim = _extension(q, hopper), q.shape[-1]
    launch, tile = (ext.backward_fa3, ext.fa3_bwd_tile) if hopper else (ext.backward, ext.bwd_tile)
    qk, kk, vk, dok = (_kernel_layout(x, ext.head_dim) for x in (q, k, v, dout))
    lse = lse.contiguous()
    delta, lse_log2 = torch.empty_like(lse), torch.empty_like(lse)  # laid out like lse
    dq_accum = torch.empty(qk.shape, device=q.device, dtype=torch.float32)  # zeroed by prepare
    ext.prepare(_last_contiguous(out), _last_contiguous(dout), lse, _contiguous(dlse), lse_log2, delta, dq_accum)
    dk, dv = (torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (kk, vk))  # contiguous, as ops promise
    split_tiles, split_chunks = _split(spec.global_tokens, max_seqlen_q, max_seqlen_k, tile, deterministic)
    documents = q.shape[0] if cu_seqlens_q is None else cu_seqlens_q.numel() - 1
    rows = split_tiles * tile[1]  # (documents, rows, key heads, dK and dV)
    dkv_split = torch.zeros((documents, rows, kk.shape[-2], 2 * ext.head_dim), device=q.device, dtype=torch.float32)
    shape = (spec, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    by_key_tile = schedule_for(*shape, tile, transposed=True, device=q.device)
    by_query_tile = by_key_tile  # deterministic: dQ gets its own pass over fa2's forward tiles (csrc/fa2/bwd.cuh)
    if deterministic:
        by_query_tile = schedule_for(*shape, ext.fwd_tile, transposed=False, device=q.device)
    launch(
        dok, qk, kk, vk, lse_log2, delta, dq_accum, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
        max_seqlen_k, by_key_tile.counts, by_key_tile.indices, _layout(spec), _mask_ints(spec), softmax_scale, softcap,
        by_query_tile.counts, by_query_tile.indices, deterministic, split_tiles, split_chunks, dkv_split,
    )  # fmt: skip
    return _unpad(dq_accum.to(q.dtype), head_dim), _unpad(dk, head_dim), _unpad(dv, head_dim)


def _split(
    global_tokens: int, max_seqlen_q: int, max_seqlen_k: int, tile: tuple[int, int], deterministic: bool
) -> tuple[int, int]:
    """(key tiles, blocks each) of the backward's split: the tiles holding the global keys, each over enough
    blocks that none visits more than SPLIT_VISITS query tiles per query head. Their dK/dV parts are added in
    float32, in no fixed order, so `deterministic` never splits. (0, 1): no split."""
    tq, tk = tile
    chunks = -(-max_seqlen_q // (tq * SPLIT_VISITS))  # ceil(query tiles / SPLIT_VISITS)
    if deterministic or global_tokens == 0 or chunks < 2:
        return 0, 1
    return min(-(-global_tokens // tk), -(-max_seqlen_k // tk)), chunks


def _unpad(x: Tensor, head_dim: int) -> Tensor:
    """The first head_dim columns, contiguous as the custom ops promise (a copy only for padded head dims)."""
    return x if x.shape[-1] == head_dim else x[..., :head_dim].contiguous()


def _extension(q: Tensor, hopper: bool = False) -> ModuleType:
    """The checked, built extension for q's head dim (zero-padded up to an instantiated one)."""
    check(q, "fa3" if hopper else "fa2")
    return kernels.fa2(kernels.padded_head_dim(q.shape[-1]))


def _check_grid(q: Tensor, cu_seqlens_q: Tensor | None) -> None:
    """ValueError before launch where a call needs more documents or heads than one launch grid holds."""
    documents = q.shape[0] if cu_seqlens_q is None else cu_seqlens_q.numel() - 1
    if documents > MAX_GRID_YZ:
        name = "q" if cu_seqlens_q is None else "cu_seqlens_q"
        raise ValueError(
            f"{name}: the fa2 kernels take at most {MAX_GRID_YZ} documents (batch rows) per call, got {documents}; "
            "split the batch"
        )
    if q.shape[-2] > MAX_GRID_YZ:
        raise ValueError(f"q: the fa2 kernels take at most {MAX_GRID_YZ} heads, got {q.shape[-2]}")


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
    return x if aligned else x.contiguous()


def _lse_shape(q: Tensor) -> tuple[int, ...]:
    return (q.shape[0], q.shape[2], q.shape[1]) if q.dim() == 4 else (q.shape[1], q.shape[0])


def _layout(spec: MaskSpec) -> Tensor | None:
    layout = spec.layout4d()
    return None if layout is None else layout.to(torch.uint8).contiguous()


def _mask_ints(spec: MaskSpec) -> list[int]:
    """[causal, left, right, global_tokens, dilation, layout_bq, layout_bk], as csrc/fa2/fa2.cu reads them."""
    left, right = spec.window
    return [int(spec.causal), left, right, spec.global_tokens, spec.dilation, *spec.block_size]
