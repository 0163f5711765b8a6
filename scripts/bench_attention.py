"""Attention speed: our kernels (fa2, fa3) against torch SDPA's flash and cuDNN backends and FlexAttention.

In one process and on the same inputs (seeded, bf16), every implementation runs every shape in three modes: fwd;
bwd, the backward alone (torch.autograd.grad with retain_graph on an output computed outside the timing); fwd+bwd.
A time is the median of many CUDA-event timed repetitions after warm-up (triton.testing.do_bench,
return_mode="median"). FLOPs count only the visible (query, key) pairs, counted exactly from the element rule
(masks.element_mask, in chunks of rows): 4 * pairs * head_dim per head forward, 2.5x that backward. peak_mib is what
one untimed run allocated above what was allocated before it (the inputs; for bwd also the forward's saved
tensors). Once per shape, each output is compared with another implementation's (max abs diff).

Shapes: head dims 64 and 128 with heads = 2048 / head dim; seqlen 1k..16k at batch x seqlen = 16k tokens, causal and
not; the same at 4k..16k with GQA (8 query heads per key/value head: 32/4 at d64, the 1b preset's, and 16/2 at
d128); causal sliding windows W = 1024 and 4096 (window_size=(W-1, 0)) at 16k and 64k; the first 64 tokens global
plus window 1024 at 64k; a causal pack of 16k tokens in documents of 128..8192 tokens (seeded) at d64 (32/32 and
32/4 heads) and d128; and, fwd+bwd only, peak memory at 8k, 32k, 128k (batch 1, causal, head dim 128, 16 heads).
Rows name their query and key/value heads (heads, heads_k) and, packed, their documents. SDPA runs dense and causal
natively (is_causal; GQA by enable_gqa); the other masks would need a dense O(N^2) mask, so its rows there are skipped
with that reason. FlexAttention runs compiled with the same mask; its BlockMask is built by the untimed first call
and cached.

The record goes to <out>/attention-<gpu>-<yyyymmdd>.json (header, rows, ratios), replacing the GPU's earlier record,
the plot (TFLOP/s vs seqlen, one line per implementation, one panel per head dim, causal and mode) beside it as .png,
and the ratio table is printed last. A failing implementation is recorded with its error and the run goes on.

On a fresh machine FlexAttention's compiles dominate (about 50 s per shape on the H200: create_block_mask, forward
and backward kernels), so every shape takes over half an hour. Split it with --masks, --head-dims or --impls over
several processes and gather the parts in one record with --merge (which adds to the record of the same day).

    python scripts/bench_attention.py                                 # every shape, on the GPU
    python scripts/bench_attention.py --quick                         # a handful of shapes for kernel development
    python scripts/bench_attention.py --masks causal --merge          # one part of a split run
    python scripts/bench_attention.py --quick --kernel-times 10       # and each kernel's time per run (profiler)
    python scripts/bench_attention.py --layers 22 --kernel-times 3 --impls fa3 --masks varlen-causal --head-dims 64 \
        --modes fwd+bwd                                               # a 22-layer stack: gpu_busy = 1 - host
    python scripts/bench_attention.py --device cpu --out /tmp/bench   # dry run: reference and flex, tiny shapes

With --ncu-runs N the selected shapes' implementations and modes only run N times each, untimed and unrecorded: the
program that Nsight Compute wraps, on the benchmark's own shapes and inputs, e.g. the stall reasons of one kernel
(scripts/ncu_stalls.py reads a report's source page):

    ncu --clock-control none -k bwd_kernel --launch-skip 2 --launch-count 1 --section WarpStateStats \
        --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
        python scripts/bench_attention.py --head-dims 64 --masks window-1024 --seqlens 65536 --impls fa3 \
        --modes fwd+bwd --ncu-runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from benchmarking import record
from benchmarking.attention.plot import plot
from benchmarking.attention.record import format_ratios, write_record
from benchmarking.attention.runners import (
    IMPLS,
    MODES,
    Inputs,
    Runner,
    check_outputs,
    error_message,
    impl_runner,
    make_inputs,
    mode_step,
    shape_modes,
    step_skip,
)
from benchmarking.attention.shapes import (
    CPU_SCALE,
    GPU_SCALE,
    MODE_FLOPS,
    Shape,
    forward_flops,
    plan,
    selected,
    visible_pairs,
)
from benchmarking.attention.timing import kernel_times, median_ms, peak_mib, timing_note

CODE_ENV = "LEGALPT_BENCH_CODE"  # the header's note of the measured code, where it is not the checkout's commit


def bench_shape(shape: Shape, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> list[dict]:
    """Every implementation and mode on one shape: a row each, measured, skipped (with why) or failed (with what)."""
    x = make_inputs(shape, dtype, device)
    pairs = visible_pairs(shape, device)
    fwd_flops = forward_flops(shape, pairs)
    base = {
        "group": shape.group, "mask": shape.mask, "dtype": str(dtype).removeprefix("torch."),
        "head_dim": shape.head_dim, "seqlen_q": shape.seqlen, "seqlen_k": shape.seqlen, "batch": shape.batch,
        "heads": shape.heads, "heads_k": shape.kv_heads, "causal": shape.causal, "layers": args.layers,
        "documents": len(shape.doc_lens) or None,
        "density": pairs / (shape.batch * shape.seqlen**2),
    }  # fmt: skip
    runners = {impl: impl_runner(impl, x) for impl in args.impls}
    checks = check_outputs(runners)
    rows = []
    for impl, run in runners.items():
        for mode in shape_modes(shape, args.modes):
            row = {"impl": impl, "mode": mode, **base, "ms": None, "tflops": None, "peak_mib": None}
            if skip := step_skip(impl, run, mode, device):
                row["skipped"] = skip
            elif isinstance(checks[impl], str):
                row["error"] = checks[impl]
            else:
                row["max_abs_diff"], row["diff_vs"] = checks[impl]
                row.update(_measure(mode, run, x, fwd_flops, device, args))
            rows.append(row)
            print(_progress(row), flush=True)
    return rows


def _measure(mode: str, run: Runner, x: Inputs, fwd_flops: int, device: torch.device, args: argparse.Namespace) -> dict:
    """A row's measurement of --layers calls a step: ms, TFLOP/s, peak memory, and with --kernel-times each kernel's
    time, the share of the wall time they fill and (GPU) the share of the profiled timeline they fill."""
    flops = fwd_flops * args.layers * MODE_FLOPS[mode]
    try:
        step = mode_step(mode, run, x, args.layers)
        peak = peak_mib(step, device)
        ms = median_ms(step, device, args.cpu_reps)
        kernels = {}
        if args.kernel_times:
            kernels["kernels_us"], gpu_busy = kernel_times(step, device, args.kernel_times)
            kernels["kernel_share"] = sum(kernels["kernels_us"].values()) / 1e3 / ms
            if gpu_busy is not None:
                kernels["gpu_busy"] = gpu_busy
    except Exception as error:  # recorded in the row; the run goes on
        return {"error": error_message(error)}
    return {"ms": ms, "tflops": flops / ms / 1e9, "peak_mib": peak, **kernels}


def _progress(row: dict) -> str:
    what = (
        f"{row['impl']:<10} {row['mode']:<7} {row['mask']:<20} d={row['head_dim']:<3} S={row['seqlen_q']:<6} "
        f"B={row['batch']:<2} H={row['heads']:<2}/{row['heads_k']:<2}"
    )
    if row.get("skipped") or row.get("error"):
        return f"{what} {'skipped' if row.get('skipped') else 'ERROR'}: {row.get('skipped') or row.get('error')}"
    peak = f" peak {row['peak_mib']:,.0f} MiB" if row["peak_mib"] is not None else ""
    diff = f" diff {row['max_abs_diff']} vs {row['diff_vs']}"
    longest = list(row.get("kernels_us", {}).items())[:5]
    kernels = "".join(f" | {name.removeprefix('void ')[:40]} {us:.0f} us" for name, us in longest)
    return f"{what} {row['ms']:9.3f} ms {row['tflops']:7.3g} TFLOP/s{peak}{diff}{kernels}"


def header(args: argparse.Namespace, argv: list[str] | None, device: torch.device, dtype: torch.dtype) -> dict:
    cuda = device.type == "cuda"
    return record.header(
        "attention", device, __file__, argv,
        device=device.type,
        cudnn=torch.backends.cudnn.version() if cuda else None,
        dtype=str(dtype).removeprefix("torch."),
        impls=args.impls,
        modes=list(args.modes),
        quick=args.quick,
        timing=timing_note(device, args.cpu_reps),
        # where the measured legalpt is not the checkout's commit (an A/B's tree: scripts/ab_attention.py says which)
        **({"code": os.environ[CODE_ENV]} if os.environ.get(CODE_ENV) else {}),
    )  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run on tiny shapes")
    parser.add_argument("--quick", action="store_true", help="head dim 128 dense and causal at 4k, window 1024 at 16k")
    parser.add_argument(
        "--impls",
        nargs="+",
        help="default: fa2 sdpa-flash sdpa-cudnn flex fa3 fa3-fp8 fa3-fp8-kernel (cpu: reference flex)",
    )
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
        "--layers", type=int, default=1, metavar="L",
        help="each timed step makes L calls, as L layers do (fwd+bwd: L forwards, one backward through all); with "
        "--kernel-times a row's kernel_share is the kernels' time over the wall time, and on a GPU its gpu_busy their "
        "share of the profiled timeline: what host overhead leaves",
    )  # fmt: skip
    parser.add_argument(
        "--ncu-runs", type=int, default=0, metavar="N",
        help="only run each selected shape, implementation and mode N times, untimed, for ncu (no record)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=record.RESULTS, help="folder of the record and plot")
    args = parser.parse_args(argv)
    cpu = args.device == "cpu"
    args.impls = args.impls or (
        ["reference", "flex"]
        if cpu
        else ["fa2", "sdpa-flash", "sdpa-cudnn", "flex", "fa3", "fa3-fp8", "fa3-fp8-kernel"]
    )
    if unknown := [i for i in args.impls if i not in IMPLS]:
        parser.error(f"--impls: unknown {unknown}; expected some of {', '.join(IMPLS)}")
    args.modes = tuple(args.modes or (("fwd", "fwd+bwd") if args.quick else MODES))
    if args.cpu_reps < 1:
        parser.error(f"--cpu-reps must be >= 1; got {args.cpu_reps}")
    if args.ncu_runs < 0:
        parser.error(f"--ncu-runs must be >= 0 (0: measure as usual); got {args.ncu_runs}")
    if args.layers < 1:
        parser.error(f"--layers must be >= 1; got {args.layers}")
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
            for mode in shape_modes(shape, args.modes):
                what = f"{impl} {mode} {shape.mask} d={shape.head_dim} S={shape.seqlen}"
                if skip := step_skip(impl, run, mode, device):
                    print(f"{what}: skipped, {skip}")
                    continue
                step = mode_step(mode, run, x, args.layers)
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
    start, head = time.perf_counter(), header(args, argv, device, dtype)
    today = record.path_of(args.out, head)
    old = json.loads(today.read_text()) if args.merge and today.exists() else None
    measured: list[dict] = []
    for n, shape in enumerate(shapes, 1):
        measured += bench_shape(shape, args, device, dtype)
        # the record is rewritten after every shape, so a run cut off by a time limit keeps what it measured
        path, rows, table = write_record(args.out, old, measured, {**head, "complete": n == len(shapes)})
    print(f"\nwrote {path} ({len(rows)} rows, {time.perf_counter() - start:.0f} s)")
    if plot(rows, path.with_suffix(".png")):
        print(f"wrote {path.with_suffix('.png')}")
    else:
        path.with_suffix(".png").unlink(missing_ok=True)  # an earlier run's plot of the same day would not match
    for kind in ("skipped", "error"):
        counts = Counter(r[kind] for r in rows if r.get(kind))
        for reason, count in counts.items():
            print(f"{kind}: {count} rows: {reason}")
    print()
    print(format_ratios(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
