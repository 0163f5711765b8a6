"""The training loop end to end on tiny configs: outputs, metrics, checkpoints, exact resume, trackers."""

import itertools
import json
import logging
import math
import os
import signal

import pytest
import torch
from accelerate.utils import LoggerType
from train_helpers import tiny_overrides as shared_tiny_overrides
from transformers import AutoModelForCausalLM, AutoTokenizer

import legalpt.hf
import legalpt.train.trainer as trainer
from legalpt.config import LOGGERS, TrainConfig, compose
from legalpt.train.checkpoint import latest_checkpoint, resolve_resume
from legalpt.train.optim import build_optimizer, lr_factor
from legalpt.train.tracking import tracker_name


def tiny_overrides(tmp_path, *extra: str) -> list[str]:
    """train_helpers' tiny run, in rows of two."""
    return shared_tiny_overrides(tmp_path, "train.batch_size=2", *extra)


def test_lr_schedule_warms_up_then_decays_to_floor():
    cfg = TrainConfig(steps=100, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_factor(0, cfg) == pytest.approx(0.1)
    assert lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(10, cfg) == pytest.approx(1.0)
    assert lr_factor(55, cfg) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_factor(100, cfg) == pytest.approx(0.1)
    factors = [lr_factor(s, cfg) for s in range(10, 101)]
    assert all(a >= b for a, b in itertools.pairwise(factors))


def test_optimizer_decays_matrices_only():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    groups = build_optimizer(model, TrainConfig(weight_decay=0.3)).param_groups
    decayed = {id(p) for g in groups if g["weight_decay"] == 0.3 for p in g["params"]}
    assert decayed == {id(model[0].weight)}
    assert sum(len(g["params"]) for g in groups) == 4


def test_tiny_run_writes_checkpoints_export_and_metrics(tmp_path):
    run_dir = tmp_path / "run"
    result = trainer.train(compose("train", tiny_overrides(tmp_path, f"train.output_dir={run_dir}")))

    assert [step for step, _ in result.eval_losses] == [0, 3, 6]
    assert all(math.isfinite(loss) for _, loss in result.eval_losses)
    assert result.checkpoint == latest_checkpoint(run_dir) == run_dir / "checkpoints" / "step_000006"
    assert (run_dir / "train.log").read_text().count(": eval loss") == 3

    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_lines = [m for m in lines if "train/loss" in m]
    assert [m["step"] for m in train_lines] == [2, 4, 6]
    assert {"train/lr", "train/grad_norm", "train/tokens_per_s", "train/tokens"} <= set(train_lines[0])
    assert train_lines[-1]["train/tokens"] == 6 * 2 * 128

    # The export is a plain HF folder: model and tokenizer load with transformers alone.
    model = AutoModelForCausalLM.from_pretrained(result.export_dir, attn_implementation="sdpa")
    tokenizer = AutoTokenizer.from_pretrained(result.export_dir)
    ids = tokenizer("WHEREAS the parties agree", return_tensors="pt").input_ids
    assert model(ids).logits.shape == (1, ids.shape[1], len(tokenizer))


def test_a_run_without_checkpoints_or_export_writes_only_its_metrics_and_log(tmp_path):
    """train.save_every=0 and train.export_hf=false, as throughput measurements run: the steps and their metrics as
    usual, no checkpoint, no HF folder."""
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(tmp_path, f"train.output_dir={run_dir}", "train.save_every=0", "train.export_hf=false")
    result = trainer.train(compose("train", overrides))

    assert result.checkpoint is None and result.export_dir is None and latest_checkpoint(run_dir) is None
    assert not (run_dir / "hf").exists() and not (run_dir / "checkpoints").exists()
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if "train/loss" in m] == [2, 4, 6]
    log = (run_dir / "train.log").read_text()
    assert "checkpoint: none saved (train.save_every=0): the run cannot resume" in log
    assert "HF export:  none (train.export_hf=false)" in log


def test_a_run_without_checkpoints_names_the_one_it_resumed_from(tmp_path, caplog):
    """After a resume, train.save_every=0 leaves the resumed checkpoint the one to resume from: the report says so,
    stopped or finished, and does not call it this run's."""
    resumed = tmp_path / "checkpoints" / "step_000004"
    result = trainer.TrainResult(tmp_path, None, resumed, None)
    with caplog.at_level(logging.INFO, logger=trainer.__name__):
        trainer.report_locations(result, saves=False)
        result.stopped_by = signal.SIGTERM
        trainer.report_locations(result, saves=False)
    assert f"checkpoint: none saved (train.save_every=0): the same command resumes from {resumed}" in caplog.text
    assert f"stopped by SIGTERM without a checkpoint (train.save_every=0): the same command resumes from {resumed}" in (
        caplog.text
    )


def test_gradient_accumulation_counts_every_micro_batch(tmp_path):
    """Two micro-batches of one row per optimizer step: each step consumes both, and training still descends."""
    overrides = ("train.steps=3", "train.eval_every=100", "train.grad_clip=0")
    accumulated = trainer.train(
        compose(
            "train",
            tiny_overrides(
                tmp_path, f"train.output_dir={tmp_path / 'acc'}", *overrides, "train.batch_size=1", "train.grad_accum=2"
            ),
        )
    )
    lines = [json.loads(line) for line in (accumulated.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["train/tokens"] for m in lines if "train/tokens" in m] == [2 * 2 * 128, 3 * 2 * 128]
    assert accumulated.eval_losses[-1][1] < accumulated.eval_losses[0][1]


def test_resumed_run_equals_uninterrupted_run(tmp_path, train_until_first_checkpoint):
    straight = trainer.train(compose("train", tiny_overrides(tmp_path, f"train.output_dir={tmp_path / 'a'}")))

    train_until_first_checkpoint(compose("train", tiny_overrides(tmp_path, f"train.output_dir={tmp_path / 'b'}")))
    assert latest_checkpoint(tmp_path / "b").name == "step_000003"

    resumed = trainer.train(compose("train", tiny_overrides(tmp_path, f"train.output_dir={tmp_path / 'b'}")))
    assert resumed.eval_losses[-1] == straight.eval_losses[-1]
    a = AutoModelForCausalLM.from_pretrained(straight.export_dir)
    b = AutoModelForCausalLM.from_pretrained(resumed.export_dir)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("deterministic", [False, True])
def test_deterministic_turns_on_torchs_mode_and_the_atomic_free_backward(deterministic, tmp_path, monkeypatch):
    """Every attention call of the run asks for the backward without atomics, under torch's deterministic mode and
    cuBLAS's workspace setting; all three as before after the run."""
    seen = set()
    varlen = legalpt.hf.flash_attn_varlen_func  # packed rows: the trainer's path, whatever the backend

    def spy(*args, **kwargs):
        mode = torch.are_deterministic_algorithms_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        seen.add((kwargs["deterministic"], *mode))
        return varlen(*args, **kwargs)

    monkeypatch.setattr(legalpt.hf, "flash_attn_varlen_func", spy)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    overrides = tiny_overrides(tmp_path, f"train.output_dir={tmp_path}", f"train.deterministic={deterministic}")
    trainer.train(compose("train", overrides))
    assert seen == {(True, True, ":4096:8") if deterministic else (False, False, None)}
    assert not torch.are_deterministic_algorithms_enabled()
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


@pytest.mark.cuda
def test_deterministic_runs_on_a_gpu_are_bit_identical(tmp_path):
    """Two runs with train.deterministic=true: the same held-out losses and weights, bit for bit."""
    runs = [
        trainer.train(compose("train", tiny_overrides(tmp_path, f"train.output_dir={tmp_path / name}",
                                                      "train.deterministic=true")))
        for name in ("a", "b")
    ]  # fmt: skip
    assert runs[0].eval_losses == runs[1].eval_losses
    a, b = (AutoModelForCausalLM.from_pretrained(run.export_dir) for run in runs)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0, msg=name)


def test_resume_path_must_hold_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"train\.resume"):
        resolve_resume(str(tmp_path), tmp_path)
    assert resolve_resume("auto", tmp_path) is None
    assert resolve_resume("none", tmp_path) is None


def test_wandb_runs_offline_inside_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(tmp_path, f"train.output_dir={run_dir}", "train.steps=2", "logger=wandb")
    result = trainer.train(compose("train", overrides))
    assert result.wandb_dir is not None and str(run_dir) in result.wandb_dir
    offline_runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 1
    assert any(offline_runs[0].glob("*.wandb"))


def test_a_bad_logger_is_named(tmp_path):
    with pytest.raises(ValueError, match="logger"):
        trainer.train(compose("train", tiny_overrides(tmp_path, f"train.output_dir={tmp_path}", "logger=tensorboardx")))


def test_every_logger_the_config_accepts_is_off_or_an_accelerate_tracker(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # WANDB_MODE=disabled turns every tracker off
    trackers = {tracker.value for tracker in LoggerType}
    for logger in LOGGERS:
        assert (tracker_name(logger) is None) if logger == "none" else (tracker_name(logger) in trackers)


@pytest.fixture
def model_and_batches(tiny_model_config):
    """A one-layer model, a packed batch of one document, and a batch that is all padding (no targets)."""
    from legalpt.data.pack import collate_packed
    from legalpt.data.tokenizer import train_bpe
    from legalpt.model import build_model

    tokenizer = train_bpe(["the parties agree to the terms of this agreement"] * 20, 300)
    config = tiny_model_config(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    model = build_model(config, tokenizer)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    real = collate_packed([{"input_ids": [5, 6, 7, eos], "seq_lens": [4], "num_pad": 0}])
    padding = collate_packed([{"input_ids": [eos, pad, pad, pad], "seq_lens": [1, 3], "num_pad": 3}])
    return model, real, padding


def test_a_micro_batch_without_targets_adds_nothing_instead_of_nan(model_and_batches):
    """A packed row of padding alone (every label ignored) must not turn the step's loss or weights into NaN."""
    from accelerate import Accelerator

    model, real, padding = model_and_batches
    accelerator = Accelerator()  # whatever device the suite runs on: the state is global to the process
    model.to(accelerator.device)
    real, padding = ({k: v.to(accelerator.device) if torch.is_tensor(v) else v for k, v in b.items()}
                     for b in (real, padding))  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = TrainConfig(grad_accum=2, grad_clip=1.0)
    with torch.no_grad():
        expected = model(**real).loss  # the step's loss is the real row's mean: the padding row adds no target
    loss, grad_norm, tokens = trainer.train_step(model, optimizer, iter([real, padding]), cfg, accelerator)
    assert math.isfinite(loss.item()) and math.isfinite(float(grad_norm)) and tokens == 8
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize(
    "override",
    ["train.grad_accum=0", "train.eval_every=-1", "train.save_every=-1", "train.keep_checkpoints=0", "train.steps=0"],
)
def test_values_the_loop_cannot_run_with_are_named(tmp_path, override):
    key = override.split("=")[0]
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        trainer.train(compose("train", tiny_overrides(tmp_path, f"train.output_dir={tmp_path}", override)))


def test_eval_every_zero_trains_without_held_out_evaluation(tmp_path):
    run_dir = tmp_path / "run"
    result = trainer.train(
        compose("train", tiny_overrides(tmp_path, f"train.output_dir={run_dir}", "train.eval_every=0"))
    )
    assert result.eval_losses == [] and result.checkpoint == run_dir / "checkpoints" / "step_000006"
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert not any("eval/loss" in m for m in lines) and any("train/loss" in m for m in lines)


def test_live_evaluation_needs_its_own_cadence_without_eval_every(tmp_path):
    overrides = tiny_overrides(tmp_path, f"train.output_dir={tmp_path}", "train.eval_every=0", "train.eval_documents=2")
    with pytest.raises(
        ValueError, match=r"train\.eval_documents_every: expected a number >= 1 with train\.eval_every=0"
    ):
        trainer.train(compose("train", overrides))


def test_heldout_loss_skips_batches_without_targets(model_and_batches):
    from legalpt.eval.perplexity import heldout_loss

    model, real, padding = model_and_batches
    report = heldout_loss(model, [real, padding])
    with torch.no_grad():
        expected = model(**real).loss.item()
    assert report["tokens"] == 3
    assert report["loss"] == pytest.approx(expected, rel=1e-5)
