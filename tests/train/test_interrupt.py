"""SIGINT and SIGTERM during training: the step finishes, a checkpoint is saved, `legalpt-train` exits with 128 + the
signal's number and a resume continues from that step; a second Ctrl-C aborts; several processes stop together."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from train_helpers import tiny_overrides

import legalpt.train.interrupt as interrupt
import legalpt.train.trainer as trainer
from legalpt.config import compose
from legalpt.train.checkpoint import checkpoint_problem, latest_checkpoint

TRAIN = "import sys; from legalpt.cli import train_main; sys.argv[0] = 'legalpt-train'; train_main()"
ENV = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def test_a_signal_asks_to_stop_and_a_second_ctrl_c_aborts(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(interrupt, "monotonic", lambda: now[0])
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    with interrupt.StopSignals(SimpleNamespace(num_processes=1)) as stop:
        assert stop.requested() is None
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested() == signal.SIGINT
        now[0] += 0.5  # torchrun's copy of the same Ctrl-C, and a preemption notice: the stop is already on its way
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested() == signal.SIGINT
        now[0] += 2  # the user presses Ctrl-C again
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert {signum: signal.getsignal(signum) for signum in before} == before
    assert interrupt.exit_status(signal.SIGINT) == 130 and interrupt.exit_status(signal.SIGTERM) == 143


def wait_for(condition, process: subprocess.Popen, what: str, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process.poll() is not None:
            pytest.fail(f"the run ended before {what}:\n{process.communicate()[1][-4000:]}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"no {what} after {timeout_s} s")
        time.sleep(0.2)


def train_steps_logged(run_dir) -> list[int]:
    """The steps metrics.jsonl holds a training line of (so far: a line being written is left out)."""
    path = run_dir / "metrics.jsonl"
    steps = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if "train/loss" in entry:
            steps.append(entry["step"])
    return steps


def terminated_run(overrides: list[str], run_dir, steps: int) -> tuple[int, str]:
    """legalpt-train with `overrides` in a process of its own, sent SIGTERM once `steps` steps are logged: its exit
    status and output (stdout, then stderr)."""
    process = subprocess.Popen([sys.executable, "-c", TRAIN, *overrides], env=ENV, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    wait_for(lambda: len(train_steps_logged(run_dir)) >= steps, process, f"{steps} logged steps")
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=600)
    return process.returncode, stdout + stderr


def test_sigterm_saves_a_checkpoint_exits_143_and_the_run_resumes_there(tmp_path):
    run_dir = tmp_path / "run"
    common = ("train.batch_size=2", f"train.output_dir={run_dir}", "train.log_every=1", "train.eval_every=10000")
    overrides = tiny_overrides(tmp_path, *common, "train.save_every=10000", steps=10000)
    returncode, output = terminated_run(overrides, run_dir, steps=2)

    assert returncode == 143, output[-4000:]
    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint is not None and checkpoint_problem(checkpoint) is None
    stopped_at = json.loads((checkpoint / "trainer_state.json").read_text())["step"]
    assert 2 <= stopped_at < 10000 and checkpoint.name == f"step_{stopped_at:06d}"
    assert train_steps_logged(run_dir)[-1] == stopped_at  # the step that was under way when the signal came
    assert f"stopped by SIGTERM: checkpoint {checkpoint}; the same command resumes from it" in output
    assert not (run_dir / "hf").exists()  # the run is not finished: no export

    resumed = trainer.train(compose("train", tiny_overrides(tmp_path, *common, steps=stopped_at + 2)))
    assert f"resumed from {checkpoint} at step {stopped_at}" in (run_dir / "train.log").read_text()
    assert resumed.checkpoint.name == f"step_{stopped_at + 2:06d}" and resumed.stopped_by is None
    assert train_steps_logged(run_dir)[-3:] == [stopped_at, stopped_at + 1, stopped_at + 2]
    assert (resumed.export_dir / "config.json").is_file()


def test_without_checkpoints_a_signal_stops_the_run_without_saving(tmp_path):
    """train.save_every=0 (as bench_train's jobs run): the stop ends the run after its step, with nothing written
    but its metrics and log, and says that it cannot resume."""
    run_dir = tmp_path / "run"
    common = ("train.batch_size=2", f"train.output_dir={run_dir}", "train.log_every=1", "train.eval_every=0")
    overrides = tiny_overrides(tmp_path, *common, "train.save_every=0", steps=10000)
    returncode, output = terminated_run(overrides, run_dir, steps=1)

    assert returncode == 143, output[-4000:]
    assert latest_checkpoint(run_dir) is None and not (run_dir / "hf").exists()
    assert "SIGTERM received: stopping after this step (train.save_every=0)" in output
    assert "stopped by SIGTERM without a checkpoint (train.save_every=0): the run cannot resume" in output


WORKER = r"""
import os, sys, time
import legalpt.train.trainer as trainer
from legalpt.cli import train_main

real_step = trainer.train_step
calls = 0

def slow_step(model, optimizer, batches, cfg, accelerator):
    global calls
    result = real_step(model, optimizer, batches, cfg, accelerator)
    calls += 1
    sys.stdout.write(f"STEP {accelerator.process_index} {calls} {os.getpid()}\n")  # one write: the ranks share a pipe
    sys.stdout.flush()
    time.sleep(0.5)  # room for the signal to land inside a step
    return result

trainer.train_step = slow_step
sys.argv[0] = "legalpt-train"
try:
    train_main()
except SystemExit as stop:
    sys.stdout.write(f"EXIT {os.environ['RANK']} {stop.code}\n")
    sys.stdout.flush()
    raise
"""


@pytest.mark.slow
def test_a_sigterm_to_one_of_two_processes_stops_both_after_the_same_step(tmp_path):
    run_dir = tmp_path / "run"
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    common = ("train.batch_size=1", f"train.output_dir={run_dir}", "train.eval_every=10000", "train.save_every=10000")
    overrides = tiny_overrides(tmp_path, *common, steps=10000)
    env = {**ENV, "ACCELERATE_USE_CPU": "true"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    process = subprocess.Popen([*command, *overrides], env=env, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)  # fmt: skip
    steps: dict[int, int] = {}
    exits, output = [], []
    for line in process.stdout:
        output.append(line)
        for rank, step, pid in (map(int, found) for found in re.findall(r"STEP (\d+) (\d+) (\d+)", line)):
            steps[rank] = step
            if rank == 1 and step == 2:
                os.kill(pid, signal.SIGTERM)  # rank 1 alone: rank 0 learns of it at the step boundary
        exits += re.findall(r"EXIT (\d+) (\S+)", line)
    process.wait(timeout=600)

    assert len(steps) == 2 and steps[0] == steps[1] >= 2, "".join(output)[-4000:]
    assert exits and all(code == "143" for _, code in exits), exits  # torchrun may end the later one first
    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint.name == f"step_{steps[0]:06d}" and checkpoint_problem(checkpoint) is None
    assert {p.name for p in checkpoint.glob("random_states_*.pkl")} == {"random_states_0.pkl", "random_states_1.pkl"}
