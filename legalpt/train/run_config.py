"""What a run folder remembers of its config, and how a later start in the folder continues that run.

A run folder (train.output_dir) keeps, next to its checkpoints:

    config.yaml     the resolved config the run started with (written when a start finds no checkpoint to resume)
    resumes.jsonl   one line per start that resumed a checkpoint: its step and the settings it changed

The run's config is the record with each resume's changes applied. On the command line a start in a folder that holds
a run continues that config, changed only where its overrides say (`restore`); the trainer then checks what a resume
changes (`note_start`). A resume may change how the run goes on (train.steps to extend it, train.log_every, logger,
eval.*), but not the model or the token stream its checkpoints were trained on: a changed model.* setting (other than
`WEIGHT_NEUTRAL`) or data.* setting (other than `STREAM_NEUTRAL`) is refused with one line naming the keys.
Hydra's `.hydra/` holds the config each launch ran with, rewritten by every launch; config.yaml is the run's own and a
resume never rewrites it.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from legalpt.config import Config, ConfigError
from legalpt.train.checkpoint import read_state, resolve_resume

log = logging.getLogger(__name__)

RECORD = "config.yaml"
RESUMES = "resumes.jsonl"
# The data settings a resume may change: where prepared data is kept, how many workers prepare it, and which other
# tokenizers the data report compares. Every other data.* setting shapes the token stream the checkpoints were
# trained on, and every model.* setting the model they hold.
STREAM_NEUTRAL = frozenset({"data.cache_dir", "data.output_dir", "data.num_proc", "data.compare_tokenizers"})
# The model settings a resume may change: how attention is computed (kernels, sdpa, eager), not the weights; switching
# is how one checks a run against another attention implementation.
WEIGHT_NEUTRAL = frozenset({"model.attention_backend", "model.attn_implementation"})
FOLDER_KEY = "train.output_dir"  # names the folder itself, which a resume may spell another way
_UNSET = object()


def run_folder(output_dir: str) -> Path:
    """The run folder a train.output_dir names (as `legalpt.runtime.agree_on_run_dir` resolves it)."""
    return Path(output_dir).expanduser().resolve()


def run_config(run_dir: Path) -> DictConfig | None:
    """The config the run in `run_dir` last trained with: its record with each resume's changes; None without one."""
    record = run_dir / RECORD
    if not record.is_file():
        return None
    try:
        config = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(record))
    except OmegaConfBaseException as error:  # a record of another version's schema, or no config at all
        raise ConfigError(
            f"{FOLDER_KEY}: {record} is not a legalpt run config ({str(error).splitlines()[0]})"
        ) from None
    resumes = run_dir / RESUMES
    for line in resumes.read_text().splitlines() if resumes.is_file() else []:
        for key, value in json.loads(line)["overrides"].items():
            OmegaConf.update(config, key, value, merge=False)
    return config


def restore(cfg: DictConfig, overrides: Iterable[str]) -> DictConfig:
    """The config a command line trains with: `cfg` (what it composed) in a new run folder; in one that holds a run,
    that run's config with the settings its `overrides` name taken from `cfg`.

    A resume that would change the model or the token stream raises ConfigError, before anything is written."""
    run_dir = run_folder(cfg.train.output_dir)
    recorded = run_config(run_dir)
    if recorded is None:
        return cfg
    config, composed = copy.deepcopy(recorded), copy.deepcopy(cfg)
    OmegaConf.resolve(composed)  # its values as this command line resolves them (${now:...} included)
    for path in override_paths(overrides):
        OmegaConf.update(config, path, OmegaConf.select(composed, path), merge=False)
    if resolve_resume(config.train.resume, run_dir) is not None:
        resume_overrides(run_dir, recorded, config)
    return config


def override_paths(overrides: Iterable[str]) -> list[str]:
    """Where each command-line override lands: its key (train.steps=20), its group (model=125m: model), or the
    package a group option goes to (+source@data.sources.extra=wikipedia: data.sources.extra)."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return [override.package or override.key_or_group for override in parsed]


def resume_overrides(run_dir: Path, before: DictConfig, after: DictConfig | Config) -> dict[str, Any]:
    """The settings (dotted key → new value) in which `after` differs from the run's config `before`; ConfigError,
    naming the keys, if any of them changes the model or the token stream."""
    old, new = _settings(before), _settings(after)
    changed = [key for key in sorted(old.keys() | new.keys()) if old.get(key, _UNSET) != new.get(key, _UNSET)]
    changed = [key for key in changed if key != FOLDER_KEY]
    refused = [key for key in changed if _fixed_on_resume(key)]
    if refused:
        values = ", ".join(f"{key}={old.get(key)!r} → {new.get(key)!r}" for key in refused)
        raise ConfigError(
            f"{', '.join(refused)}: cannot change when resuming the run in {run_dir} ({values}); "
            "train another model or data in a new train.output_dir"
        )
    return {key: new.get(key) for key in changed}


def note_start(accelerator: Accelerator, run_dir: Path, config: Config) -> Path | None:
    """Keep the run folder's account of its config. A start with no checkpoint to resume is the run's start: its
    config becomes the record (replacing one of a start that never reached a checkpoint). A resume is checked against
    the run's config (ConfigError on a model or token-stream change) and appends its step and changes to
    resumes.jsonl; a resume into a folder without a record (train.resume=<another run's checkpoint>) records it.
    Returns the checkpoint the run resumes from, None for a start."""
    checkpoint = resolve_resume(config.train.resume, run_dir)
    before = run_config(run_dir) if checkpoint is not None else None
    accelerator.wait_for_everyone()  # every rank has read the folder before rank 0 writes to it
    if before is None:
        if accelerator.is_main_process:
            _write_record(run_dir, config)
        return checkpoint
    changes = resume_overrides(run_dir, before, config)
    step, _ = read_state(checkpoint)
    if changes:
        log.info("resuming at step %d with %s", step, ", ".join(f"{key}={value!r}" for key, value in changes.items()))
    if accelerator.is_main_process:
        with (run_dir / RESUMES).open("a") as resumes:
            resumes.write(json.dumps({"step": step, "overrides": changes}) + "\n")
    return checkpoint


def _fixed_on_resume(key: str) -> bool:
    """A setting of the model, of what trains in it, or of the token stream: what the checkpoints were trained with."""
    if key.startswith("model."):
        return key not in WEIGHT_NEUTRAL
    if key.startswith("train.lora."):  # the adapters a checkpoint holds; only the export's form may change
        return key != "train.lora.export"
    return key.startswith("data.") and key not in STREAM_NEUTRAL


def _write_record(run_dir: Path, config: Config) -> None:
    """Write config.yaml whole or not at all (a half-written record would fail every resume), and drop the resumes
    of an earlier record."""
    partial = run_dir / f"{RECORD}.partial"
    partial.write_text(OmegaConf.to_yaml(OmegaConf.structured(config)))
    partial.replace(run_dir / RECORD)
    (run_dir / RESUMES).unlink(missing_ok=True)


def _settings(config: DictConfig | Config) -> dict[str, Any]:
    """Every setting of `config` by its dotted key; a list is one setting."""
    flat: dict[str, Any] = {}

    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict):
            for name, child in node.items():
                walk(child, f"{key}.{name}" if key else str(name))
        else:
            flat[key] = node

    walk(OmegaConf.to_container(OmegaConf.structured(config), resolve=True), "")
    return flat
