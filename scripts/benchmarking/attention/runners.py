"""Each implementation the attention benchmark compares, as a forward on one set of seeded inputs, what a timed step
of each mode runs, and the check that the implementations' outputs agree.

Ours (fa2, fa3, reference) run through the public API, `flash_attn_func` / `flash_attn_varlen_func` with `backend=`;
fa3-fp8 is `flash_attn_fp8_func` on the Hopper kernel, forward only, its quantization included; fa3-fp8-kernel the
kernel alone on inputs quantized beforehand, as a model that fuses the quantization into the op before would run it.
torch's SDPA runs with its flash or cuDNN backend forced, dense and causal only (other masks would need a dense
O(N^2) mask tensor). FlexAttention runs through legalpt's flex backend, called directly: see `_flex`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from legalpt.attention import BACKENDS, flash_attn_func, flash_attn_varlen_func

from .shapes import Shape

MODES = ("fwd", "bwd", "fwd+bwd")
IMPLS = ("fa2", "fa3", "sdpa-flash", "sdpa-cudnn", "flex", "reference", "fa3-fp8", "fa3-fp8-kernel")
CUDA_IMPLS = {"fa2", "fa3", "sdpa-flash", "sdpa-cudnn", "fa3-fp8", "fa3-fp8-kernel"}
DIFF_BASELINES = ("sdpa-flash", "flex", "sdpa-cudnn", "reference", "fa2", "fa3")  # whose output a check compares with

Runner = Callable[[], Tensor]  # one forward, output in the layout of q


@dataclass
class Inputs:
    shape: Shape
    q: Tensor  # (B, S, H, D), or (total, H, D) for varlen; all three require grad
    k: Tensor
    v: Tensor
    grad_out: Tensor  # like q
    cu_seqlens: Tensor | None  # int32 (docs + 1,) for varlen


def make_inputs(shape: Shape, dtype: torch.dtype, device: torch.device) -> Inputs:
    """Seeded inputs of `shape`: every implementation of a shape sees the same ones."""
    torch.manual_seed(0)
    lead = (shape.seqlen,) if shape.doc_lens else (shape.batch, shape.seqlen)
    q = torch.randn(*lead, shape.heads, shape.head_dim, device=device, dtype=dtype)
    k, v = (torch.randn(*lead, shape.kv_heads, shape.head_dim, device=device, dtype=dtype) for _ in range(2))
    cu = None
    if shape.doc_lens:
        cu = torch.tensor([0, *accumulate(shape.doc_lens)], dtype=torch.int32, device=device)
    return Inputs(shape, q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), torch.randn_like(q), cu)


def impl_runner(impl: str, x: Inputs) -> Runner | str:
    """The forward of `impl` on x, or the reason it cannot run this shape."""
    shape, device = x.shape, x.q.device
    if impl in CUDA_IMPLS and device.type != "cuda":
        return f"{impl} needs CUDA (--device cpu runs reference and flex only)"
    if impl.startswith("sdpa"):
        if shape.mask not in ("dense", "causal"):
            return "SDPA expresses only dense and causal masks without an O(N^2) mask tensor"
        backend = SDPBackend.FLASH_ATTENTION if impl == "sdpa-flash" else SDPBackend.CUDNN_ATTENTION
        return _sdpa(x, backend)
    if impl == "flex":
        return _flex(x)
    if impl.startswith("fa3-fp8"):
        return _fp8(x, kernel_only=impl == "fa3-fp8-kernel")
    if impl not in BACKENDS:
        return f"backend {impl!r} is not registered in legalpt.attention (have {', '.join(BACKENDS)})"
    kw = {"causal": shape.causal, "window_size": shape.window, "global_tokens": shape.global_tokens, "backend": impl}
    if x.cu_seqlens is None:
        return lambda: flash_attn_func(x.q, x.k, x.v, **kw)
    max_len = max(shape.doc_lens)
    return lambda: flash_attn_varlen_func(x.q, x.k, x.v, x.cu_seqlens, x.cu_seqlens, max_len, max_len, **kw)


def _sdpa(x: Inputs, backend: SDPBackend) -> Runner:
    """SDPA with `backend` forced; GQA through enable_gqa, as transformers' sdpa attention calls it."""
    qh, kh, vh = (t.transpose(1, 2) for t in (x.q, x.k, x.v))  # (B, H, S, D) views of the same inputs
    gqa = x.shape.kv_heads != x.shape.heads

    def run() -> Tensor:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qh, kh, vh, is_causal=x.shape.causal, enable_gqa=gqa).transpose(1, 2)

    return run


def _fp8(x: Inputs, kernel_only: bool) -> Runner | str:
    """FP8 attention (per-block scales, incoherent processing) on the fa3 kernel, where it runs this shape; with
    kernel_only, the kernel on inputs quantized here, once. Imported only here: a tree from before FP8 (an A/B's
    older commit) has no legalpt.attention.fp8."""
    shape = x.shape
    if shape.doc_lens or shape.global_tokens or shape.head_dim != 128:
        return "the FP8 kernel runs head dim 128 on equal-length rows, causal or windowed"
    try:
        from legalpt.attention import fp8
    except ImportError:
        return "this legalpt has no FP8 attention"
    q, k, v = x.q.detach(), x.k.detach(), x.v.detach()
    if not kernel_only:
        return lambda: fp8.flash_attn_fp8_func(q, k, v, causal=shape.causal, window_size=shape.window, backend="fa3")
    inputs = fp8.quantize(q, k, v)
    v_kernel, scale = fp8.kernel_v(inputs.v), shape.head_dim**-0.5
    return lambda: fp8.kernel_forward(inputs, scale, shape.causal, shape.window, q.dtype, v_kernel)[0]


def _flex(x: Inputs) -> Runner:
    """FlexAttention with the shape's mask, through legalpt's flex backend called directly: the public API would add
    its argument checks, and for varlen a host sync on cu_seqlens, to the baseline's time."""
    shape = x.shape
    max_len = max(shape.doc_lens, default=shape.seqlen)
    q, k, v = x.q, x.k, x.v
    if q.device.type != "cuda":  # FlexAttention has no backward on the CPU and refuses inputs that need one
        q, k, v = q.detach(), k.detach(), v.detach()
    return _flex_backend(q, k, v, x.cu_seqlens, max_len, shape.spec, shape.head_dim**-0.5)


def _flex_backend(q: Tensor, k: Tensor, v: Tensor, cu: Tensor | None, max_len: int, spec, scale: float) -> Runner:
    """The one use of legalpt internals: `legalpt.attention.backends.get("flex").attention(AttentionBatch)`, or in a
    tree from before that contract (an A/B of an older commit), `legalpt.attention.flex.attention` with the batch as
    loose arguments. Imported only when flex runs: its imports cost a quarter second."""
    try:
        from legalpt.attention.backends import AttentionBatch, get
    except ImportError:
        from legalpt.attention import flex

        return lambda: flex.attention(q, k, v, cu, cu, max_len, max_len, spec, scale, 0.0, False)[0]
    backend, batch = get("flex"), AttentionBatch(q, k, v, cu, cu, max_len, max_len, spec, scale)
    return lambda: backend.attention(batch)[0]


def shape_modes(shape: Shape, modes: tuple[str, ...]) -> tuple[str, ...]:
    """The modes a shape runs in: the memory shapes fwd+bwd alone."""
    return ("fwd+bwd",) if shape.group == "memory" else modes


def step_skip(impl: str, run: Runner | str, mode: str, device: torch.device) -> str | None:
    """Why an implementation's step does not run: its runner's reason (a string), or its mode's."""
    if isinstance(run, str):
        return run
    if impl == "flex" and mode != "fwd" and device.type != "cuda":
        return "FlexAttention has no backward on the CPU"
    if impl.startswith("fa3-fp8") and mode != "fwd":
        return "FP8 attention is forward only"
    return None


def mode_step(mode: str, run: Runner, x: Inputs, layers: int = 1) -> Callable[[], object]:
    """What one timed repetition does: `layers` calls, as a model's layers make them (fwd+bwd: every forward, then
    one backward through all); for bwd the forwards run here, once, outside the timing."""
    inputs, grads = (x.q, x.k, x.v), [x.grad_out] * layers
    if mode == "fwd":
        return run if layers == 1 else lambda: [run() for _ in range(layers)]
    if mode == "bwd":
        outs = [run() for _ in range(layers)]
        return lambda: torch.autograd.grad(outs, inputs, grads, retain_graph=True)
    return lambda: torch.autograd.grad([run() for _ in range(layers)], inputs, grads)


def check_outputs(runners: dict[str, Runner | str]) -> dict[str, tuple | str]:
    """Per implementation that runs: (max abs diff of its output, the implementation compared with), or its error."""
    outputs, results = {}, {}
    for impl, run in runners.items():
        if isinstance(run, str):
            continue
        try:
            outputs[impl] = run().detach()
        except Exception as error:  # one implementation's failure is a result, not the end of the run
            results[impl] = error_message(error)
    for impl, out in outputs.items():
        other = next((b for b in DIFF_BASELINES if b != impl and b in outputs), None)
        diff = None if other is None else (out.float() - outputs[other].float()).abs().max().item()
        results[impl] = (_number(diff), other)
    return results


def error_message(error: Exception) -> str:
    """An error as a row records it (type and first line); frees the CUDA memory a failed run may have left cached."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"[:500]


def _number(x: float | None) -> float | str | None:
    return x if x is None or math.isfinite(x) else str(x)  # JSON has no NaN
