"""A run folder's record of its config: written at the run's start, restored and checked by a resume, which appends
its changes to resumes.jsonl; the end summary and wandb follow the run across resumes. The command line's resume
recipe and sweeps are tested in tests/test_cli.py."""

import json
import re

import pytest
from omegaconf import OmegaConf
from train_helpers import tiny_overrides as shared_tiny_overrides

import legalpt.train.trainer as trainer
from legalpt.config import ConfigError, compose, to_config
from legalpt.train.checkpoint import latest_checkpoint
from legalpt.train.run_config import override_paths, restore, resume_overrides


def tiny_overrides(tmp_path, *extra: str) -> list[str]:
    """A tiny run of one layer in rows of two, in tmp_path/run: 6 steps, checkpoints at 3 and 6."""
    return shared_tiny_overrides(
        tmp_path, "model.num_layers=1", "train.batch_size=2", f"train.output_dir={tmp_path / 'run'}", *extra
    )


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_resume_applies_and_notes_its_changes_and_leaves_the_record_untouched(tmp_path, train_until_first_checkpoint):
    run_dir = tmp_path / "run"
    train_until_first_checkpoint(compose("train", tiny_overrides(tmp_path)))
    record = (run_dir / "config.yaml").read_text()
    assert OmegaConf.load(run_dir / "config.yaml").model.num_layers == 1 and not (run_dir / "resumes.jsonl").exists()

    trainer.train(compose("train", tiny_overrides(tmp_path, "train.log_every=1")))
    assert (run_dir / "config.yaml").read_text() == record
    assert read_jsonl(run_dir / "resumes.jsonl") == [{"step": 3, "overrides": {"train.log_every": 1}}]
    logged_steps = [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in m]
    assert logged_steps == [2, 4, 5, 6]  # every 2 steps before the resume, every step after it


def test_a_resume_may_switch_how_attention_is_computed(tmp_path, train_until_first_checkpoint):
    run_dir = tmp_path / "run"
    train_until_first_checkpoint(compose("train", tiny_overrides(tmp_path, "model.attention_backend=auto")))

    trainer.train(compose("train", tiny_overrides(tmp_path, "model.attention_backend=reference")))
    changes = {"model.attention_backend": "reference"}
    assert read_jsonl(run_dir / "resumes.jsonl") == [{"step": 3, "overrides": changes}]
    assert OmegaConf.load(run_dir / "config.yaml").model.attention_backend == "auto"


def test_the_summary_compares_with_the_runs_first_eval_loss_after_a_resume(tmp_path, train_until_first_checkpoint):
    run_dir = tmp_path / "run"
    train_until_first_checkpoint(compose("train", tiny_overrides(tmp_path)))
    first = next(m["eval/loss"] for m in read_jsonl(run_dir / "metrics.jsonl") if m["step"] == 0)

    resumed = trainer.train(compose("train", tiny_overrides(tmp_path)))
    assert [step for step, _ in resumed.eval_losses] == [6]  # this process evaluated at the end only
    summary = re.findall(r"eval loss:  (\S+) → (\S+) \((\S+)× the first\)", (run_dir / "train.log").read_text())
    assert summary[-1] == (
        f"{first:.4f}",
        f"{resumed.eval_losses[-1][1]:.4f}",
        f"{resumed.eval_losses[-1][1] / first:.2f}",
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "model.num_layers=2",
            "model.num_layers: cannot change when resuming the run in {run} (model.num_layers=1 → 2)",
        ),
        ("data.seq_len=64", "data.seq_len: cannot change when resuming the run in {run} (data.seq_len=128 → 64)"),
    ],
)
def test_a_resume_that_would_change_the_model_or_its_data_is_refused(
    tmp_path, train_until_first_checkpoint, override, message
):
    run_dir = tmp_path / "run"
    train_until_first_checkpoint(compose("train", tiny_overrides(tmp_path)))
    record = (run_dir / "config.yaml").read_text()

    with pytest.raises(ConfigError) as refused:
        trainer.train(compose("train", tiny_overrides(tmp_path, override)))
    assert str(refused.value).startswith(message.format(run=run_dir.resolve()))
    assert (run_dir / "config.yaml").read_text() == record and not (run_dir / "resumes.jsonl").exists()
    assert latest_checkpoint(run_dir).name == "step_000003"


def test_a_resume_may_not_switch_lora_on_or_reshape_it_but_may_change_its_export(tmp_path):
    before = compose("train", tiny_overrides(tmp_path))
    for override in ("train.lora.enabled=true", "train.lora.r=4"):
        with pytest.raises(ConfigError, match=rf"^{re.escape(override.split('=')[0])}: cannot change when resuming"):
            resume_overrides(tmp_path, before, compose("train", tiny_overrides(tmp_path, override)))
    after = compose("train", tiny_overrides(tmp_path, "train.lora.export=adapter"))
    assert resume_overrides(tmp_path, before, after) == {"train.lora.export": "adapter"}


def test_a_start_that_never_reached_a_checkpoint_does_not_bind_the_folder(tmp_path):
    """A first start that fails before its first checkpoint (here: a mistyped corpus path) leaves a record; the
    corrected start is the run's real start and replaces it."""
    run_dir = tmp_path / "run"
    missing = tmp_path / "no such corpus"
    with pytest.raises(FileNotFoundError, match="no such corpus"):
        trainer.train(compose("train", tiny_overrides(tmp_path, f"data.paths=['{missing}']", "data=files")))
    assert OmegaConf.load(run_dir / "config.yaml").data.paths == [str(missing)]

    trainer.train(compose("train", tiny_overrides(tmp_path, "train.steps=2", "train.save_every=2")))
    assert OmegaConf.load(run_dir / "config.yaml").data.paths == []
    assert latest_checkpoint(run_dir).name == "step_000002"


def test_a_resume_continues_the_runs_wandb_run(tmp_path, monkeypatch, train_until_first_checkpoint):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    run_dir = tmp_path / "run"
    train_until_first_checkpoint(compose("train", tiny_overrides(tmp_path, "logger=wandb")))
    wandb.finish()  # the interrupted process's run ends with it
    run_id = (run_dir / "wandb_run_id").read_text().strip()

    result = trainer.train(compose("train", tiny_overrides(tmp_path, "logger=wandb")))
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    # one wandb run, logged twice: <time to the second>-<run id>, and "-1" after it when both start in one second
    named = re.compile(rf"offline-run-\d{{8}}_\d{{6}}-{run_id}(-1)?")
    assert len(runs) == 2 and all(named.fullmatch(run.name) for run in runs), [run.name for run in runs]
    assert result.wandb_dir == str(runs[-1])


def write_run(run_dir, overrides: list[str], resumes: list[dict]) -> None:
    """A run folder's record of a run started with `overrides`, and its resumes' lines."""
    run_dir.mkdir(parents=True)
    config = to_config(compose("train", [*overrides, f"train.output_dir={run_dir}"]))
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(config)))
    (run_dir / "resumes.jsonl").write_text("".join(json.dumps(resume) + "\n" for resume in resumes))


def test_restore_continues_the_runs_config_changed_only_where_the_command_line_says(tmp_path):
    run_dir = tmp_path / "run"
    write_run(
        run_dir, ["model=tiny", "model.num_layers=1", "train.steps=6"], [{"step": 6, "overrides": {"train.steps": 9}}]
    )

    def restored(*overrides: str):
        command_line = [f"train.output_dir={run_dir}", *overrides]
        return to_config(restore(compose("train", command_line), command_line))

    config = restored()
    assert (config.model.hidden_size, config.model.num_layers) == (64, 1)  # the tiny preset, one layer
    assert config.train.steps == 9  # as the last resume left it
    assert restored("train.steps=12", "train.log_every=5").train.log_every == 5
    assert restored("model=tiny", "model.num_layers=1").model.num_layers == 1  # the run's own command, repeated
    assert restored("model=small").model.hidden_size == 384  # a group's values (refused by a resume, not here)


def test_restore_in_a_new_folder_keeps_the_composed_config(tmp_path):
    command_line = [f"train.output_dir={tmp_path / 'new'}", "train.steps=7"]
    cfg = compose("train", command_line)
    assert restore(cfg, command_line) is cfg


@pytest.mark.parametrize(
    ("override", "path"),
    [
        ("train.steps=20", "train.steps"),
        ("model=125m", "model"),
        ("+source@data.sources.extra=wikipedia", "data.sources.extra"),
        ("'data.paths=[a, b]'", "data.paths"),
    ],
)
def test_override_paths_name_where_each_override_lands(override, path):
    assert override_paths([override.strip("'")]) == [path]
