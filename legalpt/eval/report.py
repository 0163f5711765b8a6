"""The eval report: report.json (everything), report.md (the documents scored and those left out as trained on,
headline metrics, one column per checkpoint, with 95% bootstrap intervals; the harness's numbers with their standard
errors, and its forgetting table of two checkpoints), PNG plots of citation accuracy by reporter, by position in the
document and by prompt length, and the same to wandb when it is on.

Headline rows are found, not listed: every number or interval ({mean, low, high}) in a task's summary becomes a
row, while per-item and per-bucket detail (lists, `by_*` breakdowns) stays in the JSON and the plots.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt

from legalpt.config import EVAL_TASKS
from legalpt.eval import harness
from legalpt.runtime import wandb_offline_unless_keyed

# (breakdown of the full-citation summary, title, x label) of the plotted exact-match accuracies
PLOTS = (
    ("by_reporter", "exact match by reporter", "reporter"),
    ("by_position", "exact match by position of the citation in the document", "position in document (tenths)"),
    ("by_prompt_tokens", "exact match by prompt length", "prompt tokens"),
)
DETAIL = ("per_document",)  # per-document tables stay in report.json


def is_interval(value) -> bool:
    return isinstance(value, dict) and {"mean", "low", "high"} <= value.keys()


def headline(summary: dict, prefix: str = "") -> dict[str, float | str | dict]:
    """Numbers and intervals of a task summary, flattened to 'a/b/c' keys; lists (per-item rows, breakdowns) and
    per-document tables left out; an `x_ci` pair (low, high) shown as text."""
    rows: dict[str, float | str | dict] = {}
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if key in DETAIL or value is None or isinstance(value, bool):
            continue
        if key.endswith("_ci") and isinstance(value, list | tuple) and len(value) == 2:
            rows[name] = f"[{value[0]:.3g}, {value[1]:.3g}]"
        elif is_interval(value) or isinstance(value, int | float):
            rows[name] = value
        elif isinstance(value, dict):
            rows.update(headline(value, f"{name}/"))
    return rows


def format_value(value) -> str:
    if is_interval(value):
        if math.isnan(value["mean"]):
            return "–"
        return f"{value['mean']:.4g} [{value['low']:.3g}, {value['high']:.3g}]"
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:.4g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def markdown(report: dict) -> str:
    """Headline table per task, one column per checkpoint; intervals are 95% bootstrap over documents."""
    results = report["checkpoints"]
    names = list(results)
    lines = ["# legalpt evaluation", ""]
    lines += [f"- checkpoint {i + 1}: `{name}`" for i, name in enumerate(names)]
    if data := report.get("data"):  # absent when no task scored documents or examples
        unit = data.get("unit", "documents")  # response_loss scores fine-tuning examples
        scope = f"every {unit.removesuffix('s')}" if data["scope"] == "all" else "the held-out split"
        lines += [f"- eval set: `{report['eval_set']['path']}`"] if "eval_set" in report else []
        lines.append(
            f"- {unit} scored: {data['documents']} of {scope}; "
            f"{data['excluded_training']} left out as training {unit} of the checkpoint(s)"
        )
    header = "| metric | " + " | ".join(f"checkpoint {i + 1}" for i in range(len(names))) + " |"
    for task in (task for task in EVAL_TASKS if any(task in r for r in results.values())):
        if task == "harness":  # the harness's own numbers: each with its standard error, not an interval
            lines += ["", "## harness", "", *harness.markdown(results)]
            continue
        rows = {name: headline(results[name].get(task, {})) for name in names}
        keys = list(dict.fromkeys(key for row in rows.values() for key in row))
        lines += ["", f"## {task}", "", header, "|---" * (len(names) + 1) + "|"]
        for key in keys:
            cells = [format_value(rows[name][key]) if key in rows[name] else "–" for name in names]
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_citations(results: dict, out_dir: Path) -> list[Path]:
    """One PNG per breakdown of full-citation exact match, one bar series (with 95% interval) per checkpoint."""
    paths = []
    for key, title, xlabel in PLOTS:
        series = {name: r["citations"]["full"].get(key, []) for name, r in results.items() if "citations" in r}
        buckets = list(dict.fromkeys(row["bucket"] for rows in series.values() for row in rows if row["items"]))
        if not buckets:
            continue
        fig, ax = plt.subplots(figsize=(9, 4.5))
        width = 0.8 / len(series)
        for i, (name, rows) in enumerate(series.items()):
            by_bucket = {row["bucket"]: row for row in rows}
            xs = [j + i * width for j in range(len(buckets))]
            means = [by_bucket[b]["mean"] if b in by_bucket else math.nan for b in buckets]
            pairs = list(zip(buckets, means, strict=True))
            errors = [
                [max(0.0, m - by_bucket[b]["low"]) if b in by_bucket else 0 for b, m in pairs],
                [max(0.0, by_bucket[b]["high"] - m) if b in by_bucket else 0 for b, m in pairs],
            ]
            ax.bar(xs, means, width=width, yerr=errors, capsize=2, label=f"checkpoint {i + 1}: {name}")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(buckets))], buckets, rotation=45, ha="right", fontsize=8)
        ax.set(title=title, xlabel=xlabel, ylabel="exact match", ylim=(0, 1.05))
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"citations_{key}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def log_to_wandb(report: dict, plots: list[Path], out_dir: Path, project: str) -> None:
    """Headline metrics and plots as one wandb run (offline unless an API key is set), job type `eval`."""
    import wandb

    wandb_offline_unless_keyed()
    run = wandb.init(project=project, dir=str(out_dir), job_type="eval", config=report["config"])
    for i, (name, result) in enumerate(report["checkpoints"].items()):
        metrics = {f"checkpoint{i + 1}/{task}/{key}": (value["mean"] if is_interval(value) else value)
                   for task in EVAL_TASKS if task in result
                   for key, value in headline(result[task]).items()}  # fmt: skip
        if "harness" in result:
            metrics[f"checkpoint{i + 1}/harness/lm_eval_version"] = result["harness"]["lm_eval_version"]
        run.summary.update({**metrics, f"checkpoint{i + 1}/name": name})
    run.log({path.stem: wandb.Image(str(path)) for path in plots})
    if rows := report.get("forgetting"):
        run.log({"harness_forgetting": wandb.Table(columns=list(rows[0]), data=[list(r.values()) for r in rows])})
    run.finish()


def write_report(report: dict, out_dir: Path, logger: str, project: str) -> list[Path]:
    """Write report.json, report.md and the plots into `out_dir` (and wandb); return the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "report.json", out_dir / "report.md"
    json_path.write_text(json.dumps(report, indent=2, default=str))
    md_path.write_text(markdown(report))
    plots = plot_citations(report["checkpoints"], out_dir)
    if logger == "wandb" and os.environ.get("WANDB_MODE") != "disabled":
        log_to_wandb(report, plots, out_dir, project)
    return [json_path, md_path, *plots]
