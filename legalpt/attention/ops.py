"""The attention custom ops: `legalpt::attention_forward` and `legalpt::attention_backward`.

Registered with torch.library, with fake (meta) implementations and autograd, so the attention is one opaque node
under torch.compile(fullgraph=True). The backend is an op argument: each op looks its kernels up in `_KERNELS` by
name: the reference, our FA2 CUDA kernels (fa2.py) and our Hopper kernels (fa3.py). `deterministic`
selects fa2's atomic-free dQ; the reference backward is deterministic either way. Nothing here compiles or loads
CUDA code: the kernels build on first use.
"""

from types import ModuleType
from typing import Optional

import torch
from torch import Tensor

from legalpt.attention import fa2, fa3, reference
from legalpt.attention.masks import MaskSpec

# name -> module with forward(), backward()
_KERNELS: dict[str, ModuleType] = {"reference": reference, "fa2": fa2, "fa3": fa3}


def attention(
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
    deterministic: bool,
    backend: str,
) -> tuple[Tensor, Tensor]:
    """Differentiable attention through the custom op: (out like q, logsumexp float32)."""
    inputs = (
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, softcap, *_mask_args(spec),
        deterministic, backend,
    )  # fmt: skip
    if torch.compiler.is_compiling():  # the op itself: one opaque node, and Dynamo refuses a tensor passed twice
        return torch.ops.legalpt.attention_forward(*inputs)  # (as cu_seqlens_q and _k) to an autograd.Function
    return _Attention.apply(*inputs)


def _mask_args(spec: MaskSpec) -> tuple:
    bq, bk = spec.block_size
    left, right = spec.window
    return spec.causal, left, right, spec.global_tokens, spec.dilation, spec.block_layout, bq, bk


def _spec(
    causal: bool, left: int, right: int, global_tokens: int, dilation: int, layout: Tensor | None, bq: int, bk: int
) -> MaskSpec:
    return MaskSpec(causal, (left, right), global_tokens, dilation, layout, (bq, bk))


def _kernels(backend: str) -> ModuleType:
    if backend not in _KERNELS:
        raise ValueError(f"backend: expected one of {', '.join(_KERNELS)} for the attention ops, got {backend!r}")
    return _KERNELS[backend]


@torch.library.custom_op("legalpt::attention_forward", mutates_args=())
def attention_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Optional[Tensor],  # noqa: UP045 (torch.library's schema inference wants typing.Optional)
    cu_seqlens_k: Optional[Tensor],  # noqa: UP045
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    softcap: float,
    causal: bool,
    window_left: int,
    window_right: int,
    global_tokens: int,
    dilation: int,
    block_layout: Optional[Tensor],  # noqa: UP045
    block_q: int,
    block_k: int,
    deterministic: bool,
    backend: str,
) -> tuple[Tensor, Tensor]:
    """out (like q), logsumexp float32: (B, H, Sq) for 4-D q, (H, total_q) for varlen q (total_q, H, D)."""
    spec = _spec(causal, window_left, window_right, global_tokens, dilation, block_layout, block_q, block_k)
    return _kernels(backend).forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, spec, softmax_scale, softcap
    )


@attention_forward.register_fake
def _attention_forward_fake(q: Tensor, *args) -> tuple[Tensor, Tensor]:
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if q.dim() == 4 else (q.shape[1], q.shape[0])
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("legalpt::attention_backward", mutates_args=())
def attention_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    dlse: Optional[Tensor],  # noqa: UP045
    cu_seqlens_q: Optional[Tensor],  # noqa: UP045
    cu_seqlens_k: Optional[Tensor],  # noqa: UP045
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    softcap: float,
    causal: bool,
    window_left: int,
    window_right: int,
    global_tokens: int,
    dilation: int,
    block_layout: Optional[Tensor],  # noqa: UP045
    block_q: int,
    block_k: int,
    deterministic: bool,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv given dout and the gradient of the logsumexp (None = 0)."""
    spec = _spec(causal, window_left, window_right, global_tokens, dilation, block_layout, block_q, block_k)
    return _kernels(backend).backward(
        dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, spec, softmax_scale,
        softcap, deterministic,
    )  # fmt: skip


@attention_backward.register_fake
def _attention_backward_fake(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, *args) -> tuple[Tensor, Tensor, Tensor]:
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))


def _setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    q, k, v, cu_seqlens_q, cu_seqlens_k, *_ = inputs
    block_layout = inputs[14]
    ctx.save_for_backward(q, k, v, *output, cu_seqlens_q, cu_seqlens_k, block_layout)
    ctx.scalars = inputs[5:14], inputs[15:]  # the non-tensor arguments around block_layout


def _backward(ctx, dout: Tensor, dlse: Tensor) -> tuple:
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, block_layout = ctx.saved_tensors
    before, after = ctx.scalars
    dq, dk, dv = attention_backward(
        dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, *before, block_layout, *after
    )
    return (dq, dk, dv) + (None,) * 16


attention_forward.register_autograd(_backward, setup_context=_setup_context)


class _Attention(torch.autograd.Function):
    """The op's autograd (same context, same backward op) for `attention`. torch.library's own wrapper binds the
    op's 19 arguments to its schema on every call with inputs that require grad (utils.fill_defaults): about 60 us
    on a fast CPU, 150+ on the GPU machine's, longer than a 1k-token forward kernel, which it left waiting. Inside
    `forward` grad mode is off, so the op takes its direct path. The registered autograd stays: it serves direct
    calls of the op, opcheck and torch.compile."""

    @staticmethod
    def forward(ctx, *inputs):
        output = torch.ops.legalpt.attention_forward(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx, dout: Tensor, dlse: Tensor) -> tuple:
        return _backward(ctx, dout, dlse)
