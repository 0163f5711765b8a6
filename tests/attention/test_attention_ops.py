"""The custom ops: torch.library.opcheck, and torch.compile(fullgraph=True) forward + backward equal to eager."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from legalpt.attention import flash_attn_func, flash_attn_varlen_func, ops
from legalpt.attention.backends import AttentionBatch


def _forward_args(varlen: bool) -> tuple:
    """attention_forward arguments: GQA, causal window, global tokens, dilation, a per-head/per-document layout."""
    if varlen:
        cu = torch.tensor([0, 20, 21, 60], dtype=torch.int32)
        q, k, v = torch.randn(60, 4, 16), torch.randn(60, 2, 16), torch.randn(60, 2, 16)
        layout = torch.rand(3, 4, 3, 3) < 0.7
        seq = (cu, cu, 39, 39)
    else:
        q, k, v = torch.randn(2, 37, 4, 16), torch.randn(2, 45, 2, 16), torch.randn(2, 45, 2, 16)
        layout = torch.rand(4, 3, 3) < 0.7
        seq = (None, None, 37, 45)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    # softmax_scale, softcap, mask [causal, left, right, global_tokens, dilation, block_q, block_k], layout,
    # deterministic, backend
    options = (0.3, 3.0, [1, 12, 0, 2, 2, 16, 16], layout, False, "reference")
    return (q, k, v, *seq, *options)


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_opcheck(varlen):
    args = _forward_args(varlen)
    torch.library.opcheck(torch.ops.legalpt.attention_forward.default, args)
    out, lse = torch.ops.legalpt.attention_forward(*args)
    q, k, v = (x.detach() for x in args[:3])
    backward_args = (torch.randn_like(out), out.detach(), lse.detach(), torch.randn_like(lse), q, k, v, *args[3:])
    torch.library.opcheck(torch.ops.legalpt.attention_backward.default, backward_args)


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_eager_autograd_matches_the_ops_registered_one(varlen):
    """`ops.attention` runs its own autograd.Function in eager mode (torch.library's wrapper costs ~60 us a call):
    the same outputs and gradients, bit for bit, as the op's registered autograd, which opcheck and compile use."""
    args = _forward_args(varlen)
    *batch_args, backend = args
    q, k, v = args[:3]
    batch = AttentionBatch.from_op_args(*batch_args)
    assert batch.op_args()[9] == args[9]  # the mask flattened and back
    eager = ops.attention(batch, backend)
    registered = torch.ops.legalpt.attention_forward(*args)
    assert type(eager[0].grad_fn).__name__ == "_AttentionBackward"
    assert all(torch.equal(a, b) for a, b in zip(eager, registered, strict=True))
    grads = [torch.autograd.grad((out * out.detach()).sum() + lse.sum(), (q, k, v)) for out, lse in (eager, registered)]
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_calls_without_gradients_skip_the_op_but_not_under_a_dispatch_mode(varlen, monkeypatch):
    """Inference (no input needs a gradient, or grad mode off) runs the backend directly, with the op's results bit
    for bit; a dispatch mode (a tracer, a profiler of ops) still sees the op."""
    args = _forward_args(varlen)
    *batch_args, backend = args
    batch = AttentionBatch.from_op_args(*batch_args)
    detached = AttentionBatch.from_op_args(*(x.detach() if torch.is_tensor(x) else x for x in batch_args))
    registered = torch.ops.legalpt.attention_forward(*args)
    with _OpCalls() as calls, torch.no_grad():
        ops.attention(batch, backend)
    assert calls.count == 1

    def refuse(*args):
        raise AssertionError("the op ran for a call that needs no gradient")

    monkeypatch.setattr(ops._Attention, "apply", refuse)
    monkeypatch.setattr(AttentionBatch, "from_op_args", refuse)  # the op's implementation rebuilds the batch
    for run in (lambda: ops.attention(detached, backend), torch.no_grad()(lambda: ops.attention(batch, backend))):
        out, lse = run()
        assert torch.equal(out, registered[0]) and torch.equal(lse, registered[1]) and out.grad_fn is None


class _OpCalls(TorchDispatchMode):
    """Counts legalpt::attention_forward calls."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.legalpt.attention_forward.default
        return func(*args, **(kwargs or {}))


def _loss(fn, *args, **kw):
    out, lse, _ = fn(*args, return_attn_probs=True, **kw)
    return (out * out.detach()).sum() + lse.sum()  # gradients flow through out and the logsumexp


def _eager_and_compiled_grads(fn, args: tuple, kw: dict, compile_backend: str):
    inputs = args[:3]
    eager = torch.autograd.grad(_loss(fn, *args, **kw), inputs)
    compiled_loss = torch.compile(lambda *a: _loss(fn, *a, **kw), fullgraph=True, backend=compile_backend)
    return eager, torch.autograd.grad(compiled_loss(*args), inputs)


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_compile_fullgraph_aot_eager(varlen):
    kw = {"causal": True, "window_size": (12, 0), "global_tokens": 2, "block_size": (16, 16)}
    if varlen:
        cu = torch.tensor([0, 20, 21, 60], dtype=torch.int32)
        args = (*(torch.randn(60, h, 16, requires_grad=True) for h in (4, 2, 2)), cu, cu, 39, 39)
        fn = flash_attn_varlen_func
    else:
        args = tuple(torch.randn(2, s, h, 16, requires_grad=True) for s, h in ((37, 4), (45, 2), (45, 2)))
        fn = flash_attn_func
    torch._dynamo.reset()
    eager, compiled = _eager_and_compiled_grads(fn, args, kw, "aot_eager")
    for a, b in zip(eager, compiled, strict=True):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_compile_fullgraph_inductor():
    args = tuple(torch.randn(2, s, h, 16, requires_grad=True) for s, h in ((37, 4), (45, 2), (45, 2)))
    torch._dynamo.reset()
    eager, compiled = _eager_and_compiled_grads(
        flash_attn_func, args, {"causal": True, "block_size": (16, 16)}, "inductor"
    )
    for a, b in zip(eager, compiled, strict=True):
        torch.testing.assert_close(a, b)
