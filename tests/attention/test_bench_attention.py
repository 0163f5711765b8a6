"""scripts/bench_attention.py as a CPU dry run: its record, what a run cut off midway leaves, and the parts it is
built from (scripts/benchmarking/attention: the shape plan and the merge of a split run)."""

import importlib
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
ARGS = ["--device", "cpu", "--masks", "causal", "--head-dims", "64", "--impls", "reference", "--modes", "fwd"]


@pytest.fixture
def bench(load_script):
    return load_script("bench_attention")


@pytest.fixture
def shapes(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    return importlib.import_module("benchmarking.attention.shapes")


def _record(out: Path) -> dict:
    [path] = out.glob("attention-*.json")
    return json.loads(path.read_text())


def test_a_full_run_writes_a_complete_record(bench, tmp_path):
    assert bench.main([*ARGS, "--out", str(tmp_path)]) == 0
    record = _record(tmp_path)
    seqlens = sorted({r["seqlen_q"] for r in record["rows"]})
    assert record["header"]["complete"] and seqlens == list(bench.CPU_SCALE.seqlens)


def test_kernel_times_name_what_each_row_ran(bench, tmp_path):
    assert bench.main([*ARGS, "--kernel-times", "2", "--out", str(tmp_path)]) == 0
    rows = _record(tmp_path)["rows"]
    assert rows and all(row["kernels_us"] for row in rows)
    for row in rows:  # on the CPU, operators by their own time: the reference's matmuls among them, longest first
        times = list(row["kernels_us"].values())
        assert any(name.startswith("aten::") for name in row["kernels_us"]) and times == sorted(times, reverse=True)
        assert all(t > 0 for t in times)


def test_ncu_runs_only_run_each_step(bench, shapes, tmp_path, monkeypatch, capsys):
    """--ncu-runs N: each selected step runs N times for a profiler that wraps the process, and nothing is timed or
    recorded."""
    runs = []
    step_of = bench.mode_step

    def counted(mode, run, x, layers):
        step = step_of(mode, run, x, layers)
        return lambda: (runs.append((mode, x.shape.seqlen)), step())

    monkeypatch.setattr(bench, "mode_step", counted)
    monkeypatch.setattr(bench, "median_ms", lambda *a: pytest.fail("--ncu-runs timed a step"))
    assert bench.main([*ARGS, "--ncu-runs", "3", "--out", str(tmp_path)]) == 0
    seqlens = [*bench.CPU_SCALE.seqlens, *shapes.CPU_SCALE.gqa]  # the causal sweep, then the GQA one
    assert runs == [("fwd", s) for s in seqlens for _ in range(3)]
    assert not list(tmp_path.iterdir())
    assert capsys.readouterr().out.count("ran 3 times") == len(seqlens)


def test_a_run_cut_off_keeps_the_shapes_it_measured(bench, tmp_path, monkeypatch):
    measure = bench.bench_shape

    def cut_off_after_the_first(shape, *args):
        if shape.seqlen != bench.CPU_SCALE.seqlens[0]:
            raise KeyboardInterrupt  # what a time limit's signal does to the run
        return measure(shape, *args)

    monkeypatch.setattr(bench, "bench_shape", cut_off_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        bench.main([*ARGS, "--out", str(tmp_path)])
    record = _record(tmp_path)
    assert not record["header"]["complete"]
    assert {r["seqlen_q"] for r in record["rows"]} == {bench.CPU_SCALE.seqlens[0]}


def test_shapes_run_in_the_order_given(shapes):
    chosen = shapes.selected(shapes.plan(shapes.GPU_SCALE, quick=False), ["window-1024", "dense"], [128, 64])
    order = list(dict.fromkeys((s.head_dim, s.mask) for s in chosen))
    assert order == [(128, "window-1024"), (128, "dense"), (64, "window-1024"), (64, "dense")]
    for group in ("sweep", "gqa"):  # the plan's order within: the sweep, then the GQA sweep, each by seqlen
        seqlens = [s.seqlen for s in chosen if (s.head_dim, s.mask, s.group) == (128, "dense", group)]
        assert seqlens == sorted(seqlens)
    groups = [s.group for s in chosen if (s.head_dim, s.mask) == (128, "dense")]
    assert groups == sorted(groups, key=["sweep", "gqa"].index)


def test_gqa_rows_name_their_key_heads_and_agree_with_the_reference(bench, tmp_path):
    args = ["--device", "cpu", "--masks", "causal", "varlen-causal", "--head-dims", "64", "--seqlens", "512",
            "--impls", "reference", "flex", "--modes", "fwd", "--out", str(tmp_path)]  # fmt: skip
    assert bench.main(args) == 0
    rows = _record(tmp_path)["rows"]
    heads = {(r["group"], r["heads"], r["heads_k"], r["documents"] is not None) for r in rows}
    assert heads == {("sweep", 4, 4, False), ("gqa", 4, 1, False), ("varlen", 4, 4, True), ("varlen", 4, 1, True)}
    flex = [r for r in rows if r["impl"] == "flex"]
    assert len(flex) == 4 and all(r["diff_vs"] == "reference" and r["max_abs_diff"] < 0.05 for r in flex)


def test_seqlens_select_and_order(shapes):
    chosen = shapes.selected(shapes.plan(shapes.GPU_SCALE, quick=False), ["window-1024"], [128], [65536, 16384])
    assert [(s.mask, s.seqlen) for s in chosen] == [("window-1024", 65536), ("window-1024", 16384)]


def test_no_shape_matches_the_selection(bench, tmp_path):
    with pytest.raises(SystemExit, match="no shape matches"):
        bench.main([*ARGS, "--seqlens", "7", "--out", str(tmp_path)])


def test_all_shapes_without_a_selection(shapes):
    planned = shapes.plan(shapes.GPU_SCALE, quick=False)
    assert shapes.selected(planned, None, None) == planned


def test_merge_adds_a_part_to_the_record_of_the_day(bench, tmp_path):
    assert bench.main([*ARGS, "--out", str(tmp_path)]) == 0
    part = ["--device", "cpu", "--masks", "dense", "--head-dims", "64", "--impls", "reference", "--modes", "fwd"]
    assert bench.main([*part, "--seqlens", "128", "--merge", "--out", str(tmp_path)]) == 0
    record = _record(tmp_path)
    assert {(r["mask"], r["seqlen_q"]) for r in record["rows"]} == {
        *(("causal", s) for s in bench.CPU_SCALE.seqlens),
        ("dense", 128),
    }
    first, second = record["header"]["parts"]
    assert "--masks causal" in first and "--masks dense" in second and "--merge" in second
    assert len(record["ratios"]) == len(record["rows"])  # one row per shape and mode: reference alone


def test_layers_stack_calls_and_say_what_the_kernels_fill(bench, tmp_path):
    args = [*ARGS, "--seqlens", "256", "--modes", "fwd", "fwd+bwd", "--layers", "3", "--kernel-times", "1"]
    assert bench.main([*args, "--out", str(tmp_path)]) == 0
    rows = [r for r in _record(tmp_path)["rows"] if r["ms"] is not None]
    assert rows and all(r["layers"] == 3 and r["kernel_share"] > 0 and "gpu_busy" not in r for r in rows)  # CPU
    x = bench.make_inputs(bench.plan(bench.CPU_SCALE, quick=True)[0], bench.torch.float32, "cpu")
    calls = []

    def run():
        calls.append(1)
        return x.q * x.k.sum() * x.v.sum()

    for mode in ("fwd", "bwd", "fwd+bwd"):
        calls.clear()
        step = bench.mode_step(mode, run, x, 3)
        made = len(calls)  # bwd: its forwards run when the step is made, outside the timing
        step()
        assert (made, len(calls)) == ((3, 3) if mode == "bwd" else (0, 3))


def test_gpu_busy_is_the_kernels_share_of_one_traces_timeline(monkeypatch):
    """timing._busy_share: kernels' summed time over the span from the first one's start to the last one's end; a
    gap between kernels (the GPU waiting for the host) lowers it, host-side events do not count."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    timing = importlib.import_module("benchmarking.attention.timing")

    def event(device, start, end, annotation=False):
        span = SimpleNamespace(start=start, end=end)
        return SimpleNamespace(device_type=device, time_range=span, is_user_annotation=annotation)

    def share(*events):
        return timing._busy_share(SimpleNamespace(events=lambda: list(events)))

    cuda, cpu = timing.DeviceType.CUDA, timing.DeviceType.CPU
    assert share(event(cuda, 50, 90), event(cpu, 0, 100), event(cuda, 10, 40)) == pytest.approx(70 / 80)
    assert share(event(cuda, 10, 40), event(cuda, 20, 30), event(cuda, 35, 60)) == 1  # overlaps count once
    assert share(event(cuda, 0, 10), event(cuda, 0, 40, annotation=True), event(cuda, 20, 30)) == pytest.approx(2 / 3)
    assert share(event(cpu, 0, 5)) is None


def test_layer_stacks_render_both_shares(load_script):
    """performance.md's layer stacks show the kernels' share of the wall time and, where the record has it, of the
    profiled timeline ("–" for rows measured before gpu_busy existed)."""
    table = load_script("performance_table")
    row = {"impl": "fa3", "mask": "varlen-causal", "head_dim": 64, "seqlen_q": 16384, "batch": 1, "heads": 32,
           "heads_k": 4, "mode": "fwd+bwd", "layers": 22, "ms": 104.9, "kernel_share": 0.92}  # fmt: skip
    lines = table.layer_stacks([{**row, "gpu_busy": 0.997}, row])
    assert lines[-3].endswith("| 0.920 | 0.997 |") and lines[-2].endswith("| 0.920 | – |")


def test_fp8_rows_render_against_our_forward(load_script):
    """performance.md's FP8 table pairs each FP8 forward (kernel alone, and with quantization) with fa3's on the same
    shape, and skips FP8 rows that have no fa3 row."""
    table = load_script("performance_table")
    shape = {"group": "dense", "mask": "causal", "head_dim": 128, "seqlen_q": 16384, "batch": 1, "heads": 16}
    rows = [
        {**shape, "impl": "fa3", "mode": "fwd", "ms": 3.0, "tflops": 400.0},
        {**shape, "impl": "fa3-fp8-kernel", "mode": "fwd", "ms": 1.5, "tflops": 800.0},
        {**shape, "impl": "fa3-fp8", "mode": "fwd", "ms": 2.0, "tflops": 600.0},
        {**shape, "impl": "fa3-fp8", "mode": "fwd", "seqlen_q": 4096, "ms": 1.0, "tflops": 300.0},
    ]
    lines = table.fp8_forward(rows)
    assert [line for line in lines if line.startswith("| causal")] == [
        "| causal | 128 | 16,384 | 1 × 16 | 3.000 | 1.500 | 800 | 2.00× | 2.000 | 1.50× |"
    ]
    assert table.fp8_forward(rows[:1]) == []


def test_backward_balance_model_shows_the_gqa_tail(load_script):
    """scripts/backward_balance.py: head-major order leaves the 1b preset's GQA backward half idle at its end; key
    tiles first spread it evenly; non-GQA shapes are near even either way."""
    rows = {row["shape"]: row for row in load_script("backward_balance").main([])}
    training = rows["1b training (batch 1) causal d64 1 x 8192, heads 32/4"]
    assert training["head_major"] > 1.4 and training["tile_first"] < 1.05
    assert all(row["tile_first"] < 1.06 for row in rows.values())
