"""The attention benchmark's plot: TFLOP/s against seqlen over the dense sweep."""

from __future__ import annotations

from pathlib import Path

from .runners import MODES


def plot(rows: list[dict], path: Path) -> bool:
    """TFLOP/s vs seqlen of the dense sweep: one panel per (head dim, causal, mode), one line per implementation.
    Returns False, writing nothing, where the rows hold no measured sweep."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = [r for r in rows if r["group"] == "sweep" and r["tflops"] is not None]
    if not sweep:
        return False
    panels = sorted({(r["head_dim"], r["causal"]) for r in sweep})
    modes = [m for m in MODES if any(r["mode"] == m for r in sweep)]
    seqlens = sorted({r["seqlen_q"] for r in sweep})
    fig, axes = plt.subplots(len(panels), len(modes), figsize=(4.5 * len(modes), 3.2 * len(panels)), squeeze=False)
    for (head_dim, causal), row_axes in zip(panels, axes, strict=True):
        for mode, ax in zip(modes, row_axes, strict=True):
            for impl in dict.fromkeys(r["impl"] for r in sweep):
                points = sorted(
                    (r["seqlen_q"], r["tflops"])
                    for r in sweep
                    if (r["impl"], r["head_dim"], r["causal"], r["mode"]) == (impl, head_dim, causal, mode)
                )
                if points:
                    ax.plot(*zip(*points, strict=True), marker="o", label=impl)
            ax.set_xscale("log", base=2)
            ax.set_xticks(seqlens, [f"{s // 1024}k" if s >= 1024 else str(s) for s in seqlens])
            ax.set_ylim(bottom=0)
            ax.set_title(f"head dim {head_dim}, {'causal' if causal else 'dense'}, {mode}", fontsize=10)
            ax.set_xlabel("seqlen")
            ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
