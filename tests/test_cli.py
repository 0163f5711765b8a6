"""The console scripts as a user runs them: help, bad configuration, missing files, prepare, train, eval."""

import json
import os
import subprocess
import sys

import pytest

from legalpt.config import compose, to_config
from legalpt.eval.run import evaluate, newest_export


def run_cli(command: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
    """Run `legalpt-<command>` the way its console script does, in a fresh process."""
    code = f"import sys; from legalpt.cli import {command}_main as main; sys.argv[0] = 'legalpt-{command}'; main()"
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


@pytest.mark.parametrize("command", ["train", "prepare", "eval"])
def test_help_lists_config_groups(command):
    result = run_cli(command, "--help")
    assert result.returncode == 0, result.stderr
    assert f"legalpt-{command}" in result.stdout
    groups = result.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    for group in ("model", "data", "train", "eval"):
        assert f"{group}:" in groups


def test_unknown_key_is_named(tmp_path):
    result = run_cli("train", "train.stepz=3", f"train.output_dir={tmp_path}")
    assert result.returncode != 0
    assert "stepz" in result.stderr


def test_wrong_type_is_named(tmp_path):
    result = run_cli("train", "train.steps=many", f"train.output_dir={tmp_path}")
    assert result.returncode != 0
    assert "train.steps" in result.stderr and "many" in result.stderr


@pytest.mark.parametrize(
    ("command", "override", "message"),
    [
        ("train", "model.attention_backend=fa4",
         "model.attention_backend: expected one of auto, reference, fa2, fa3, sdpa, flex, got 'fa4'"),
        ("prepare", "data=files",
         "data.paths: expected documents to read (data.synthetic_documents=0 turns the demo corpus off), got []"),
        ("eval", "eval.tasks=[rouge]",
         "eval.tasks: expected a subset of perplexity, citations, citation_set, choice, got ['rouge']"),
    ],
)  # fmt: skip
def test_a_bad_value_stops_with_one_line_and_no_run_folder(tmp_path, command, override, message):
    result = run_cli(command, override, cwd=tmp_path)
    assert result.returncode != 0
    assert result.stderr.splitlines() == [message] and result.stdout == ""
    assert list(tmp_path.iterdir()) == []  # nothing written: train's run folder (runs/<time>) was never made


def test_missing_file_is_named(tmp_path):
    missing = tmp_path / "no such folder" / "contracts.jsonl"
    result = run_cli("prepare", f"data.paths=['{missing}']", f"data.cache_dir={tmp_path}")
    assert result.returncode != 0
    assert str(missing) in result.stderr


@pytest.mark.parametrize(
    ("checkpoint", "expected"),
    [
        ("/nonexistent", "is not a folder and not a hub id"),
        ("not a model", "has no config.json: expected a Hugging Face model folder (a run's hf/ export"),
        ("a file.txt", "is a file: expected a Hugging Face model folder"),
        ("legalpt-tests/no-such-model", "is not in the local cache (HF_HUB_OFFLINE is set)"),
    ],
)
def test_a_checkpoint_that_is_no_model_stops_with_one_line(tmp_path, checkpoint, expected):
    (tmp_path / "not a model").mkdir()
    (tmp_path / "not a model" / "notes.txt").write_text("no model here")
    (tmp_path / "a file.txt").write_text("no model here")
    if not checkpoint.startswith(("/", "legalpt-tests")):
        checkpoint = str(tmp_path / checkpoint)
    result = run_cli("eval", f"eval.checkpoint='{checkpoint}'", "model=tiny", cwd=tmp_path)
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and result.stdout == "", result.stderr
    assert lines[0].startswith(f"eval.checkpoint: {checkpoint} ") and expected in lines[0]


def test_config_defaults_compose_to_the_demo_job():
    cfg = to_config(compose("train"))
    assert cfg.data.paths == [] and cfg.logger == "wandb"
    assert cfg.model.attn_implementation == "legalpt"
    assert cfg.train.output_dir.startswith("runs/")


def test_prepare_train_eval_from_the_command_line(tmp_path):
    common = [
        "model=tiny",
        "data.synthetic_documents=6",
        "data.seq_len=128",
        "data.vocab_size=400",
        f"data.cache_dir={tmp_path / 'cache'}",
    ]
    prepared = run_cli("prepare", *common)
    assert prepared.returncode == 0, prepared.stderr
    assert "train" in prepared.stdout + prepared.stderr

    run_dir = tmp_path / "runs" / "tiny"
    trained = run_cli(
        "train", *common, "train.steps=4", "train.eval_every=2", "train.batch_size=2", f"train.output_dir={run_dir}"
    )
    assert trained.returncode == 0, trained.stderr
    log = (run_dir / "train.log").read_text()
    for where in ("checkpoint:", "HF export:", "wandb run:", "log:"):
        assert where in log
    assert (run_dir / ".hydra" / "config.yaml").is_file()

    assert newest_export(tmp_path / "runs") == run_dir / "hf"
    small_eval = ["eval.citations.max_items=4", "eval.citations.set_documents=1", "eval.citations.set_new_tokens=8",
                  "eval.generation.max_new_tokens=8", "eval.perplexity_context=128", "eval.bootstrap=20"]  # fmt: skip
    evaluated = run_cli("eval", *common, *small_eval, f"eval.runs_dir={tmp_path / 'runs'}")
    assert evaluated.returncode == 0, evaluated.stderr
    report = json.loads((run_dir / "hf" / "eval" / "report.json").read_text())
    result = report["checkpoints"][str(run_dir / "hf")]
    assert result["perplexity"]["by_kind"]["all"]["perplexity"] > 1
    assert (run_dir / "hf" / "eval" / "report.md").is_file()


def test_eval_without_any_run_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"eval\.runs_dir"):
        evaluate(compose("eval", [f"eval.runs_dir={tmp_path}", "model=tiny"]))
