"""The console scripts as a user runs them: help, bad configuration, missing files, prepare, train, resume, sweeps,
eval."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

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
         "eval.tasks: expected a subset of perplexity, response_loss, citations, citation_set, choice, harness, "
         "got ['rouge']"),
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


# A tiny run started with model and train overrides: one layer, 4 steps, checkpoints at steps 2 and 4.
TINY_RUN = ["model=tiny", "model.num_layers=1", "data.synthetic_documents=6", "data.seq_len=128",
            "data.vocab_size=400", "train.steps=4", "train.eval_every=2", "train.save_every=2", "train.log_every=2",
            "train.batch_size=2", "logger=none"]  # fmt: skip


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """The tiny run, trained to its end by `legalpt-train`."""
    root = tmp_path_factory.mktemp("finished")
    trained = run_cli("train", *TINY_RUN, f"data.cache_dir={root / 'cache'}", f"train.output_dir={root / 'run'}")
    assert trained.returncode == 0, trained.stderr
    return root / "run"


def test_the_resume_recipe_continues_a_run_started_with_overrides(finished_run, tmp_path):
    """The README's recipe: the run folder alone (and more steps) restores the one-layer model and its data."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    record = (run_dir / "config.yaml").read_text()

    resumed = run_cli("train", f"train.output_dir={run_dir}", "train.steps=6")
    assert resumed.returncode == 0, resumed.stderr
    log = (run_dir / "train.log").read_text()
    assert f"resumed from {run_dir / 'checkpoints' / 'step_000004'} at step 4" in log
    sizes = re.findall(r"model: llama, (\S+)M parameters", log)
    assert len(sizes) == 2 and sizes[0] == sizes[1]  # the resume built the run's model, not the default one
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in m] == [2, 4, 6]
    assert (run_dir / "config.yaml").read_text() == record
    assert read_jsonl(run_dir / "resumes.jsonl") == [{"step": 4, "overrides": {"train.steps": 6}}]
    launched = OmegaConf.load(run_dir / ".hydra" / "config.yaml")  # Hydra's copy: what this launch trained with
    assert (launched.model.num_layers, launched.train.steps) == (1, 6)


@pytest.mark.parametrize(
    ("override", "keys"),
    [
        ("model.num_layers=2", "model.num_layers"),
        ("model=small", "model.hidden_size, model.intermediate_size, model.max_position_embeddings, model.num_heads, "
                        "model.num_kv_heads, model.num_layers"),  # where the small preset differs from the run's
        ("data.vocab_size=500", "data.vocab_size"),
    ],
)  # fmt: skip
def test_a_resume_that_would_change_the_model_or_its_data_stops_with_one_line(finished_run, override, keys):
    kept = ("config.yaml", ".hydra/config.yaml", ".hydra/overrides.yaml", "train.log", "metrics.jsonl")
    before = {name: (finished_run / name).read_text() for name in kept}
    result = run_cli("train", f"train.output_dir={finished_run}", override)
    assert result.returncode != 0 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"{keys}: cannot change when resuming the run in {finished_run} ("
    ), result.stderr
    assert {name: (finished_run / name).read_text() for name in kept} == before
    assert not (finished_run / "resumes.jsonl").exists()


def test_a_sweep_trains_each_job_in_its_own_folder_and_resumes_each_there(tmp_path):
    sweep = tmp_path / "sweep"
    common = [*TINY_RUN, f"data.cache_dir={tmp_path / 'cache'}", f"train.output_dir={sweep}", "train.lr=0.001,0.003"]
    result = run_cli("train", "-m", *common)
    assert result.returncode == 0, result.stderr
    for job, lr in enumerate((0.001, 0.003)):
        run_dir = sweep / str(job)
        assert OmegaConf.load(run_dir / "config.yaml").train.lr == lr
        assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in m] == [2, 4]
        assert (run_dir / "hf" / "config.json").is_file() and "resumed from" not in (run_dir / "train.log").read_text()

    extended = run_cli("train", "-m", *common, "train.steps=6")  # the same sweep, longer: each job goes on
    assert extended.returncode == 0, extended.stderr
    for job in (0, 1):
        run_dir = sweep / str(job)
        assert read_jsonl(run_dir / "resumes.jsonl") == [{"step": 4, "overrides": {"train.steps": 6}}]
        assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in m] == [2, 4, 6]


def test_eval_without_any_run_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"eval\.runs_dir"):
        evaluate(compose("eval", [f"eval.runs_dir={tmp_path}", "model=tiny"]))
