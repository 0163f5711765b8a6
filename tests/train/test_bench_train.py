"""scripts/bench_train.py: a CPU dry run through legalpt-train, and, with a fake runner standing in for the trainer's
process, how rows, out-of-memory jobs, failures, the longest-seq_len search and a merged second part are recorded."""

import json
import signal
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from legalpt.config import compose

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
ROW_KEYS = {"attention", "model", "seq_len", "batch_size", "gpus", "documents", "activation_checkpointing",
            "save_attention", "offload_activations", "mlp_chunk_tokens", "precision", "compile", "loss_impl",
            "grad_accum", "steps", "tokens_per_s", "mfu", "peak_gib", "oom", "error", "vs_sdpa"}  # fmt: skip
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
PROFILE = {"steps": 2, "wall_ms": 10.0, "device_busy_ms": 9.0, "kernel_ms": {"attention": 5.0, "matmul": 3.0},
           "longest_kernels_ms": {"fwd_kernel": 5.0}}  # fmt: skip


@pytest.fixture
def bench(load_script):
    return load_script("bench_train")


@pytest.fixture
def fake_bench(bench, monkeypatch):
    """The script with the header computed in this process (the dry run tests the separate process)."""
    record = sys.modules["benchmarking.record"]
    monkeypatch.setattr(bench, "machine_header", lambda device, argv: record.header("train", device, "x.py", argv))
    return bench


def _record(out: Path) -> dict:
    [path] = out.glob("train-*.json")
    return json.loads(path.read_text())


class FakeTrainer:
    """Stands in for legalpt-train: a job fits when seq_len <= capacity[attention]; one that fits writes
    metrics.jsonl with a slow first step, then `speed[attention]` tokens/s for every other step (times `packed`
    on the demo corpus as generated, times `accum` where train.grad_accum > 1)."""

    def __init__(
        self,
        capacity: dict,
        speed: dict,
        fail: str | None = None,
        packed: dict | None = None,
        accum: dict | None = None,
    ):
        self.capacity, self.speed, self.fail, self.packed = capacity, speed, fail, packed or {}
        self.accum = accum or {}  # speed factors of jobs with train.grad_accum > 1
        self.commands: list[list[str]] = []  # legalpt-train's
        self.prepared: list[list[str]] = []  # legalpt-prepare's

    def __call__(self, command, env, timeout, log):
        bench = sys.modules["benchmarking.train.runs"]
        if Path(command[0]).name == "legalpt-prepare":
            self.prepared.append(command)
            return bench.Outcome(0, "prepared\n")
        self.commands.append(command)
        given = dict(arg.split("=", 1) for arg in command if "=" in arg and not arg.startswith("-"))
        attention, seq_len = given["model.attn_implementation"], int(given["data.seq_len"])
        if self.fail == attention:
            return bench.Outcome(1, "Traceback (most recent call last):\nValueError: no kernel for this shape\n")
        if seq_len > self.capacity[attention]:
            return bench.Outcome(1, f"step 1\n{OOM}\nSet HYDRA_FULL_ERROR=1 for a complete stack trace.\n")
        run_dir = Path(given["train.output_dir"])
        run_dir.mkdir(parents=True)
        with (run_dir / "metrics.jsonl").open("w") as f:
            f.write(json.dumps({"step": 0, "eval/loss": 5.0}) + "\n")
            start, count = int(given.get("train.profile_start", 0)), int(given.get("train.profile_steps", 0))
            for step in range(1, int(given["train.steps"]) + 1):
                speed = self.speed[attention] * (0.1 if step == 1 else 1 + step / 100)
                speed *= self.packed.get(attention, 1.0) if given["data"] == "demo" else 1.0
                speed *= self.accum.get(attention, 1.0) if int(given.get("train.grad_accum", 1)) > 1 else 1.0
                speed *= 0.5 if start < step <= start + count else 1  # the profiler slows its steps down
                metrics = {"train/tokens_per_s": speed, "train/mfu": speed / 1e6, "train/peak_gib": seq_len / 100}
                peak = {"train/mfu_peak": "Fake GPU (dense bf16 table)", "train/mfu_peak_tflops": 1.0}
                f.write(json.dumps({"step": step, **metrics, **peak}) + "\n")
        if count:
            (run_dir / "profile").mkdir()
            (run_dir / "profile" / "summary-rank0.json").write_text(json.dumps(PROFILE))
        return bench.Outcome(0, "done\n")


def fake_args(tmp_path, *more):
    return ["--device", "cpu", "--models", "tiny", "--seq-lens", "256", "512", "--steps", "4", "--warmup", "1",
            "--out", str(tmp_path), *more]  # fmt: skip


@pytest.mark.slow
def test_a_cpu_dry_run_writes_the_record(bench, tmp_path, capsys):
    """Two real jobs (each a fresh legalpt-train process, ~20 s on 2 busy cores): the fake runner below covers more
    seq_lens and the search."""
    out = tmp_path / "out"
    overrides = ["data.vocab_size=400", f"data.cache_dir={tmp_path / 'cache'}"]
    args = ["--device", "cpu", "--models", "tiny", "--seq-lens", "256", "--steps", "3", "--warmup", "1"]
    assert bench.main([*args, "--override", *overrides, "--out", str(out)]) == 0
    record = _record(out)
    head = record["header"]
    assert head["benchmark"] == "train" and head["gpu"].startswith("cpu") and head["gpu_count"] == 0
    assert {"torch", "transformers", "legalpt", "commit", "date"} <= set(head) and head["complete"]
    assert head["command"].split()[1:3] == ["scripts/bench_train.py", "--device"]
    assert "data=demo_long" in head["data"] and head["overrides"] == overrides and head["search"] is None
    ours, sdpa = record["rows"]
    assert (ours["attention"], sdpa["attention"]) == ("legalpt", "sdpa")
    for row in (ours, sdpa):
        assert set(row) == ROW_KEYS and row["documents"] == "long"
        assert (row["model"], row["seq_len"], row["batch_size"], row["gpus"], row["steps"]) == ("tiny", 256, 1, 1, 3)
        assert row["tokens_per_s"] > 0 and not row["oom"] and row["error"] is None
        assert row["mfu"] is None and row["peak_gib"] is None  # a CPU has neither
        assert (row["activation_checkpointing"], row["loss_impl"]) == ("none", "plain")  # the config's defaults
    assert ours["vs_sdpa"] == pytest.approx(ours["tokens_per_s"] / sdpa["tokens_per_s"]) and sdpa["vs_sdpa"] is None
    printed = capsys.readouterr().out
    assert "vs sdpa" in printed and f"{ours['vs_sdpa']:.2f}x" in printed


def test_an_oom_is_recorded_and_the_search_brackets_the_capacity(fake_bench, tmp_path):
    capacity = {"legalpt": 3000, "sdpa": 700}
    fake = FakeTrainer(capacity, {"legalpt": 2000.0, "sdpa": 1000.0})
    assert fake_bench.main(fake_args(tmp_path, "--search-max", "8192"), runner=fake) == 0
    record = _record(tmp_path)
    assert record["header"]["mfu_peak"] == {"name": "Fake GPU (dense bf16 table)", "tflops": 1.0}
    row = record["rows"][0]
    # the median of steps 2..4 (the first is warmup): 2000 * 1.03; the peak is the largest step's
    assert row["tokens_per_s"] == pytest.approx(2000 * 1.03) and row["mfu"] == pytest.approx(2000 * 1.03 / 1e6)
    assert row["peak_gib"] == pytest.approx(2.56) and row["vs_sdpa"] == pytest.approx(2.0)
    search = sys.modules["benchmarking.train.search"]
    for entry in record["longest"]:
        cap, longest, oom = capacity[entry["attention"]], entry["longest_seq_len"], entry["first_oom"]
        assert longest <= cap < oom and oom - longest <= max(longest / search.PRECISION, 2 * search.STEP)
        assert entry["complete"] and entry["error"] is None
    tries = record["search"]
    assert all(t["oom"] == (t["seq_len"] > capacity[t["attention"]]) for t in tries)
    assert all(t["oom"] and t["tokens_per_s"] is None for t in tries if t["seq_len"] > capacity[t["attention"]])
    assert all(t["error"] == OOM for t in tries if t["oom"])  # which memory ran out, and the allocation
    assert all(t["steps"] == 2 and t["batch_size"] == 1 for t in tries)
    measured = {(r["attention"], r["seq_len"]) for r in record["rows"]}
    assert not {(t["attention"], t["seq_len"]) for t in tries} & measured  # the rows' jobs are not run again
    # the data of each seq_len was built once, before its first job, with the jobs' data and model settings
    seq_lens = [int(c.split("=")[1]) for command in fake.prepared for c in command if c.startswith("data.seq_len=")]
    assert len(seq_lens) == len(set(seq_lens)) == len({t["seq_len"] for t in [*tries, *record["rows"]]})
    kept = ("data", "model=", "model.max_position_embeddings=")
    assert all(c.startswith(kept) for command in fake.prepared for c in command[1:])
    # a row longer than the preset's positions is prepared with the positions its job runs with
    positions = 2048  # the tiny preset's
    long = [c for c in fake.prepared for a in c if a.startswith("data.seq_len=") and int(a.split("=")[1]) > positions]
    assert long and all(any(a.startswith("model.max_position_embeddings=") for a in c) for c in long)


def test_a_failed_preparation_is_tried_again_by_the_next_job(bench, tmp_path, capsys):
    runs = sys.modules["benchmarking.train.runs"]
    calls = []

    def runner(command, env, timeout, log):
        calls.append(command)
        return runs.Outcome(1 if len(calls) == 1 else 0, "ValueError: the first try fails\n")

    jobs = runs.Jobs(tmp_path, ["data=demo_long"], [], "cpu", 1, 60.0, runner)
    for _ in range(3):
        jobs.prepare(["model=tiny", "data=demo_long", "data.seq_len=256", "train.steps=2"], {}, tmp_path / "p.log")
    assert len(calls) == 2 and "legalpt-prepare failed (exit 1" in capsys.readouterr().out


def test_profiled_steps_are_summarized_and_left_out_of_tokens_per_s(fake_bench, tmp_path, capsys):
    fake = FakeTrainer({"legalpt": 3000, "sdpa": 3000}, {"legalpt": 2000.0, "sdpa": 1000.0})
    args = fake_args(tmp_path, "--steps", "6", "--profile", "2", "--search-max", "1024")
    assert fake_bench.main(args, runner=fake) == 0
    record = _record(tmp_path)
    for row in record["rows"]:  # steps 2 and 3 profiled after the warmup's step 1; timed: 4, 5, 6
        assert row["profile"] == PROFILE
        assert row["tokens_per_s"] == pytest.approx({"legalpt": 2000.0, "sdpa": 1000.0}[row["attention"]] * 1.05)
    assert all("profile" not in t for t in record["search"])  # only the throughput rows are profiled
    searched = [c for c in fake.commands if "train.steps=2" in c]
    assert searched and not any(a.startswith("train.profile") for c in searched for a in c)
    assert "where a step's time goes" in capsys.readouterr().out


def test_profile_needs_a_timed_step_after_it(fake_bench, tmp_path):
    with pytest.raises(SystemExit):
        fake_bench.main(fake_args(tmp_path, "--profile", "3"), runner=FakeTrainer({}, {}))


def test_a_merged_part_continues_the_search(fake_bench, tmp_path):
    fake = FakeTrainer({"legalpt": 3000, "sdpa": 3000}, {"legalpt": 1.0, "sdpa": 1.0})
    assert fake_bench.main(fake_args(tmp_path, "--attention", "legalpt", "--search-max", "1024"), runner=fake) == 0
    first = len(fake.commands)
    more = ["--seq-lens", "--attention", "legalpt", "--search-max", "8192", "--search-start", "256", "--merge"]
    assert fake_bench.main([*fake_args(tmp_path), *more], runner=fake) == 0
    tried = [int(c.split("=")[1]) for command in fake.commands[first:] for c in command if c.startswith("data.seq_len")]
    assert tried[0] == 2048 and 1024 not in tried  # 256..1024 are known from the first part
    record = _record(tmp_path)
    assert [r["seq_len"] for r in record["rows"]] == [256, 512] and len(record["header"]["parts"]) == 2
    [entry] = record["longest"]
    assert entry["longest_seq_len"] <= 3000 < entry["first_oom"] and entry["search_max"] == 8192


def test_a_failure_other_than_memory_stops_the_search(fake_bench, tmp_path):
    fake = FakeTrainer({"legalpt": 3000, "sdpa": 3000}, {"legalpt": 1.0, "sdpa": 1.0}, fail="sdpa")
    assert fake_bench.main(fake_args(tmp_path, "--search-max", "8192"), runner=fake) == 0
    record = _record(tmp_path)
    failed = [r for r in record["rows"] if r["attention"] == "sdpa"]
    assert all(r["error"] == "ValueError: no kernel for this shape" and not r["oom"] for r in failed)
    assert all(r["vs_sdpa"] is None for r in record["rows"])
    by_attention = {e["attention"]: e for e in record["longest"]}
    assert by_attention["sdpa"]["error"] == "ValueError: no kernel for this shape"
    assert by_attention["sdpa"]["longest_seq_len"] is None and by_attention["legalpt"]["error"] is None
    assert all(t["attention"] == "legalpt" for t in record["search"])


def test_options_are_overridden_only_when_given(fake_bench, tmp_path):
    fake = FakeTrainer({"legalpt": 3000, "sdpa": 3000}, {"legalpt": 1.0, "sdpa": 1.0})
    assert fake_bench.main(fake_args(tmp_path, "--attention", "sdpa"), runner=fake) == 0
    assert not any(arg.startswith(("train.activation_checkpointing", "train.loss_impl")) for arg in fake.commands[0])
    assert "data=demo_long" in fake.commands[0] and "model=tiny" in fake.commands[0]
    more = ["--attention", "sdpa", "--activation-checkpointing", "full", "--loss-impl", "chunked"]
    assert fake_bench.main(fake_args(tmp_path, *more), runner=fake) == 0
    assert {"train.activation_checkpointing=full", "train.loss_impl=chunked"} <= set(fake.commands[-1])
    row = _record(tmp_path)["rows"][0]
    assert (row["activation_checkpointing"], row["loss_impl"]) == ("full", "chunked")
    assert not any(arg.startswith("train.save_attention") for arg in fake.commands[-1])


def test_saved_attention_rows_stand_beside_plain_ones(fake_bench, tmp_path):
    """--save-attention false true: a row of each per shape, named by the option, in one record and table."""
    fake = FakeTrainer({"legalpt": 3000, "sdpa": 3000}, {"legalpt": 1.0, "sdpa": 1.0})
    more = ["--activation-checkpointing", "full", "--save-attention", "false", "true"]
    assert fake_bench.main(fake_args(tmp_path, *more), runner=fake) == 0
    rows = _record(tmp_path)["rows"]
    assert sorted((r["save_attention"], r["attention"], r["seq_len"]) for r in rows) == sorted(
        (save, attention, seq_len)
        for save in (False, True)
        for attention in ("legalpt", "sdpa")
        for seq_len in (256, 512)
    )
    assert all(r["vs_sdpa"] == pytest.approx(1.0) for r in rows if r["attention"] == "legalpt")  # against its own kind
    assert {"train.save_attention=true"} <= set(fake.commands[-1])
    options = sys.modules["benchmarking.train.record"].options
    assert options(rows[-1]).startswith("full + saved attention / ")


def test_grad_accum_names_its_rows(fake_bench, tmp_path):
    """--grad-accum: overridden in each job, recorded in its row, shown in the table, and part of what a row's sdpa
    ratio is matched on (legalpt gains twice as much from accumulation here); a run without it records the config's
    1 and overrides nothing."""
    fake = FakeTrainer({"legalpt": 4096, "sdpa": 4096}, {"legalpt": 3000, "sdpa": 2000}, accum={"legalpt": 2.0})
    assert fake_bench.main(fake_args(tmp_path, "--grad-accum", "1", "4"), runner=fake) == 0
    rows = _record(tmp_path)["rows"]
    assert "train.grad_accum=4" in fake.commands[-1]
    ratios = {r["grad_accum"]: r["vs_sdpa"] for r in rows if r["attention"] == "legalpt" and r["seq_len"] == 256}
    assert ratios == {1: pytest.approx(1.5), 4: pytest.approx(3.0)}
    options = sys.modules["benchmarking.train.record"].options
    assert "4 micro-batches a step" in options(rows[-1]) and "micro-batches" not in options(rows[0])
    plain = tmp_path / "plain"
    assert fake_bench.main(fake_args(plain), runner=fake) == 0
    assert {r["grad_accum"] for r in _record(plain)["rows"]} == {1}
    assert not any("train.grad_accum" in arg for command in fake.commands[-2:] for arg in command)


def test_memory_options_name_their_rows(fake_bench, tmp_path):
    """--offload-activations, --mlp-chunk-tokens and --precision: overridden in each job, recorded in its row, shown
    in the table; bf16 parameters run under FSDP2, one GPU as a one-rank torchrun job."""
    fake = FakeTrainer({"legalpt": 3000, "sdpa": 3000}, {"legalpt": 1.0, "sdpa": 1.0})
    more = ["--activation-checkpointing", "full", "--offload-activations", "true", "--mlp-chunk-tokens", "0", "64",
            "--precision", "autocast", "bf16-fsdp"]  # fmt: skip
    assert fake_bench.main(fake_args(tmp_path, *more), runner=fake) == 0
    rows = _record(tmp_path)["rows"]
    assert {(r["offload_activations"], r["mlp_chunk_tokens"], r["precision"]) for r in rows} == {
        (True, chunk, precision) for chunk in (0, 64) for precision in ("autocast", "bf16-fsdp")
    }
    last = fake.commands[-1]
    assert {"train.offload_activations=true", "train.mlp_chunk_tokens=64", "train.precision=bf16-fsdp"} <= set(last)
    assert "train.distributed=fsdp2" in last and "torch.distributed.run" in last and "--nproc-per-node=1" in last
    assert not any("torch.distributed.run" in c or "train.distributed=fsdp2" in c for c in fake.commands[0])
    options = sys.modules["benchmarking.train.record"].options
    assert options(rows[-1]).startswith("full + offloaded + MLP in 64-token chunks + bf16 parameters / ")


def test_packed_rows_run_on_the_demo_corpus_beside_long_ones(fake_bench, tmp_path, monkeypatch, load_script):
    """--documents long packed: the packed jobs train on the demo corpus as generated (their own legalpt-prepare),
    the long ones on demo_long; each row names its corpus, its ratio is against sdpa on the same corpus, the search
    keeps the corpora apart, and the performance table names both."""
    fake = FakeTrainer({"legalpt": 3000, "sdpa": 300}, {"legalpt": 2.0, "sdpa": 1.0}, packed={"sdpa": 0.5})
    more = ["--documents", "long", "packed", "--search-max", "4096"]
    assert fake_bench.main(fake_args(tmp_path, *more), runner=fake) == 0
    record = _record(tmp_path)
    rows = [r for r in record["rows"] if not r["oom"]]
    assert {(r["documents"], r["attention"]) for r in rows} == {
        (documents, attention) for documents in ("long", "packed") for attention in ("legalpt", "sdpa")
    }
    ratios = {r["documents"]: r["vs_sdpa"] for r in rows if r["attention"] == "legalpt" and r["seq_len"] == 256}
    assert ratios == {"long": pytest.approx(2.0), "packed": pytest.approx(4.0)}
    assert all(("data=demo" in c) != ("data=demo_long" in c) for c in fake.commands)  # one corpus a job
    packed_jobs = [c for c in fake.commands if "data=demo" in c]
    assert 0 < len(packed_jobs) < len(fake.commands) and {"data=demo" in c for c in fake.prepared} == {True, False}
    assert sorted((e["attention"], e["documents"]) for e in record["longest"]) == sorted(
        (attention, documents) for attention in ("legalpt", "sdpa") for documents in ("long", "packed")
    )
    assert record["header"]["documents"] == ["long", "packed"] and record["header"]["data_packed"] == ["data=demo"]
    options = sys.modules["benchmarking.train.record"].options
    assert "packed documents" in options(next(r for r in rows if r["documents"] == "packed"))
    assert "packed" not in options(next(r for r in rows if r["documents"] == "long"))

    table = load_script("performance_table")
    monkeypatch.setattr(table, "RESULTS", tmp_path)
    record["header"] |= {"gpu": "Fake GPU", "gpu_count": 1}
    next(tmp_path.glob("train-*.json")).write_text(json.dumps(record))
    text = "\n".join(table.training())
    assert "the long-document demo corpus (data=demo_long" in text
    assert "the demo corpus as generated for the rows of packed documents (data=demo)" in text


def test_a_merged_part_keeps_the_corpora_of_the_parts_before(fake_bench, tmp_path, load_script):
    """A long-only part merged into a record with packed rows: the header still names the packed corpus, and the
    table says each run sized its own long corpus (the header keeps the last run's overrides only)."""
    fake = FakeTrainer({"legalpt": 3000, "sdpa": 3000}, {"legalpt": 2.0, "sdpa": 1.0})
    assert fake_bench.main(fake_args(tmp_path, "--documents", "packed"), runner=fake) == 0
    assert _record(tmp_path)["header"]["data"] is None  # no job ran on the long corpus
    assert fake_bench.main(fake_args(tmp_path, "--merge"), runner=fake) == 0
    head = _record(tmp_path)["header"]
    assert head["documents"] == ["long", "packed"] and head["data_packed"] == ["data=demo"]
    assert "data=demo_long" in head["data"]
    corpora = load_script("performance_table").corpora(head)
    assert "each run's documents at least its --doc-tokens long" in corpora and "synthetic_min_chars" not in corpora


def test_jobs_save_nothing_where_the_tree_can_skip_it(bench):
    """No checkpoint and no export per job; a tree from before train.export_hf saves one checkpoint at the end."""
    runs = sys.modules["benchmarking.train.runs"]
    assert runs.no_saving(5, compose("train", [])) == ["train.save_every=0", "train.export_hf=false"]
    older = OmegaConf.create({"train": {"save_every": 50}})
    assert runs.no_saving(5, older) == ["train.save_every=5", "train.keep_checkpoints=1"]


def test_a_bad_option_stops_before_any_job(fake_bench, tmp_path):
    fake = FakeTrainer({"legalpt": 3000}, {"legalpt": 1.0})
    with pytest.raises(SystemExit, match=r"train\.activation_checkpointing"):
        fake_bench.main(fake_args(tmp_path, "--activation-checkpointing", "sometimes"), runner=fake)
    assert fake.commands == [] and not list(tmp_path.glob("train-*.json"))


def test_how_a_job_ended(bench):
    runs = sys.modules["benchmarking.train.runs"]
    assert runs.failure(runs.Outcome(0, OOM), 60) == (False, None)  # a message alone is not a failure
    assert runs.failure(runs.Outcome(1, f"step 1\n{OOM}\n"), 60) == (True, OOM)  # which memory, what allocation
    oom, error = runs.failure(runs.Outcome(-signal.SIGKILL, ""), 60)  # the host's OOM killer says nothing
    assert oom and "SIGKILL" in error
    assert runs.failure(runs.Outcome(None, ""), 60) == (False, "stopped at the timeout (60 s)")
    assert runs.failure(runs.Outcome(2, "a\nKeyError: 'x'\nb\n"), 60) == (False, "KeyError: 'x'")
    torchrun = "ValueError: no kernel\nTraceback:\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
    assert runs.failure(runs.Outcome(1, torchrun), 60) == (False, "ValueError: no kernel")  # the job's, not torchrun's


def test_performance_table_renders_a_gpu_record(fake_bench, tmp_path, monkeypatch, load_script):
    capacity = {"legalpt": 3000, "sdpa": 300}
    fake = FakeTrainer(capacity, {"legalpt": 2000.0, "sdpa": 1000.0})
    assert fake_bench.main(fake_args(tmp_path, "--search-max", "4096"), runner=fake) == 0
    [path] = tmp_path.glob("train-*.json")
    table = load_script("performance_table")
    monkeypatch.setattr(table, "RESULTS", tmp_path)
    assert table.training() == []  # a CPU dry run is no figure
    record = json.loads(path.read_text())
    record["header"] |= {"gpu": "Fake GPU", "gpu_count": 1}
    path.write_text(json.dumps(record))
    text = "\n".join(table.training())
    assert "## Training on the Fake GPU" in text and "MFU against Fake GPU (dense bf16 table)" in text
    assert "| tiny | legalpt | 256 | 1 × 1 | none / plain / eager | 2,060 | 0.2% | 2.6 | 2.00× |" in text
    assert "| tiny | sdpa | 512 | 1 × 1 | none / plain / eager | OOM | OOM | OOM | OOM |" in text
    longest = {e["attention"]: e for e in record["longest"]}
    row = f"| tiny | legalpt | 1 | none / plain / eager | {longest['legalpt']['longest_seq_len']:,} | "
    assert row + f"{longest['legalpt']['first_oom']:,} |" in text


def test_rows_from_before_save_attention_merge_with_their_redone_jobs(bench):
    """A record written before the options has no save_attention or grad_accum: its rows are the redone jobs' (False,
    1), not others."""
    record = sys.modules["benchmarking.train.record"]
    old_row = {"model": "1b", "attention": "legalpt", "activation_checkpointing": "full", "loss_impl": "chunked",
               "compile": False, "gpus": 1, "seq_len": 8192, "batch_size": 1, "tokens_per_s": 1.0}  # fmt: skip
    redone = {**old_row, "save_attention": False, "grad_accum": 1, "tokens_per_s": 2.0}
    saving = {**old_row, "save_attention": True}
    old = {"header": {"command": "first"}, "rows": [old_row], "search": [], "longest": []}
    merged = record.build({"command": "second"}, [redone, saving], [], [], old)
    assert [(r["save_attention"], r["tokens_per_s"]) for r in merged["rows"]] == [(False, 2.0), (True, 1.0)]
