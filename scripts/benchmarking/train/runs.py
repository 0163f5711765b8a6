"""One benchmarked training job: `legalpt-train` with Hydra overrides in a fresh process, so that a CUDA
out-of-memory leaves nothing behind for the next job, and the row read from the job's metrics.jsonl.

A row is {attention, model, seq_len, batch_size, gpus, documents, activation_checkpointing, save_attention,
offload_activations, mlp_chunk_tokens, precision, compile, loss_impl, grad_accum, steps, tokens_per_s, mfu, peak_gib,
oom, error}, and with --profile its `profile` (legalpt.train.profiling's summary); documents: the corpus
(Setting.documents). The eight options are the values the job ran with (its composed config), null where this tree's
config has no such field; an option the benchmark was not given is not overridden, so the script runs on trees from
before and after the options exist (those with `train.eval_every=0`, which every job sets: held-out evaluation
measures nothing here and costs a step's time at long seq_lens). A job writes no checkpoint and no export where the
tree can skip them (`no_saving`). tokens_per_s and mfu are medians over the steps after the first `warmup`
(train.log_every=1 makes each step its own window), peak_gib the largest peak; a metric the trainer does not log (MFU
and peak memory on a CPU) is null. oom: the job failed out of memory (CUDA's error, or a SIGKILL, as the host's OOM
killer sends); error: the last error line of any other failure, or the timeout, and for an oom which memory ran out
(CUDA's line, naming the allocation, or the SIGKILL).

A job's packed data is built before it, untimed, by `legalpt-prepare` (once per data configuration), so that the
timeout and the first steps measure training alone.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from legalpt.config import compose, to_config
from legalpt.data.demo import MAX_CHARS, MIN_CHARS

ROOT = Path(__file__).resolve().parents[3]
CHARS_PER_TOKEN = 6  # characters of a joined demo document per token it must hold (the demo BPE makes ~4.9)
DOCUMENTS_PER_KIND = 3  # joined documents of each kind (contract, opinion): one is held out, the rest trained on
OPTIONS = (  # train.* a setting may override
    "activation_checkpointing", "save_attention", "offload_activations", "mlp_chunk_tokens", "precision", "loss_impl",
    "compile", "grad_accum",
)  # fmt: skip
_OOM = re.compile(r"out of memory|OutOfMemoryError|SIGKILL", re.IGNORECASE)
_LAUNCHER_ERROR = re.compile(r"ChildFailedError|CalledProcessError")  # the launchers' own, after the job's
_TAIL_CHARS = 20_000  # of a job's output, kept to tell an OOM from another failure
PREPARE_TIMEOUT_S = 3600  # for legalpt-prepare, which tokenizes and packs before the timed job
_TERM_GRACE_S = 30  # a timed-out job's seconds between SIGTERM (accelerate passes it on to ranks) and SIGKILL


@dataclass(frozen=True)
class Setting:
    """A configuration of the trainer, but for seq_len and batch size: what a row belongs to and what a search
    searches. An option left None is not overridden (the config's default applies)."""

    model: str  # preset in conf/model/
    attention: str  # model.attn_implementation
    activation_checkpointing: str | None = None
    loss_impl: str | None = None
    compile: bool | None = None
    save_attention: bool | None = None
    offload_activations: bool | None = None
    mlp_chunk_tokens: int | None = None
    precision: str | None = None  # train.precision; bf16-fsdp runs under FSDP2 (train.distributed=fsdp2)
    grad_accum: int | None = None  # micro-batches per optimizer step (the optimizer's step amortized over them)
    gpus: int = 1  # processes (one GPU each)
    # long: one document fills a row (demo_data); packed: the demo corpus as generated, several documents to a row
    documents: str = "long"

    def overrides(self) -> list[str]:
        given = {name: getattr(self, name) for name in OPTIONS if getattr(self, name) is not None}
        options = [f"train.{name}={str(value).lower()}" for name, value in given.items()]
        sharded = ["train.distributed=fsdp2"] if self.precision == "bf16-fsdp" else []
        return [f"model={self.model}", f"model.attn_implementation={self.attention}", *options, *sharded]


@dataclass
class Outcome:
    """How a job's process ended: its exit status (None when it was stopped at the timeout) and its output's tail."""

    returncode: int | None
    output: str


Runner = Callable[[list[str], dict[str, str], float, Path], Outcome]  # (command, environment, timeout, log file)


def run_process(command: list[str], env: dict[str, str], timeout: float, log: Path) -> Outcome:
    """Run `command` with its output in `log`; at the timeout, stop it (SIGTERM, then SIGKILL)."""
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        try:
            returncode = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.wait(_TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            returncode = None
    with log.open("rb") as f:
        f.seek(max(0, log.stat().st_size - _TAIL_CHARS))
        return Outcome(returncode, f.read().decode(errors="replace"))


def demo_data(doc_tokens: int) -> list[str]:
    """Overrides for the long-document demo corpus (data=demo_long) with documents of at least `doc_tokens` tokens,
    DOCUMENTS_PER_KIND of each kind."""
    min_chars = CHARS_PER_TOKEN * doc_tokens
    mean_chars = (MAX_CHARS - MIN_CHARS) / math.log(MAX_CHARS / MIN_CHARS)  # of a log-uniform demo document
    documents = max(4, math.ceil(2 * DOCUMENTS_PER_KIND * min_chars / mean_chars))
    return ["data=demo_long", f"data.synthetic_min_chars={min_chars}", f"data.synthetic_documents={documents}"]


# The demo corpus as generated (data=demo: documents of MIN_CHARS to MAX_CHARS characters, about 1k to 45k tokens),
# so that a row of 8k tokens or more packs several documents, which attention must keep apart
PACKED_DATA = ["data=demo"]


def no_saving(steps: int, cfg: DictConfig) -> list[str]:
    """Overrides for a job without a checkpoint or an export (nothing is resumed or used, and the 1b preset's would
    write ~15 GB a job); on trees whose config `cfg` has no train.export_hf, one checkpoint at the end."""
    if OmegaConf.select(cfg, "train.export_hf", default=None) is None:
        return [f"train.save_every={steps}", "train.keep_checkpoints=1"]
    return ["train.save_every=0", "train.export_hf=false"]


def installed(command: str) -> str:
    """The path of one of legalpt's console scripts."""
    if (path := shutil.which(command)) is None:
        raise SystemExit(f"{command} is not on PATH: install the project first (pip install -e .)")
    return path


def launcher(gpus: int, process_group: bool = False) -> list[str]:
    """The command that starts `legalpt-train` on `gpus` GPUs: one process, or accelerate's launcher; `process_group`:
    one GPU as a one-rank job (torchrun), as FSDP2's bf16 parameters need."""
    train = installed("legalpt-train")
    if gpus == 1 and process_group:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
        return [*torchrun, "--no-python", train]
    if gpus == 1:
        return [train]
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", f"--num_processes={gpus}", train]


@dataclass
class Jobs:
    """What the jobs of one benchmark run share, and how each runs."""

    work: Path  # run folders and logs (a job's folder is removed once its row is read)
    data: list[str]  # the long-document corpus's overrides (demo_data); packed settings use PACKED_DATA
    extra: list[str]  # overrides for every job, applied last (--override)
    device: str  # cuda | cpu
    warmup: int  # first steps left out of tokens_per_s and mfu
    timeout: float  # seconds a job may run
    runner: Runner = run_process
    peak: dict = field(default_factory=dict)  # what MFU is against, as the jobs logged it: {"name", "tflops"}
    prepared: set = field(default_factory=set)  # the data configurations legalpt-prepare has built
    profile: int = 0  # steps of a throughput job profiled right after the warmup (train.profile_steps), untimed
    _count: itertools.count = field(default_factory=itertools.count)

    def plan(self, setting: Setting, seq_len: int, batch_size: int, steps: int, run_dir: Path) -> tuple[list, dict]:
        """The job's overrides and the option values it runs with; raises ConfigError for a bad value, before any
        job starts (the script plans every job first)."""
        data = self.data if setting.documents == "long" else PACKED_DATA
        fixed = [*setting.overrides(), *data, f"data.seq_len={seq_len}"]
        base = compose("train", [*fixed, *self.extra])
        positions = base.model.max_position_embeddings
        overrides = [
            *fixed,
            *([f"model.max_position_embeddings={seq_len}"] if seq_len > positions else []),  # RoPE reaches the row
            f"train.batch_size={batch_size}",
            f"train.steps={steps}",
            "train.log_every=1",
            "train.eval_every=0",  # no held-out loss: at long seq_lens its two forwards would cost a step's time
            *no_saving(steps, base),
            "train.resume=none",
            f"train.output_dir={run_dir}",
            "logger=none",
            *self.extra,
        ]
        cfg = compose("train", overrides)
        to_config(cfg)
        return overrides, {name: OmegaConf.select(cfg, f"train.{name}", default=None) for name in OPTIONS}

    def run(self, setting: Setting, seq_len: int, batch_size: int, steps: int, profiled: bool = False) -> dict:
        """Train `steps` steps of `setting` at (`seq_len`, `batch_size`) in a fresh process; returns its row.
        `profiled`: the steps after the warmup are profiled (self.profile of them) and left out of its tokens/s, and
        the row's "profile" is the trainer's summary of them (legalpt.train.profiling)."""
        run_dir = self.work / f"run-{next(self._count)}"
        overrides, options = self.plan(setting, seq_len, batch_size, steps, run_dir)
        profile = self.profile if profiled else 0
        if profile:
            overrides += [f"train.profile_start={self.warmup}", f"train.profile_steps={profile}"]
        # on a CPU, accelerate joins a launched job's processes only when told to use the CPU
        cpu = {"CUDA_VISIBLE_DEVICES": "", "ACCELERATE_USE_CPU": "true"} if self.device == "cpu" else {}
        env = {**os.environ, "HYDRA_FULL_ERROR": "1", **cpu}
        self.prepare(overrides, env, run_dir.with_suffix(".prepare.log"))
        command = [*launcher(setting.gpus, options["precision"] == "bf16-fsdp"), *overrides]
        outcome = self.runner(command, env, self.timeout, run_dir.with_suffix(".log"))
        metrics = read_metrics(run_dir / "metrics.jsonl", self.warmup + profile)
        self.peak = metrics.pop("peak") or self.peak
        summary = run_dir / "profile" / "summary-rank0.json"
        profiled_row = {"profile": json.loads(summary.read_text()) if summary.exists() else None} if profile else {}
        shutil.rmtree(run_dir, ignore_errors=True)  # the job's metrics, log and profile, read above
        oom, error = failure(outcome, self.timeout)
        return {
            "attention": setting.attention,
            "model": setting.model,
            "seq_len": seq_len,
            "batch_size": batch_size,
            "gpus": setting.gpus,
            "documents": setting.documents,
            **options,
            "steps": steps,
            **metrics,
            "oom": oom,
            "error": error,
            **profiled_row,
        }

    def prepare(self, overrides: list[str], env: dict[str, str], log: Path) -> None:
        """Build the packed data of a job with `overrides` unless a job with the same data and model settings had it
        built; a failure is the job's to report (it prepares again and fails the same way)."""
        # the data's settings, the tokenizer's (model, model.pretrained) and the positions a long row is checked against
        kept = ("data", "model=", "model.pretrained=", "model.max_position_embeddings=")
        data = tuple(o for o in overrides if o.startswith(kept))
        if data in self.prepared:
            return
        outcome = self.runner([installed("legalpt-prepare"), *data], env, PREPARE_TIMEOUT_S, log)
        if outcome.returncode == 0:
            self.prepared.add(data)
        else:  # the job prepares again, inside its timeout, and reports what fails
            print(f"legalpt-prepare failed (exit {outcome.returncode}; log {log}): {outcome.output.strip()[-300:]}")


def read_metrics(path: Path, warmup: int) -> dict:
    """tokens_per_s and mfu (medians over the steps after `warmup`, or the last step when no step is left), peak_gib
    (the largest), each None where the job logged none; and "peak", what MFU is against (None if not logged)."""
    lines = path.read_text().splitlines() if path.exists() else []
    steps = [m for m in map(json.loads, lines) if "train/tokens_per_s" in m]
    measured = steps[warmup:] or steps[-1:]

    def median(key: str) -> float | None:
        values = [m[key] for m in measured if m.get(key) is not None]
        return statistics.median(values) if values else None

    peaks = [m["train/peak_gib"] for m in steps if m.get("train/peak_gib") is not None]
    named = next((m for m in steps if "train/mfu_peak" in m), None)
    return {
        "tokens_per_s": median("train/tokens_per_s"),
        "mfu": median("train/mfu"),
        "peak_gib": max(peaks, default=None),
        "peak": named and {"name": named["train/mfu_peak"], "tflops": named.get("train/mfu_peak_tflops")},
    }


def failure(outcome: Outcome, timeout: float) -> tuple[bool, str | None]:
    """(oom, error) of a job's outcome: (False, None) when it succeeded."""
    if outcome.returncode is None:
        return False, f"stopped at the timeout ({timeout:.0f} s)"
    if outcome.returncode == 0:
        return False, None
    if outcome.returncode == -signal.SIGKILL or _OOM.search(outcome.output):
        said = [line.strip() for line in outcome.output.splitlines() if _OOM.search(line)]
        return True, (said[-1] if said else "killed by SIGKILL (the host's memory?)")[:300]
    lines = [line.strip() for line in outcome.output.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"Error|Exception", line) and not _LAUNCHER_ERROR.search(line)]
    return False, ((errors or lines or [f"exit status {outcome.returncode}"])[-1])[:300]
