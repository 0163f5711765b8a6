"""What train and eval share: mixed precision, the run folder and its HF export, and the main process's logging.

Rank 0 alone writes logs and wandb; every rank uses the run folder rank 0 chose. Neither `legalpt.train` nor
`legalpt.eval` is imported here, so both can depend on this module without depending on each other.
"""

from __future__ import annotations

import logging
import netrc
import os
from pathlib import Path
from urllib.parse import urlparse

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list

from legalpt.config import MIXED_PRECISIONS

EXPORT_DIR = "hf"  # the run folder's final model and tokenizer: a standard HF folder anyone can load


def mixed_precision(setting: str) -> str:
    """accelerate's mixed_precision for `train.mixed_precision` (auto = bf16 on GPUs that support it)."""
    if setting not in MIXED_PRECISIONS:
        raise ValueError(f"train.mixed_precision={setting!r}: expected one of {', '.join(MIXED_PRECISIONS)}")
    if setting == "auto":
        return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"
    return setting


def export_dir(run_dir: Path) -> Path:
    """Where a run folder keeps its HF export."""
    return run_dir / EXPORT_DIR


def agree_on_run_dir(accelerator: Accelerator, output_dir: str) -> Path:
    """Rank 0's run folder for every rank (a timestamp may resolve differently on each)."""
    chosen = [str(Path(output_dir).expanduser().resolve())]
    broadcast_object_list(chosen, from_process=0)
    run_dir = Path(chosen[0])
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    return run_dir


def on_local_main_process() -> bool:
    """Whether this process is its machine's first (LOCAL_RANK unset or 0, as launchers set it): the one that shows
    progress bars, without an Accelerator at hand."""
    return int(os.environ.get("LOCAL_RANK", "0")) == 0


def log_on_main_process_only(accelerator: Accelerator) -> None:
    """legalpt's info messages from rank 0 alone; warnings and errors from every rank."""
    if not accelerator.is_main_process:
        logging.getLogger("legalpt").setLevel(logging.WARNING)


def wandb_offline_unless_keyed() -> None:
    """Run wandb offline when no API key is configured, so a fresh machine never stops at a login prompt.

    The key is looked up where wandb keeps it (WANDB_API_KEY, else the netrc entry of its host) without asking
    wandb itself: reading `wandb.api.api_key` settles wandb's settings as online before WANDB_MODE can be set.
    """
    if "WANDB_MODE" not in os.environ and not _wandb_key_configured():
        os.environ["WANDB_MODE"] = "offline"


def _wandb_key_configured() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):  # no netrc file, or one wandb could not read either
        return False
