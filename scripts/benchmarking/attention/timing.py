"""How the attention benchmark measures one step: its median time, its peak memory, and each kernel's share.

On the GPU a time is the median of CUDA-event timed repetitions after warm-up (triton.testing.do_bench,
return_mode="median"); on the CPU the median of a few wall-clock runs. Peak memory is what one untimed run allocates
above what was allocated before it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

Step = Callable[[], object]


def timing_note(device: torch.device, cpu_reps: int) -> str:
    """How `median_ms` times on `device`, for the record's header."""
    if device.type == "cuda":
        return "triton do_bench median, warmup 50 ms, rep 200 ms"
    return f"median of {cpu_reps} runs"


def median_ms(step: Step, device: torch.device, cpu_reps: int) -> float:
    if device.type == "cuda":
        from triton.testing import do_bench  # only a GPU machine needs triton

        return do_bench(step, warmup=50, rep=200, return_mode="median")
    times = []
    for _ in range(cpu_reps):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def peak_mib(step: Step, device: torch.device) -> float | None:
    """MiB one run allocates above what is allocated before it (also the warm-up, and compiles where needed)."""
    if device.type != "cuda":
        step()
        return None
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    result = step()
    torch.cuda.synchronize(device)
    del result
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


def kernel_times(step: Step, device: torch.device, steps: int) -> tuple[dict[str, float], float | None]:
    """Microseconds per step of each CUDA kernel that `step` launches (on the CPU: each operator's own time), over
    `steps` runs under torch.profiler, longest first. Where do_bench gives one time, this says which kernel spends
    it, so that close variants of a kernel are told apart by the kernel that changed.

    Also, on a GPU, the share of the profiled runs' timeline (first kernel's start to last kernel's end, the runs
    back to back) that kernels fill: the rest is where the GPU waited for the host, a lower bound since the profiler
    slows the launches. One trace gives both, so the share does not mix runs whose clocks differ (the summed kernel
    times over do_bench's median did, by several %)."""
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    step()  # compiles and caches outside the profile
    sync()
    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        for _ in range(steps):
            step()
        sync()
    times = {}
    for event in prof.key_averages():
        total = event.device_time_total if cuda else event.self_cpu_time_total
        if total > 0 and (not cuda or event.device_type == DeviceType.CUDA):
            times[event.key] = round(total / steps, 1)
    return dict(sorted(times.items(), key=lambda item: -item[1])), _busy_share(prof) if cuda else None


def _busy_share(prof: profile) -> float | None:
    """The time some kernel runs over the span from the first kernel's start to the last one's end (kernels that
    overlap, on several streams, count once; annotations of the GPU timeline are not kernels)."""
    ranges = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA and not e.is_user_annotation
    )
    if not ranges:
        return None
    busy, (start, end) = 0, ranges[0]
    for a, b in ranges[1:]:  # merge the sorted intervals
        if a > end:
            busy, start = busy + end - start, a
        end = max(end, b)
    busy += end - start
    span = end - ranges[0][0]
    return busy / span if span > 0 else None
