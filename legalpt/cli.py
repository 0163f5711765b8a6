"""Hydra entry points: `legalpt-train`, `legalpt-prepare`, `legalpt-eval`, and the check that runs before them.

Each is a thin `@hydra.main` wrapper around a plain function that tests call directly with a composed config.
`--help` lists the config groups (model, data, train, eval) and the resolved defaults. `ValidateConfig`, a Hydra
callback named in conf/config.yaml, checks the composed config before Hydra creates the run folder. A
`legalpt-train` in a run folder that holds a run continues that run's config (`legalpt.train.run_config.restore`),
and each job of a `-m` sweep trains in its own folder, `<train.output_dir>/<job number>` (conf/train.yaml).
"""

from __future__ import annotations

import copy
import logging
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, open_dict
from omegaconf.errors import OmegaConfBaseException

import legalpt.config  # registers the schema with Hydra's ConfigStore

log = logging.getLogger(__name__)
# Absolute, so the commands find the presets from any working directory (a relative path would be read as a
# Python package next to legalpt.cli when it runs as a console script).
CONF = str(legalpt.config.CONF_DIR)


class ValidateConfig(Callback):
    """Checks the composed config (`legalpt.config.to_config`) when a run starts, before Hydra creates its folder
    and before the command imports anything heavy: a bad value ends the command with one line naming its key, and
    leaves no run folder behind. For `legalpt-train` under a launcher (WORLD_SIZE set) it also checks that accelerate
    joins every launched process into one job. Hydra turns exceptions raised in callbacks into warnings, so this
    exits itself.

    In a run folder that holds a run, `legalpt-train` trains with that run's config, changed where the command line
    says: it replaces the composed config here, so that Hydra's .hydra/config.yaml shows what the job runs with, and
    a resume that would change the model or its data stops before Hydra writes anything."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.job.name == "train":
            _continue_recorded_run(config)
        _exit_if_invalid(config)
        if config.hydra.job.name == "train" and "WORLD_SIZE" in os.environ:  # started by torchrun or accelerate
            _exit_if_split_launch()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _exit_if_invalid(config)  # the base config; each job's swept values are checked by the command itself


def _exit_if_split_launch() -> None:
    """Stop a launch whose processes accelerate does not join into one job, before they write one run folder."""
    from legalpt.train.distributed import check_launch  # imports torch and accelerate

    try:
        check_launch()
    except RuntimeError as error:
        raise SystemExit(str(error)) from None


def _continue_recorded_run(config: DictConfig) -> None:
    """Replace the run's settings in Hydra's `config` by the run's config that `restore` gives; in a new run folder
    leave them as composed (still unresolved, so that Hydra's run folder and the job's agree on ${now:...})."""
    from legalpt.train.run_config import restore  # imports torch and accelerate

    job = _task_config(config)
    with _exit_on_bad_config():
        restored = restore(job, config.hydra.overrides.task)
    if restored is job:
        return
    with open_dict(config):
        for key in restored:
            config[key] = restored[key]


def _exit_if_invalid(config: DictConfig) -> None:
    with _exit_on_bad_config():
        legalpt.config.to_config(_task_config(config))


def _task_config(config: DictConfig) -> DictConfig:
    """The command's config, as Hydra hands it to the task function."""
    job = copy.deepcopy(config)
    with open_dict(job):
        del job["hydra"]
    return job


@contextmanager
def _exit_on_bad_config() -> Iterator[None]:
    """End the command with the one line that names the bad setting (or the missing checkpoint) instead of a trace."""
    try:
        yield
    except (legalpt.config.ConfigError, FileNotFoundError) as error:
        raise SystemExit(str(error)) from None
    except OmegaConfBaseException as error:  # a missing mandatory value (???) or an interpolation that fails
        first = str(error).splitlines()[0]
        raise SystemExit(first if error.full_key in first else f"{error.full_key}: {first}") from None


@hydra.main(version_base="1.3", config_path=CONF, config_name="train")
def train_main(cfg: DictConfig) -> None:
    from legalpt.train.checkpoint import CheckpointError
    from legalpt.train.interrupt import exit_status
    from legalpt.train.trainer import train

    if HydraConfig.get().mode == RunMode.MULTIRUN:
        with _exit_on_bad_config():
            cfg = _sweep_job(cfg)
    try:
        result = train(cfg)
    except legalpt.config.ConfigError as error:  # a sweep job's values, or a resume that would change its model
        raise SystemExit(str(error)) from None
    except CheckpointError as error:  # a full disk, an unwritable folder, a damaged checkpoint named by train.resume
        raise SystemExit(str(error)) from None
    except KeyboardInterrupt:  # Ctrl-C before training began, or a second one: nothing (more) is saved
        print("legalpt-train: interrupted, nothing saved since the last checkpoint", file=sys.stderr)
        raise SystemExit(exit_status(signal.SIGINT)) from None
    if result.stopped_by:  # a signal stopped it after a step and its checkpoint (legalpt.train.interrupt)
        raise SystemExit(exit_status(result.stopped_by))


def _sweep_job(cfg: DictConfig) -> DictConfig:
    """A `-m` job trains in Hydra's folder of the job, <train.output_dir>/<job number>, continuing the run there if it
    holds one (rerunning a sweep resumes each job in its own folder)."""
    from legalpt.train.run_config import restore

    hydra_config = HydraConfig.get()
    cfg.train.output_dir = hydra_config.runtime.output_dir
    return restore(cfg, hydra_config.overrides.task)


@hydra.main(version_base="1.3", config_path=CONF, config_name="prepare")
def prepare_main(cfg: DictConfig) -> None:
    config = legalpt.config.to_config(cfg)
    from legalpt.data.pipeline import format_stats, prepare

    data = prepare(config.data, config.model.pretrained)
    log.info("prepared\n%s", format_stats(data.stats))


@hydra.main(version_base="1.3", config_path=CONF, config_name="eval")
def eval_main(cfg: DictConfig) -> None:
    from legalpt.eval.run import CheckpointError, evaluate

    try:
        evaluate(cfg)
    except CheckpointError as error:  # checked before anything loads: one line naming the setting and the path
        raise SystemExit(str(error)) from None
