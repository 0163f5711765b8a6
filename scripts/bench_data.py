"""Data-preparation throughput: our `prepare` against a plain `datasets` baseline, same input, same tokenizer.

The input is raw text written as .jsonl shards to a temporary folder: distinct demo documents
(`legalpt.data.demo.generate_documents`, new seeds until --mb megabytes) or the documents of --paths. A byte-level
BPE is trained on a sample first (untimed) and saved; all three variants load it from that folder:

    ours_full      legalpt.data.pipeline.prepare: load, clean, exact + near dedup, split, tokenize, pack
    ours_tok_pack  the same with cleaning and dedup switched off: load, split, tokenize, pack
    baseline       datasets.load_dataset("json") → map(tokenizer(batch["text"]), batched) → concatenate-and-split
                   into seq_len blocks, remainder dropped (the grouping of Hugging Face's run_clm example)

Every run gets a fresh cache folder, so nothing is reused between runs. The variants run in turn, --repeats times,
and each one's median time counts; MB are 10^6 bytes of UTF-8 document text. The record goes to
<out>/data-cpu<cores>-<yyyymmdd>.json (scripts/benchmarking/record.py names and heads it), replacing the machine's
earlier one.

    python scripts/bench_data.py                      # ~20 MB of demo documents, num_proc = CPU count
    python scripts/bench_data.py --mb 0.2 --repeats 1 # smoke test

--streaming-memory measures instead the peak memory of streaming prepare (`legalpt.data.stream.PackedStream`: read,
clean, tokenize, pack every row once) over inputs of each --sizes-mb: .jsonl shards of demo documents repeated with
varied ids, written under the system's temporary folder and deleted after. Each size runs in a fresh process, whose
peak resident set size (ru_maxrss) is the figure; memory is flat when the largest peak is within 1.2x of the smallest.
The result is stored under "streaming_memory" in the same record, next to the throughput that is there already.

    python scripts/bench_data.py --streaming-memory --sizes-mb 1000 4000  # the issue's 1 GB and 4 GB
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# The forked map workers would each switch the Rust thread pool off with a warning; one setting for every variant.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import datasets
import pyarrow.compute as pc
import tokenizers
from benchmarking import record
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from legalpt.config import CleanConfig, DataConfig, DedupConfig
from legalpt.data.demo import generate_documents
from legalpt.data.pipeline import prepare
from legalpt.data.sources import load_documents
from legalpt.data.stream import PackedStream, stream_records
from legalpt.data.tokenizer import train_bpe

MB = 10**6
TARGETS = {"ours_full": 1.5, "ours_tok_pack": 1.0}  # most allowed time of each, as a multiple of the baseline's
FLAT_MEMORY = 1.2  # most allowed peak memory of streaming prepare, as a multiple of the smallest input's


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=20.0, help="MB of demo documents (ignored with --paths)")
    parser.add_argument("--paths", nargs="+", help="local files, folders or globs to read instead of demo documents")
    parser.add_argument("--seed", type=int, default=0, help="first seed of the demo documents")
    parser.add_argument("--seq-len", type=int, default=2048, help="tokens per packed row / block")
    parser.add_argument("--num-proc", type=int, default=os.cpu_count() or 1, help="worker processes, every variant")
    parser.add_argument("--shards", type=int, default=4, help=".jsonl files the input is written to")
    parser.add_argument("--vocab-size", type=int, default=8192, help="size of the BPE all variants use")
    parser.add_argument("--tokenizer-mb", type=float, default=2.0, help="MB of text the BPE is trained on")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each variant (the median counts)")
    parser.add_argument("--out", type=Path, default=record.RESULTS, help="folder of the JSON record")
    parser.add_argument("--streaming-memory", action="store_true", help="peak memory of streaming prepare instead")
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1000.0, 4000.0], help="inputs, streaming")
    args = parser.parse_args(argv)
    if min(args.sizes_mb) <= 0:
        parser.error(f"--sizes-mb must all be > 0; got {args.sizes_mb}")
    for name in ("mb", "tokenizer_mb"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0; got {getattr(args, name)}")
    for name in ("seq_len", "num_proc", "shards", "repeats"):
        if getattr(args, name) < (2 if name == "seq_len" else 1):
            parser.error(f"--{name.replace('_', '-')} must be >= {2 if name == 'seq_len' else 1}")
    return args


def demo_texts(mb: float, seed: int) -> list[str]:
    """Distinct demo documents (no duplicates for dedup to remove), 64 per seed, until `mb` MB of text."""
    texts, size = [], 0
    while size < mb * MB:
        for document in generate_documents(64, seed):
            texts.append(document["text"])
            size += len(document["text"].encode())
            if size >= mb * MB:
                break
        seed += 1
    return texts


def local_texts(paths: list[str], cache_dir: Path) -> list[str]:
    """The documents of `paths`, read by our loader (any format it reads), as plain texts."""
    documents, skipped = load_documents(DataConfig(paths=paths, cache_dir=str(cache_dir)))
    print(f"read {documents.num_rows} documents from --paths; {skipped}")
    return documents["text"]


def write_shards(texts: list[str], folder: Path, shards: int) -> list[str]:
    """`texts` as records {"text"} in `shards` .jsonl files of consecutive documents."""
    folder.mkdir(parents=True)
    files = []
    for shard in range(shards):
        path = folder / f"corpus-{shard:02d}.jsonl"
        part = texts[shard * len(texts) // shards : (shard + 1) * len(texts) // shards]
        path.write_text("".join(json.dumps({"text": text}) + "\n" for text in part))
        files.append(str(path))
    return files


def save_tokenizer(texts: list[str], vocab_size: int, sample_mb: float, folder: Path) -> None:
    """Train a BPE on the first `sample_mb` MB of `texts` and save it where every variant loads it from."""
    sample, size = [], 0
    for text in texts:
        if size >= sample_mb * MB:
            break
        sample.append(text)
        size += len(text.encode())
    train_bpe(sample, vocab_size).save_pretrained(str(folder))


def run_ours(files: list[str], tokenizer: Path, cache_dir: Path, args: argparse.Namespace, full: bool) -> dict:
    cfg = DataConfig(
        paths=files,
        tokenizer=str(tokenizer),
        seq_len=args.seq_len,
        cache_dir=str(cache_dir),
        num_proc=args.num_proc,
        clean=CleanConfig(enabled=full),
        dedup=DedupConfig(exact=full, near=full),
    )
    data = prepare(cfg)
    splits = [data.stats["train"], data.stats["heldout"]]
    return {
        "documents": sum(s["documents"] for s in splits),
        "tokens": sum(s["tokens"] - s["documents"] for s in splits),  # without the eos closing each document
        "rows": sum(s["rows"] for s in splits),
    }


def hf_tokenize(batch: dict[str, list], tokenizer: PreTrainedTokenizerFast) -> dict[str, list]:
    return tokenizer(batch["text"])


def group_texts(batch: dict[str, list], block_size: int) -> dict[str, list]:
    """run_clm's grouping: concatenate every column, drop the remainder, cut into blocks of `block_size`."""
    joined = {name: [x for seq in seqs for x in seq] for name, seqs in batch.items()}
    usable = len(joined["input_ids"]) // block_size * block_size
    blocks = {name: [seq[i : i + block_size] for i in range(0, usable, block_size)] for name, seq in joined.items()}
    blocks["labels"] = [list(ids) for ids in blocks["input_ids"]]
    return blocks


def run_baseline(files: list[str], tokenizer_dir: Path, cache_dir: Path, args: argparse.Namespace) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    num_proc = args.num_proc if args.num_proc > 1 else None
    raw = datasets.load_dataset("json", data_files=files, split="train", cache_dir=str(cache_dir), num_proc=num_proc)
    tokenized = raw.map(
        hf_tokenize,
        batched=True,
        num_proc=num_proc,
        remove_columns=raw.column_names,
        fn_kwargs={"tokenizer": tokenizer},
    )
    blocks = tokenized.map(group_texts, batched=True, num_proc=num_proc, fn_kwargs={"block_size": args.seq_len})
    tokens = pc.sum(pc.list_value_length(tokenized.with_format("arrow")["input_ids"])).as_py()
    return {"documents": raw.num_rows, "tokens": tokens, "rows": blocks.num_rows}


def timed(run: Callable[[Path], dict], scratch: Path) -> dict:
    """`run(fresh cache folder)`, its wall time and the load average around it (other work on the machine shows)."""
    cache_dir = Path(tempfile.mkdtemp(prefix="cache-", dir=scratch))
    clock = time.perf_counter()
    result = run(cache_dir)
    seconds = time.perf_counter() - clock
    shutil.rmtree(cache_dir)
    return {**result, "seconds": seconds, "load_avg_1m": os.getloadavg()[0]}


def measure(files: list[str], tokenizer: Path, scratch: Path, args: argparse.Namespace, raw_bytes: int) -> list[dict]:
    variants = {
        "ours_full": lambda cache: run_ours(files, tokenizer, cache, args, full=True),
        "ours_tok_pack": lambda cache: run_ours(files, tokenizer, cache, args, full=False),
        "baseline": lambda cache: run_baseline(files, tokenizer, cache, args),
    }
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for repeat in range(args.repeats):  # in turn, so that load from other work falls on every variant alike
        for name, run in variants.items():
            runs[name].append(timed(run, scratch))
            print(f"repeat {repeat + 1}/{args.repeats} {name}: {runs[name][-1]['seconds']:.2f} s", flush=True)
    baseline = statistics.median(r["seconds"] for r in runs["baseline"])
    rows = []
    for name, results in runs.items():
        median = statistics.median(r["seconds"] for r in results)
        rows.append(
            {
                "variant": name,
                "seconds": [round(r["seconds"], 3) for r in results],
                "median_s": round(median, 3),
                "mb_per_s": round(raw_bytes / MB / median, 3),
                "over_baseline": round(median / baseline, 3),
                "target_over_baseline": TARGETS.get(name),
                "met": median / baseline <= TARGETS[name] if name in TARGETS else None,
                "load_avg_1m": [round(r["load_avg_1m"], 2) for r in results],
                **{key: results[-1][key] for key in ("documents", "tokens", "rows")},
            }
        )
    return rows


def header(args: argparse.Namespace, argv: list[str] | None, corpus: dict) -> dict:
    """The record's header, filed under the CPU: this benchmark measures no GPU."""
    return record.header(
        "data", "cpu", __file__, argv,
        machine={"cpu_count": os.cpu_count(), "platform": platform.platform(), "processor": platform.machine()},
        python=platform.python_version(),
        datasets=datasets.__version__,
        tokenizers=tokenizers.__version__,
        settings={
            "seq_len": args.seq_len,
            "num_proc": args.num_proc,
            "vocab_size": args.vocab_size,
            "repeats": args.repeats,
            "tokenizers_parallelism": os.environ["TOKENIZERS_PARALLELISM"],
        },
        corpus=corpus,
        load_avg_1m_at_start=round(os.getloadavg()[0], 2),
    )  # fmt: skip


def table(rows: list[dict], mb: float) -> str:
    lines = [f"{mb:.1f} MB of raw text", f"{'variant':<14} {'median s':>9} {'MB/s':>7} {'/baseline':>10} {'target':>7}"]
    for row in rows:
        target = f"≤{row['target_over_baseline']}" if row["target_over_baseline"] else ""
        met = {True: " met", False: " MISSED", None: ""}[row["met"]]
        lines.append(
            f"{row['variant']:<14} {row['median_s']:>9.2f} {row['mb_per_s']:>7.2f} "
            f"{row['over_baseline']:>10.3f} {target:>7}{met}"
        )
    return "\n".join(lines)


def write_repeated(texts: list[str], mb: float, folder: Path, shards: int) -> tuple[list[str], int, int]:
    """`texts` over and over as records {id, text} in `shards` .jsonl files until `mb` MB of document text; each copy
    gets its own id and first line. Returns the files, and the documents and bytes of text written."""
    folder.mkdir(parents=True)
    files = [folder / f"stream-{shard:02d}.jsonl" for shard in range(shards)]
    documents, size = 0, 0
    outs = [path.open("w") for path in files]
    try:
        while size < mb * MB:
            text = f"Document {documents}.\n{texts[documents % len(texts)]}"
            outs[documents % shards].write(json.dumps({"id": f"doc-{documents}", "text": text}) + "\n")
            documents, size = documents + 1, size + len(text.encode())
    finally:
        for out in outs:
            out.close()
    return [str(path) for path in files], documents, size


def stream_once(files: list[str], tokenizer_dir: str, seq_len: int, results: multiprocessing.Queue) -> None:
    """In a fresh process: every row of streaming prepare (read, clean, tokenize, pack) over `files`, then this
    process's peak resident memory, and what it was once the libraries were imported."""
    imported = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux → MiB
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    stream = PackedStream(stream_records(DataConfig(paths=files)), tokenizer, seq_len, clean=CleanConfig(), epochs=1)
    clock = time.perf_counter()
    for _ in stream:
        pass
    results.put(
        {
            **stream.state_dict()["counts"],
            "skipped": stream.skipped.total,
            "seconds": round(time.perf_counter() - clock, 2),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "rss_after_imports_mib": round(imported, 1),
        }
    )


def streaming_memory(args: argparse.Namespace, argv: list[str] | None) -> dict:
    """Peak memory of streaming prepare over each input size, every size in a fresh process."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_stream-") as tmp:
        scratch = Path(tmp)
        texts = demo_texts(args.tokenizer_mb, args.seed)  # the distinct documents that are repeated
        save_tokenizer(texts, args.vocab_size, args.tokenizer_mb, scratch / "tokenizer")
        spawn = multiprocessing.get_context("spawn")  # a new interpreter: its peak memory is this run's alone
        for mb in args.sizes_mb:
            folder = scratch / f"input-{mb:g}"
            files, documents, raw_bytes = write_repeated(texts, mb, folder, args.shards)
            results = spawn.Queue()
            child = spawn.Process(target=stream_once, args=(files, str(scratch / "tokenizer"), args.seq_len, results))
            child.start()
            child.join()
            if child.exitcode != 0:
                raise RuntimeError(f"streaming prepare of {mb:g} MB failed in its process (exit code {child.exitcode})")
            row = results.get()
            shutil.rmtree(folder)
            row = {"mb": mb, "raw_bytes": raw_bytes, "files": len(files), "input_documents": documents, **row}
            row["mb_per_s"] = round(raw_bytes / MB / row["seconds"], 3)
            rows.append(row)
            print(f"{mb:g} MB: peak {row['peak_rss_mib']:.0f} MiB, {row['seconds']:.0f} s", flush=True)
    peaks = [row["peak_rss_mib"] for row in rows]
    corpus = {"source": "demo, repeated with varied ids", "distinct_documents": len(texts)}
    return {
        "header": header(args, argv, corpus),
        "rows": rows,
        "peak_ratio": round(max(peaks) / min(peaks), 3),
        "target_ratio": FLAT_MEMORY,
        "met": max(peaks) <= FLAT_MEMORY * min(peaks),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    datasets.disable_progress_bars()
    if args.streaming_memory:
        result = streaming_memory(args, argv)
        path = update_record(args.out, {"streaming_memory": result}, result["header"])
        print(f"wrote {path}: peak memory ratio {result['peak_ratio']} (target <= {FLAT_MEMORY}, met: {result['met']})")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench_data-") as tmp:
        scratch = Path(tmp)
        texts = local_texts(args.paths, scratch / "read") if args.paths else demo_texts(args.mb, args.seed)
        if not texts:
            raise ValueError(f"--paths: no document could be read from {args.paths}")
        raw_bytes = sum(len(text.encode()) for text in texts)
        files = write_shards(texts, scratch / "input", min(args.shards, len(texts)))
        save_tokenizer(texts, args.vocab_size, args.tokenizer_mb, scratch / "tokenizer")
        corpus = {"source": "paths" if args.paths else "demo", "documents": len(texts), "raw_bytes": raw_bytes}
        head = header(args, argv, {**corpus, "files": len(files)})
        rows = measure(files, scratch / "tokenizer", scratch, args, raw_bytes)
    path = update_record(args.out, {"header": head, "rows": rows}, head)
    print(f"wrote {path}")
    print(table(rows, raw_bytes / MB))
    return 0


def update_record(out: Path, parts: dict, head: dict) -> Path:
    """Write `parts` into the machine's record in `out` (renamed to `head`'s date), keeping what the other mode
    measured there."""
    old = record.current(out, head["benchmark"], head["gpu"])
    return record.write(out, (json.loads(old.read_text()) if old else {}) | parts, head)


if __name__ == "__main__":
    sys.exit(main())
