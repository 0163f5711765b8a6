"""`legalpt-eval`: held-out loss and perplexity of a checkpoint, written as a JSON report.

With no arguments it evaluates the newest run's HF export (under `eval.runs_dir`) on the held-out split of the
configured corpus, using that checkpoint's own tokenizer.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from accelerate import Accelerator
from accelerate.logging import get_logger
from omegaconf import DictConfig

from legalpt.config import Config, to_config
from legalpt.data.pipeline import prepare
from legalpt.eval.perplexity import heldout_loss
from legalpt.model import build_model
from legalpt.train.checkpoint import export_dir
from legalpt.train.trainer import make_loader, mixed_precision

# accelerate's logger: rank 0 alone writes, whatever the number of processes.
log = get_logger(__name__)


def newest_export(runs_dir: Path) -> Path:
    """The most recently written HF export among the run folders in `runs_dir`."""
    exports = [p.parent for p in runs_dir.expanduser().glob("*/hf/config.json")]
    if not exports:
        raise FileNotFoundError(
            f"eval.runs_dir={str(runs_dir)!r}: no run with an HF export (*/hf/config.json); "
            "train one with legalpt-train or pass eval.checkpoint=<folder or hub id>"
        )
    return max(exports, key=lambda p: (p / "config.json").stat().st_mtime)


def resolve_checkpoint(cfg: Config) -> str:
    """`eval.checkpoint` (a run folder means its export) or the newest run's export."""
    if cfg.eval.checkpoint is None:
        return str(newest_export(Path(cfg.eval.runs_dir)))
    path = Path(cfg.eval.checkpoint).expanduser()
    if (export_dir(path) / "config.json").is_file():
        return str(export_dir(path))
    return cfg.eval.checkpoint


def default_report_path(checkpoint: str) -> Path:
    """eval.json inside a local checkpoint folder; in the working directory for a hub id."""
    folder = Path(checkpoint).expanduser()
    return folder / "eval.json" if folder.is_dir() else Path("eval.json")


def evaluate(cfg: DictConfig | Config) -> dict:
    """Evaluate the checkpoint `cfg` names; return the report that is also written as JSON."""
    cfg = to_config(cfg)
    checkpoint = resolve_checkpoint(cfg)
    accelerator = Accelerator(mixed_precision=mixed_precision(cfg.train.mixed_precision))
    data = prepare(cfg.data, checkpoint)
    model = accelerator.prepare(build_model(dataclasses.replace(cfg.model, pretrained=checkpoint), data.tokenizer))
    loader = make_loader(data.heldout, cfg.eval.batch_size, accelerator, seed=None)
    metrics = heldout_loss(model, loader, cfg.eval.max_batches, lambda t: accelerator.reduce(t, "sum"))
    report = {"checkpoint": checkpoint, "heldout_documents": data.stats["heldout"]["documents"], **metrics}
    output = Path(cfg.eval.output or default_report_path(checkpoint))
    if accelerator.is_main_process:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(report, indent=2))
    log.info(
        "held-out loss %.4f, perplexity %.2f over %d tokens → %s",
        report["loss"],
        report["perplexity"],
        report["tokens"],
        output,
    )
    return report
