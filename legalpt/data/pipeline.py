"""Data preparation end to end: documents → cleaning → dedup → train/held-out split → tokenizer → token ids →
packed rows.

`prepare(cfg.data, cfg.model.pretrained)` is what `legalpt-prepare` and the trainer call. The packed rows of both
splits are cached under `<cache_dir>/packed/<key>/` (or written to `data.output_dir`, which remembers its key), the key
covering the corpus content, the tokenizer, seq_len, the packing options, the split and the packing code, so a second
run loads the documents, fingerprints them and memory-maps the rows.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from legalpt.config import DataConfig
from legalpt.data import pack
from legalpt.data.clean import clean_documents
from legalpt.data.dedup import deduplicate
from legalpt.data.pack import PackStats, pack_dataset
from legalpt.data.readers.rows import SkipReport
from legalpt.data.sources import corpus_fingerprint, count_characters, data_sources, find_files, load_documents
from legalpt.data.tokenizer import compare_tokenizers, extend_tokenizer, get_tokenizer, load_tokenizer

SPLITS = ("train", "heldout")
_TOKEN_FEATURES = datasets.Features({"input_ids": datasets.List(datasets.Value("int32"))})


@dataclass
class PreparedData:
    """Packed rows of both splits (columns input_ids, seq_lens, context_lens, num_pad), their tokenizer, and what
    happened."""

    train: datasets.Dataset
    heldout: datasets.Dataset
    tokenizer: PreTrainedTokenizerFast
    # skipped: SkipReport; train, heldout: PackStats.to_dict(); seq_len; tokenizer (its name or path); vocab_size;
    # added_tokens (extend_tokenizer's choice and check, or None); tokens_per_byte; rows_dir (where the rows are);
    # cached (rows loaded, not built); seconds (per phase); input_bytes (read); wall_s (the whole prepare)
    stats: dict[str, Any]
    # `tokenizer` before data.extend_tokenizer added legal tokens (None when it did not, or its check rejected them):
    # the ids a pretrained model's embeddings know, from which legalpt.model.extend_embeddings initializes the new rows
    base_tokenizer: PreTrainedTokenizerFast | None = None
    # the documents of the train split (id, text, ...), which the run's training-documents manifest records
    train_documents: datasets.Dataset | None = None


@dataclass
class Corpus:
    """The documents after loading, cleaning and dedup, their train/held-out split, and what each step did."""

    documents: datasets.Dataset  # every kept document, in order
    splits: dict[str, datasets.Dataset]  # "train", "heldout"
    skipped: SkipReport  # what loading skipped, by reason
    cleaning: dict[str, Any]  # clean_documents' report
    dedup: dict[str, Any]  # deduplicate's report
    loaded: int  # documents loaded, before cleaning and dedup
    characters: int  # their characters
    input_bytes: int  # bytes read to load them (input_bytes)


def split_corpus(cfg: DataConfig) -> Corpus:
    """Load, clean, deduplicate and split the documents of `cfg`: the one definition of the held-out split, shared
    by training (`prepare`) and evaluation."""
    documents, skipped = load_documents(cfg)
    if documents.num_rows == 0:
        where = f"data.paths {list(cfg.paths)}" + (f" and data.sources {list(cfg.sources)}" if cfg.sources else "")
        raise ValueError(f"{where}: no document could be loaded ({skipped})")
    loaded, characters, read = documents.num_rows, count_characters(documents), input_bytes(cfg, documents)
    documents, cleaning = clean_documents(documents, cfg.clean, cfg.num_proc)
    documents, dedup = deduplicate(documents, cfg.dedup, cfg.num_proc)
    splits = dict(zip(SPLITS, split_documents(documents, cfg.heldout_fraction, cfg.seed), strict=True))
    return Corpus(documents, splits, skipped, cleaning, dedup, loaded, characters, read)


def prepare(cfg: DataConfig, pretrained: str | None = None) -> PreparedData:
    """Load, split, tokenize and pack the documents of `cfg` (its fine-tuning examples for data.format=sft);
    `pretrained` names the model whose tokenizer to use."""
    start = time.perf_counter()
    _check(cfg, pretrained)
    if cfg.format == "sft":  # fine-tuning examples: rendered, masked and packed whole by legalpt.data.sft
        from legalpt.data.sft import prepare_sft

        return prepare_sft(cfg, pretrained)
    others = {name: load_tokenizer(name) for name in cfg.compare_tokenizers}  # loaded first: a bad name fails early
    seconds: dict[str, float] = {}
    clock = time.perf_counter()
    corpus = split_corpus(cfg)
    documents, documents_by_split = corpus.documents, corpus.splits
    skipped, cleaning, dedup = corpus.skipped, corpus.cleaning, corpus.dedup
    seconds["load"] = time.perf_counter() - clock

    clock = time.perf_counter()
    base = tokenizer = get_tokenizer(cfg, documents_by_split["train"], pretrained)
    added = None
    if cfg.extend_tokenizer:
        tokenizer, added = extend_tokenizer(base, documents_by_split["train"], cfg.extra_tokens, cfg.cache_dir)
    if cfg.bos and tokenizer.bos_token_id is None:
        raise ValueError(f"data.bos: tokenizer {tokenizer.name_or_path!r} has no bos token to start documents with")
    tokens_per_byte = _tokens_per_byte(base, tokenizer, others, documents_by_split)
    seconds["tokenizer"] = time.perf_counter() - clock

    key = cache_key(documents, tokenizer, cfg)
    folder = Path(cfg.output_dir or Path(cfg.cache_dir) / "packed" / key).expanduser()
    cached = holds_rows(folder, key)
    if not cached:
        _build(folder, key, documents_by_split, tokenizer, cfg, seconds)
    rows = {split: datasets.load_from_disk(str(folder / split)) for split in SPLITS}
    saved = json.loads((folder / "stats.json").read_text())
    pack_stats = {split: PackStats(**saved[split]).to_dict() for split in SPLITS}
    stats = {
        "skipped": skipped,
        "clean": cleaning,
        "dedup": dedup,
        **pack_stats,
        "seq_len": cfg.seq_len,
        "tokenizer": tokenizer.name_or_path,
        "vocab_size": len(tokenizer),
        "added_tokens": added,
        "tokens_per_byte": tokens_per_byte,
        "rows_dir": str(folder),
        "cached": cached,
        "seconds": seconds,
        "input_bytes": corpus.input_bytes,
        "wall_s": time.perf_counter() - start,
    }
    write_report(folder / "report.json", stats, corpus.loaded, corpus.characters)
    return PreparedData(
        train=rows["train"],
        heldout=rows["heldout"],
        tokenizer=tokenizer,
        stats=stats,
        base_tokenizer=base if tokenizer is not base else None,
        train_documents=documents_by_split["train"],
    )


def write_report(path: Path, stats: dict[str, Any], loaded: int, characters: int) -> dict[str, Any]:
    """The run's report as JSON next to the packed rows: what was read, kept and skipped (by reason), tokens,
    characters, time and throughput (input bytes read per second of the whole prepare)."""
    skipped, wall_s = stats["skipped"], stats["wall_s"]
    report = {
        "documents": {
            "read": loaded + skipped.total,
            "skipped": skipped.counts,
            "skipped_examples": skipped.examples,
            "emptied_by_cleaning": stats["clean"].get("emptied", 0),
            "exact_duplicates": stats["dedup"]["exact_duplicates"],
            "near_duplicates": stats["dedup"]["near_duplicates"],
            "containment_duplicates": stats["dedup"]["containment_duplicates"],
            "kept": stats["train"]["documents"] + stats["heldout"]["documents"],
        },
        "duplicate_examples": stats["dedup"]["examples"],
        "characters": characters,
        "splits": {split: stats[split] for split in SPLITS},
        "seq_len": stats["seq_len"],
        "tokenizer": stats["tokenizer"],
        "vocab_size": stats["vocab_size"],
        "added_tokens": stats["added_tokens"],
        "tokens_per_byte": stats["tokens_per_byte"],
        "cached": stats["cached"],
        "seconds": stats["seconds"],
        "input_bytes": stats["input_bytes"],
        "wall_s": wall_s,
        "mb_per_s": stats["input_bytes"] / 1e6 / wall_s if wall_s else None,
    }
    path.write_text(json.dumps(report, indent=2))
    return report


def input_bytes(cfg: DataConfig, documents: datasets.Dataset) -> int:
    """Bytes read to load `documents`: the size of every file that data.paths and the file sources name, and the
    UTF-8 text of the documents that came from no file (hub datasets, the demo corpus)."""
    files = {path for source in data_sources(cfg).values() if source.paths for path in find_files(source.paths)}
    columns = documents.with_format("arrow")
    from_no_file = pc.invert(pc.is_in(columns["source"], value_set=pa.array(sorted(files), pa.string())))
    text_bytes = pc.sum(pc.filter(pc.binary_length(columns["text"]), from_no_file)).as_py() or 0
    return sum(os.path.getsize(path) for path in files) + text_bytes


def split_documents(
    documents: datasets.Dataset, heldout_fraction: float, seed: int
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """A seeded random `heldout_fraction` of the documents (at least one when there are two) and the rest, in order."""
    n = documents.num_rows
    num_heldout = min(n - 1, max(1, round(n * heldout_fraction))) if n >= 2 else 0
    order = np.random.default_rng(seed).permutation(n)
    return documents.select(np.sort(order[num_heldout:])), documents.select(np.sort(order[:num_heldout]))


def format_stats(stats: dict[str, Any]) -> str:
    """A short report of `PreparedData.stats` for the terminal."""
    if stats.get("format") == "sft":
        from legalpt.data.sft import format_sft_stats

        return format_sft_stats(stats)
    train, heldout = stats["train"], stats["heldout"]
    lines = [f"documents  {train['documents']:,} train, {heldout['documents']:,} held-out; {stats['skipped']}"]
    clean, dedup = stats["clean"], stats["dedup"]
    if clean.get("characters_in"):
        lines.append(f"cleaning   {clean['characters_in']:,} → {clean['characters_out']:,} characters")
    lines.append(
        f"dedup      {dedup['exact_duplicates']:,} exact, {dedup['near_duplicates']:,} near and "
        f"{dedup['containment_duplicates']:,} contained duplicates removed"
    )
    lines += [
        f"           {p['removed_id']} duplicates {p['kept_id']} ({p['kind']}, similarity {p['similarity']:.2f})"
        for p in dedup["examples"]
    ]
    for label, split in (("train", train), ("held-out", heldout)):
        lines.append(
            f"{label:<9}  {split['tokens']:,} tokens in {split['rows']:,} rows of {stats['seq_len']} "
            f"({split['padding_pct']:.2f}% padding), longest document {split['longest_document']:,} tokens"
        )
    lines.append(f"tokenizer  {stats['tokenizer'] or 'trained BPE'} ({stats['vocab_size']:,} tokens)")
    if added := stats["added_tokens"]:
        lines.append(f"           {_extension(added)}")
    measured = stats["tokens_per_byte"]
    lines.append(
        f"tokens/B   on {measured['text']} text: "
        + ", ".join(f"{name} {value:.4f}" for name, value in measured["tokenizers"].items())
    )
    lines.append(f"rows       {stats['rows_dir']}{' (from cache)' if stats['cached'] else ''}")
    lines.append(f"report     {stats['rows_dir']}/report.json, lengths.png")
    phases = ", ".join(f"{phase} {s:.2f}" for phase, s in stats["seconds"].items())
    read = f"{stats['input_bytes'] / 1e6 / stats['wall_s']:.2f} MB/s read" if stats["wall_s"] else "no time"
    lines.append(f"seconds    {phases}; all {stats['wall_s']:.2f} ({read})")
    return "\n".join(lines)


def _extension(added: dict[str, Any]) -> str:
    """What data.extend_tokenizer found, and whether its check on documents it did not mine let it in."""
    found = f"{len(added['reporters'])} reporter abbreviations and {len(added['terms'])} word tokens"
    check = added["check"]
    if not check["documents"]:
        return f"not extended: no training document was left out of mining to check {found} on"
    figures = f"tokens/B on {check['documents']} unmined documents {check['base']:.4f} → {check['extended']:.4f}"
    return f"+{found}; {figures}" if check["applied"] else f"not extended, {found} do not help: {figures}"


def _check(cfg: DataConfig, pretrained: str | None) -> None:
    """What `prepare` cannot run with, before anything is loaded. The ranges are `DataConfig.validate`'s, run here
    again for callers that built `cfg` without `legalpt.config.to_config`; streaming and a foreign output folder are
    errors of prepare alone."""
    if cfg.streaming:  # legalpt-prepare would otherwise quietly run the in-memory pipeline
        raise ValueError(
            "data.streaming: streaming packs rows on the fly during training and writes none to prepare; "
            "run legalpt-train data.streaming=true, or prepare with data.streaming=false"
        )
    cfg.validate("data", trains_bpe=not pretrained)
    if cfg.output_dir:
        folder = Path(cfg.output_dir).expanduser()
        if folder.exists() and not (holds_rows(folder) or _is_empty_dir(folder)):
            raise ValueError(f"data.output_dir: {str(folder)!r} exists and is not a legalpt-prepare output; "
                             "expected a new or empty folder, or one an earlier prepare wrote")  # fmt: skip


def holds_rows(folder: Path, key: str | None = None) -> bool:
    """Whether `folder` holds packed rows written by `_build` or `sft` (with this cache key, when one is given)."""
    try:
        saved = json.loads((folder / "stats.json").read_text())
    except (OSError, ValueError):
        return False
    return key is None or saved.get("key") == key


def _is_empty_dir(folder: Path) -> bool:
    return folder.is_dir() and not any(folder.iterdir())


def _tokens_per_byte(
    base: PreTrainedTokenizerFast,
    tokenizer: PreTrainedTokenizerFast,
    others: dict[str, PreTrainedTokenizerFast],
    documents_by_split: dict[str, datasets.Dataset],
) -> dict[str, Any]:
    """Tokens per byte of held-out text (train text when there is none) under the base tokenizer, the extended one,
    and the `others` (data.compare_tokenizers)."""
    text = "heldout" if documents_by_split["heldout"].num_rows else "train"
    named = {"base": base, **({"extended": tokenizer} if tokenizer is not base else {}), **others}
    return {"text": text, "tokenizers": compare_tokenizers(named, documents_by_split[text])}


def cache_key(documents: datasets.Dataset, tokenizer: PreTrainedTokenizerFast, cfg: DataConfig) -> str:
    """The identity of packed rows: the documents, the settings that shape rows, the tokenizer and the code."""
    digest = hashlib.sha256()
    digest.update(json.dumps([corpus_fingerprint(documents), cfg.seq_len, cfg.seed, cfg.heldout_fraction]).encode())
    digest.update(json.dumps([cfg.bos, cfg.eos, cfg.chunk_overlap]).encode())
    digest.update(tokenizer.backend_tokenizer.to_str().encode())
    digest.update(f"{tokenizer.bos_token_id}-{tokenizer.eos_token_id}-{tokenizer.pad_token_id}".encode())
    # The code that makes the rows is part of their identity: change the packing, and old rows are not reused.
    digest.update(Path(pack.__file__).read_bytes() + Path(__file__).read_bytes())
    return digest.hexdigest()[:16]


def _build(
    folder: Path,
    key: str,
    documents_by_split: dict[str, datasets.Dataset],
    tokenizer: PreTrainedTokenizerFast,
    cfg: DataConfig,
    seconds: dict[str, float],
) -> None:
    """Tokenize and pack both splits into `folder`, built aside and renamed into place so it is never half written;
    what `folder` held before (rows of other settings, in a data.output_dir) is replaced."""
    with publishing(folder, key) as (work, out):
        clock = time.perf_counter()
        tokenized = {
            split: _tokenize(docs, tokenizer, cfg.num_proc, work / f"{split}-tokens.arrow", f"{key}-{split}")
            for split, docs in documents_by_split.items()
        }
        seconds["tokenize"] = time.perf_counter() - clock
        plot_lengths({split: _lengths(ids) for split, ids in tokenized.items()}, cfg.seq_len, out / "lengths.png")

        clock = time.perf_counter()
        pack_stats = {}
        for split, ids in tokenized.items():
            rows, pack_stats[split] = pack_dataset(
                ids,
                cfg.seq_len,
                tokenizer.eos_token_id if cfg.eos else None,
                tokenizer.pad_token_id,
                str(work),
                bos_id=tokenizer.bos_token_id if cfg.bos else None,
                overlap=cfg.chunk_overlap,
            )
            # An empty dataset must be written as one (empty) shard: with none, load_from_disk() fails.
            rows.save_to_disk(str(out / split), num_shards=None if rows.num_rows else 1)
        (out / "stats.json").write_text(
            json.dumps({"key": key, **{split: asdict(s) for split, s in pack_stats.items()}})
        )
        seconds["pack"] = time.perf_counter() - clock


@contextmanager
def publishing(folder: Path, key: str) -> Iterator[tuple[Path, Path]]:
    """(work, out): a scratch folder and the folder to fill, both beside `folder`. When the block ends without an
    error, `out` becomes `folder` by one rename, so a reader never sees it half written; what `folder` held before
    (rows of other settings, in a data.output_dir) is replaced, and an error leaves it as it was."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f"{folder.name}.partial-") as tmp:
        work, out = Path(tmp) / "work", Path(tmp) / "out"
        work.mkdir()
        out.mkdir()
        yield work, out
        if folder.exists() and not holds_rows(folder, key):
            folder.rename(Path(tmp) / "replaced")  # removed with the temporary folder
        try:
            out.rename(folder)
        except OSError:
            if not folder.exists():
                raise  # else another process published the same rows first, and those serve as well


def _lengths(tokenized: datasets.Dataset) -> np.ndarray:
    if tokenized.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    return pc.list_value_length(tokenized.with_format("arrow")["input_ids"]).to_numpy()


def plot_lengths(lengths: dict[str, np.ndarray], seq_len: int, path: Path) -> None:
    """Histogram of document lengths in tokens (log scale), one series per split, with the row length marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    longest = max((int(x.max()) for x in lengths.values() if x.size), default=1)
    bins = np.geomspace(1, max(2, longest + 1), 40)
    fig, ax = plt.subplots(figsize=(8, 4))
    for split, values in lengths.items():
        ax.hist(np.maximum(values, 1), bins=bins, alpha=0.6, label=f"{split} ({values.size:,} documents)")
    ax.axvline(seq_len, color="black", linestyle="--", linewidth=1, label=f"row length {seq_len}")
    ax.set(xscale="log", xlabel="document length (tokens)", ylabel="documents", title="document lengths")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _tokenize(
    documents: datasets.Dataset, tokenizer: PreTrainedTokenizerFast, num_proc: int, cache_file: Path, fingerprint: str
) -> datasets.Dataset:
    if documents.num_rows == 0:  # map() skips an empty dataset, and would return it without the input_ids column
        return datasets.Dataset.from_dict({"input_ids": []}, features=_TOKEN_FEATURES)
    return documents.map(
        encode_batch,
        batched=True,
        batch_size=64,
        num_proc=num_proc if num_proc > 1 else None,
        remove_columns=documents.column_names,
        features=_TOKEN_FEATURES,
        fn_kwargs={"backend": copy.deepcopy(tokenizer.backend_tokenizer)},  # a copy: encode_batch changes a setting
        cache_file_name=str(cache_file),
        new_fingerprint=fingerprint,
        desc="tokenizing",
    )


def encode_batch(batch: dict[str, list], backend: Tokenizer) -> dict[str, list]:
    """Token ids of a batch of texts ({"text": [...]} -> {"input_ids": [...]}), without special tokens added."""
    # The Rust tokenizer alone (what the transformers wrapper calls), told to read special-token strings as plain
    # text: an "<|endoftext|>" written in a document must not end it. The wrapper's own split_special_tokens does
    # the same at half the speed. Set on every call, because the setting does not survive pickling into workers.
    backend.encode_special_tokens = True
    encodings = backend.encode_batch_fast(batch["text"], add_special_tokens=False)
    return {"input_ids": [encoding.ids for encoding in encodings]}
