"""Durable checkpoints: written under a temporary name and renamed once complete; a full disk (checked before the
save, or hit while writing) or an unwritable folder stops the save with one line and keeps the earlier checkpoints."""

import errno
import io
import itertools
import os
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from train_helpers import tiny_overrides

import legalpt.train.trainer as trainer
from legalpt.config import compose
from legalpt.train.checkpoint import (
    MARKER,
    CheckpointError,
    human_bytes,
    latest_checkpoint,
    load_checkpoint,
    read_state,
    save_checkpoint,
    state_bytes,
)

DiskUsage = namedtuple("DiskUsage", "total used free")
PLENTY = 1 << 40


def on_disk(folder: Path) -> int:
    """Bytes of the files under `folder`, as `du --apparent-size` counts them."""
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(folder) for name in names)


def make_trained(*sizes: int):
    """An Accelerator with a small MLP and AdamW after one step (so the optimizer has its state)."""
    accelerator = Accelerator()
    layers = [torch.nn.Linear(a, b) for a, b in itertools.pairwise(sizes)]
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, sizes[0])).sum().backward()
    optimizer.step()
    return accelerator, model, optimizer


@pytest.fixture
def trained():
    return make_trained(32, 32, 4)


def save(trained, run_dir: Path, step: int, keep: int = 2) -> Path:
    accelerator, model, optimizer = trained
    return save_checkpoint(accelerator, run_dir, step, step * 10, keep, first_size=state_bytes(model, optimizer))


def fake_disk(monkeypatch, free) -> None:
    """shutil.disk_usage reports `free()` free bytes."""
    monkeypatch.setattr(shutil, "disk_usage", lambda path: DiskUsage(PLENTY, PLENTY - free(), free()))


def full_disk_torch_save(monkeypatch, error: Exception) -> list[str]:
    """torch.save writes half of what it would, then raises `error`, as on a disk that just filled up; returns the
    paths it was asked to write."""
    real_save, targets = torch.save, []

    def half_then_fail(obj, f, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(obj, buffer)
        Path(f).write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        targets.append(str(f))
        raise error

    monkeypatch.setattr(torch, "save", half_then_fail)
    return targets


def test_a_checkpoint_is_written_under_a_temporary_name_and_renamed_when_complete(tmp_path, trained, monkeypatch):
    accelerator = trained[0]
    written_to = []
    real_save_state = accelerator.save_state

    def record(path):
        written_to.append(Path(path))
        assert not (tmp_path / "checkpoints" / "step_000002").exists()  # nothing under the final name yet
        return real_save_state(path)

    monkeypatch.setattr(accelerator, "save_state", record)
    leftover = tmp_path / "checkpoints" / "step_000001.partial"  # a save killed halfway, before this one
    leftover.mkdir(parents=True)
    (leftover / "optimizer.bin").write_bytes(b"\0" * 100)

    path = save(trained, tmp_path, 2)
    assert written_to == [tmp_path / "checkpoints" / "step_000002.partial"]
    assert path == tmp_path / "checkpoints" / "step_000002" and (path / MARKER).is_file()
    assert read_state(path) == (2, 20)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000002"]


def test_a_full_disk_mid_save_keeps_the_last_checkpoint_and_says_so(tmp_path, trained, monkeypatch):
    first = save(trained, tmp_path, 1)
    size = on_disk(first)
    weights = {name: tensor.clone() for name, tensor in trained[1].state_dict().items()}
    targets = full_disk_torch_save(monkeypatch, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    fake_disk(monkeypatch, lambda: 123 * 1024)

    with pytest.raises(CheckpointError) as caught:
        save(trained, tmp_path, 2)
    assert targets and "step_000002.partial" in targets[0]  # it failed while writing, after the model file
    partial = tmp_path / "checkpoints" / "step_000002.partial"
    assert str(caught.value) == (
        f"cannot save step 2 to {partial}: no space left on the device; about {human_bytes(size)} needed, "
        f"123.0 KiB free; the newest complete checkpoint stays {first}"
    )
    assert "\n" not in str(caught.value)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001"]  # temporary folder gone
    assert latest_checkpoint(tmp_path) == first and on_disk(first) == size

    monkeypatch.undo()
    with torch.no_grad():
        for parameter in trained[1].parameters():
            parameter.zero_()
    assert load_checkpoint(trained[0], first) == (1, 10)
    for name, tensor in trained[1].state_dict().items():
        torch.testing.assert_close(tensor, weights[name], rtol=0, atol=0)


def test_torch_saves_iostream_error_on_a_full_disk_is_named_as_a_full_disk(tmp_path, trained, monkeypatch):
    """torch.save reports ENOSPC as RuntimeError('basic_ios::clear: iostream error'): judged by the space left."""
    save(trained, tmp_path, 1)
    targets = full_disk_torch_save(monkeypatch, RuntimeError("[enforce fail] basic_ios::clear: iostream error"))
    fake_disk(monkeypatch, lambda: 0 if targets else PLENTY)  # full once torch.save began to write
    with pytest.raises(CheckpointError, match=r"step_000002\.partial: no space left on the device; about "):
        save(trained, tmp_path, 2)
    assert not (tmp_path / "checkpoints" / "step_000002.partial").exists()


def test_an_error_that_is_not_the_disks_is_raised_as_it_is(tmp_path, trained, monkeypatch):
    save(trained, tmp_path, 1)
    full_disk_torch_save(monkeypatch, RuntimeError("something else broke"))
    with pytest.raises(RuntimeError, match="something else broke") as caught:
        save(trained, tmp_path, 2)
    assert type(caught.value) is RuntimeError
    assert latest_checkpoint(tmp_path).name == "step_000001"
    assert not (tmp_path / "checkpoints" / "step_000002.partial").exists()


def test_free_space_is_checked_before_writing(tmp_path, trained, monkeypatch):
    """First save: against the parameter and optimizer state bytes; later: against the previous checkpoint's size."""
    accelerator, model, _ = trained
    calls = []
    monkeypatch.setattr(accelerator, "save_state", lambda path: calls.append(path))
    parameters = list(model.parameters())
    # float32 weights and Adam's two moments, and a float32 step counter per parameter tensor
    expected = sum(p.numel() for p in parameters) * 4 * 3 + 4 * len(parameters)
    fake_disk(monkeypatch, lambda: expected - 1)
    needed_free = f"about {human_bytes(expected)} needed, {human_bytes(expected - 1)} free"
    with pytest.raises(CheckpointError, match=f"no space left on the device; {needed_free}; the newest complete "):
        save(trained, tmp_path, 1)
    assert calls == []

    monkeypatch.undo()
    first = save(trained, tmp_path, 1)
    calls = []
    monkeypatch.setattr(accelerator, "save_state", lambda path: calls.append(path))
    fake_disk(monkeypatch, lambda: on_disk(first) - 1)
    with pytest.raises(CheckpointError, match=f"about {human_bytes(on_disk(first))} needed, "):
        save(trained, tmp_path, 2)
    assert calls == [] and latest_checkpoint(tmp_path) == first


def test_the_first_estimate_is_close_to_the_checkpoint_written(tmp_path):
    """Parameters and optimizer state are nearly all of a checkpoint: the rest (RNG states, headers) is small."""
    trained = make_trained(256, 256, 256)
    estimate = state_bytes(trained[1], trained[2])
    written = on_disk(save(trained, tmp_path, 1))
    assert estimate <= written <= 1.05 * estimate


def test_an_unwritable_folder_stops_the_save_with_one_line(tmp_path, trained, monkeypatch):
    first = save(trained, tmp_path, 1)

    def read_only(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)

    monkeypatch.setattr(trained[0], "save_state", read_only)
    with pytest.raises(CheckpointError, match=r"step_000002\.partial: the folder is not writable \(Read-only file"):
        save(trained, tmp_path, 2)
    assert latest_checkpoint(tmp_path) == first


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_checkpoint_folder_stops_the_save_with_one_line(tmp_path, trained):
    first = save(trained, tmp_path, 1)
    root = tmp_path / "checkpoints"
    root.chmod(0o555)
    try:
        with pytest.raises(CheckpointError, match=r"the folder is not writable \(Permission denied\)"):
            save(trained, tmp_path, 2)
    finally:
        root.chmod(0o755)
    assert latest_checkpoint(tmp_path) == first


def test_a_training_run_stops_at_a_full_disk_with_its_last_checkpoint(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    real_save = torch.save

    def disk_full_at_step_2(obj, f, *args, **kwargs):
        if "step_000002" in str(f):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full_at_step_2)
    overrides = tiny_overrides(tmp_path, "train.batch_size=2", f"train.output_dir={run_dir}", steps=2)
    with pytest.raises(CheckpointError, match=r"cannot save step 2 to .*: no space left on the device; about "):
        trainer.train(compose("train", overrides))
    assert latest_checkpoint(run_dir) == run_dir / "checkpoints" / "step_000001"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000001"]
