"""Hydra entry points: `legalpt-train`, `legalpt-prepare`, `legalpt-eval`, and the check that runs before them.

Each is a thin `@hydra.main` wrapper around a plain function that tests call directly with a composed config.
`--help` lists the config groups (model, data, train, eval) and the resolved defaults. `ValidateConfig`, a Hydra
callback named in conf/config.yaml, checks the composed config before Hydra creates the run folder.
"""

from __future__ import annotations

import copy
import logging
import os
from typing import Any

import hydra
from hydra.experimental.callback import Callback
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
    exits itself."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
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


def _exit_if_invalid(config: DictConfig) -> None:
    job = copy.deepcopy(config)
    with open_dict(job):
        del job["hydra"]  # the command's config, as Hydra hands it to the task function
    try:
        legalpt.config.to_config(job)
    except legalpt.config.ConfigError as error:
        raise SystemExit(str(error)) from None
    except OmegaConfBaseException as error:  # a missing mandatory value (???) or an interpolation that fails
        first = str(error).splitlines()[0]
        raise SystemExit(first if error.full_key in first else f"{error.full_key}: {first}") from None


@hydra.main(version_base="1.3", config_path=CONF, config_name="train")
def train_main(cfg: DictConfig) -> None:
    from legalpt.train.trainer import train

    train(cfg)


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
