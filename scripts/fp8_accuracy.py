"""Accuracy of FP8 attention against float64, beside bf16's: per-tensor and per-block scales, with and without
incoherent processing (legalpt/attention/fp8.py).

The inputs follow FlashAttention-3's FP8 accuracy experiment: Q, K and V entries from N(0, 1), plus N(0, 10^2) on
a fraction of them (0.1%) to stand for the outlier features of real activations. Each row of the record is the
root-mean-square error of the output against float64 attention, averaged over the seeds; bf16 is plain PyTorch
attention (SDPA) in bf16 on the same device. Two more rows keep some operands exact (P alone in e4m3; Q, K and P),
to show where the error comes from.

    python scripts/fp8_accuracy.py                     # CPU: the FP8 numerics in float32 (fp8.reference_forward)
    python scripts/fp8_accuracy.py --device cuda

The record goes to <out>/fp8-accuracy-<gpu>-<yyyymmdd>.json (scripts/benchmarking/record.py names and heads it).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
from benchmarking import record
from torch import Tensor

from legalpt.attention import fp8
from legalpt.attention.fp8 import flash_attn_fp8_func

VARIANTS = [("tensor", False), ("tensor", True), ("block", False), ("block", True)]  # (scaling, incoherent)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true", help="causal attention (else dense)")
    parser.add_argument("--outlier-rate", type=float, default=0.001, help="fraction of entries given an outlier")
    parser.add_argument("--outlier-std", type=float, default=10.0, help="standard deviation of the outliers")
    parser.add_argument("--seeds", type=int, default=3, help="random inputs the errors are averaged over")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=record.RESULTS, help="folder of the JSON record")
    args = parser.parse_args(argv)

    errors: dict[str, list[float]] = {}
    for seed in range(args.seeds):
        gen = torch.Generator(args.device).manual_seed(seed)
        q, k, v = (_inputs(args, gen) for _ in range(3))
        exact = _sdpa(q.double(), k.double(), v.double(), args.causal)
        errors.setdefault("bf16", []).append(_rmse(_sdpa(q.bfloat16(), k.bfloat16(), v.bfloat16(), args.causal), exact))
        for scaling, incoherent in VARIANTS:
            out = flash_attn_fp8_func(q, k, v, causal=args.causal, scaling=scaling, incoherent=incoherent, seed=seed)
            errors.setdefault(_name(scaling, incoherent), []).append(_rmse(out, exact))
        for name, out in _error_sources(q, k, v, args.causal, seed).items():
            errors.setdefault(name, []).append(_rmse(out, exact))
    rows = [{"method": name, "rmse": statistics.fmean(errs), "rmse_per_seed": errs} for name, errs in errors.items()]
    head = record.header("fp8-accuracy", args.device, __file__, argv, batch=args.batch, seqlen=args.seqlen,
                         heads=args.heads, head_dim=args.head_dim, causal=args.causal,
                         outlier_rate=args.outlier_rate, outlier_std=args.outlier_std, seeds=args.seeds)  # fmt: skip
    result = {"header": head, "rows": rows}
    path = record.write(args.out, result)
    baseline = errors[_name("tensor", False)]
    print(f"wrote {path}\n{'method':<38} {'rmse':>10} {'vs fp8 per-tensor':>18}")
    for row in rows:
        print(f"{row['method']:<38} {row['rmse']:>10.3e} {statistics.fmean(baseline) / row['rmse']:>17.2f}x")
    return result


def _inputs(args: argparse.Namespace, gen: torch.Generator) -> Tensor:
    """(B, S, H, D) float32: N(0, 1), plus N(0, outlier_std^2) on a fraction outlier_rate of the entries."""
    shape = (args.batch, args.seqlen, args.heads, args.head_dim)
    x = torch.randn(shape, generator=gen, device=args.device)
    outliers = torch.rand(shape, generator=gen, device=args.device) < args.outlier_rate
    return x + outliers * args.outlier_std * torch.randn(shape, generator=gen, device=args.device)


def _error_sources(q: Tensor, k: Tensor, v: Tensor, causal: bool, seed: int) -> dict[str, Tensor]:
    """Per-block scales with incoherent processing, with only some operands in e4m3: P alone, then Q, K and P (the
    full method adds V), so that the record shows where the error comes from."""
    full = fp8.quantize(q, k, v, "block", incoherent=True, seed=seed)
    m = fp8.incoherence_matrix(q.shape[-1], seed, q.device)
    exact_qk = fp8.Fp8Inputs(q @ m, k @ m, v, *(torch.ones_like(s) for s in (full.q_scale, full.k_scale, full.v_scale)))
    exact_v = fp8.Fp8Inputs(full.q, full.k, v, full.q_scale, full.k_scale, torch.ones_like(full.v_scale))
    scale = q.shape[-1] ** -0.5
    return {
        "fp8 per-block + incoherent, P alone": fp8.reference_forward(exact_qk, scale, causal)[0],
        "fp8 per-block + incoherent, Q, K, P": fp8.reference_forward(exact_v, scale, causal)[0],
    }


def _sdpa(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
    return out.transpose(1, 2)


def _rmse(out: Tensor, exact: Tensor) -> float:
    return (out.double() - exact).square().mean().sqrt().item()


def _name(scaling: str, incoherent: bool) -> str:
    return f"fp8 per-{scaling}" + (" + incoherent" if incoherent else "")


if __name__ == "__main__":
    main()
