"""Training throughput and the longest trainable context: legalpt attention against transformers' sdpa (documents
kept apart), through the same trainer on the same data.

Every job is `legalpt-train` in a fresh process (a CUDA out-of-memory leaves nothing behind for the next), with
model.attn_implementation=legalpt and =sdpa one after the other for each model preset, trainer options, batch size
and seq_len, on the long-document demo corpus (data=demo_long, its documents made long enough that a row of the
longest seq_len is one document: the figure is about long documents, not about packing short ones); with --documents
packed, also on the demo corpus as generated, several documents to a row, which sdpa keeps apart by an explicit
block-diagonal mask and legalpt by its varlen kernels (a row's `documents` says which corpus it ran on). A row holds
tokens/s and MFU (medians over the steps after --warmup), peak GPU memory, and whether the job ran out of memory,
read from the job's metrics.jsonl (scripts/benchmarking/train/runs.py says how). With --profile N the N steps after
the warmup run under torch.profiler (train.profile_steps, left out of tokens/s) and each row holds where a step's
time goes: wall against GPU-busy milliseconds and kernel time by kind (matmul, attention, optimizer, ...). With
--search-max, each setting is then searched for the longest seq_len that trains at batch 1
(benchmarking/train/search.py): doubling from --search-start, then bisection to within 1/16.

Trainer options are Hydra overrides given only when asked for (--activation-checkpointing full selective ...,
--save-attention true false, --offload-activations, --mlp-chunk-tokens, --precision autocast bf16-fsdp (a one-GPU
bf16-fsdp job runs as a one-rank torchrun job), --loss-impl, --compile true false, --grad-accum (micro-batches a
step), --override KEY=VALUE for anything else), so the script runs on trees with and without them. The record goes to
<out>/train-<gpu>-<yyyymmdd>.json (header, rows, search, longest; scripts/benchmarking/record.py names and heads it),
rewritten after every job, so a run cut off by a time limit keeps what it measured; --merge adds this run to the
record of the same day, and a search continues from the jobs the record already holds. Give every part of a split run
the same --doc-tokens (else the default, the longest seq_len of each part, makes a different corpus per part).

    python scripts/bench_train.py                                          # 1b preset at 8k and 32k, one GPU
    python scripts/bench_train.py --seq-lens 8192 --loss-impl chunked --activation-checkpointing full \\
        --search-max 1048576 --doc-tokens 1048576 --merge                  # and the longest context
    python scripts/bench_train.py --device cpu --models tiny --seq-lens 256 512 --steps 3 \\
        --override data.vocab_size=400 --out /tmp/bench                    # dry run
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch
from benchmarking import record
from benchmarking.train.record import SETTING_FIELDS, build, format_longest, format_profiles, format_rows, key
from benchmarking.train.runs import PACKED_DATA, Jobs, Runner, Setting, demo_data, run_process
from benchmarking.train.search import bounds, next_seq_len, outcome
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from legalpt.config import ConfigError

SCRIPTS = Path(__file__).resolve().parent
# The header names the GPU, which initialises CUDA: in a process of its own, so that this one holds no CUDA memory
# while the jobs search for the longest seq_len that fits.
_HEADER = (
    "import json, sys; from benchmarking import record; a = json.loads(sys.argv[1]); "
    "print(json.dumps(record.header('train', a['device'], a['script'], a['argv'])))"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["1b"], help="model presets in conf/model/")
    parser.add_argument("--seq-lens", type=int, nargs="*", default=[8192, 32768], help="data.seq_len of the rows")
    parser.add_argument("--attention", nargs="+", default=["legalpt", "sdpa"], help="model.attn_implementation")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1], help="train.batch_size of the rows")
    parser.add_argument("--activation-checkpointing", nargs="+", help="train.activation_checkpointing values")
    parser.add_argument("--loss-impl", nargs="+", help="train.loss_impl values")
    parser.add_argument("--compile", nargs="+", choices=("true", "false"), help="train.compile values")
    parser.add_argument("--save-attention", nargs="+", choices=("true", "false"), help="train.save_attention values")
    parser.add_argument("--offload-activations", nargs="+", choices=("true", "false"),
                        help="train.offload_activations values")  # fmt: skip
    parser.add_argument("--mlp-chunk-tokens", type=int, nargs="+", help="train.mlp_chunk_tokens values")
    parser.add_argument("--precision", nargs="+", choices=("autocast", "bf16-fsdp"),
                        help="train.precision values (bf16-fsdp: FSDP2; one GPU as a one-rank job)")  # fmt: skip
    parser.add_argument("--grad-accum", type=int, nargs="+", help="train.grad_accum values (micro-batches a step)")
    parser.add_argument("--documents", nargs="+", choices=("long", "packed"), default=["long"],
                        help="long: one document fills a row (--doc-tokens); packed: the demo corpus as generated, "
                             "several documents to a row")  # fmt: skip
    parser.add_argument("--gpus", type=int, default=1, help="processes, one GPU each (accelerate launch when > 1)")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps of a row's job")
    parser.add_argument("--warmup", type=int, default=3, help="first steps left out of tokens/s and MFU")
    parser.add_argument(
        "--profile", type=int, default=0, metavar="STEPS",
        help="profile STEPS steps of each row's job after the warmup (left out of tokens/s); 0 = none",
    )  # fmt: skip
    parser.add_argument("--search-max", type=int, default=0, help="longest seq_len searched; 0 = no search")
    parser.add_argument("--search-start", type=int, help="first seq_len of the search (default: the shortest row's)")
    parser.add_argument("--search-steps", type=int, default=2, help="steps of a search job (2: AdamW's state exists)")
    parser.add_argument("--doc-tokens", type=int, default=0, help="tokens a document holds at least (0 = longest)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run")
    parser.add_argument("--override", nargs="+", action="extend", default=[], help="Hydra overrides for every job")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds a job may run")
    parser.add_argument("--merge", action="store_true", help="add to today's record in --out")
    parser.add_argument("--out", type=Path, default=record.RESULTS, help="folder of the JSON record")
    args = parser.parse_args(argv)
    for name in ("gpus", "steps", "search_steps", "timeout"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")
    for name in ("warmup", "search_max", "doc_tokens", "profile"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0; got {getattr(args, name)}")
    if min([*args.seq_lens, *args.batch_sizes], default=2) < 1 or min(args.seq_lens, default=2) < 2:
        parser.error(f"--seq-lens must be >= 2 and --batch-sizes >= 1; got {args.seq_lens}, {args.batch_sizes}")
    if args.profile and args.steps <= args.warmup + args.profile:
        parser.error(f"--steps {args.steps} leaves no timed step after --warmup {args.warmup} and --profile "
                     f"{args.profile}")  # fmt: skip
    if not args.seq_lens and not args.search_max:
        parser.error("nothing to run: give --seq-lens, --search-max, or both")
    args.search_start = args.search_start or min(args.seq_lens, default=4096)
    if args.search_max and not 2 <= args.search_start <= args.search_max:
        parser.error(f"--search-start {args.search_start} must be in [2, --search-max {args.search_max}]")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU here (use --device cpu for a dry run)")
    if args.device == "cpu" and args.gpus > 1:
        parser.error("--gpus > 1 needs --device cuda")
    return args


def settings(args: argparse.Namespace) -> list[Setting]:
    """Every setting, the attentions of one configuration next to each other."""
    compiled = [value == "true" for value in args.compile] if args.compile else [None]
    saved = [value == "true" for value in args.save_attention] if args.save_attention else [None]
    offloaded = [value == "true" for value in args.offload_activations] if args.offload_activations else [None]
    grid = itertools.product(
        args.models, args.activation_checkpointing or [None], saved, offloaded, args.mlp_chunk_tokens or [None],
        args.precision or [None], args.loss_impl or [None], compiled, args.grad_accum or [None], args.documents,
        args.attention,
    )  # fmt: skip
    return [
        Setting(
            model,
            attention,
            ckpt,
            loss,
            comp,
            save_attention=save,
            offload_activations=offload,
            mlp_chunk_tokens=chunk,
            precision=precision,
            grad_accum=accum,
            gpus=args.gpus,
            documents=documents,
        )
        for model, ckpt, save, offload, chunk, precision, loss, comp, accum, documents, attention in grid
    ]


def planned(args: argparse.Namespace) -> list[tuple[Setting, int, int]]:
    """The throughput jobs (setting, seq_len, batch size): the attentions of one configuration and shape one after
    the other, so that their ratio comes from neighbouring jobs."""
    every, n = settings(args), len(args.attention)
    groups = [every[i : i + n] for i in range(0, len(every), n)]  # one configuration's attentions
    return [(s, seq_len, b) for group in groups for b in args.batch_sizes for seq_len in args.seq_lens for s in group]


def machine_header(device: str, argv: list[str]) -> dict:
    """record.header("train", ...) (GPU, versions, commit, date, command), computed in a process of its own."""
    given = {"device": device, "script": __file__, "argv": argv}
    child = subprocess.run(
        [sys.executable, "-c", _HEADER, json.dumps(given)], cwd=SCRIPTS, capture_output=True, text=True, check=True
    )
    return json.loads(child.stdout)


def header(args: argparse.Namespace, argv: list[str] | None, data: list[str]) -> dict:
    search = {"start": args.search_start, "max": args.search_max, "steps": args.search_steps}
    return {
        **machine_header(args.device, sys.argv[1:] if argv is None else argv),
        "models": args.models,
        "seq_lens": args.seq_lens,
        "attention": args.attention,
        "batch_sizes": args.batch_sizes,
        "steps": args.steps,
        "warmup": args.warmup,
        "search": search if args.search_max else None,
        "data": data if "long" in args.documents else None,
        "documents": args.documents,
        "data_packed": PACKED_DATA if "packed" in args.documents else None,
        "overrides": args.override,
    }


def main(argv: list[str] | None = None, runner: Runner = run_process) -> int:
    args = parse_args(argv)
    doc_tokens = args.doc_tokens or max([*args.seq_lens, args.search_max])
    with tempfile.TemporaryDirectory(prefix="bench-train-") as work:
        jobs = Jobs(Path(work), demo_data(doc_tokens), args.override, args.device, args.warmup, args.timeout, runner,
                    profile=args.profile)  # fmt: skip
        jobs_planned = planned(args)
        searched = settings(args) if args.search_max else []
        try:  # every job's config is checked before the first job starts
            for s, seq_len, batch_size in jobs_planned:
                jobs.plan(s, seq_len, batch_size, args.steps, Path(work))
            # a searched setting as its jobs' rows name it: the options it runs with
            resolved = {s: {**asdict(s), **jobs.plan(s, args.search_max, 1, args.search_steps, Path(work))[1]}
                        for s in searched}  # fmt: skip
        except (ConfigError, HydraException, OmegaConfBaseException) as error:  # a bad value, or a key not there
            raise SystemExit(str(error)) from None
        bench = Bench(args, jobs, header(args, argv, jobs.data))
        for s, seq_len, batch_size in jobs_planned:
            bench.rows.append(jobs.run(s, seq_len, batch_size, args.steps, profiled=True))
            bench.saved(bench.rows[-1])
        for s in searched:
            bench.search(s, resolved[s])
        path = bench.save(complete=True)
    final = json.loads(path.read_text())
    print(f"\nwrote {path}\n")
    print(format_rows(final["rows"]))
    if args.profile:
        print(f"\nwhere a step's time goes ({args.profile} profiled steps a job, ms per step)\n")
        print(format_profiles(final["rows"]))
    if final["longest"]:
        print(f"\nlongest seq_len that trains at batch 1 ({args.search_steps} steps a job)\n")
        print(format_longest(final["longest"]))
    return 0


class Bench:
    """The jobs run so far, and the record they make (rewritten after every job)."""

    def __init__(self, args: argparse.Namespace, jobs: Jobs, head: dict):
        self.args, self.jobs, self.head = args, jobs, head
        today = record.path_of(args.out, head)
        self.old = json.loads(today.read_text()) if args.merge and today.exists() else None
        self.rows: list[dict] = []  # throughput jobs
        self.tries: list[dict] = []  # search jobs
        self.found: dict[tuple, dict] = {}  # searched setting → its entry in the record's `longest`

    def save(self, complete: bool) -> Path:
        head = {**self.head, "mfu_peak": self.jobs.peak or None, "complete": complete}
        return record.write(self.args.out, build(head, self.rows, self.tries, list(self.found.values()), self.old))

    def saved(self, job: dict) -> None:
        """Report a finished job and write the record with it."""
        report(job)
        self.save(complete=False)

    def search(self, s: Setting, setting: dict) -> None:
        """Run the search for the longest seq_len of `s` to its end; `setting`: its fields as its rows name them."""
        start, limit = self.args.search_start, self.args.search_max
        while True:
            earlier = [*self.old["rows"], *self.old.get("search", [])] if self.old else []
            mine = [j for j in [*earlier, *self.rows, *self.tries] if j["batch_size"] == 1 and same(j, setting)]
            known = {j["seq_len"]: outcome(j) for j in mine}  # the later job of two at one seq_len
            longest, oom = bounds(known, limit)
            seq_len = next_seq_len(known, start, limit)
            self.found[key(setting, SETTING_FIELDS)] = {
                **{f: setting[f] for f in SETTING_FIELDS},
                "start": start,
                "search_max": limit,
                "longest_seq_len": longest,
                "first_oom": oom,
                "complete": seq_len is None,
                "error": next((j["error"] for j in reversed(mine) if outcome(j) == "error"), None),
            }
            if seq_len is None:
                return
            self.tries.append(self.jobs.run(s, seq_len, 1, self.args.search_steps))
            self.saved(self.tries[-1])


def same(job: dict, setting: dict) -> bool:
    return key(job, SETTING_FIELDS) == key(setting, SETTING_FIELDS)


def report(row: dict) -> None:
    """One line per finished job, as it finishes."""
    if row["oom"]:
        result = f"out of memory: {row['error']}"
    elif row["error"]:
        result = f"failed: {row['error']}"
    else:
        mfu = "" if row["mfu"] is None else f", MFU {row['mfu']:.1%}"
        peak = "" if row["peak_gib"] is None else f", peak {row['peak_gib']:.1f} GiB"
        result = f"{row['tokens_per_s'] or 0:,.0f} tokens/s{mfu}{peak}"
    print(f"{row['attention']} {row['model']} seq_len {row['seq_len']} batch {row['batch_size']}: {result}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
