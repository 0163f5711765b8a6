"""Where a measurement came from: the commit it ran on, for the records that benchmark scripts write."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


CODE = ("legalpt", "csrc", "scripts", "conf", "pyproject.toml")  # what a measurement's figures depend on


def commit() -> str:
    """LEGALPT_COMMIT if set (the GPU machine's copy of the tree may carry a stale .git), else git's short HEAD,
    with "-dirty" when the code differs from it (edited or new files under CODE)."""
    if os.environ.get("LEGALPT_COMMIT"):
        return os.environ["LEGALPT_COMMIT"]
    try:
        head = _git("rev-parse", "--short", "HEAD")
        changed = _git("status", "--porcelain", "--", *CODE)
    except OSError:
        return "unknown"
    return f"{head}-dirty" if head and changed else head or "unknown"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO).stdout.strip()
