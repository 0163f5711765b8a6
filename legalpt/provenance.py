"""Where a measurement came from: the commit it ran on, for the records that benchmark scripts write."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def commit() -> str:
    """LEGALPT_COMMIT if set (the GPU machine gets a copy of the tree without .git), else git's short HEAD."""
    if os.environ.get("LEGALPT_COMMIT"):
        return os.environ["LEGALPT_COMMIT"]
    try:
        found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    except OSError:
        return "unknown"
    return found.stdout.strip() or "unknown"
