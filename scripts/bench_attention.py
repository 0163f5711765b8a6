"""Attention speed: our kernels (fa2, fa3) against torch SDPA's flash and cuDNN backends and FlexAttention.

The benchmark of issue 3. In one process and on the same inputs (seeded, bf16), every implementation runs every
shape in three modes: fwd; bwd, the backward alone (torch.autograd.grad with retain_graph on an output computed
outside the timing); fwd+bwd. A time is the median of many CUDA-event timed repetitions after warm-up
(triton.testing.do_bench, return_mode="median"). FLOPs count only the visible (query, key) pairs, counted exactly
from the element rule (masks.element_mask, in chunks of rows): 4 * pairs * head_dim per head forward, 2.5x that
backward. peak_mib is what one untimed run allocated above what was allocated before it (the inputs; for bwd also
the forward's saved tensors). Once per shape, each output is compared with another implementation's (max abs diff).

Shapes: head dims 64 and 128 with heads = 2048 / head dim; seqlen 1k..16k at batch x seqlen = 16k tokens, causal and
not; causal sliding windows W = 1024 and 4096 (window_size=(W-1, 0)) at 16k and 64k; the first 64 tokens global plus
window 1024 at 64k; a causal pack of 16k tokens in documents of 128..4096 tokens (seeded); and, fwd+bwd only, peak
memory at 8k, 32k, 128k (batch 1, causal, head dim 128, 16 heads). SDPA runs dense and causal natively (is_causal);
the other masks would need a dense O(N^2) mask, so its rows there are skipped with that reason. FlexAttention runs
compiled with the same mask; its BlockMask is built by the untimed first call and cached.

The record goes to <out>/attention-<gpu>-<yyyymmdd>.json (header, rows, ratios), the plot (TFLOP/s vs seqlen, one
line per implementation, one panel per head dim, causal and mode) beside it as .png, and the ratio table is printed
last. A failing implementation is recorded with its error and the run goes on.

On a fresh machine FlexAttention's compiles dominate (about 50 s per shape on the H200: create_block_mask, forward
and backward kernels), so every shape takes over half an hour. Split it with --masks, --head-dims or --impls over
several calls and gather the parts in one record with --merge (the record of the day must be in --out).

    python scripts/bench_attention.py                                 # every shape, on the GPU
    python scripts/bench_attention.py --quick                         # a handful of shapes for kernel development
    python scripts/bench_attention.py --masks causal --merge          # one part of a split run
    python scripts/bench_attention.py --quick --kernel-times 10       # and each kernel's time per run (profiler)
    python scripts/bench_attention.py --device cpu --out /tmp/bench   # dry run: reference and flex, tiny shapes

With --ncu-runs N the selected shapes' implementations and modes only run N times each, untimed and unrecorded: the
program that Nsight Compute wraps, on the benchmark's own shapes and inputs, e.g. the stall reasons of one kernel:

    ncu --clock-control none -k bwd_kernel --launch-skip 2 --launch-count 1 --section WarpStateStats \
        --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
        python scripts/bench_attention.py --head-dims 64 --masks window-1024 --seqlens 65536 --impls fa3 \
        --modes fwd+bwd --ncu-runs 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import accumulate
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd import DeviceType
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from legalpt.attention import BACKENDS, flash_attn_func, flash_attn_varlen_func, flex
from legalpt.attention.masks import MaskSpec, element_mask
from legalpt.provenance import commit

ROOT = Path(__file__).resolve().parent.parent
MODES = ("fwd", "bwd", "fwd+bwd")
BWD_FLOPS = 2.5  # backward FLOPs per forward FLOP
OURS = ("fa3", "fa2", "reference")  # the implementation the ratios are of: the first of these that runs
THEIRS = ("sdpa-flash", "sdpa-cudnn", "flex")  # what the ratios compare it with
DIFF_BASELINES = ("sdpa-flash", "flex", "sdpa-cudnn", "reference", "fa2", "fa3")  # whose output a check compares with
CUDA_IMPLS = {"fa2", "fa3", "sdpa-flash", "sdpa-cudnn"}
_PAIRS_PER_CHUNK = 1 << 24  # (query, key) pairs evaluated at once when counting the visible ones


@dataclass(frozen=True)
class Scale:
    """The sizes of a run: the issue's on the GPU, tiny ones (at most 512 tokens) for a CPU dry run."""

    hidden: int  # heads * head_dim
    tokens: int  # batch * seqlen of the dense sweep and of the varlen pack
    seqlens: tuple[int, ...]  # the dense sweep
    windows: tuple[int, ...]  # sliding-window sizes W
    long: tuple[int, ...]  # seqlens of the window shapes
    global_tokens: int
    doc_lens: tuple[int, int]  # range of the varlen document lengths
    memory: tuple[int, ...]  # seqlens of the peak-memory shapes (batch 1, causal, head dim 128)


GPU_SCALE = Scale(2048, 16384, (1024, 2048, 4096, 8192, 16384), (1024, 4096), (16384, 65536), 64, (128, 4096),
                  (8192, 32768, 131072))  # fmt: skip
CPU_SCALE = Scale(256, 512, (128, 256, 512), (64,), (512,), 8, (16, 128), ())


@dataclass(frozen=True)
class Shape:
    group: str  # sweep | window | global | varlen | memory
    mask: str  # dense | causal | window-W | globalG+window-W | varlen-causal
    head_dim: int
    heads: int
    batch: int
    seqlen: int  # per row; varlen: the packed total
    causal: bool
    window: tuple[int, int] = (-1, -1)
    global_tokens: int = 0
    doc_lens: tuple[int, ...] = ()  # varlen documents

    @property
    def spec(self) -> MaskSpec:
        return MaskSpec(self.causal, self.window, self.global_tokens)


def plan(scale: Scale, quick: bool) -> list[Shape]:
    """The shapes of a run, in order."""
    if quick:
        seqlen = scale.seqlens[len(scale.seqlens) // 2]
        window = scale.windows[0]
        return [
            *(_dense(scale, 128, seqlen, causal) for causal in (False, True)),
            _window(scale, 128, scale.long[0], window, 0),
        ]
    shapes = [_dense(scale, d, s, c) for d in (64, 128) for c in (False, True) for s in scale.seqlens]
    shapes += [_window(scale, d, s, w, 0) for d in (64, 128) for w in scale.windows for s in scale.long]
    shapes += [_window(scale, d, scale.long[-1], scale.windows[0], scale.global_tokens) for d in (64, 128)]
    lens = _doc_lens(scale.tokens, *scale.doc_lens)
    shapes += [
        Shape("varlen", "varlen-causal", d, scale.hidden // d, 1, scale.tokens, True, doc_lens=lens) for d in (64, 128)
    ]
    shapes += [Shape("memory", "causal", 128, 16, 1, s, True) for s in scale.memory]
    return shapes


def selected(
    shapes: list[Shape], masks: list[str] | None, head_dims: list[int] | None, seqlens: list[int] | None = None
) -> list[Shape]:
    """The shapes with the given masks, head dims and seqlens (all where None), in the order given: head dim first,
    then mask, then seqlen, the plan's order within. A run cut off by a time limit has then measured what was listed
    first."""

    def rank(chosen: list | None, value: object) -> int:
        return chosen.index(value) if chosen else 0

    kept = [
        s
        for s in shapes
        if s.mask in (masks or [s.mask])
        and s.head_dim in (head_dims or [s.head_dim])
        and s.seqlen in (seqlens or [s.seqlen])
    ]
    return sorted(kept, key=lambda s: (rank(head_dims, s.head_dim), rank(masks, s.mask), rank(seqlens, s.seqlen)))


def _dense(scale: Scale, head_dim: int, seqlen: int, causal: bool) -> Shape:
    heads = scale.hidden // head_dim
    return Shape("sweep", "causal" if causal else "dense", head_dim, heads, scale.tokens // seqlen, seqlen, causal)


def _window(scale: Scale, head_dim: int, seqlen: int, window: int, global_tokens: int) -> Shape:
    """Causal sliding window of W keys, as transformers maps sliding_window=W: window_size=(W - 1, 0)."""
    mask = f"global{global_tokens}+window-{window}" if global_tokens else f"window-{window}"
    group = "global" if global_tokens else "window"
    heads = scale.hidden // head_dim
    return Shape(group, mask, head_dim, heads, 1, seqlen, True, (window - 1, 0), global_tokens)


def _doc_lens(tokens: int, low: int, high: int) -> tuple[int, ...]:
    """Document lengths drawn uniformly in [low, high] (seed 0) until `tokens`, the last one cut to fit."""
    draw, lens = random.Random(0), []
    while sum(lens) < tokens:
        lens.append(min(draw.randint(low, high), tokens - sum(lens)))
    return tuple(lens)


def visible_pairs(shape: Shape, device: torch.device) -> int:
    """Number of (query, key) pairs the mask lets attend, summed over the batch (or documents), exact."""
    docs = Counter(shape.doc_lens) if shape.doc_lens else Counter({shape.seqlen: shape.batch})
    return sum(count * _document_pairs(shape.spec, n, device) for n, count in docs.items())


def _document_pairs(spec: MaskSpec, seqlen: int, device: torch.device) -> int:
    """Visible pairs of one document of seqlen queries and keys, by the element rule in chunks of rows: O(N) memory."""
    j = torch.arange(seqlen, device=device, dtype=torch.int32)[None, :]
    rows = max(1, _PAIRS_PER_CHUNK // seqlen)
    total = torch.zeros((), dtype=torch.int64, device=device)
    for start in range(0, seqlen, rows):
        i = torch.arange(start, min(start + rows, seqlen), device=device, dtype=torch.int32)[:, None]
        total += element_mask(spec, i, j, 0).sum()
    return int(total)


@dataclass
class Inputs:
    shape: Shape
    q: Tensor  # (B, S, H, D), or (total, H, D) for varlen; all three require grad
    k: Tensor
    v: Tensor
    grad_out: Tensor  # like q
    cu_seqlens: Tensor | None  # int32 (docs + 1,) for varlen


def make_inputs(shape: Shape, dtype: torch.dtype, device: torch.device) -> Inputs:
    torch.manual_seed(0)
    lead = (shape.seqlen,) if shape.doc_lens else (shape.batch, shape.seqlen)
    q, k, v = (torch.randn(*lead, shape.heads, shape.head_dim, device=device, dtype=dtype) for _ in range(3))
    cu = None
    if shape.doc_lens:
        cu = torch.tensor([0, *accumulate(shape.doc_lens)], dtype=torch.int32, device=device)
    return Inputs(shape, q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), torch.randn_like(q), cu)


Runner = Callable[[], Tensor]  # one forward, output in the layout of q


def impl_runner(impl: str, x: Inputs) -> Runner | str:
    """The forward of `impl` on x, or the reason it cannot run this shape."""
    shape, device = x.shape, x.q.device
    if impl in CUDA_IMPLS and device.type != "cuda":
        return f"{impl} needs CUDA (--device cpu runs reference and flex only)"
    if impl.startswith("sdpa"):
        if shape.mask not in ("dense", "causal"):
            return "SDPA expresses only dense and causal masks without an O(N^2) mask tensor"
        backend = SDPBackend.FLASH_ATTENTION if impl == "sdpa-flash" else SDPBackend.CUDNN_ATTENTION
        return _sdpa(x, backend)
    if impl == "flex":
        return _flex(x)
    if impl not in BACKENDS:
        return f"backend {impl!r} is not registered in legalpt.attention (have {', '.join(BACKENDS)})"
    kw = {"causal": shape.causal, "window_size": shape.window, "global_tokens": shape.global_tokens, "backend": impl}
    if x.cu_seqlens is None:
        return lambda: flash_attn_func(x.q, x.k, x.v, **kw)
    max_len = max(shape.doc_lens)
    return lambda: flash_attn_varlen_func(x.q, x.k, x.v, x.cu_seqlens, x.cu_seqlens, max_len, max_len, **kw)


def _sdpa(x: Inputs, backend: SDPBackend) -> Runner:
    qh, kh, vh = (t.transpose(1, 2) for t in (x.q, x.k, x.v))  # (B, H, S, D) views of the same inputs

    def run() -> Tensor:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qh, kh, vh, is_causal=x.shape.causal).transpose(1, 2)

    return run


def _flex(x: Inputs) -> Runner:
    shape = x.shape
    max_len = max(shape.doc_lens, default=shape.seqlen)
    args = (x.cu_seqlens, x.cu_seqlens, max_len, max_len, shape.spec, shape.head_dim**-0.5, 0.0, False)
    q, k, v = x.q, x.k, x.v
    if q.device.type != "cuda":  # FlexAttention has no backward on the CPU and refuses inputs that need one
        q, k, v = q.detach(), k.detach(), v.detach()
    return lambda: flex.attention(q, k, v, *args)[0]


def shape_modes(shape: Shape, args: argparse.Namespace) -> tuple[str, ...]:
    """The modes a shape runs in: the memory shapes fwd+bwd alone."""
    return ("fwd+bwd",) if shape.group == "memory" else args.modes


def step_skip(impl: str, run: Runner | str, mode: str, device: torch.device) -> str | None:
    """Why an implementation's step does not run: its runner's reason (a string), or its mode's."""
    if isinstance(run, str):
        return run
    if impl == "flex" and mode != "fwd" and device.type != "cuda":
        return "FlexAttention has no backward on the CPU"
    return None


def mode_step(mode: str, run: Runner, x: Inputs) -> Callable[[], object]:
    """What one timed repetition does; for bwd the forward runs here, once, outside the timing."""
    inputs = (x.q, x.k, x.v)
    if mode == "fwd":
        return run
    if mode == "bwd":
        out = run()
        return lambda: torch.autograd.grad(out, inputs, x.grad_out, retain_graph=True)
    return lambda: torch.autograd.grad(run(), inputs, x.grad_out)


def peak_mib(step: Callable[[], object], device: torch.device) -> float | None:
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


def median_ms(step: Callable[[], object], device: torch.device, cpu_reps: int) -> float:
    if device.type == "cuda":
        from triton.testing import do_bench  # only the GPU machine needs triton

        return do_bench(step, warmup=50, rep=200, return_mode="median")
    times = []
    for _ in range(cpu_reps):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def check_outputs(runners: dict[str, Runner | str]) -> dict[str, tuple | str]:
    """Per implementation that runs: (max abs diff of its output, the implementation compared with), or its error."""
    outputs, results = {}, {}
    for impl, run in runners.items():
        if isinstance(run, str):
            continue
        try:
            outputs[impl] = run().detach()
        except Exception as error:  # one implementation's failure is a result, not the end of the run
            results[impl] = _error(error)
    for impl, out in outputs.items():
        other = next((b for b in DIFF_BASELINES if b != impl and b in outputs), None)
        diff = None if other is None else (out.float() - outputs[other].float()).abs().max().item()
        results[impl] = (_number(diff), other)
    return results


def _error(error: Exception) -> str:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"[:500]


def _number(x: float | None) -> float | str | None:
    return x if x is None or math.isfinite(x) else str(x)  # JSON has no NaN


def bench_shape(shape: Shape, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> list[dict]:
    x = make_inputs(shape, dtype, device)
    pairs = visible_pairs(shape, device)
    fwd_flops = 4 * pairs * shape.head_dim * shape.heads
    base = {
        "group": shape.group, "mask": shape.mask, "dtype": str(dtype).removeprefix("torch."),
        "head_dim": shape.head_dim, "seqlen_q": shape.seqlen, "seqlen_k": shape.seqlen, "batch": shape.batch,
        "heads": shape.heads, "causal": shape.causal, "documents": len(shape.doc_lens) or None,
        "density": pairs / (shape.batch * shape.seqlen**2),
    }  # fmt: skip
    runners = {impl: impl_runner(impl, x) for impl in args.impls}
    checks = check_outputs(runners)
    rows = []
    for impl, run in runners.items():
        for mode in shape_modes(shape, args):
            row = {"impl": impl, "mode": mode, **base, "ms": None, "tflops": None, "peak_mib": None}
            if skip := step_skip(impl, run, mode, device):
                row["skipped"] = skip
            elif isinstance(checks[impl], str):
                row["error"] = checks[impl]
            else:
                row["max_abs_diff"], row["diff_vs"] = checks[impl]
                row.update(_measure(mode, run, x, fwd_flops, device, args.cpu_reps, args.kernel_times))
            rows.append(row)
            print(_progress(row), flush=True)
    return rows


def _measure(
    mode: str, run: Runner, x: Inputs, fwd_flops: int, device: torch.device, cpu_reps: int, kernel_steps: int
) -> dict:
    flops = fwd_flops * {"fwd": 1.0, "bwd": BWD_FLOPS, "fwd+bwd": 1.0 + BWD_FLOPS}[mode]
    try:
        step = mode_step(mode, run, x)
        peak = peak_mib(step, device)
        ms = median_ms(step, device, cpu_reps)
        kernels = {"kernels_us": kernel_times(step, device, kernel_steps)} if kernel_steps else {}
    except Exception as error:  # recorded in the row; the run goes on
        return {"error": _error(error)}
    return {"ms": ms, "tflops": flops / ms / 1e9, "peak_mib": peak, **kernels}


def kernel_times(step: Callable[[], object], device: torch.device, steps: int) -> dict[str, float]:
    """Microseconds per step of each CUDA kernel that `step` launches (on the CPU: each operator's own time), over
    `steps` runs under torch.profiler, longest first. Where do_bench gives one time, this says which kernel spends
    it: close variants are told apart by their kernels (docs/kernels.md, steps 15 and 16)."""
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
    return dict(sorted(times.items(), key=lambda item: -item[1]))


def _progress(row: dict) -> str:
    what = (
        f"{row['impl']:<10} {row['mode']:<7} {row['mask']:<20} d={row['head_dim']:<3} S={row['seqlen_q']:<6} "
        f"B={row['batch']:<2} H={row['heads']:<2}"
    )
    if row.get("skipped") or row.get("error"):
        return f"{what} {'skipped' if row.get('skipped') else 'ERROR'}: {row.get('skipped') or row.get('error')}"
    peak = f" peak {row['peak_mib']:,.0f} MiB" if row["peak_mib"] is not None else ""
    diff = f" diff {row['max_abs_diff']} vs {row['diff_vs']}"
    longest = list(row.get("kernels_us", {}).items())[:5]
    kernels = "".join(f" | {name.removeprefix('void ')[:40]} {us:.0f} us" for name, us in longest)
    return f"{what} {row['ms']:9.3f} ms {row['tflops']:7.3g} TFLOP/s{peak}{diff}{kernels}"


def ratios(rows: list[dict]) -> list[dict]:
    """Per shape and mode: our time and how many times faster ours is than each other implementation
    (their ms / our ms); for fwd+bwd also our peak memory over sdpa-flash's."""
    measured = {(*_key(r), r["impl"]): r for r in rows if r["ms"] is not None}
    ours = next((impl for impl in OURS if any(key[-1] == impl for key in measured)), None)
    table = []
    for key in dict.fromkeys(_key(r) for r in rows):
        mine = measured.get((*key, ours))
        if mine is None:
            continue
        entry = {"ours": ours, "ours_ms": mine["ms"], **dict(zip(_KEY_FIELDS, key, strict=True))}
        for impl in THEIRS:
            theirs = measured.get((*key, impl))
            entry[f"vs_{impl}"] = theirs["ms"] / mine["ms"] if theirs else None
        sdpa = measured.get((*key, "sdpa-flash"))
        usable = sdpa and mine["peak_mib"] and sdpa["peak_mib"]
        entry["peak_vs_sdpa-flash"] = mine["peak_mib"] / sdpa["peak_mib"] if usable else None
        table.append(entry)
    return table


_KEY_FIELDS = ("group", "mask", "head_dim", "seqlen_q", "batch", "heads", "mode")


def _key(row: dict) -> tuple:
    return tuple(row[f] for f in _KEY_FIELDS)


def format_ratios(table: list[dict]) -> str:
    if not table:
        return "no ratios: the implementation of ours (fa3, fa2, or reference on the CPU) has no measured row"
    ours = table[0]["ours"]
    lines = [
        f"{'mask':<20} {'d':>3} {'seqlen':>6} {'BxH':>6} {'mode':<7} {ours + ' ms':>10} "
        + " ".join(f"{ours + '/' + t:>16}" for t in THEIRS)
        + f" {'mem/sdpa-flash':>14}"
    ]
    for e in table:
        cells = " ".join(f"{_times(e[f'vs_{t}']):>16}" for t in THEIRS)
        lines.append(
            f"{e['mask']:<20} {e['head_dim']:>3} {e['seqlen_q']:>6} {e['batch']:>2}x{e['heads']:<3} {e['mode']:<7} "
            f"{e['ours_ms']:>10.3f} {cells} {_times(e['peak_vs_sdpa-flash']):>14}"
        )
    return "\n".join(lines)


def _times(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}x"


def plot(rows: list[dict], path: Path) -> bool:
    """TFLOP/s vs seqlen of the dense sweep: one panel per (head dim, causal, mode), one line per implementation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = [r for r in rows if r["group"] == "sweep" and r["tflops"] is not None]
    if not sweep:
        return False
    panels = sorted({(r["head_dim"], r["causal"]) for r in sweep})
    modes = [m for m in MODES if any(r["mode"] == m for r in sweep)]
    fig, axes = plt.subplots(len(panels), len(modes), figsize=(4.5 * len(modes), 3.2 * len(panels)), squeeze=False)
    for (head_dim, causal), row_axes in zip(panels, axes, strict=True):
        for mode, ax in zip(modes, row_axes, strict=True):
            for impl in dict.fromkeys(r["impl"] for r in sweep):
                points = sorted(
                    (r["seqlen_q"], r["tflops"])
                    for r in sweep
                    if (r["impl"], r["head_dim"], r["causal"], r["mode"]) == (impl, head_dim, causal, mode)
                )
                if points:
                    ax.plot(*zip(*points, strict=True), marker="o", label=impl)
            ax.set_xscale("log", base=2)
            seqlens = sorted({r["seqlen_q"] for r in sweep})
            ax.set_xticks(seqlens, [f"{s // 1024}k" if s >= 1024 else str(s) for s in seqlens])
            ax.set_ylim(bottom=0)
            ax.set_title(f"head dim {head_dim}, {'causal' if causal else 'dense'}, {mode}", fontsize=10)
            ax.set_xlabel("seqlen")
            ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def merged(old: dict, rows: list[dict], head: dict) -> tuple[list[dict], dict]:
    """A record assembled from runs split over several processes (a full run outlasts one device call): the old
    record's rows that this run did not re-measure, then this run's; every part's command in the header. Each
    comparison of implementations on one shape still comes from one process."""
    new = {(*_key(r), r["impl"]) for r in rows}
    kept = [r for r in old["rows"] if (*_key(r), r["impl"]) not in new]
    return kept + rows, {**head, "parts": [*old["header"].get("parts", [old["header"]["command"]]), head["command"]]}


def write_record(path: Path, old: dict | None, rows: list[dict], head: dict) -> tuple[list[dict], list[dict]]:
    """Write the record of `rows` (merged into `old`, the record --merge adds to, if any); returns its rows and
    ratio table. head["complete"] is False while shapes of the run are still to come."""
    if old is not None:
        rows, head = merged(old, rows, head)
    table = ratios(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"header": head, "rows": rows, "ratios": table}, indent=2) + "\n")
    return rows, table


CODE_ENV = "LEGALPT_BENCH_CODE"  # the header's note of the measured code, where it is not the checkout's commit


def header(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict:
    cuda = device.type == "cuda"
    return {
        "gpu": torch.cuda.get_device_name(device) if cuda else f"cpu{os.cpu_count()}",
        "device": device.type,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "commit": commit(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "dtype": str(dtype).removeprefix("torch."),
        "impls": args.impls,
        "modes": list(args.modes),
        "quick": args.quick,
        "timing": "triton do_bench median, warmup 50 ms, rep 200 ms" if cuda else f"median of {args.cpu_reps} runs",
        # where the measured legalpt is not the checkout's commit (an A/B's tree: scripts/ab_attention.py says which)
        **({"code": os.environ[CODE_ENV]} if os.environ.get(CODE_ENV) else {}),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run on tiny shapes")
    parser.add_argument("--quick", action="store_true", help="head dim 128 dense and causal at 4k, window 1024 at 16k")
    parser.add_argument("--impls", nargs="+", help="default: fa2 sdpa-flash sdpa-cudnn flex fa3 (cpu: reference flex)")
    parser.add_argument("--modes", nargs="+", choices=MODES, help="default: all three (--quick: fwd fwd+bwd)")
    parser.add_argument("--masks", nargs="+", help="only shapes with these masks, e.g. causal window-1024")
    parser.add_argument("--head-dims", nargs="+", type=int, help="only shapes with these head dims")
    parser.add_argument(
        "--seqlens", nargs="+", type=int, help="only shapes with these seqlens (varlen: the packed total)"
    )
    parser.add_argument(
        "--merge", action="store_true", help="add to today's record in --out (its rows of re-measured shapes replaced)"
    )
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--cpu-reps", type=int, default=3, help="timed runs per measurement on the CPU")
    parser.add_argument(
        "--kernel-times", type=int, default=0, metavar="STEPS",
        help="also profile STEPS runs per row: microseconds per run of each kernel, in the row's kernels_us",
    )  # fmt: skip
    parser.add_argument(
        "--ncu-runs", type=int, default=0, metavar="N",
        help="only run each selected shape, implementation and mode N times, untimed, for ncu (no record)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="folder of the record and plot")
    args = parser.parse_args(argv)
    known = ("fa2", "fa3", "sdpa-flash", "sdpa-cudnn", "flex", "reference")
    cpu = args.device == "cpu"
    args.impls = args.impls or (["reference", "flex"] if cpu else ["fa2", "sdpa-flash", "sdpa-cudnn", "flex", "fa3"])
    if unknown := [i for i in args.impls if i not in known]:
        parser.error(f"--impls: unknown {unknown}; expected some of {', '.join(known)}")
    args.modes = tuple(args.modes or (("fwd", "fwd+bwd") if args.quick else MODES))
    if args.cpu_reps < 1:
        parser.error(f"--cpu-reps must be >= 1; got {args.cpu_reps}")
    if args.ncu_runs < 0:
        parser.error(f"--ncu-runs must be >= 0 (0: measure as usual); got {args.ncu_runs}")
    if args.kernel_times < 0:
        parser.error(f"--kernel-times must be >= 0 (0: no profile); got {args.kernel_times}")
    if not cpu and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU here (use --device cpu for a dry run)")
    return args


def run_for_profiler(shapes: list[Shape], args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> int:
    """--ncu-runs: every selected (shape, implementation, mode) step run that many times, in that order."""
    for shape in shapes:
        x = make_inputs(shape, dtype, device)
        for impl in args.impls:
            run = impl_runner(impl, x)
            for mode in shape_modes(shape, args):
                what = f"{impl} {mode} {shape.mask} d={shape.head_dim} S={shape.seqlen}"
                if skip := step_skip(impl, run, mode, device):
                    print(f"{what}: skipped, {skip}")
                    continue
                step = mode_step(mode, run, x)
                for _ in range(args.ncu_runs):
                    step()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                print(f"{what}: ran {args.ncu_runs} times")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    # FlexAttention and create_block_mask compile once per shape (dynamic=False); the default limit of 8 would send
    # later shapes to the unfused, O(N^2) fallback
    torch._dynamo.config.recompile_limit = 512
    scale = CPU_SCALE if device.type == "cpu" else GPU_SCALE
    shapes = selected(plan(scale, args.quick), args.masks, args.head_dims, args.seqlens)
    if not shapes:
        raise SystemExit(
            f"--masks {args.masks} --head-dims {args.head_dims} --seqlens {args.seqlens}: no shape matches"
        )
    if args.ncu_runs:
        return run_for_profiler(shapes, args, device, dtype)
    if device.type == "cpu":
        print("--device cpu: no peak-memory shapes (they need CUDA memory statistics)")
        torch.set_num_threads(1)  # a dry run on shared cores: several threads mostly wait for each other there
    start, head = time.perf_counter(), header(args, device, dtype)
    path = args.out / f"attention-{head['gpu'].replace(' ', '-')}-{datetime.now(timezone.utc):%Y%m%d}.json"
    old = json.loads(path.read_text()) if args.merge and path.exists() else None
    measured: list[dict] = []
    for n, shape in enumerate(shapes, 1):
        measured += bench_shape(shape, args, device, dtype)
        # the record is rewritten after every shape, so a run cut off by a time limit keeps what it measured
        rows, table = write_record(path, old, measured, {**head, "complete": n == len(shapes)})
    print(f"\nwrote {path} ({len(rows)} rows, {time.perf_counter() - start:.0f} s)")
    if plot(rows, path.with_suffix(".png")):
        print(f"wrote {path.with_suffix('.png')}")
    for kind in ("skipped", "error"):
        counts = Counter(r[kind] for r in rows if r.get(kind))
        for reason, count in counts.items():
            print(f"{kind}: {count} rows: {reason}")
    print()
    print(format_ratios(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
