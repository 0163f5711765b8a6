"""Helpers of the training tests: the overrides of a tiny run."""

from __future__ import annotations


def tiny_overrides(tmp_path, *extra: str, steps: int = 6) -> list[str]:
    """A tiny run of `steps` steps that evaluates and saves at the start, halfway and at the end; `extra` last."""
    return [
        "model=tiny",
        "data.synthetic_documents=6",
        "data.seq_len=128",
        "data.vocab_size=400",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"train.steps={steps}",
        f"train.warmup_steps={steps // 3}",
        f"train.eval_every={steps // 2}",
        "train.eval_batches=2",
        f"train.save_every={steps // 2}",
        "train.log_every=2",
        "logger=none",
        *extra,
    ]
