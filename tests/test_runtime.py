"""What train and eval share: mixed precision settings, wandb on a fresh machine (offline unless a key is configured,
decided before wandb settles its settings), and eval's independence from train."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from accelerate.utils import PrecisionType

from legalpt import runtime
from legalpt.config import MIXED_PRECISIONS


def test_bad_mixed_precision_names_the_key():
    with pytest.raises(ValueError, match=r"train\.mixed_precision"):
        runtime.mixed_precision("fp8")


def test_every_mixed_precision_setting_is_one_accelerate_takes():
    for setting in MIXED_PRECISIONS:
        assert runtime.mixed_precision(setting) in {precision.value for precision in PrecisionType}


def test_eval_imports_no_training_code():
    """Train may run evaluation; eval only shares legalpt.runtime with it, so it never loads the training loop."""
    code = "import sys, legalpt.eval.run; assert not [m for m in sys.modules if m.startswith('legalpt.train')]"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.fixture
def bare_home(tmp_path, monkeypatch):
    """A home with no netrc and no wandb variables, like a fresh machine."""
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_no_key_means_offline(bare_home):
    runtime.wandb_offline_unless_keyed()
    assert os.environ["WANDB_MODE"] == "offline"


def test_a_netrc_key_or_an_explicit_mode_is_left_alone(bare_home, monkeypatch):
    netrc_file = bare_home / ".netrc"
    netrc_file.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    netrc_file.chmod(0o600)
    runtime.wandb_offline_unless_keyed()
    assert "WANDB_MODE" not in os.environ
    monkeypatch.setenv("WANDB_MODE", "disabled")
    runtime.wandb_offline_unless_keyed()
    assert os.environ["WANDB_MODE"] == "disabled"


def test_a_fresh_machine_starts_an_offline_run(bare_home):
    """The whole path in a clean process: wandb.init must not ask for a login (it did when wandb was asked first)."""
    code = (
        "from legalpt.runtime import wandb_offline_unless_keyed; wandb_offline_unless_keyed(); import wandb; "
        f"run = wandb.init(dir={str(bare_home)!r}, project='legalpt-test'); assert run.settings.mode == 'offline'; "
        "run.finish()"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env |= {"HOME": str(bare_home), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=bare_home, timeout=120)
