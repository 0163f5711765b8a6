"""Experiment tracking: wandb through accelerate's tracker API, plus a local metrics.jsonl in every run folder.

wandb runs offline (its folder inside the run folder) unless an API key is configured, so a fresh machine never
blocks on a login prompt (`legalpt.runtime.wandb_offline_unless_keyed`); `logger=none` turns it off. metrics.jsonl is
written whatever the logger, by rank 0 only.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from accelerate import Accelerator

from legalpt.config import LOGGERS
from legalpt.runtime import wandb_offline_unless_keyed


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


class MetricsLog:
    """Appends one JSON object per logged step to `<run_dir>/metrics.jsonl` and forwards it to the tracker."""

    def __init__(self, accelerator: Accelerator, run_dir: Path, start_step: int):
        self.accelerator = accelerator
        self.path = run_dir / "metrics.jsonl"
        if accelerator.is_main_process and self.path.exists():
            # A resumed run repeats the steps after its checkpoint: drop their old lines.
            lines = self.path.read_text().splitlines()
            kept = [line for line in lines if json.loads(line)["step"] <= start_step]
            self.path.write_text("".join(line + "\n" for line in kept))

    def log(self, step: int, values: dict[str, float | str]) -> None:
        self.accelerator.log(values, step=step)
        if self.accelerator.is_main_process:
            with self.path.open("a") as f:
                f.write(json.dumps({"step": step, **values}) + "\n")
