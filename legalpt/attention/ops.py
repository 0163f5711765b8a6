"""The attention custom ops, `legalpt::attention_forward` and `legalpt::attention_backward`, and the base class of the
backends they serve (`KernelBackend`: reference, fa2, fa3).

Registered with torch.library, with fake (meta) implementations and autograd, so the attention is one opaque node
under torch.compile(fullgraph=True). An `AttentionBatch` crosses the op boundary as `AttentionBatch.op_args()` (the
mask flattened once, by `MaskSpec.ints`), and the backend is an op argument, looked up by name. Nothing here
compiles or loads CUDA code.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Optional

import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from legalpt.attention import backends
from legalpt.attention.backends.base import AttentionBatch


class KernelBackend(ABC):
    """A backend whose forward and backward run inside the custom ops (`attention` below)."""

    name: str
    returns_lse = True

    @abstractmethod
    def check(self, batch: AttentionBatch) -> None:
        """ValueError naming what keeps this backend from running `batch` here."""

    def attention(self, batch: AttentionBatch) -> tuple[Tensor, Tensor]:
        return attention(batch, self.name)

    def prepared(self) -> Callable[[AttentionBatch], tuple[Tensor, Tensor]]:
        """`attention` for batches laid out alike (the same shapes, strides, dtypes and device, cu_seqlens of the same
        values, the same mask and options), the first of which has passed `check`: what `forward` decides per call
        is decided once, on the first call that runs it. The layers of a decoding step call it. Calls that need the
        op (gradients, tracing) get the op, and prepare nothing."""
        forward = None

        def run(call: AttentionBatch) -> tuple[Tensor, Tensor]:
            nonlocal forward
            if _needs_op(call):
                return attention(call, self.name)
            if forward is None:
                forward = self.forward_like(call)
            return forward(call)

        return run

    def forward_like(self, batch: AttentionBatch) -> Callable[[AttentionBatch], tuple[Tensor, Tensor]]:
        """`forward` for batches laid out like `batch` (`prepared`); backends that decide something per call
        decide it once in theirs."""
        return self.forward

    @abstractmethod
    def forward(self, batch: AttentionBatch) -> tuple[Tensor, Tensor]:
        """out like q (contiguous), logsumexp float32: (B, H, Sq), or (H, total_q) for varlen."""

    @abstractmethod
    def backward(
        self, batch: AttentionBatch, out: Tensor, lse: Tensor, dout: Tensor, dlse: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """dq, dk, dv (contiguous) given dout and the gradient of the logsumexp (None = 0)."""


def attention(batch: AttentionBatch, backend: str) -> tuple[Tensor, Tensor]:
    """Differentiable attention through the custom op: (out like q, logsumexp float32).

    Eager calls that need no gradient (generation, evaluation) run the backend's forward directly: the op's dispatch
    (its arguments flattened and rebuilt, the autograd and no-grad redispatch) costs more host time than a decoding
    step's kernel. Tracing, compilation, dispatch modes and meta tensors (the op's fake implementation) still see the
    op."""
    if not _needs_op(batch):
        return _kernels(backend).forward(batch)
    inputs = (*batch.op_args(), backend)
    if torch.compiler.is_compiling():  # the op itself: one opaque node, and Dynamo refuses a tensor passed twice
        return torch.ops.legalpt.attention_forward(*inputs)  # (as cu_seqlens_q and _k) to an autograd.Function
    return _Attention.apply(*inputs)


def _needs_op(batch: AttentionBatch) -> bool:
    """Whether a call must go through the op: it needs a gradient, or it is traced (compiled, under a dispatch mode,
    or on meta tensors)."""
    needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (batch.q, batch.k, batch.v))
    return needs_grad or torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None or batch.q.is_meta


def _kernels(backend: str) -> KernelBackend:
    found = backends.get(backend) if backend in backends.NAMES else None
    if not isinstance(found, KernelBackend):
        names = [n for n in backends.NAMES if isinstance(backends.get(n), KernelBackend)]
        raise ValueError(f"backend: expected one of {', '.join(names)} for the attention ops, got {backend!r}")
    return found


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
    mask: list[int],
    block_layout: Optional[Tensor],  # noqa: UP045
    deterministic: bool,
    backend: str,
) -> tuple[Tensor, Tensor]:
    """out (like q), logsumexp float32: (B, H, Sq) for 4-D q, (H, total_q) for varlen q (total_q, H, D)."""
    batch = AttentionBatch.from_op_args(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, softcap, mask, block_layout,
        deterministic,
    )  # fmt: skip
    return _kernels(backend).forward(batch)


@attention_forward.register_fake
def _attention_forward_fake(q: Tensor, *args) -> tuple[Tensor, Tensor]:
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if q.dim() == 4 else (q.shape[1], q.shape[0])
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("legalpt::attention_backward", mutates_args=())
def attention_backward(
    dout: Tensor,
    out: Tensor,
    lse: Tensor,
    dlse: Optional[Tensor],  # noqa: UP045
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Optional[Tensor],  # noqa: UP045
    cu_seqlens_k: Optional[Tensor],  # noqa: UP045
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    softcap: float,
    mask: list[int],
    block_layout: Optional[Tensor],  # noqa: UP045
    deterministic: bool,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv given dout, the forward's out and logsumexp, and the gradient of the logsumexp (None = 0); then
    the forward's arguments."""
    batch = AttentionBatch.from_op_args(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, softcap, mask, block_layout,
        deterministic,
    )  # fmt: skip
    return _kernels(backend).backward(batch, out, lse, dout, dlse)


@attention_backward.register_fake
def _attention_backward_fake(dout: Tensor, out: Tensor, lse: Tensor, dlse, q: Tensor, k: Tensor, v: Tensor, *args):
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))


_LAYOUT = 10  # block_layout's place among the forward's inputs: the one tensor after the scalars


def _setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    q, k, v, cu_seqlens_q, cu_seqlens_k, *_ = inputs
    ctx.save_for_backward(*output, q, k, v, cu_seqlens_q, cu_seqlens_k, inputs[_LAYOUT])
    ctx.scalars = inputs[5:_LAYOUT], inputs[_LAYOUT + 1 :]  # the non-tensor arguments around block_layout


def _backward(ctx, dout: Tensor, dlse: Tensor) -> tuple:
    out, lse, q, k, v, cu_seqlens_q, cu_seqlens_k, block_layout = ctx.saved_tensors
    before, after = ctx.scalars
    grads = attention_backward(dout, out, lse, dlse, q, k, v, cu_seqlens_q, cu_seqlens_k, *before, block_layout, *after)
    return (*grads, *(None,) * (len(before) + len(after) + 3))


attention_forward.register_autograd(_backward, setup_context=_setup_context)


class _Attention(torch.autograd.Function):
    """The op's autograd (same context, same backward op) for `attention`. torch.library's own wrapper binds the
    op's arguments to its schema on every call with inputs that require grad (utils.fill_defaults): about 60 us
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
