"""Resuming after a crash: folders that are not complete checkpoints (a save's leftover temporary folder, no marker, a
truncated trainer_state.json) are skipped with a warning, and a metrics.jsonl whose last line was cut is repaired."""

import json
import logging
from types import SimpleNamespace

import pytest
from train_helpers import tiny_overrides

import legalpt.train.trainer as trainer
from legalpt.config import compose
from legalpt.train.checkpoint import latest_checkpoint, resolve_resume
from legalpt.train.tracking import MetricsLog


def checkpoint_folder(run_dir, name: str, state: str | None, marker: bool = True):
    """A folder under checkpoints/ with a trainer state of text `state` (None: no such file) and the marker."""
    folder = run_dir / "checkpoints" / name
    folder.mkdir(parents=True)
    if state is not None:
        (folder / "trainer_state.json").write_text(state)
    if marker:
        (folder / "COMPLETE").write_text("")
    return folder


def test_resume_skips_folders_that_are_not_complete_checkpoints(tmp_path, caplog):
    good = checkpoint_folder(tmp_path, "step_000002", '{"step": 2, "tokens": 512}')
    checkpoint_folder(tmp_path, "step_000001", '{"step": 1, "tokens": 256}')
    unmarked = checkpoint_folder(tmp_path, "step_000004", '{"step": 4, "tokens": 1024}', marker=False)
    truncated = checkpoint_folder(tmp_path, "step_000005", '{"step": 5, "tok')
    not_an_object = checkpoint_folder(tmp_path, "step_000006", "[5]")
    leftover = checkpoint_folder(tmp_path, "step_000007.partial", None, marker=False)

    with caplog.at_level(logging.WARNING, logger="legalpt"):
        assert latest_checkpoint(tmp_path) == good
        assert resolve_resume("auto", tmp_path) == good
    warned = [record.getMessage() for record in caplog.records]
    assert len(warned) == 2 * 4
    assert any(f"skipping {leftover}: the temporary folder of a save that did not finish" in w for w in warned)
    assert any(f"skipping {unmarked}: no COMPLETE marker, its save did not finish (if legalpt 0.1.0 saved it: "
               f"`touch {unmarked / 'COMPLETE'}`)" in w for w in warned)  # fmt: skip
    assert any(f"skipping {truncated}: {truncated / 'trainer_state.json'}: unreadable trainer state" in w
               for w in warned)  # fmt: skip
    assert any(f"skipping {not_an_object}:" in w for w in warned)


def test_steps_are_ordered_by_number_not_by_name(tmp_path):
    checkpoint_folder(tmp_path, "step_999999", '{"step": 999999, "tokens": 1}')
    newest = checkpoint_folder(tmp_path, "step_1000000", '{"step": 1000000, "tokens": 2}')
    assert latest_checkpoint(tmp_path) == newest


def test_a_resume_path_that_is_no_complete_checkpoint_is_one_line(tmp_path):
    truncated = checkpoint_folder(tmp_path, "step_000005", '{"step": 5, "tok')
    with pytest.raises(FileNotFoundError) as caught:
        resolve_resume(str(truncated), tmp_path)
    message = str(caught.value)
    assert message.startswith(f"train.resume={str(truncated)!r}: {truncated} is not a complete checkpoint (")
    assert "unreadable trainer state" in message and "\n" not in message


def test_a_cut_last_metrics_line_is_dropped_on_resume(tmp_path, caplog):
    lines = [{"step": step, "train/loss": 5.0 - step} for step in range(1, 6)]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    cut = json.dumps({"step": 6, "train/loss": -1.0})[:9]  # the process died while writing this line
    (tmp_path / "metrics.jsonl").write_text(text + cut)
    accelerator = SimpleNamespace(is_main_process=True, log=lambda values, step: None)

    with caplog.at_level(logging.WARNING, logger="legalpt"):
        metrics = MetricsLog(accelerator, tmp_path, start_step=4)
    assert any("metrics.jsonl: dropping its last line, cut short" in r.getMessage() for r in caplog.records)
    metrics.log(5, {"train/loss": 0.5})
    kept = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kept == [*lines[:4], {"step": 5, "train/loss": 0.5}]


def test_a_damaged_metrics_line_in_the_middle_is_dropped_and_named(tmp_path, caplog):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "x\n{"step": 3}\n')
    accelerator = SimpleNamespace(is_main_process=True)
    with caplog.at_level(logging.WARNING, logger="legalpt"):
        MetricsLog(accelerator, tmp_path, start_step=3)
    assert any("metrics.jsonl: dropping line 2, damaged" in r.getMessage() for r in caplog.records)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 3}\n'


def test_a_crash_that_truncated_the_trainer_state_and_cut_the_metrics_resumes(tmp_path, caplog):
    """The newest checkpoint's trainer_state.json and metrics.jsonl's last line were cut: the resume warns, continues
    from the checkpoint before, and ends where an uninterrupted run ends."""
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(tmp_path, "train.batch_size=2", f"train.output_dir={run_dir}", steps=4)
    straight = trainer.train(compose("train", overrides))
    finished = (run_dir / "metrics.jsonl").read_text()
    state = run_dir / "checkpoints" / "step_000004" / "trainer_state.json"
    state.write_text(state.read_text()[:10])
    (run_dir / "metrics.jsonl").write_text(finished[:-20])

    with caplog.at_level(logging.WARNING, logger="legalpt"):
        resumed = trainer.train(compose("train", overrides))
    warned = " ".join(record.getMessage() for record in caplog.records)
    assert f"skipping {state.parent}: {state}: unreadable trainer state" in warned
    assert "metrics.jsonl: dropping its last line, cut short" in warned
    assert f"resumed from {run_dir / 'checkpoints' / 'step_000002'} at step 2" in (run_dir / "train.log").read_text()
    assert resumed.checkpoint == latest_checkpoint(run_dir) == state.parent
    assert resumed.eval_losses[-1] == straight.eval_losses[-1]

    def by_step(text: str) -> list[tuple]:
        entries = [json.loads(line) for line in text.splitlines()]
        return [(e["step"], e.get("train/loss"), e.get("eval/loss"), e.get("train/tokens")) for e in entries]

    assert by_step((run_dir / "metrics.jsonl").read_text()) == by_step(finished)
