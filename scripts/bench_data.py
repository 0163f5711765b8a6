"""Data-preparation throughput: our `prepare` against a plain `datasets` baseline, same input, same tokenizer.

The input is raw text written as .jsonl shards to a temporary folder: distinct demo documents
(`legalpt.data.synthetic.generate_documents`, new seeds until --mb megabytes) or the documents of --paths. A byte-level
BPE is trained on a sample first (untimed) and saved; all three variants load it from that folder:

    ours_full      legalpt.data.pipeline.prepare: load, clean, exact + near dedup, split, tokenize, pack
    ours_tok_pack  the same with cleaning and dedup switched off: load, split, tokenize, pack
    baseline       datasets.load_dataset("json") → map(tokenizer(batch["text"]), batched) → concatenate-and-split
                   into seq_len blocks, remainder dropped (the grouping of Hugging Face's run_clm example)

Every run gets a fresh cache folder, so nothing is reused between runs. The variants run in turn, --repeats times,
and each one's median time counts; MB are 10^6 bytes of UTF-8 document text. The record goes to
<out>/data-<yyyymmdd>.json with a header naming the machine, versions, commit, date and command.

    python scripts/bench_data.py                      # ~20 MB of demo documents, num_proc = CPU count
    python scripts/bench_data.py --mb 0.2 --repeats 1 # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

# The forked map workers would each switch the Rust thread pool off with a warning; one setting for every variant.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import datasets
import pyarrow.compute as pc
import tokenizers
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from legalpt.config import CleanConfig, DataConfig, DedupConfig
from legalpt.data.pipeline import prepare
from legalpt.data.sources import load_documents
from legalpt.data.synthetic import generate_documents
from legalpt.data.tokenizer import train_bpe
from legalpt.provenance import commit

ROOT = Path(__file__).resolve().parent.parent
MB = 10**6
TARGETS = {"ours_full": 1.5, "ours_tok_pack": 1.0}  # most allowed time of each, as a multiple of the baseline's


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
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="folder of the JSON record")
    args = parser.parse_args(argv)
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
    return {
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "processor": platform.machine()},
        "python": platform.python_version(),
        "torch": torch.__version__,
        "datasets": datasets.__version__,
        "tokenizers": tokenizers.__version__,
        "commit": commit(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "scripts/bench_data.py", *(sys.argv[1:] if argv is None else argv)]),
        "settings": {
            "seq_len": args.seq_len,
            "num_proc": args.num_proc,
            "vocab_size": args.vocab_size,
            "repeats": args.repeats,
            "tokenizers_parallelism": os.environ["TOKENIZERS_PARALLELISM"],
        },
        "corpus": corpus,
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
    }


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory(prefix="bench_data-") as tmp:
        scratch = Path(tmp)
        texts = local_texts(args.paths, scratch / "read") if args.paths else demo_texts(args.mb, args.seed)
        if not texts:
            raise ValueError(f"--paths: no document could be read from {args.paths}")
        raw_bytes = sum(len(text.encode()) for text in texts)
        files = write_shards(texts, scratch / "input", min(args.shards, len(texts)))
        save_tokenizer(texts, args.vocab_size, args.tokenizer_mb, scratch / "tokenizer")
        corpus = {"source": "paths" if args.paths else "demo", "documents": len(texts), "raw_bytes": raw_bytes}
        record = {"header": header(args, argv, {**corpus, "files": len(files)}), "rows": []}
        record["rows"] = measure(files, scratch / "tokenizer", scratch, args, raw_bytes)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"data-{datetime.now(timezone.utc):%Y%m%d}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")
    print(table(record["rows"], raw_bytes / MB))
    return 0


if __name__ == "__main__":
    sys.exit(main())
