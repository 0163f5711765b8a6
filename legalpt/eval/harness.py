"""lm-evaluation-harness (`lm-eval`) tasks as a `legalpt-eval` task, and the forgetting table of two checkpoints.

Any task, group or tag the harness knows (LegalBench's tasks, `mmlu_professional_law`, general tasks such as
`hellaswag` to measure forgetting), or of task YAMLs under `eval.harness.include_path`, runs on the model
`legalpt-eval` already loaded: it goes to the harness's HF model class (`HFLM(pretrained=model)`), so the harness
scores the same weights at the same precision with the same attention (`model.attn_implementation`, legalpt's
kernels by default) as every other task. The report keeps the harness's own numbers (each metric with its standard
error), its version, and the few-shot count and limit they were produced with.

With two checkpoints, `forgetting` lines them up per task and metric: base (`eval.checkpoint`), new
(`eval.compare`), and the change, marked worse where it goes against the harness's `higher_is_better`.

lm-eval is imported here only, inside the functions, so importing legalpt never imports it.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

from legalpt.config import HarnessConfig

LIST_TASKS = "list them with `lm-eval ls tasks` (add --include_path <folder> for your own)"


@functools.cache
def task_manager(include_path: str | None):
    """The harness's task index (its own tasks, then those under `include_path`): built once per process, as
    indexing its ~15,000 task files takes seconds."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path)


def check_tasks(cfg: HarnessConfig) -> None:
    """That lm-eval is installed and knows every name in `cfg.tasks`, before any model loads; raises ValueError."""
    try:
        import lm_eval
    except ImportError:
        raise ValueError("eval.harness.tasks: needs lm-eval: pip install 'legalpt[harness]'") from None
    if cfg.include_path is not None and not Path(cfg.include_path).expanduser().is_dir():
        raise ValueError(f"eval.harness.include_path: expected a folder of task YAMLs, got {cfg.include_path!r}")
    known = set(task_manager(_include_path(cfg)).all_tasks)
    unknown = [name for name in cfg.tasks if name not in known and not _is_task_file(name)]
    if unknown:
        where = f"lm-eval {lm_eval.__version__}" + (f" or {cfg.include_path}" if cfg.include_path else "")
        raise ValueError(f"eval.harness.tasks: unknown {unknown} (no task, group or tag of {where}); {LIST_TASKS}")


def check_data(cfg: HarnessConfig) -> None:
    """That the data of every task in `cfg.tasks` can be read (from the hub, its cache or local files), before any
    model loads, rather than after the other tasks ran; raises ValueError. What is read stays in `datasets`' cache."""
    try:
        task_manager(_include_path(cfg)).load(list(cfg.tasks))
    except OSError as error:  # FileNotFoundError of a missing file or dataset, ConnectionError without the hub
        raise ValueError(
            f"eval.harness.tasks: a task's data cannot be read: {str(error).splitlines()[0]} (a task YAML's "
            "data_files are read relative to the working directory)"
        ) from None


def run_harness(model, tokenizer, cfg: HarnessConfig, batch_size: int, bootstrap: int) -> dict:
    """The harness's results for `cfg.tasks` on `model` (already on its device and precision), summarized.

    `bootstrap` resamples give the standard errors of metrics that are no plain mean (0: no standard errors)."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    if cfg.apply_chat_template and not getattr(tokenizer, "chat_template", None):
        raise ValueError("eval.harness.apply_chat_template: the checkpoint's tokenizer has no chat template")
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=cfg.batch_size or batch_size)
    limit = cfg.limit if cfg.limit is None or cfg.limit < 1 else int(cfg.limit)
    output = lm_eval.simple_evaluate(
        model=lm,
        tasks=list(cfg.tasks),
        num_fewshot=cfg.num_fewshot,
        limit=limit,
        bootstrap_iters=bootstrap,
        log_samples=cfg.log_samples,
        apply_chat_template=cfg.apply_chat_template,
        task_manager=task_manager(_include_path(cfg)),
    )
    return {
        "lm_eval_version": lm_eval.__version__,
        "limit": limit,
        "num_fewshot": cfg.num_fewshot,
        "apply_chat_template": cfg.apply_chat_template,
        "attn_implementation": model.config._attn_implementation,
        "dtype": str(output["config"].get("model_dtype")),
        "tasks": summarize(output),
        **({"samples": samples(output)} if cfg.log_samples else {}),
    }


def samples(output: dict) -> dict[str, list[dict]]:
    """Per task, each scored example of a `simple_evaluate(log_samples=True)` output: its id, prompt (the first
    request's context), target, answers after the task's filters, metric values and the harness's prompt hash."""
    rows = {}
    for task, logged in output["samples"].items():
        rows[task] = [
            {
                "doc_id": sample["doc_id"],
                "prompt": sample["arguments"][0][0],
                "prompt_hash": sample["prompt_hash"],
                "target": sample["target"],
                "filtered_resps": sample["filtered_resps"],
                "metrics": {metric: _plain(sample[metric]) for metric in sample["metrics"]},
            }
            for sample in logged
        ]
    return rows


def summarize(output: dict) -> dict[str, dict]:
    """Per task and group of a `simple_evaluate` output, by name: its metrics and their standard errors (keyed as the
    harness keys them, `metric` or `metric,filter` where a task filters its answers; an error the harness did not
    compute is left out), the examples scored, the few-shot count used, the task's version, and which way each
    metric is better. Groups also list their tasks."""
    tasks = {}
    for name, row in output["results"].items():
        metrics, stderr = {}, {}
        for key, value in row.items():
            metric, comma, filter_name = key.partition(",")
            if not comma or isinstance(value, bool) or not isinstance(value, int | float):
                continue  # names, aliases, and an error of "N/A"
            shown = metric if filter_name == "none" else f"{metric},{filter_name}"
            if metric.endswith("_stderr"):
                stderr[shown.replace("_stderr", "", 1)] = float(value)  # float(): numpy scalars are no JSON
            else:
                metrics[shown] = float(value)
        tasks[name] = {
            "metrics": metrics,
            "stderr": stderr,
            "examples": row.get("sample_len"),
            "num_fewshot": output["n-shot"].get(name),
            "version": str(output["versions"].get(name)),
            "higher_is_better": output["higher_is_better"].get(name, {}),
        }
        if name in output.get("group_subtasks", {}):
            tasks[name]["subtasks"] = list(output["group_subtasks"][name])
    return tasks


def _plain(value):
    """A numpy scalar as the Python number JSON can hold; anything else as it is."""
    return value.item() if hasattr(value, "item") else value


def forgetting(results: dict[str, dict]) -> list[dict]:
    """Per task and metric both of two checkpoints' harness results hold: base (the first checkpoint), new (the
    second), delta = new - base, and whether the change is worse by the metric's direction."""
    base, new = (result["harness"]["tasks"] for result in results.values())
    rows = []
    for task, row in base.items():
        other = new.get(task, {}).get("metrics", {})
        for metric, value in row["metrics"].items():
            if metric not in other:
                continue
            delta = other[metric] - value
            higher = row["higher_is_better"].get(metric.partition(",")[0], True)
            worse = bool(delta < 0 if higher else delta > 0)
            rows.append({"task": task, "metric": metric, "base": value, "new": other[metric], "delta": delta,
                         "worse": worse})  # fmt: skip
    return rows


def markdown(results: dict[str, dict]) -> list[str]:
    """The harness section of report.md: one row per task and metric, one column per checkpoint (value ± standard
    error), and with two checkpoints the change from the first to the second (the forgetting table)."""
    harness = {name: result["harness"] for name, result in results.items() if "harness" in result}
    first = next(iter(harness.values()))
    lines = [
        f"lm-eval {first['lm_eval_version']}; {_scope(first['limit'])}; attention {first['attn_implementation']}, "
        f"{first['dtype']}; chat template {'on' if first['apply_chat_template'] else 'off'}",
        "",
    ]
    deltas = {}
    header = ["task", "metric", "shots", *(f"checkpoint {i + 1}" for i in range(len(harness)))]
    if len(harness) == 2:
        deltas = {(row["task"], row["metric"]): row for row in forgetting(results)}
        lines += ["Forgetting: Δ = checkpoint 2 − checkpoint 1 (eval.compare − eval.checkpoint); *worse* where it goes "
                  "against the metric's direction.", ""]  # fmt: skip
        header.append("Δ")
    lines += ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for task, row in first["tasks"].items():
        for metric in row["metrics"]:
            cells = [task, metric, str(row["num_fewshot"])]
            cells += [_with_stderr(h["tasks"].get(task, {}), metric) for h in harness.values()]
            if deltas:
                change = deltas.get((task, metric))
                cells.append(f"{change['delta']:+.4g}" + (" *worse*" if change["worse"] else "") if change else "–")
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _scope(limit: float | None) -> str:
    if limit is None:
        return "every example"
    return f"{limit:.0%} of each task's examples" if limit < 1 else f"the first {limit} examples of each task"


def _with_stderr(row: dict, metric: str) -> str:
    value = row.get("metrics", {}).get(metric)
    if value is None or math.isnan(value):
        return "–"
    error = row["stderr"].get(metric)
    return f"{value:.4g}" + (f" ± {error:.2g}" if error is not None else "")


def _include_path(cfg: HarnessConfig) -> str | None:
    return str(Path(cfg.include_path).expanduser()) if cfg.include_path else None


def _is_task_file(name: str) -> bool:
    """The harness also takes a task YAML's path in place of a name."""
    return name.endswith((".yaml", ".yml")) and Path(name).expanduser().is_file()
