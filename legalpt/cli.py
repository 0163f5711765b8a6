"""Hydra entry points: `legalpt-train`, `legalpt-prepare`, `legalpt-eval`.

Each is a thin `@hydra.main` wrapper around a plain function that tests call directly with a composed config.
`--help` lists the config groups (model, data, train, eval) and the resolved defaults.
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

import legalpt.config  # registers the schema with Hydra's ConfigStore

log = logging.getLogger(__name__)
# Absolute, so the commands find the presets from any working directory (a relative path would be read as a
# Python package next to legalpt.cli when it runs as a console script).
CONF = str(legalpt.config.CONF_DIR)


@hydra.main(version_base="1.3", config_path=CONF, config_name="train")
def train_main(cfg: DictConfig) -> None:
    from legalpt.train.trainer import train

    train(cfg)


@hydra.main(version_base="1.3", config_path=CONF, config_name="prepare")
def prepare_main(cfg: DictConfig) -> None:
    from legalpt.data.pipeline import format_stats, prepare

    config = legalpt.config.to_config(cfg)
    data = prepare(config.data, config.model.pretrained)
    log.info("prepared\n%s", format_stats(data.stats))


@hydra.main(version_base="1.3", config_path=CONF, config_name="eval")
def eval_main(cfg: DictConfig) -> None:
    from legalpt.eval.run import evaluate

    evaluate(cfg)
