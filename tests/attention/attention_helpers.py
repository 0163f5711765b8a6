"""Test oracle for legalpt.attention: naive float64 attention with a dense mask written straight from the rule.

Deliberately independent of legalpt.attention.masks: the mask below is the element rule of DESIGN.md transcribed
element by element, scores are dense, and the softmax is torch's. `assert_flash_attn_rule` is the accuracy rule for
low-precision backends. `assert_documents_stay_apart` and the FP8 checks, shared by the GPU and emulated kernel
tests, drive legalpt's API, so they import it where they run: the oracle's module stays free of legalpt.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def rule_mask(
    seqlen_q: int,
    seqlen_k: int,
    *,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    global_tokens: int = 0,
    dilation: int = 1,
    layout: Tensor | None = None,
    block_size: tuple[int, int] = (128, 128),
) -> Tensor:
    """Bool (H or 1, Sq, Sk) mask of one document; layout is (H or 1, nq, nk) for this document."""
    i = torch.arange(seqlen_q)[:, None]
    j = torch.arange(seqlen_k)[None, :]
    ip = i + (seqlen_k - seqlen_q)  # bottom-right aligned query position in key coordinates
    left, right = window
    causal_ok = (j <= ip) if causal else torch.ones_like(ip - j, dtype=torch.bool)
    in_window = torch.ones_like(causal_ok)
    if left != -1:
        in_window = in_window & (j >= ip - left)
    if right != -1:
        in_window = in_window & (j <= ip + right)
    in_window = in_window & ((ip - j) % dilation == 0)
    is_global = ((ip >= 0) & (ip < global_tokens)) | (j < global_tokens)
    mask = (causal_ok & (in_window | is_global))[None]
    if layout is not None:
        mask = mask & layout.cpu()[:, i // block_size[0], j // block_size[1]]
    return mask


def naive_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    softmax_scale: float | None = None,
    softcap: float = 0.0,
    block_layout: Tensor | None = None,
    dtype: torch.dtype = torch.float64,
    **mask_kwargs,
) -> tuple[Tensor, Tensor]:
    """(out, lse) computed in `dtype`, in the public API's layouts; differentiable, NaN-free on unseen rows.

    dtype=bfloat16/float16 is "the same computation done by plain PyTorch in low precision" of flash-attn's tests.
    """
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    if cu_seqlens_q is None:
        outs, lses = [], []
        for b in range(q.shape[0]):
            out, lse = _one_document(q[b], k[b], v[b], scale, softcap, _doc_layout(block_layout, b), mask_kwargs)
            outs.append(out)
            lses.append(lse)
        return torch.stack(outs), torch.stack(lses)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs, lses = [], []
    for b in range(len(cq) - 1):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        out, lse = _one_document(q[qs], k[ks], v[ks], scale, softcap, _doc_layout(block_layout, b), mask_kwargs)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, dim=1)


def _doc_layout(layout: Tensor | None, b: int) -> Tensor | None:
    if layout is None:
        return None
    if layout.dim() == 2:
        return layout[None]
    if layout.dim() == 3:
        return layout
    return layout[b]


def _one_document(
    q: Tensor, k: Tensor, v: Tensor, scale: float, softcap: float, layout: Tensor | None, mask_kwargs: dict
) -> tuple[Tensor, Tensor]:
    """q (Sq, H, D), k/v (Sk, Hk, D) -> out (Sq, H, D), lse (H, Sq)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    s = torch.einsum("ihd,jhd->hij", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    mask = rule_mask(q.shape[0], k.shape[0], layout=layout, **mask_kwargs).to(q.device).expand_as(s)
    seen = mask.any(-1, keepdim=True)
    s = torch.where(seen, s.masked_fill(~mask, float("-inf")), 0.0)  # unseen rows: finite dummy scores
    p = torch.softmax(s, dim=-1) * mask
    lse = torch.where(seen[..., 0], torch.logsumexp(s, dim=-1), float("-inf"))
    return torch.einsum("hij,jhd->ihd", p, v), lse


def assert_flash_attn_rule(name: str, got: Tensor, exact: Tensor, plain: Tensor, ratio: float, atol: float) -> None:
    """flash-attn's accuracy rule: max |got - exact| <= ratio * max |plain - exact| + atol.

    `exact` is the float64 result, `plain` the same quantity computed by plain PyTorch in the precision under test
    (naive_attention(dtype=...)). A NaN anywhere in `got` fails.
    """
    if got.numel() == 0:
        return
    err = (got.double() - exact).abs().max().item()
    plain_err = (plain.double() - exact).abs().max().item()
    assert err <= ratio * plain_err + atol, f"{name}: max error {err:.3g} > {ratio} x plain {plain_err:.3g} + {atol:g}"


def rising_scores(q: Tensor, k: Tensor) -> None:
    """Make the scores of rows i with i % 8 >= 4 rise along the keys and those of the other rows flat, in place (q,
    k: (..., S, H, D), not yet requiring grad). Rising rows: the queries' first feature becomes 20, and every key's
    is a ramp from 0 to 20, so a row's largest score climbs by about 400 * softmax_scale (50 to 70 log2 units at
    head dims 64 to 128) and its running max moves in every late key tile, far more than random scores ever move
    it: the forward's rescale of O and the row sum (csrc/fa2/fwd.cuh) runs there with large corrections. Flat rows
    (queries 0) never move their max after the first tile. In every m16 tile the rising rows are those of the upper
    16 lanes, so a warp vote that missed them would leave their max stale, which overflows P in float16 (past
    2^16; in bfloat16 it would go unseen). (The same range with smaller queries and larger keys ill-conditions dq:
    its error grows with the keys' mean, through delta = rowsum(dO * O) from the rounded O, in flash-attn's
    algorithm and in ours alike.)"""
    rising = torch.arange(q.shape[-3], device=q.device) % 8 >= 4
    q[..., ~rising, :, :] = 0.0
    q[..., rising, :, 0] = 20.0
    ramp = torch.linspace(0.0, 20.0, k.shape[-3], dtype=torch.float32, device=k.device)
    k[..., 0] = ramp[:, None].to(k.dtype)


def assert_documents_stay_apart(backend: str, head_dim: int, device: torch.device | str) -> None:
    """NaN in one packed document never reaches the one before it: the rows that a tile at a document's end brings
    from the next one (cp.async zero-fills them; fa3's TMA reads them and the kernels zero them) must not meet a zero
    probability (0 x NaN). The first document's outputs and gradients equal it run alone."""
    from legalpt.attention import flash_attn_func, flash_attn_varlen_func  # here: see the module's docstring

    cu = torch.tensor([0, 70, 200], dtype=torch.int32, device=device)
    q, k, v, g = (torch.randn(200, 2, head_dim, dtype=torch.bfloat16, device=device) for _ in range(4))
    for x in (q, k, v, g):
        x[70:] = float("nan")
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = flash_attn_varlen_func(q, k, v, cu, cu, 130, 130, causal=True, backend=backend)
    grads = torch.autograd.grad(out, (q, k, v), g)
    alone = [x[:70].detach().unsqueeze(0).requires_grad_() for x in (q, k, v)]
    out_alone = flash_attn_func(*alone, causal=True, backend=backend)
    grads_alone = torch.autograd.grad(out_alone, alone, g[:70].unsqueeze(0))
    for name, ours, single in zip(("out", "dq", "dk", "dv"), (out, *grads), (out_alone, *grads_alone), strict=True):
        assert torch.isfinite(ours[:70]).all(), f"{name}: the next document's NaN reached the first"
        torch.testing.assert_close(ours[:70], single[0], atol=2e-2, rtol=2e-2, msg=name)


class EmulatedKernels:
    """The CUDA extension's functions over the kernels' CPU builds (kernels.emulated, one per head dim), so that the
    fa2 and fa3 backends run their kernels' own source on CPU tensors."""

    def __init__(self) -> None:
        from legalpt.attention import build

        self.head_dims, self.has_sm90 = build.HEAD_DIMS, True

    @staticmethod
    def _build(head_dim: int):
        from legalpt.attention import kernels

        return kernels.emulated(head_dim)

    def tiles(self, head_dim: int, sm90: bool, *mask):
        return self._build(head_dim).tiles(head_dim, sm90, *mask)

    def forward(self, q: Tensor, *args) -> None:
        self._build(q.shape[-1]).forward(q, *args)

    def forward_fp8(self, q: Tensor, *args) -> None:
        self._build(q.shape[-1]).forward_fp8(q, *args)

    def quantize_fp8(self, q: Tensor, *args) -> None:
        self._build(q.shape[-1]).quantize_fp8(q, *args)

    def prepare(self, *args) -> None:  # the last argument, dq_accum, has the padded head dim
        self._build(args[-1].shape[-1]).prepare(*args)

    def backward(self, dout: Tensor, q: Tensor, *args) -> None:
        self._build(q.shape[-1]).backward(dout, q, *args)


def use_emulated_kernels(monkeypatch) -> None:
    """The fa2 and fa3 backends on the emulated kernels: the machine's checks (a GPU, the build) are the GPU's, so
    only the checks of the inputs stay."""
    from legalpt.attention import kernels
    from legalpt.attention.backends import cuda

    emulated = EmulatedKernels()
    monkeypatch.setattr(kernels, "extension", lambda: emulated)
    monkeypatch.setattr(cuda.CudaBackend, "check", lambda self, batch: cuda.check_inputs(batch, self.name))


# Hopper's FP8 tensor cores keep about 14 bits of the float32 accumulator's mantissa (DeepSeek-V3's report, section
# 3.3.2), so the kernel's Q K^T and P V carry a relative error of about 2^-13 of their sums of |products| that the
# float32 reference does not: the checks below bound it at 2^-12.
FP8_ACCUMULATION_EPS = 2.0**-12


def assert_fp8_kernel_computes_reference(
    out: Tensor,
    lse: Tensor,
    ref: Tensor,
    ref_lse: Tensor,
    q: Tensor,
    k: Tensor,
    truth: tuple[Tensor, Tensor] | None = None,
) -> None:
    """The FP8 kernel's (out, lse) against fp8.reference_forward's through flash_attn_fp8_func (softmax scale
    1/sqrt(D)); rows without keys give 0 and -inf.

    truth None (the emulated kernel, the reference's own float32 arithmetic): the output equal up to exp2's rounding
    moving a P across an e4m3 rounding boundary and the output's rounding, the lse up to float32 sums.
    truth (out, lse) float64 attention of the dequantized inputs (the GPU): the tensor core's accumulation
    (FP8_ACCUMULATION_EPS) adds to the lse at most eps * sum_d |q_d k_d| * scale <= eps * |q| |k| * scale
    (Cauchy-Schwarz, which the rotation of incoherent processing keeps), and the output meets flash-attn's rule: its
    error against the truth at most twice the reference's (both most and on average)."""
    assert out.dtype == ref.dtype and not out.isnan().any() and not lse.isnan().any()
    seen = ref_lse > -math.inf  # (B, H, Sq)
    assert torch.equal(lse[~seen], ref_lse[~seen])
    rows = seen.transpose(1, 2)  # (B, Sq, H)
    assert torch.equal(out[~rows].float(), torch.zeros_like(out[~rows].float()))
    lse_bound = 1e-4 + 1e-5 * ref_lse.abs()  # (B, H, Sq)
    if truth is not None:
        group = q.shape[2] // k.shape[2]
        q_norm = q.float().norm(dim=-1).transpose(1, 2)  # (B, H, Sq)
        k_norm = k.float().norm(dim=-1).amax(dim=1).repeat_interleave(group, dim=1)  # (B, H): the largest key's
        lse_bound = lse_bound + FP8_ACCUMULATION_EPS * q.shape[-1] ** -0.5 * q_norm * k_norm[..., None]
    lse_error = (lse - ref_lse).abs()[seen]
    assert (lse_error <= lse_bound[seen]).all(), f"lse: {(lse_error / lse_bound[seen]).max():.2f} of its bound"
    if truth is None:
        difference = (out.float() - ref.float())[rows]
        assert difference.abs().max() < 1e-2 and difference.abs().mean() < 1e-4
        return
    error, ref_error = ((x.double() - truth[0]).abs()[rows] for x in (out, ref))
    print(
        f"fp8 kernel's error: max {error.max():.3g}, mean {error.mean():.3g}; the reference's:"
        f" max {ref_error.max():.3g}, mean {ref_error.mean():.3g}; lse {lse_error.max():.3g}"
    )
    assert error.max() <= 2 * ref_error.max() + 1e-6 and error.mean() <= 2 * ref_error.mean() + 1e-6


def fp8_quantize_inputs(
    dtype: torch.dtype, lengths: tuple[int, int], heads: tuple[int, int], batch: int, layout: str, device: str = "cpu"
) -> tuple[Tensor, Tensor, Tensor]:
    """q (B, Sq, H, 128), k and v (B, Sk, Hk, 128) with the outliers incoherent processing is for: a few features 20x
    larger than the rest, and one value in a thousand 100x. layout: "contiguous"; "misaligned", rows 8 bytes off
    16-byte alignment; "packed", views of one (B, S, 3, H, D) tensor (Sq = Sk, H = Hk); "heads-first", (B, H, S, D)
    transposed."""
    (seqlen_q, seqlen_k), (h, hk) = lengths, heads

    def outliers(x: Tensor) -> Tensor:  # float32
        x[..., torch.randperm(x.shape[-1])[:3]] *= 20
        return torch.where(torch.rand(x.shape, device=device) < 1e-3, 100 * x, x).to(dtype)

    if layout == "packed":
        qkv = outliers(torch.randn(batch, seqlen_q, 3 * h, 128, device=device)).view(batch, seqlen_q, 3, h, 128)
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    shapes = ((batch, seqlen_q, h), (batch, seqlen_k, hk), (batch, seqlen_k, hk))
    if layout == "heads-first":
        return tuple(outliers(torch.randn(b, n, s, 128, device=device)).transpose(1, 2) for b, s, n in shapes)
    xs = tuple(outliers(torch.randn(*shape, 128, device=device)) for shape in shapes)
    if layout == "misaligned":  # 4 elements into a buffer: 8 bytes past an allocation's alignment
        return tuple(torch.cat([x.new_zeros(4), x.flatten()])[4:].view(x.shape) for x in xs)
    return xs


def fused_quantize(quantize):
    """fp8.quantize as the fused kernels compute it, with V from `quantize` (kernel_quantize writes V^T alone; its
    bytes are quantize's: assert_fused_quantization_is_quantize). With the rotation a few of the fused values lie one
    e4m3 step from quantize's (float32 sums in another order), and each moves its row's logsumexp past
    assert_fp8_kernel_computes_reference's float32 bound: the reference gets the kernel's very inputs."""
    from dataclasses import replace

    from legalpt.attention import fp8

    def fused(q, k, v, scaling="block", incoherent=True, seed=0):
        assert scaling == "block"
        inputs, _ = fp8.kernel_quantize(q, k, v, incoherent, seed)
        return replace(inputs, v=quantize(q, k, v, scaling, incoherent, seed).v)

    return fused


def _bytes(x: Tensor) -> Tensor:
    return x.view(torch.uint8)


def assert_fused_quantization_is_quantize(q: Tensor, k: Tensor, v: Tensor) -> tuple:
    """Without the rotation, fp8.kernel_quantize writes fp8.quantize's e4m3 bytes and scales and kernel_v's V^T (its
    padding keys zero), bit for bit; its (inputs, vt)."""
    from legalpt.attention import fp8

    got, vt = fp8.kernel_quantize(q, k, v, incoherent=False)
    want = fp8.quantize(q, k, v, incoherent=False)
    for name in ("q", "k"):
        assert torch.equal(_bytes(getattr(got, name)), _bytes(getattr(want, name))), name
    for name in ("q_scale", "k_scale", "v_scale"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert torch.equal(_bytes(vt), _bytes(fp8.kernel_v(want.v)))
    return got, vt


def assert_fused_quantization_keeps_special_values(q: Tensor, k: Tensor, v: Tensor) -> None:
    """assert_fused_quantization_is_quantize on inputs (B >= 1, S >= 8, H >= 2) with planted specials: a Q block
    holding NaN and infinities (scale 1: the infinities saturate to 448), one holding infinities alone (scale
    infinite: zeros of x's sign, NaN for an infinity), zeros of both signs and subnormals in an ordinary K block, a V
    head with an infinity in its first key block and NaN in its last (the NaN's scale 1 must win the reduction over
    blocks), and one with an infinity alone. NaN bytes are compared as NaN: their sign is the
    division's (the CPU's inf / inf is negative, the GPU's positive), not the quantization's."""
    from legalpt.attention import fp8

    q, k, v = (x.clone() for x in (q, k, v))
    tiny = torch.finfo(q.dtype).smallest_normal / 4  # a subnormal of the dtype
    q[0, 1:4, 0, :3] = torch.tensor([math.nan, math.inf, -math.inf])
    q[0, 4:6, -1, :2] = torch.tensor([math.inf, -math.inf])
    k[0, 2:6, 0, 0] = torch.tensor([0.0, -0.0, tiny, -tiny])
    v[0, 3, 0, 0], v[0, -1, 0, 1] = math.inf, math.nan
    v[-1, 2, -1, 1] = -math.inf
    got, vt = fp8.kernel_quantize(q, k, v, incoherent=False)
    want = fp8.quantize(q, k, v, incoherent=False)
    for name, x, y in (("q", got.q, want.q), ("k", got.k, want.k), ("vt", vt, fp8.kernel_v(want.v))):
        nan = y.float().isnan()
        assert torch.equal(x.float().isnan(), nan), name
        assert torch.equal(_bytes(x)[~nan], _bytes(y)[~nan]), name
    for name in ("q_scale", "k_scale", "v_scale"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert got.q[0, 2, 0, 1].float() == fp8.E4M3_MAX and got.q[0, 3, 0, 2].float() == -fp8.E4M3_MAX


def assert_fused_quantization_rotates(q: Tensor, k: Tensor, v: Tensor, seed: int) -> None:
    """With the rotation (a Walsh-Hadamard transform in fp8.kernel_quantize, a float32 matmul in fp8.quantize):
    every e4m3 value times its scale lies within half an e4m3 step of x M in float64 plus float32's rounding of the
    sums; the scales are quantize's up to that rounding of each side's amax (a few float32 ulps, which a fixed
    relative bound would cut into); a tiny share of the values lies one step from quantize's, none further. V is
    not rotated: V^T is kernel_v's bit for bit."""
    from legalpt.attention import fp8

    got, vt = fp8.kernel_quantize(q, k, v, incoherent=True, seed=seed)
    want = fp8.quantize(q, k, v, incoherent=True, seed=seed)
    m = fp8.incoherence_matrix(q.shape[-1], seed, q.device).double()
    for name, x in (("q", q), ("k", k)):
        x8, want8 = getattr(got, name).double(), getattr(want, name).double()  # (B, S, H, D) e4m3 values
        scale, want_scale = (getattr(i, f"{name}_scale").double() for i in (got, want))  # (B, H, blocks)
        rounding = 2**-20 * (x.double().abs() @ m.abs())  # (B, S, H, D): float32 sums' error, generously
        amax_error = 2 * _block_max(rounding) / fp8.E4M3_MAX  # both sides' amax, in the scale's units
        assert ((scale - want_scale).abs() <= amax_error + 2**-22 * want_scale).all(), name
        per_row = scale.repeat_interleave(fp8.BLOCK_ROWS, 2)[..., : x.shape[1]].transpose(1, 2)[..., None]
        exact = x.double() @ m / per_row  # (B, S, H, D) in units of the scale
        step = _e4m3_step(torch.maximum(x8.abs(), exact.abs()))
        assert ((x8 - exact).abs() <= step / 2 + rounding / per_row).all(), name
        differ = x8 != want8
        assert differ.sum() <= max(1, 1e-3 * differ.numel()), name  # one of a few hundred values is no share
        assert ((x8 - want8).abs() <= _e4m3_step(torch.maximum(x8.abs(), want8.abs())))[differ].all(), name
    assert torch.equal(_bytes(vt), _bytes(fp8.kernel_v(want.v)))


def _block_max(x: Tensor) -> Tensor:
    """x (B, S, H, D) -> its largest value per (batch, head, block of 128 rows), (B, H, blocks)."""
    rows, blocks = 128, -(-x.shape[1] // 128)
    padded = torch.nn.functional.pad(x.amax(-1), (0, 0, 0, blocks * rows - x.shape[1]))  # (B, blocks x rows, H)
    return padded.view(x.shape[0], blocks, rows, x.shape[2]).amax(2).transpose(1, 2)


def _e4m3_step(a: Tensor) -> Tensor:
    """The spacing of e4m3 values at magnitudes a (float64): 2^-9 among the subnormals (below 2^-6), else
    2^(exponent - 3)."""
    exponent = torch.frexp(a).exponent - 1  # a = 2^exponent x [1, 2)
    return torch.where(a < 2**-6, 2.0**-9, torch.ldexp(torch.ones_like(a), exponent - 3))
