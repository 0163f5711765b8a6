"""Experiment tracking: wandb through accelerate's tracker API, plus a local metrics.jsonl in every run folder.

wandb runs offline (its folder inside the run folder) unless an API key is configured, so a fresh machine never
blocks on a login prompt (`legalpt.runtime.wandb_offline_unless_keyed`); `logger=none` turns it off. metrics.jsonl is
written whatever the logger, by rank 0 only; a resume drops its lines past the checkpoint, and a last line that a
crash cut short.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path

from accelerate import Accelerator

from legalpt.config import LOGGERS
from legalpt.runtime import wandb_offline_unless_keyed

log = logging.getLogger(__name__)


def tracker_name(logger: str) -> str | None:
    """The accelerate `log_with` value for a `logger` setting (None also when WANDB_MODE=disabled)."""
    if logger not in LOGGERS:
        raise ValueError(f"logger={logger!r}: expected one of {', '.join(LOGGERS)}")
    if logger == "none" or os.environ.get("WANDB_MODE") == "disabled":
        return None
    return logger


def start_tracking(accelerator: Accelerator, logger: str, project: str, run_dir: Path, config: dict) -> str | None:
    """Start the tracker on rank 0; return where its run lives (or None when off)."""
    if tracker_name(logger) is None:
        return None
    wandb_offline_unless_keyed()
    # One wandb run per run folder: a resumed job continues it instead of starting another.
    id_file = run_dir / "wandb_run_id"
    if accelerator.is_main_process and not id_file.exists():
        id_file.write_text(uuid.uuid4().hex[:12])
    accelerator.wait_for_everyone()
    wandb_kwargs = {"dir": str(run_dir), "name": run_dir.name, "id": id_file.read_text().strip(), "resume": "allow"}
    accelerator.init_trackers(project, config=config, init_kwargs={"wandb": wandb_kwargs})
    if not accelerator.is_main_process:
        return None
    files = Path(accelerator.get_tracker("wandb", unwrap=True).dir)  # <run_dir>/wandb/<run>/files
    return str(files.parent)


def readable_lines(path: Path) -> list[tuple[str, int]]:
    """(line, step) of every line of a metrics.jsonl that holds a JSON object with a step. Others are dropped with a
    warning: a last line cut short by a process that died while writing it, or a line damaged by hand."""
    lines = path.read_text(errors="replace").splitlines()  # a cut may split a character
    readable = []
    for number, line in enumerate(lines, 1):
        try:
            readable.append((line, int(json.loads(line)["step"])))
        except (ValueError, KeyError, TypeError) as error:  # TypeError: valid JSON, but not an object
            what = "its last line, cut short" if number == len(lines) else f"line {number}, damaged"
            log.warning("%s: dropping %s (%s)", path, what, error)
    return readable


def logged(run_dir: Path, name: str) -> list[tuple[int, float]]:
    """(step, value) of every readable line of the run's metrics.jsonl that holds `name`: the run's whole history,
    across the processes that resumed it."""
    path = run_dir / "metrics.jsonl"
    entries = [(step, json.loads(line)) for line, step in readable_lines(path)] if path.is_file() else []
    return [(step, entry[name]) for step, entry in entries if name in entry]


class MetricsLog:
    """Appends one JSON object per logged step to `<run_dir>/metrics.jsonl` and forwards it to the tracker."""

    def __init__(self, accelerator: Accelerator, run_dir: Path, start_step: int):
        self.accelerator = accelerator
        self.path = run_dir / "metrics.jsonl"
        if accelerator.is_main_process and self.path.exists():
            # A resumed run repeats the steps after its checkpoint: drop their old lines.
            kept = [line for line, step in readable_lines(self.path) if step <= start_step]
            partial = self.path.with_name(self.path.name + ".partial")
            partial.write_text("".join(line + "\n" for line in kept))
            partial.replace(self.path)  # the history stays whole if the process dies while it is rewritten

    def log(self, step: int, values: dict[str, float | str]) -> None:
        self.accelerator.log(values, step=step)
        if self.accelerator.is_main_process:
            with self.path.open("a") as f:
                f.write(json.dumps({"step": step, **values}) + "\n")
