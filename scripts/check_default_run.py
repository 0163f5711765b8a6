"""Measure the default job as a new user runs it: `legalpt-train` with no overrides, from a cold cache, then
`legalpt-eval` on its checkpoint.

Records wall times, the first and final held-out loss and their ratio, and the eval's headline numbers in
bench/results/default-run-<gpu>-<yyyymmdd>.json (scripts/benchmarking/record.py names and heads it), replacing the
machine's earlier record. Exits 1 when the job misses its targets: at most 10 minutes of training (on 2 CPU cores)
and a final held-out loss at most 0.6 times the first.

    python scripts/check_default_run.py            # run it and record the figures
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from benchmarking import record

ROOT = Path(__file__).resolve().parent.parent
MAX_WALL_S = 600  # most seconds the default training may take
MAX_LOSS_RATIO = 0.6  # most final over first held-out loss


def main() -> int:
    legalpt_train, legalpt_eval = shutil.which("legalpt-train"), shutil.which("legalpt-eval")
    if legalpt_train is None or legalpt_eval is None:
        sys.exit("legalpt-train / legalpt-eval are not on PATH: install the project first (pip install -e .)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    head = record.header("default-run", device, __file__, None)
    with tempfile.TemporaryDirectory() as cache:
        run_dir = Path(cache) / "run"
        # A fresh cache folder makes this a cold start: corpus, tokenizer and packing are all built again.
        command = [legalpt_train, f"data.cache_dir={cache}", f"train.output_dir={run_dir}"]
        start = time.perf_counter()
        subprocess.run(command, check=True, cwd=ROOT)
        wall = time.perf_counter() - start
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        start = time.perf_counter()
        subprocess.run([legalpt_eval, f"data.cache_dir={cache}", f"eval.checkpoint={run_dir}"], check=True, cwd=ROOT)
        eval_wall = time.perf_counter() - start
        report = next(iter(json.loads((run_dir / "hf" / "eval" / "report.json").read_text())["checkpoints"].values()))
    evals = [(m["step"], m["eval/loss"]) for m in metrics if "eval/loss" in m]
    speeds = [m["train/tokens_per_s"] for m in metrics if "train/tokens_per_s" in m]
    # the flat keys before wall_s repeat the header's facts where performance_table.py reads them
    figures = {
        "header": head,
        "date": head["date"],
        "command": "legalpt-train (defaults; cold cache)",
        "device": head["gpu"].replace(" ", "-"),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch": head["torch"],
        "commit": head["commit"],
        "wall_s": round(wall, 1),
        "eval_losses": evals,
        "first_eval_loss": evals[0][1],
        "final_eval_loss": evals[-1][1],
        "final_over_first": evals[-1][1] / evals[0][1],
        "median_train_tokens_per_s": sorted(speeds)[len(speeds) // 2],
        "eval_command": "legalpt-eval eval.checkpoint=<the run> (defaults)",
        "eval_wall_s": round(eval_wall, 1),
        "eval_bits_per_byte": report["perplexity"]["by_kind"]["all"]["bits_per_byte"],
        "eval_citation_prompts": report["citations"]["generation"]["prompts"],
        "eval_citation_exact": report["citations"]["full"]["metrics"]["exact"]["mean"],
        "eval_citation_well_formed": report["citations"]["full"]["metrics"]["well_formed"]["mean"],
    }
    out = record.write(record.RESULTS, figures, head)
    print(
        f"wall {wall / 60:.1f} min, eval loss {evals[0][1]:.3f} → {evals[-1][1]:.3f} "
        f"({figures['final_over_first']:.2f}×); eval {eval_wall / 60:.1f} min → {out}"
    )
    return 0 if wall <= MAX_WALL_S and figures["final_over_first"] <= MAX_LOSS_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
