"""Public attention functions, drop-ins for flash-attn 2.x, their validation, and the choice of backend.

`flash_attn_func` and `flash_attn_varlen_func` take the same arguments, defaults and return values as flash-attn
2.x, so switching is a change of import. Our masks come as extra keyword arguments; masks.py states the element
rule and how they combine. Every argument is checked before any compute, and a bad one raises ValueError (TypeError
for a wrong type) naming it. What flash-attn offers and legalpt does not (dropout, ALiBi, a paged KV cache) raises
instead of being ignored.

Backend (backends/): the `backend=` argument, else the environment variable LEGALPT_ATTN_BACKEND, else
`set_backend()`, else "auto". Every call becomes one `AttentionBatch`, which the chosen backend checks and runs.
"auto" runs fa3 on Hopper, fa2 where it can run elsewhere, and the reference where neither can, and says why once
(a WARNING when the inputs are on a GPU).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence

import torch
from torch import Tensor

from legalpt.attention import backends
from legalpt.attention.backends import AttentionBatch, Backend
from legalpt.attention.masks import Documents, MaskSpec
from legalpt.attention.tensor_cache import TensorCache

log = logging.getLogger(__name__)

BACKEND_ENV = "LEGALPT_ATTN_BACKEND"
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_auto_reasons_logged: set[str] = set()


BACKENDS = ("auto", *backends.NAMES)
_CHECKED_DOCUMENTS = 16  # cu_seqlens pairs whose values were checked: a step uses one, generation a few
_checked_documents: TensorCache[bool] = TensorCache(_CHECKED_DOCUMENTS)
_default_backend = "auto"


def set_backend(name: str) -> None:
    """Set the process-wide default backend (the trainer passes cfg.model.attention_backend)."""
    global _default_backend
    _default_backend = _check_backend(name, "set_backend")


def get_backend() -> str:
    """The process-wide default backend set by `set_backend` ("auto" unless changed)."""
    return _default_backend


def flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    global_tokens: int = 0,
    dilation: int = 1,
    block_layout: Tensor | None = None,
    block_size: tuple[int, int] = (128, 128),
    backend: str | None = None,
) -> Tensor | tuple[Tensor, Tensor, None]:
    """Attention over a batch of equal-length rows, each row one document.

    q: (B, Sq, H, D); k, v: (B, Sk, Hk, D) with H divisible by Hk (GQA/MQA). Returns out (B, Sq, H, D); with
    return_attn_probs=True, (out, softmax_lse (B, H, Sq) float32, None) like flash-attn with dropout_p = 0.
    window_size=(left, right), -1 = unbounded; causal is bottom-right aligned when Sq != Sk. Extras:
    global_tokens, dilation, block_layout (bool (nq, nk), (H, nq, nk) or (B, H, nq, nk) over blocks of
    block_size=(Bq, Bk), which is also the reference backend's tile); backend overrides the default.
    """
    _check_rank(q, k, v, 4, "(batch, seqlen, heads, head_dim)")
    _check_batch(q)
    _check_qkv(q, k, v)
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"k: expected batch size {q.shape[0]} (same as q), got {k.shape[0]}")
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    spec, scale = _check_options(
        q, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
        global_tokens, dilation, block_layout, block_size, seqlen_q, seqlen_k, q.shape[0],
    )  # fmt: skip
    batch = AttentionBatch(q, k, v, None, None, seqlen_q, seqlen_k, spec, scale, softcap, deterministic)
    out, lse = _resolve_backend(backend, return_attn_probs, batch).attention(batch)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Tensor | None = None,
    *,
    global_tokens: int = 0,
    dilation: int = 1,
    block_layout: Tensor | None = None,
    block_size: tuple[int, int] = (128, 128),
    backend: str | None = None,
) -> Tensor | tuple[Tensor, Tensor, None]:
    """Attention over packed documents: segment b of the token axis is [cu_seqlens[b], cu_seqlens[b + 1]).

    q: (total_q, H, D); k, v: (total_k, Hk, D); cu_seqlens_q/k: int32 (num_docs + 1,) starting at 0;
    max_seqlen_q/k: an upper bound on the document lengths. Returns out (total_q, H, D); with return_attn_probs=True,
    (out, softmax_lse (H, total_q) float32, None). A block_layout's leading B is the number of documents and its
    block indices count from each document's start. Other arguments as in `flash_attn_func`.
    """
    _check_rank(q, k, v, 3, "(total_tokens, heads, head_dim)")
    _check_qkv(q, k, v)
    _check_cu_seqlens(q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if block_table is not None:
        raise ValueError("block_table: a paged KV cache is not supported, expected None")
    spec, scale = _check_options(
        q, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
        global_tokens, dilation, block_layout, block_size, max_seqlen_q, max_seqlen_k, cu_seqlens_q.shape[0] - 1,
    )  # fmt: skip
    if not torch.compiler.is_compiling():  # the values need a host sync; under compile the op checks them itself
        _check_documents(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k)
    batch = AttentionBatch(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, spec, scale, softcap, deterministic
    )
    out, lse = _resolve_backend(backend, return_attn_probs, batch).attention(batch)
    return (out, lse, None) if return_attn_probs else out


def _resolve_backend(
    backend: str | None, need_lse: bool, batch: AttentionBatch, lse_arg: str = "return_attn_probs"
) -> Backend:
    """The backend to run: argument > environment variable > set_backend(); "auto" resolved; the choice checked.
    `lse_arg` names the caller's argument that asks for the logsumexp, for the error a backend without one raises."""
    name = _backend_name(backend)
    chosen = _auto(batch) if name == "auto" else backends.get(name)  # _auto's choice is checked (or the reference)
    if name != "auto":
        chosen.check(batch)
    if need_lse and not chosen.returns_lse:
        raise ValueError(
            f"{lse_arg}: the {chosen.name} backend has no logsumexp, expected False (or backend='reference')"
        )
    return chosen


def _backend_name(backend: str | None) -> str:
    """The backend asked for, "auto" unresolved: the argument, else the environment variable, else set_backend()."""
    if backend is not None:
        return _check_backend(backend, "backend")
    if os.environ.get(BACKEND_ENV):
        return _check_backend(os.environ[BACKEND_ENV], BACKEND_ENV)
    return _default_backend


def _auto(batch: AttentionBatch) -> Backend:
    """fa3 where it runs (Hopper), else fa2 where it runs, else the reference. Falling back to the reference is
    logged once per reason: a WARNING on a GPU (the kernels should have run there), INFO elsewhere."""
    reasons = []
    for name in ("fa3", "fa2"):
        try:
            backends.get(name).check(batch)
            return backends.get(name)
        except ValueError as why:
            reasons.append(str(why))
    reason = reasons[-1]  # fa2's: the one that decided for the reference
    if reason not in _auto_reasons_logged and not torch.compiler.is_compiling():  # a log call would break the graph
        _auto_reasons_logged.add(reason)
        level = logging.WARNING if batch.q.is_cuda else logging.INFO
        log.log(level, "attention backend auto: running the reference (%s)", reason)
    return backends.get("reference")


def _check_backend(name: str, source: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"{source}: expected one of {', '.join(BACKENDS)}, got {name!r}")
    return name


def _check_rank(
    q: Tensor, k: Tensor, v: Tensor, rank: int, layout: str, names: tuple[str, str, str] = ("q", "k", "v")
) -> None:
    for name, x in zip(names, (q, k, v), strict=True):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
        if x.dim() != rank:
            raise ValueError(f"{name}: expected a {rank}-D tensor {layout}, got shape {tuple(x.shape)}")


def _check_batch(q: Tensor) -> None:
    """At least one row, as flash-attn asks: a kernel grid cannot be empty."""
    if q.shape[0] == 0:
        raise ValueError(f"q: expected a batch of at least one row, got shape {tuple(q.shape)}")


def _check_qkv(q: Tensor, k: Tensor, v: Tensor, names: tuple[str, str] = ("k", "v")) -> None:
    """dtype, device and head layout of q (..., H, D), k and v (..., Hk, D); the leading dims are checked by callers.
    `names`: what the caller calls k and v."""
    if q.dtype not in _DTYPES:
        raise ValueError(f"q: expected dtype float32, bfloat16 or float16, got {q.dtype}")
    k_name, v_name = names
    for name, x in zip(names, (k, v), strict=True):
        if x.dtype != q.dtype:
            raise ValueError(f"{name}: expected dtype {q.dtype} (same as q), got {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name}: expected device {q.device} (same as q), got {x.device}")
    if v.shape != k.shape:
        raise ValueError(f"{v_name}: expected shape {tuple(k.shape)} (same as {k_name}), got {tuple(v.shape)}")
    heads, kv_heads = q.shape[-2], k.shape[-2]
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"{k_name}: expected head_dim {q.shape[-1]} (same as q), got {k.shape[-1]}")
    if kv_heads == 0 or heads % kv_heads != 0:
        raise ValueError(f"{k_name}: expected a number of heads that divides q's {heads} (GQA/MQA), got {kv_heads}")


def _check_cu_seqlens(q: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int) -> None:
    """Everything about cu_seqlens_* and max_seqlen_* that needs no look at the values."""
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(cu, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype != torch.int32:
            raise ValueError(f"{name}: expected dtype torch.int32, got {cu.dtype}")
        if cu.dim() != 1 or cu.shape[0] < 2:
            raise ValueError(f"{name}: expected a 1-D tensor of num_docs + 1 >= 2 offsets, got shape {tuple(cu.shape)}")
        if cu.device != q.device:
            raise ValueError(f"{name}: expected device {q.device} (same as q), got {cu.device}")
    if cu_k.shape[0] != cu_q.shape[0]:
        raise ValueError(
            f"cu_seqlens_k: expected {cu_q.shape[0]} offsets (as many as cu_seqlens_q), got {cu_k.shape[0]}"
        )
    for name, value in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if not _is_int(value) or value < 0:
            raise ValueError(f"{name}: expected an int >= 0, got {value!r}")


def _check_documents(cu_q: Tensor, cu_k: Tensor, total_q: int, total_k: int, max_q: int, max_k: int) -> None:
    """The values of cu_seqlens_q/k (Documents.from_cu_seqlens), read once per pair of tensors and their versions:
    the layers of a model share one pair per step, and each read is a host sync that would stall the GPU's queue.
    The cache is keyed by the tensors' identity and version (tensor_cache.py)."""

    def check() -> bool:
        Documents.from_cu_seqlens(cu_q, cu_k, total_q, total_k, max_q, max_k)  # raises naming the bad value
        return True

    _checked_documents.get([cu_q, cu_k], (total_q, total_k, max_q, max_k), check)


def _check_options(
    q: Tensor,
    dropout_p: float,
    softmax_scale: float | None,
    causal: bool,
    window_size: Sequence[int],
    softcap: float,
    alibi_slopes: Tensor | None,
    deterministic: bool,
    return_attn_probs: bool,
    global_tokens: int,
    dilation: int,
    block_layout: Tensor | None,
    block_size: Sequence[int],
    seqlen_q: int,
    seqlen_k: int,
    batch: int,
) -> tuple[MaskSpec, float]:
    """Check the non-tensor options and block_layout; return the mask and the softmax scale."""
    if dropout_p != 0:
        raise ValueError(f"dropout_p: dropout is not supported, expected 0.0, got {dropout_p!r}")
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes: ALiBi is not supported, expected None")
    for name, flag in (("causal", causal), ("deterministic", deterministic), ("return_attn_probs", return_attn_probs)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: expected a bool, got {type(flag).__name__}")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    elif not _is_number(softmax_scale) or not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale: expected a finite number or None, got {softmax_scale!r}")
    if not _is_pair(window_size, minimum=-1):
        raise ValueError(f"window_size: expected (left, right) ints >= -1 (-1 = unbounded), got {window_size!r}")
    if not _is_number(softcap) or not softcap >= 0:
        raise ValueError(f"softcap: expected a number >= 0 (0 = off), got {softcap!r}")
    if not _is_int(global_tokens) or global_tokens < 0:
        raise ValueError(f"global_tokens: expected an int >= 0, got {global_tokens!r}")
    if not _is_int(dilation) or dilation < 1:
        raise ValueError(f"dilation: expected an int >= 1, got {dilation!r}")
    if not _is_pair(block_size, minimum=1):
        raise ValueError(f"block_size: expected (Bq, Bk) ints >= 1, got {block_size!r}")
    if block_layout is not None:
        _check_block_layout(q, block_layout, block_size, seqlen_q, seqlen_k, batch)
    spec = MaskSpec(causal, tuple(window_size), global_tokens, dilation, block_layout, tuple(block_size))
    return spec, float(softmax_scale)


def _check_block_layout(
    q: Tensor, layout: Tensor, block_size: Sequence[int], seqlen_q: int, seqlen_k: int, batch: int
) -> None:
    blocks = (-(-seqlen_q // block_size[0]), -(-seqlen_k // block_size[1]))
    shapes = (blocks, (q.shape[-2], *blocks), (batch, q.shape[-2], *blocks))
    expected = f"a bool tensor of shape {' or '.join(str(s) for s in shapes)} (blocks of {tuple(block_size)})"
    if not isinstance(layout, Tensor) or layout.dtype != torch.bool:
        got = layout.dtype if isinstance(layout, Tensor) else type(layout).__name__
        raise ValueError(f"block_layout: expected {expected}, got {got}")
    if tuple(layout.shape) not in shapes:
        raise ValueError(f"block_layout: expected {expected}, got shape {tuple(layout.shape)}")
    if layout.device != q.device:
        raise ValueError(f"block_layout: expected device {q.device} (same as q), got {layout.device}")


def _is_int(x: object) -> bool:
    return isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_pair(x: object, minimum: int) -> bool:
    return isinstance(x, (tuple, list)) and len(x) == 2 and all(_is_int(v) and v >= minimum for v in x)
