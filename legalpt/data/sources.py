"""Document sources: files, folders and globs of legal text, datasets read through `datasets.load_dataset` (hub or
local, streamed or not), or the built-in demo corpus, as one `datasets.Dataset`.

Every document becomes a record `{id, text, source, kind, meta}`: `source` is the file it came from (the source's
name for a dataset, "synthetic" for the demo corpus), `kind` is one of `KINDS` (a source's configured kind, else
`guess_kind`), and `meta` is a JSON string (Arrow needs one schema, and every format carries different metadata).
Local files are read by `legalpt.data.readers` (one module per format). Dataset records become documents through
their source's field mapping (`SourceConfig`: text, id and meta fields); several sources are interleaved by weight
(`legalpt.data.mixture`).

Nothing is dropped silently: what cannot become a document (an empty, binary, undecodable, unreadable or corrupt
file, a line over `readers.MAX_LINE_BYTES`, a record without its text field, a record the mixture had no room for,
...) is counted by reason, with example locations, in a `SkipReport`, and loading goes on with the next record or
file.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import datasets
import pyarrow.compute as pc

from legalpt.config import DataConfig, SourceConfig
from legalpt.data import mixture, readers
from legalpt.data.kinds import KINDS, guess_kind
from legalpt.data.mixture import interleave, normalize_weights
from legalpt.data.readers.rows import FEATURES, READ_FEATURES, SkipReport, document_row, skip_row

_GLOB_CHARS = re.compile(r"[*?\[]")
FILES = "files"  # the name of the source that data.paths makes
_MISSING = object()  # a field absent from a record (None is a present, empty value)


def count_characters(documents: datasets.Dataset) -> int:
    """Characters of the `text` column, counted by Arrow without materialising the texts."""
    return pc.sum(pc.utf8_length(documents.with_format("arrow")["text"])).as_py() or 0


def load_documents(cfg: DataConfig) -> tuple[datasets.Dataset, SkipReport]:
    """The documents of `cfg.paths` and `cfg.sources`, mixed by weight (`legalpt.data.mixture`), or the demo corpus
    when both are empty; and what was skipped on the way."""
    sources = data_sources(cfg)
    if not sources:
        return _demo_corpus(cfg.synthetic_documents, cfg.seed, cfg.synthetic_min_chars), SkipReport()
    first, *others = sources.values()
    if not others and first.paths and not (first.kind or first.max_documents):  # plain files: nothing to mix
        return _separate_skips(_read_paths(first.paths, first.text_field, cfg))
    inputs = {name: open_source(name, source, cfg) for name, source in sources.items()}
    # Streamed sources are identified by their configuration alone: their content is not known before reading.
    identities = [None if sources[name].streaming else data._fingerprint for name, data in inputs.items()]
    key = hashlib.sha256(
        json.dumps([{n: asdict(s) for n, s in sources.items()}, identities], default=str).encode()
        + Path(__file__).read_bytes()
        + Path(mixture.__file__).read_bytes()
        + readers.code_fingerprint().encode()
    ).hexdigest()
    read = datasets.Dataset.from_generator(
        mixed_rows,
        features=READ_FEATURES,
        cache_dir=str(Path(cfg.cache_dir).expanduser() / "documents"),
        gen_kwargs={"sources": sources, "inputs": inputs},
        fingerprint=key[:32],
    )
    return _separate_skips(read)


def data_sources(cfg: DataConfig) -> dict[str, SourceConfig]:
    """The sources of `cfg`, checked: `paths` as the source "files" (weight 1), then `sources`, in order."""
    if not isinstance(cfg.sources, Mapping):
        raise TypeError(f"data.sources: expected a mapping of name to source, got {type(cfg.sources).__name__}")
    sources = {}
    if cfg.paths:
        if FILES in cfg.sources:
            raise ValueError(f"data.sources.{FILES}: the name {FILES!r} is taken by data.paths; choose another")
        sources[FILES] = SourceConfig(paths=list(cfg.paths), text_field=cfg.text_field)
    sources.update(cfg.sources)
    for name, source in sources.items():
        _check_source(name, source)
    if sources:
        normalize_weights([source.weight for source in sources.values()], [f"data.sources.{n}" for n in sources])
    return sources


def _check_source(name: str, source: SourceConfig) -> None:
    where = f"data.sources.{name}"
    if not isinstance(source, SourceConfig):
        raise TypeError(f"{where}: expected a SourceConfig, got {type(source).__name__}")
    if bool(source.name) == bool(source.paths):
        raise ValueError(
            f"{where}: expected either a dataset `name` or local `paths`, got {source.name=}, {source.paths=}"
        )
    dataset_only = {
        "config": source.config,
        "data_files": source.data_files,
        "id_field": source.id_field,
        "meta_fields": source.meta_fields,
        "distinct_field": source.distinct_field,
        "streaming": source.streaming,
    }
    if source.paths and any(dataset_only.values()):
        used = [field for field, value in dataset_only.items() if value]
        raise ValueError(f"{where}: {', '.join(used)} apply to a dataset `name`, not to local `paths`")
    if source.kind is not None and source.kind not in KINDS:
        raise ValueError(f"{where}.kind: expected one of {', '.join(KINDS)} or None, got {source.kind!r}")
    if not isinstance(source.max_documents, int) or source.max_documents < 0:
        raise ValueError(f"{where}.max_documents: expected a count >= 0 (0 = all), got {source.max_documents!r}")
    if not source.text_field:
        raise ValueError(f"{where}.text_field: expected a field name, got {source.text_field!r}")


def _read_paths(paths: Sequence[str], text_field: str, cfg: DataConfig) -> datasets.Dataset:
    """The files `paths` name, read into a cached dataset with the `READ_FEATURES` columns (skips as rows)."""
    files = find_files(paths)
    stamps = [(path, os.stat(path).st_size, os.stat(path).st_mtime_ns) for path in files]
    # The cache key covers every file's identity and the readers' code, so an edited file or reader reloads.
    key = hashlib.sha256(
        json.dumps([stamps, text_field, readers.MAX_LINE_BYTES]).encode() + readers.code_fingerprint().encode()
    ).hexdigest()
    return datasets.Dataset.from_generator(
        readers.read_files,
        features=READ_FEATURES,
        cache_dir=str(Path(cfg.cache_dir).expanduser() / "documents"),
        gen_kwargs={"files": files, "text_field": text_field, "max_line_bytes": readers.MAX_LINE_BYTES},
        num_proc=min(cfg.num_proc, len(files)) if cfg.num_proc > 1 else None,
        fingerprint=key[:32],
    )


def open_source(name: str, source: SourceConfig, cfg: DataConfig) -> datasets.Dataset | datasets.IterableDataset:
    """The records of one source: its files read by legalpt's readers, or its dataset through `load_dataset`."""
    if source.paths:
        return _read_paths(source.paths, source.text_field, cfg)
    try:
        return datasets.load_dataset(
            source.name,
            source.config,
            data_files=list(source.data_files) or None,
            split=source.split,
            streaming=source.streaming,
        )
    except (FileNotFoundError, ConnectionError, ValueError) as error:  # DatasetNotFoundError is a FileNotFoundError
        raise ValueError(
            f"data.sources.{name}: cannot load {source.name!r} (config {source.config!r}, split "
            f"{source.split!r}): {error}"
        ) from error


def mixed_rows(
    sources: dict[str, SourceConfig], inputs: dict[str, datasets.Dataset | datasets.IterableDataset]
) -> Iterator[dict[str, str]]:
    """The rows of every source, interleaved by weight; then what the mixture left of the sources read whole, as
    skips, so that nothing read goes uncounted (a streamed source is read only as far as the mixture needs)."""
    streams = [_source_rows(name, sources[name], data) for name, data in inputs.items()]
    weights = [source.weight for source in sources.values()]
    for _, row in interleave(streams, weights, size=lambda row: 0 if row["skip"] else len(row["text"])):
        yield row
    for stream, source in zip(streams, sources.values(), strict=True):
        if not source.streaming:
            for row in stream:
                yield row if row["skip"] else skip_row("beyond mixture share", row["id"])


def _source_rows(
    name: str, source: SourceConfig, data: datasets.Dataset | datasets.IterableDataset
) -> Iterator[dict[str, str]]:
    """One source's rows (`READ_FEATURES`), at most `max_documents` documents; skip rows pass through."""
    seen: set[str] = set()  # values of distinct_field met so far
    taken = 0
    for number, record in enumerate(_records(data)):
        if source.paths:
            row = {**record, "kind": source.kind} if source.kind and not record["skip"] else record
        else:
            row = _from_dataset_record(record, name, number, source, seen)
        yield row
        taken += not row["skip"]
        if taken == source.max_documents > 0:
            return


def _records(data: datasets.Dataset | datasets.IterableDataset) -> Iterator[dict[str, Any]]:
    if isinstance(data, datasets.IterableDataset):
        yield from data
    else:  # Arrow batches to Python rows: several times faster than indexing row by row
        for batch in data.with_format("arrow").iter(batch_size=1024):
            yield from batch.to_pylist()


def _from_dataset_record(
    record: dict[str, Any], name: str, number: int, source: SourceConfig, seen: set[str]
) -> dict[str, str]:
    """A dataset record as a document row, through the source's field mapping; or a skip row saying why not."""
    where = f"{name}:{number}"
    text = _lookup(record, source.text_field)
    if text is _MISSING:
        return skip_row("missing text field", where)
    if isinstance(text, list):  # a dotted path through a list: the parts of one document, in order
        if not all(part is None or isinstance(part, str) for part in text):
            return skip_row("text not a string", where)
        text = "\n\n".join(part for part in text if part and part.strip())
    if text is None:
        return skip_row("empty text", where)
    if not isinstance(text, str):
        return skip_row("text not a string", where)
    if source.distinct_field:
        value = json.dumps(_lookup(record, source.distinct_field), default=str)
        if value in seen:
            return skip_row("repeated record", where)
        seen.add(value)
    doc_id = _lookup(record, source.id_field) if source.id_field else None
    doc_id = where if doc_id is _MISSING or doc_id is None else str(doc_id)
    meta = {field: record[field] for field in source.meta_fields if field in record}
    kind = source.kind or guess_kind(text)
    return document_row(text, doc_id=doc_id, source=name, kind=kind, meta=meta, where=where)


def _lookup(record: dict[str, Any], path: str) -> Any:
    """The value at a dotted path ("opinions.opinion_text"); through a list, the list of its items' values."""
    value: Any = record
    for key in path.split("."):
        if isinstance(value, list):
            value = [item[key] for item in value if isinstance(item, dict) and key in item]
        elif isinstance(value, dict) and key in value:
            value = value[key]
        else:
            return _MISSING
    return value


def find_files(paths: Sequence[str]) -> list[str]:
    """Absolute paths of the files that `paths` name (files, folders searched recursively, globs), in order, once."""
    if isinstance(paths, str):
        raise TypeError(f"data.paths: expected a list of paths, got the string {paths!r}")
    found: dict[str, None] = {}  # an ordered set
    for pattern in paths:
        pattern = os.path.expanduser(pattern)
        if os.path.exists(pattern):  # a literal name wins, even when it holds glob characters
            matches = [pattern]
        elif _GLOB_CHARS.search(pattern):
            matches = sorted(glob.glob(pattern, recursive=True))
            if not matches:
                raise FileNotFoundError(f"data.paths: {pattern!r} matches no file")
        else:
            raise FileNotFoundError(f"data.paths: {pattern!r} does not exist")
        for match in matches:
            files = sorted(str(p) for p in Path(match).rglob("*") if p.is_file()) if os.path.isdir(match) else [match]
            if not files:
                raise FileNotFoundError(f"data.paths: folder {match!r} holds no files")
            found.update(dict.fromkeys(os.path.abspath(f) for f in files))
    return list(found)


def corpus_fingerprint(texts: datasets.Dataset | Iterable[str]) -> str:
    """A short content hash of the texts, in order: equal texts give equal fingerprints, wherever they came from."""
    digest = hashlib.sha256()
    for batch in text_batches(texts):
        for text in batch:
            data = text.encode("utf-8", "surrogatepass")
            # Length-prefixed, so no two different lists of texts hash the same bytes.
            digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()[:16]


def text_batches(texts: datasets.Dataset | Iterable[str]) -> Iterator[Iterable[str]]:
    """The texts in batches: the `text` column of a dataset, 1024 at a time, or a plain iterable as one batch."""
    if isinstance(texts, datasets.Dataset):
        return (batch["text"] for batch in texts.iter(batch_size=1024))
    return iter([texts])


def _demo_corpus(num_documents: int, seed: int, min_chars: int) -> datasets.Dataset:
    if num_documents < 1:
        raise ValueError(f"data.synthetic_documents: expected at least 1 document, got {num_documents}")
    from legalpt.data.demo import generate_documents, join_documents  # only the demo corpus needs the generator

    documents = generate_documents(num_documents, seed)
    records = [
        {
            "id": str(doc["id"]),
            "text": doc["text"],
            "source": doc["source"],
            "kind": doc["kind"],
            "meta": json.dumps(doc["meta"], default=str),
        }
        for doc in (join_documents(documents, min_chars) if min_chars else documents)
    ]
    return datasets.Dataset.from_list(records, features=FEATURES)


def _separate_skips(read: datasets.Dataset) -> tuple[datasets.Dataset, SkipReport]:
    reasons = read.data.column("skip").to_pylist()
    skipped = [i for i, reason in enumerate(reasons) if reason]
    report = SkipReport()
    for i, where in zip(skipped, read.select(skipped)["id"], strict=True):
        report.add(reasons[i], where)
    documents = read.select([i for i, reason in enumerate(reasons) if not reason]) if skipped else read
    return documents.remove_columns("skip"), report
