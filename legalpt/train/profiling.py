"""A look inside a few training steps (`train.profile_steps`): torch.profiler over steps
train.profile_start + 1 .. + profile_steps, written to the run folder as a Chrome trace (open it in Perfetto), a
table of the most expensive operators and kernels, and a summary that says where a step's time goes: wall time
against the time the GPU was busy (the gap is host overhead), and the kernels' time by kind (matmul, attention,
communication, optimizer, other)."""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

log = logging.getLogger(__name__)

# a kernel's kind, by the first pattern its name matches (cuBLAS, CUTLASS and nvjet matmuls; legalpt's, flash and
# cuDNN attention kernels; NCCL collectives; fused and multi-tensor optimizer kernels)
KINDS = {
    "attention": re.compile(r"legalpt::fa|flash|fmha|sdpa|attention", re.IGNORECASE),
    "matmul": re.compile(r"gemm|nvjet|cutlass|xmma|wgmma|cublas|splitk", re.IGNORECASE),
    "communication": re.compile(r"nccl", re.IGNORECASE),
    "optimizer": re.compile(r"multi_tensor|adam|fused_.*optim", re.IGNORECASE),
    "memory": re.compile(r"memcpy|memset", re.IGNORECASE),
}


def kind_of(kernel: str) -> str:
    """The kind of the kernel named `kernel`: one of KINDS or "other" (elementwise, norms, reductions ...)."""
    return next((kind for kind, pattern in KINDS.items() if pattern.search(kernel)), "other")


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Microseconds covered by the union of (start, end) intervals: the time the device had work, kernels of
    overlapping streams counted once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


class StepProfiler:
    """Profiles steps start + 1 .. start + count of this process (count 0 = off): call `before_step` and
    `after_step` around each step with the steps completed (evaluations and saves due inside the window are in it
    too), and `close` at the end. Writes trace-rank<r>.json, ops-rank<r>.txt and summary-rank<r>.json to `folder`."""

    def __init__(self, folder: Path, start: int, count: int, rank: int) -> None:
        self.folder, self.start, self.count, self.rank = folder, start, count, rank
        self.cuda = torch.cuda.is_available()
        self.profiler: profile | None = None
        self.started_at = 0.0

    def before_step(self, completed: int) -> None:
        """Start when `completed` steps are done and it is train.profile_start."""
        if self.count > 0 and completed == self.start:
            self.synchronize()  # the window holds the profiled steps' work only
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            self.profiler = profile(activities=activities)
            self.profiler.__enter__()
            self.started_at = time.perf_counter()

    def after_step(self, completed: int) -> None:
        """Stop and write when `completed` is start + count."""
        if self.profiler is not None and completed == self.start + self.count:
            self.synchronize()
            wall_s = time.perf_counter() - self.started_at
            self.profiler.__exit__(None, None, None)
            self.write(self.profiler, wall_s)
            self.profiler = None

    def close(self) -> None:
        """Stop a profile that a stop signal cut short, writing nothing."""
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            self.profiler = None

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def write(self, prof: profile, wall_s: float) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.folder / f"trace-rank{self.rank}.json"))
        sort = "self_device_time_total" if self.cuda else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=90)
        (self.folder / f"ops-rank{self.rank}.txt").write_text(table)
        summary = summarize(prof, wall_s, self.count)
        (self.folder / f"summary-rank{self.rank}.json").write_text(json.dumps(summary, indent=2))
        if self.rank == 0:
            log.info("profile of %d steps in %s:\n%s", self.count, self.folder, describe(summary))


def summarize(prof: profile, wall_s: float, steps: int) -> dict:
    """Per step: wall milliseconds, device-busy milliseconds (the union of kernel intervals), kernel milliseconds by
    kind, and the ten longest kernels."""
    # device events but the spans of user annotations (the optimizer's step, ...), which cover kernels listed too
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
    by_kind: dict[str, float] = {}
    by_name: dict[str, float] = {}
    for kernel in kernels:
        us, kind = kernel.time_range.elapsed_us(), kind_of(kernel.name)
        by_kind[kind] = by_kind.get(kind, 0.0) + us
        by_name[kernel.name] = by_name.get(kernel.name, 0.0) + us
    busy = busy_us([(k.time_range.start, k.time_range.end) for k in kernels])
    longest = sorted(by_name.items(), key=lambda item: -item[1])[:10]
    return {
        "steps": steps,
        "wall_ms": 1e3 * wall_s / steps,
        "device_busy_ms": busy / 1e3 / steps,
        "kernel_ms": {kind: us / 1e3 / steps for kind, us in sorted(by_kind.items(), key=lambda item: -item[1])},
        "longest_kernels_ms": {name[:160]: us / 1e3 / steps for name, us in longest},
    }


def describe(summary: dict, unit: str = "step") -> str:
    """Two readable lines of a summary of `unit`s (what summarize's `steps` counted)."""
    wall, busy = summary["wall_ms"], summary["device_busy_ms"]
    kinds = ", ".join(f"{kind} {ms:.1f}" for kind, ms in summary["kernel_ms"].items())
    idle = f"{100 * (1 - busy / wall):.0f}% idle" if wall > 0 else ""
    head = f"  per {unit}: wall {wall:.1f} ms, device busy {busy:.1f} ms ({idle})"
    return f"{head}\n  kernel ms by kind: {kinds or 'none'}"
