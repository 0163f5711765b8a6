"""Test setup shared by the whole suite: offline hubs and trackers, the `cuda` marker's skip, and fixtures: seeded
randomness, the tiny model config, an interrupted training run, the scripts under scripts/ as modules; accelerate's
process-wide state cleared after each test."""

import os

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import importlib.util
import random
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState
from omegaconf import OmegaConf

from legalpt.config import CONF_DIR, ModelConfig


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    """Each test's Accelerator starts from scratch: accelerate keeps one AcceleratorState per process and refuses a
    second Accelerator of another mixed precision (a bare `Accelerator()` in one test, a bf16 training run in the
    next). The process group (PartialState) is kept, as a launched job keeps it."""
    yield
    AcceleratorState._reset_state()


@pytest.fixture
def rng() -> random.Random:
    """A freshly seeded random source (torch seeded alike); the seed is printed so a failure can be replayed."""
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    torch.manual_seed(seed)
    return random.Random(seed)


@pytest.fixture(scope="session")
def tiny_model_config() -> Callable[..., ModelConfig]:
    """A function of ModelConfig fields: the `tiny` preset (conf/model/tiny.yaml: a 2-layer Llama, hidden 64, 4 heads,
    2 kv heads, intermediate 128) with those fields overridden, as `model=tiny model.<field>=...` composes it."""
    preset = OmegaConf.load(CONF_DIR / "model" / "tiny.yaml")

    def make(**overrides) -> ModelConfig:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), preset, overrides))

    return make


@pytest.fixture
def deterministic_mode(monkeypatch) -> Callable[[], None]:
    """A function that turns torch's deterministic mode on for the rest of the test: an op without a deterministic
    kernel raises, naming itself; cuBLAS gets the workspace setting it asks for."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()

    def turn_on() -> None:
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)

    yield turn_on
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@pytest.fixture
def train_until_first_checkpoint(monkeypatch):
    """A function of a train config: runs legalpt.train.trainer.train on it until the first checkpoint is saved,
    then stops it there as a killed process would stop (tests of resuming call train again)."""
    import legalpt.train.trainer as trainer

    class Interrupted(Exception):
        pass

    def run(cfg) -> None:
        real_save = trainer.save_checkpoint

        def save_then_die(*args, **kwargs):
            real_save(*args, **kwargs)
            raise Interrupted

        monkeypatch.setattr(trainer, "save_checkpoint", save_then_die)
        with pytest.raises(Interrupted):
            trainer.train(cfg)
        monkeypatch.setattr(trainer, "save_checkpoint", real_save)

    return run


SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture
def load_script(monkeypatch) -> Callable:
    """load_script(name): scripts/<name>.py as a module, finding its imports as `python scripts/<name>.py` does
    (scripts/ first on the path) and registered under its name (dataclasses look their module up there)."""

    def load(name: str):
        monkeypatch.syspath_prepend(str(SCRIPTS))
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        return module

    return load
