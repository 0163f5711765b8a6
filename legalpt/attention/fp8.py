"""FP8 (e4m3) attention forward: the quantization (per-block scales, incoherent processing) and its numerics.

FlashAttention-3's FP8 recipe (Shah et al., 2024), in the form a Hopper kernel computes it:

- **Block scaling.** Q and K get one scale per (batch, head, block of 128 rows), the kernels' tile, so that a block's
  values use e4m3's whole range; the scores of a (query tile, key tile) pair are descaled by the product of two
  scalars, folded into the softmax's scale for free. V gets one scale per (batch, key head): a scale per key tile
  would not factor out of O = P V and would cost a multiply per score in the softmax-bound loop. `scaling="tensor"`
  is the plain baseline: one scale per tensor.
- **Incoherent processing.** With `incoherent=True`, Q and K are multiplied by one random orthogonal matrix M (a
  Hadamard matrix times random signs, scaled by 1/sqrt(D)) before quantization. (Q M)(K M)^T = Q K^T, while an
  outlier feature's magnitude is spread over all D features: e4m3's rounding error is relative to each value, so a
  score's error follows its largest products, and the product of an outlier in Q with one in K no longer is one.
- **P in FP8.** O += P V runs on FP8 too: P = exp2(logit - running max + 8) lies in (0, 256] instead of (0, 1] (the
  shift costs nothing inside the exp2), which keeps P above e4m3's subnormals for logits down to 14 below the max;
  the row sums use P before rounding, and the factor 2^8 cancels in the normalization.

`reference_forward` computes exactly these steps in float32 on the CPU or a GPU, key tile by key tile with the online
softmax: the numerics the kernel must reproduce, and `scripts/fp8_accuracy.py`'s. The `fa3` backend runs them on the
Hopper kernel (csrc/sm90/fwd.cuh with e4m3 inputs) at head dim 128, which reads V transposed, its keys permuted
within each 16 to match P's register fragments (`kernel_v`).

`quantize` defines the quantization, in float32 PyTorch: the oracle, and the path of scaling="tensor" (one amax over
the whole tensor), float32 inputs and the reference backend. Where the fa3 kernel serves bf16 or fp16 inputs with
block scaling, `kernel_quantize` runs it fused instead (csrc/sm90/quantize.cuh): one read of Q and K, two of V (its
amax, then its values), and one write of their e4m3 forms, V straight into the kernel's V^T, the rotation as a fast
Walsh-Hadamard transform in registers, where `quantize`'s float32 copies, matmuls and layout passes cost as much as
the FP8 kernel. Without the rotation its bytes and scales are `quantize`'s bit for bit; with it, the product by M
differs from the matmul's by float32 rounding.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from legalpt.attention import kernels
from legalpt.attention.api import _check_qkv, _check_rank, _is_number, _is_pair
from legalpt.attention.blocks import schedule_for
from legalpt.attention.masks import MaskSpec, element_mask

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # e4m3's largest finite value
BLOCK_ROWS = 128  # rows of Q or K per scale: the kernels' query and key tiles
P_SHIFT = 8  # P is stored as exp2(logit - max + P_SHIFT): values in (0, 2^8] instead of (0, 1]
# The smallest scale: a (query tile, key tile) pair's logit scale, softmax scale x two scales, stays a normal float32
# > 0 even for inputs of magnitude ~1e-10 (a scale of 0 would make the masked scores' -inf x 0 NaN)
MIN_SCALE = 2.0**-40
SCALINGS = ("block", "tensor")
BACKENDS = ("auto", "fa3", "reference")
KERNEL_HEAD_DIM = 128  # the FP8 kernel's: a row of Q or K is one 128-byte line of shared memory
# Where P's e4m3 fragment holds key k of each 16 (csrc/sm90/wgmma.cuh, to_fragments_e4m3): V^T's column 4q + i holds
# key 2q + i (i < 2) or 2q + 8 + i - 2.
_KEY_ORDER = [2 * (a // 4) + (a % 4 if a % 4 < 2 else 8 + a % 4 - 2) for a in range(16)]


@dataclass(frozen=True)
class Fp8Inputs:
    """Q, K and V in e4m3 with their scales: x ~= x8 * scale. Q and K are after incoherent processing if any."""

    q: Tensor  # (B, Sq, H, D) float8_e4m3fn
    k: Tensor  # (B, Sk, Hk, D) float8_e4m3fn
    v: Tensor | None  # (B, Sk, Hk, D) float8_e4m3fn; None from kernel_quantize, which writes the kernel's V^T alone
    q_scale: Tensor  # (B, H, ceil(Sq / BLOCK_ROWS)) float32, one per block of query rows
    k_scale: Tensor  # (B, Hk, ceil(Sk / BLOCK_ROWS)) float32
    v_scale: Tensor  # (B, Hk) float32


def incoherence_matrix(head_dim: int, seed: int, device: torch.device | str = "cpu") -> Tensor:
    """The random orthogonal (D, D) float32 matrix H diag(signs) / sqrt(D) (H: Sylvester's Hadamard matrix)."""
    _check_hadamard(head_dim)
    h = torch.ones(1, 1)
    while h.shape[0] < head_dim:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    signs = torch.randint(0, 2, (head_dim,), generator=torch.Generator().manual_seed(seed)) * 2 - 1
    return (h * signs / math.sqrt(head_dim)).to(device)


@functools.lru_cache(maxsize=8)
def _column_factors(head_dim: int, seed: int, device: torch.device) -> Tensor:
    """M's first row, (D,) float32 on `device`: column j of M is column j of Sylvester's H (first row all ones) times
    M[0, j], so the fused kernel's rotation multiplies by these very entries. Cached, as every layer of a step asks
    for the same; callers only read it."""
    return incoherence_matrix(head_dim, seed)[0].contiguous().to(device)


def _check_hadamard(head_dim: int) -> None:
    if head_dim < 1 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim: incoherent processing needs a power of two (Hadamard matrix), got {head_dim}")


def quantize(
    q: Tensor, k: Tensor, v: Tensor, scaling: str = "block", incoherent: bool = True, seed: int = 0
) -> Fp8Inputs:
    """Q, K, V (B, S, H, D) in float32/bf16/fp16 -> e4m3 with scales (module docstring). `seed` picks M's signs."""
    _check_inputs(q, k, v, scaling, incoherent, seed)
    q, k, v = q.float(), k.float(), v.float()
    if incoherent:  # raises for a head dim that is not a power of two
        m = incoherence_matrix(q.shape[-1], seed, q.device)
        q, k = q @ m, k @ m
    block = scaling == "block"
    q8, q_scale = _quantize_rows(q, BLOCK_ROWS if block else None)
    k8, k_scale = _quantize_rows(k, BLOCK_ROWS if block else None)
    v8, v_scale = _quantize_rows(v, max(v.shape[1], 1) if block else None)
    return Fp8Inputs(q8, k8, v8, q_scale, k_scale, v_scale[..., 0])


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, scaling: str, incoherent: bool, seed: int) -> None:
    _check_rank(q, k, v, 4, "(batch, seqlen, heads, head_dim)")
    _check_qkv(q, k, v)
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"k: expected batch size {q.shape[0]} (same as q), got {k.shape[0]}")
    if scaling not in SCALINGS:
        raise ValueError(f"scaling: expected one of {SCALINGS}, got {scaling!r}")
    if not isinstance(incoherent, bool):
        raise TypeError(f"incoherent: expected a bool, got {type(incoherent).__name__}")
    if q.shape[-1] == 0:
        raise ValueError("q: expected head_dim >= 1, got 0")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise ValueError(f"seed: expected an int in [0, 2^63), got {seed!r}")


def _quantize_rows(x: Tensor, rows: int | None) -> tuple[Tensor, Tensor]:
    """x (B, S, H, D) float32 in e4m3 with one scale per (batch, head, block of `rows` rows), (B, H, blocks); rows
    None: one scale for the whole tensor, repeated over the same shape."""
    b, s, h, _ = x.shape
    rows_per = rows if rows is not None else BLOCK_ROWS
    blocks = max(1, _blocks(s, rows_per))
    row_amax = torch.nn.functional.pad(x.abs().amax(-1), (0, 0, 0, blocks * rows_per - s))  # (B, blocks x rows, H)
    amax = row_amax.reshape(b, blocks, rows_per, h).amax(2).transpose(1, 2)  # (B, H, blocks)
    if rows is None:
        amax = amax.amax().expand(b, h, blocks)
    scale = _scales(amax)
    per_row = scale.transpose(1, 2).repeat_interleave(rows_per, dim=1)[:, :s, :, None]  # (B, S, H, 1)
    return (x / per_row).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale.contiguous()


def _scales(amax: Tensor) -> Tensor:
    """Float32 amax -> the scales that map it to E4M3_MAX, at least MIN_SCALE; 1 where amax is 0 (any scale would
    do) or NaN (amax > 0 fails: the block's values keep their NaN). csrc/sm90/quantize.cuh's block_scale is this.
    A product by the reciprocal, not a division: PyTorch divides a CUDA tensor by a Python number as such a product
    and a CPU tensor by true division, which round apart in the last bit; the product rounds alike everywhere."""
    return torch.where(amax > 0, amax * (1 / E4M3_MAX), torch.ones_like(amax)).clamp(min=MIN_SCALE)


def kernel_quantize(
    q: Tensor, k: Tensor, v: Tensor, incoherent: bool = True, seed: int = 0
) -> tuple[Fp8Inputs, Tensor]:
    """quantize(q, k, v, "block", incoherent, seed) by the fused kernels (module docstring), for the fa3 kernel:
    q (B, Sq, H, 128), k and v (B, Sk, Hk, 128) in bf16 or fp16 on the kernels' device. Returns the inputs (their v
    None) and V^T (B, 128, Hk, keys) as kernel_v lays it out."""
    _check_inputs(q, k, v, "block", incoherent, seed)
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"q: expected dtype bfloat16 or float16 (the fused quantization's), got {q.dtype}")
    if q.shape[-1] != KERNEL_HEAD_DIM:
        raise ValueError(f"q: expected head_dim {KERNEL_HEAD_DIM} (the FP8 kernel's), got {q.shape[-1]}")
    if 0 in (q.shape[0], q.shape[1], q.shape[2], k.shape[1]):
        raise ValueError(f"q, k: expected a batch row, a head and a row, got shapes {tuple(q.shape)}, {tuple(k.shape)}")
    if (reason := _fa3_unavailable(q)) is not None:
        raise ValueError(f"q: the fused quantization cannot run here: {reason}")
    q, k, v = (_aligned(x) for x in (q, k, v))
    (batch, seqlen_q, heads, d), seqlen_k, kv_heads = q.shape, k.shape[1], k.shape[2]
    factors = _column_factors(d, seed, q.device) if incoherent else None
    q8, k8 = torch.empty(q.shape, dtype=E4M3, device=q.device), torch.empty(k.shape, dtype=E4M3, device=q.device)
    q_scale = torch.empty((batch, heads, _blocks(seqlen_q)), dtype=torch.float32, device=q.device)
    k_scale = torch.empty((batch, kv_heads, _blocks(seqlen_k)), dtype=torch.float32, device=q.device)
    vt = torch.empty((batch, d, kv_heads, _blocks(seqlen_k) * BLOCK_ROWS), dtype=E4M3, device=q.device)
    v_scale = torch.empty((batch, kv_heads), dtype=torch.float32, device=q.device)
    kernels.extension().quantize_fp8(q, k, v, factors, q8, k8, vt, q_scale, k_scale, v_scale)
    return Fp8Inputs(q8, k8, None, q_scale, k_scale, v_scale), vt


def _blocks(rows: int, per: int = BLOCK_ROWS) -> int:
    """Blocks of `per` rows that hold `rows`."""
    return -(-rows // per)


def _aligned(x: Tensor) -> Tensor:
    """x, or a contiguous copy where the kernels' vector loads could not read it: its last dimension strided, or a
    row not 16-byte aligned (a size-1 dimension's stride addresses nothing). quantize_fp8 checks the same (api.h)."""
    strides = (s for s, n in zip(x.stride()[:-1], x.shape[:-1], strict=True) if n > 1)
    aligned = x.stride(-1) == 1 and x.data_ptr() % 16 == 0 and all(s % 8 == 0 for s in strides)
    return x if aligned else x.clone(memory_format=torch.contiguous_format)


def reference_forward(
    inputs: Fp8Inputs, softmax_scale: float, causal: bool = False, window_size: tuple[int, int] = (-1, -1)
) -> tuple[Tensor, Tensor]:
    """FP8 attention in float32, as a kernel computes it: out (B, Sq, H, D), logsumexp (B, H, Sq) (natural log; -inf
    and out 0 on rows that see no key; NaN inputs give NaN). Masks as flash_attn_func's (causal bottom-right
    aligned).

    Each query tile of BLOCK_ROWS rows visits its key tiles in the kernel's order (the block schedule's: partial
    tiles first), since P's rounding to e4m3 depends on the running max met so far; the logits' scale is the
    kernel's float32 product, and P's exponent one rounding of score x scale - max, as its FFMA."""
    q8, k8, v8 = inputs.q, inputs.k, inputs.v
    batch, sq, heads, d = q8.shape
    sk, group, device = k8.shape[1], heads // k8.shape[2], q8.device
    spec = MaskSpec(causal=causal, window=tuple(window_size))
    tile = (BLOCK_ROWS, BLOCK_ROWS)
    schedule = schedule_for(spec, None, None, sq, sk, tile, transposed=False, device=device)
    counts, order = schedule.counts[0, 0, :, 0].long(), schedule.indices[0, 0].long()  # (nq,), (nq, cols)
    nq, nk = counts.shape[0], -(-sk // BLOCK_ROWS)
    q = _tiles(q8.float(), nq)  # (B, H, nq, BLOCK_ROWS, D)
    k = _tiles(k8.float(), nk).repeat_interleave(group, dim=1)  # (B, H, nk, BLOCK_ROWS, D)
    v = _tiles(v8.float(), nk).repeat_interleave(group, dim=1)
    k_scale = inputs.k_scale.repeat_interleave(group, dim=1)  # (B, H, nk)
    row_scale = torch.tensor(softmax_scale * math.log2(math.e), dtype=torch.float32) * inputs.q_scale  # (B, H, nq)
    rows = (torch.arange(nq, device=device)[:, None] * BLOCK_ROWS + torch.arange(BLOCK_ROWS, device=device))[..., None]
    m = torch.full((batch, heads, nq, BLOCK_ROWS, 1), -math.inf, device=device)  # running max, log2 domain
    total = torch.zeros_like(m)  # running sum of P before rounding
    acc = torch.zeros_like(q)  # sum of P8 V8
    for t in range(int(counts.max()) if nq else 0):
        kt = order[:, t].clamp(min=0)  # (nq,): each query tile's t-th key tile
        scale = (row_scale * k_scale[..., kt])[..., None, None]  # (B, H, nq, 1, 1)
        scores = q @ k[:, :, kt].transpose(-1, -2)  # (B, H, nq, BLOCK_ROWS, BLOCK_ROWS)
        cols = (kt[:, None] * BLOCK_ROWS + torch.arange(BLOCK_ROWS, device=device))[:, None, :]  # (nq, 1, keys)
        seen = element_mask(spec, rows, cols, sk - sq) & (cols < sk) & (rows < sq) & (t < counts)[:, None, None]
        scores = scores.masked_fill(~seen, -math.inf)
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True) * scale)
        base = torch.where(m_new == -math.inf, 0.0, m_new)  # rows without keys so far: P = 0, never NaN
        alpha = torch.exp2(m - base)
        exponent = (scores.double() * scale.double() - (base - P_SHIFT).double()).float()  # one rounding, as FFMA
        p = torch.exp2(exponent)
        total = total * alpha + p.sum(-1, keepdim=True)
        acc = acc * alpha + p.clamp(max=E4M3_MAX).to(E4M3).float() @ v[:, :, kt]
        m = m_new
    seen = total != 0  # a row that sees a key has P = 2^8 at its max; NaN stays NaN
    total = torch.where(seen, total, 1.0)
    v_scale = inputs.v_scale.repeat_interleave(group, dim=1)[..., None, None, None]  # (B, H, 1, 1, 1)
    out = torch.where(seen, acc * v_scale / total, 0.0)
    lse = torch.where(seen, (m - P_SHIFT) * math.log(2) + torch.log(total), -math.inf)
    out = out.permute(0, 2, 3, 1, 4).reshape(batch, nq * BLOCK_ROWS, heads, d)[:, :sq]
    return out, lse.reshape(batch, heads, nq * BLOCK_ROWS)[..., :sq]


def _tiles(x: Tensor, n: int) -> Tensor:
    """x (B, S, H, D) zero-padded to n tiles of BLOCK_ROWS rows, as (B, H, n, BLOCK_ROWS, D)."""
    padded = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, n * BLOCK_ROWS - x.shape[1]))
    return padded.reshape(x.shape[0], n, BLOCK_ROWS, *x.shape[2:]).permute(0, 3, 1, 2, 4)


def flash_attn_fp8_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    return_attn_probs: bool = False,
    *,
    scaling: str = "block",
    incoherent: bool = True,
    seed: int = 0,
    backend: str = "auto",
) -> Tensor | tuple[Tensor, Tensor, None]:
    """Attention forward with Q, K, V and P in e4m3 (module docstring), for inference and evaluation.

    q: (B, Sq, H, D); k, v: (B, Sk, Hk, D), H divisible by Hk; float32, bf16 or fp16. Returns out (B, Sq, H, D) in
    q's dtype, and with return_attn_probs=True (out, softmax_lse (B, H, Sq) float32, None) like flash_attn_func.
    window_size=(left, right), -1 = unbounded; causal is bottom-right aligned when Sq != Sk. scaling: "block" (Q, K
    per 128 rows, V per head) or "tensor"; incoherent: the random Hadamard rotation of Q and K (power-of-two head
    dims), `seed` its signs. backend: "fa3" (the Hopper kernel, head dim 128; it writes float32 inputs' output in
    bf16), "reference" (PyTorch in float32, CPU or GPU), or "auto": fa3 where it can run, else the reference.
    """
    _check_inputs(q, k, v, scaling, incoherent, seed)
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    elif not _is_number(softmax_scale) or not math.isfinite(softmax_scale) or softmax_scale <= 0:
        raise ValueError(f"softmax_scale: expected a finite number > 0 or None, got {softmax_scale!r}")
    for name, flag in (("causal", causal), ("return_attn_probs", return_attn_probs)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: expected a bool, got {type(flag).__name__}")
    if not _is_pair(window_size, minimum=-1):
        raise ValueError(f"window_size: expected (left, right) ints >= -1 (-1 = unbounded), got {window_size!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS} for FP8 attention, got {backend!r}")
    chosen = _resolve(backend, q)
    if 0 in (q.shape[0], q.shape[1], q.shape[2], k.shape[1]):  # nothing to attend: out 0, lse -inf (flash_attn_func's)
        out = q.new_zeros(q.shape)
        lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), -math.inf, device=q.device)
        return (out, lse, None) if return_attn_probs else out
    half = q.dtype in (torch.bfloat16, torch.float16)
    if chosen == "fa3" and half and scaling == "block":
        inputs, vt = kernel_quantize(q, k, v, incoherent, seed)
    else:
        inputs, vt = quantize(q, k, v, scaling, incoherent, seed), None
    if chosen == "fa3":
        out_dtype = q.dtype if half else torch.bfloat16
        out, lse = kernel_forward(inputs, float(softmax_scale), causal, tuple(window_size), out_dtype, vt)
    else:
        out, lse = reference_forward(inputs, float(softmax_scale), causal, tuple(window_size))
    out = out.to(q.dtype)
    return (out, lse, None) if return_attn_probs else out


def _resolve(backend: str, q: Tensor) -> str:
    """The backend that runs: `backend`, or for "auto" fa3 where it can run, else the reference."""
    if backend == "reference":
        return backend
    reason = _fa3_unavailable(q)
    if backend == "fa3" and reason is not None:
        raise ValueError(f"backend: fa3 cannot run FP8 attention here: {reason}")
    return "reference" if reason is not None else "fa3"


def _fa3_unavailable(q: Tensor) -> str | None:
    """Why the FP8 kernel cannot serve q's device and head dim; None when it can."""
    if q.shape[-1] != KERNEL_HEAD_DIM:
        return f"the FP8 kernel has head dim {KERNEL_HEAD_DIM}, got {q.shape[-1]}"
    reason = kernels.unavailable_reason(q.device, KERNEL_HEAD_DIM, torch.bfloat16, sm90=True)
    if reason is None and not all(hasattr(kernels.extension(), f) for f in ("forward_fp8", "quantize_fp8")):
        reason = "the installed kernels have no FP8 forward (reinstall legalpt with head dim 128 and sm90 built)"
    return reason


def kernel_forward(
    inputs: Fp8Inputs,
    softmax_scale: float,
    causal: bool,
    window_size: tuple[int, int],
    out_dtype: torch.dtype,
    v_kernel: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The FP8 kernel on `inputs` (checked by flash_attn_fp8_func): out (B, Sq, H, D) in out_dtype, logsumexp
    (B, H, Sq). v_kernel: kernel_v(inputs.v), where the caller has it already (kernel_quantize's V^T; the benchmark
    times the kernel alone)."""
    ext = kernels.extension()
    q, k = inputs.q.contiguous(), inputs.k.contiguous()
    batch, seqlen_q, heads, _ = q.shape
    spec = MaskSpec(causal=causal, window=window_size)
    tile, _ = ext.tiles(KERNEL_HEAD_DIM, True)
    schedule = schedule_for(spec, None, None, seqlen_q, k.shape[1], tile, transposed=False, device=q.device)
    out = torch.empty(q.shape, dtype=out_dtype, device=q.device)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)
    ext.forward_fp8(
        q, k, kernel_v(inputs.v) if v_kernel is None else v_kernel, out, lse, inputs.q_scale, inputs.k_scale,
        inputs.v_scale,
        schedule.counts, schedule.indices, schedule.tile[0], spec.ints(), softmax_scale,
    )  # fmt: skip
    return out, lse


def kernel_v(v: Tensor) -> Tensor:
    """V (B, Sk, Hk, D) e4m3 as the kernel reads it: V^T (B, D, Hk, keys), the keys padded with zeros to whole
    tiles of BLOCK_ROWS and permuted within each 16 to P's fragments (_KEY_ORDER)."""
    keys = _blocks(v.shape[1]) * BLOCK_ROWS
    padded = torch.zeros((v.shape[0], keys, *v.shape[2:]), dtype=v.dtype, device=v.device)
    padded[:, : v.shape[1]] = v
    order = torch.tensor(_KEY_ORDER, device=v.device)
    index = (torch.arange(keys, device=v.device) // 16 * 16).view(-1, 16) + order
    return padded[:, index.flatten()].permute(0, 3, 2, 1).contiguous()
