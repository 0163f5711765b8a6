"""Output error of the online softmax with and without slack in its running max, simulated in PyTorch.

The fa2 forward rounds P = exp2(s - m) to bf16 for P V. Moving the reference max m only when a tile's max passes it
by more than a slack (FA4's trick, fewer O rescales) leaves P's largest values anywhere in their binade instead of
at 1 and just below, where bf16's relative spacing is finest. This measures what that costs, against float64, on the
mask of test_flex_attention_agrees (window (128, 64) + 64 global tokens, 1024 tokens, head dim 64). It is why the
forward kernels rescale O whenever a row's max grows.

    python scripts/rescale_precision.py --seeds 10
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import Tensor


def online_softmax(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, slack: float, block_n: int = 64) -> Tensor:
    """Attention of q (S, D) over k, v tile by tile like the kernel: float32 state, P rounded to bf16 for P V."""
    scale = math.log2(math.e) / math.sqrt(q.shape[1])
    m = torch.full((q.shape[0],), -math.inf)
    row_sum, acc = torch.zeros(q.shape[0]), torch.zeros_like(q)
    for j0 in range(0, k.shape[0], block_n):
        s = (q @ k[j0 : j0 + block_n].T).masked_fill(~mask[:, j0 : j0 + block_n], -math.inf) * scale
        new_m = torch.where(s.amax(1) > m + slack, torch.maximum(m, s.amax(1)), m)
        safe = new_m.nan_to_num(neginf=0.0)  # a row that has seen nothing keeps p = 0
        correction = torch.exp2(m - safe)
        acc, row_sum, m = acc * correction[:, None], row_sum * correction, new_m
        p = torch.exp2(s - safe[:, None])
        row_sum += p.sum(1)
        acc += p.bfloat16().float() @ v[j0 : j0 + block_n]
    return acc / row_sum[:, None]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="random inputs the errors are averaged over")
    args = parser.parse_args(argv)
    n, d = 1024, 64
    i, j = torch.arange(n)[:, None], torch.arange(n)[None]
    mask = ((j >= i - 128) & (j <= i + 64)) | (i < 64) | (j < 64)
    for slack in (0.0, 1.0, 2.0, 4.0, 8.0):
        errors = []
        for seed in range(args.seeds):
            torch.manual_seed(seed)
            q, k, v = (torch.randn(n, d).bfloat16().float() for _ in range(3))
            scores = (q.double() @ k.double().T / math.sqrt(d)).masked_fill(~mask, -math.inf)
            exact = torch.softmax(scores, 1) @ v.double()
            out = online_softmax(q, k, v, mask, slack)
            errors.append(((out.double() - exact).abs().max(), (out.bfloat16().double() - exact).abs().max()))
        before, after = (sum(e[c].item() for e in errors) / len(errors) for c in (0, 1))
        print(f"slack {slack:g}: max error, mean over seeds: float32 {before:.2e}, after bf16 rounding {after:.2e}")


if __name__ == "__main__":
    main()
