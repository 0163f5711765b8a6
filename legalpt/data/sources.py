"""Document sources: files, folders and globs of legal text, or the built-in demo corpus, as one `datasets.Dataset`.

Every document becomes a record `{id, text, source, kind, meta}`: `source` is the file it came from ("synthetic" for
the demo corpus), `kind` is "contract", "opinion" or "other", and `meta` is a JSON string (Arrow needs one schema,
and every format carries different metadata). Formats: .txt (one document per file), .jsonl/.json (records with a
text field), .parquet (a text column), and Caselaw Access Project case JSON, recognised by its structure wherever a
record is expected: one document per case, its head matter followed by each opinion.

Nothing is dropped silently: what cannot become a document is counted by reason, with example locations, in a
`SkipReport`.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq

from legalpt.config import DataConfig

FEATURES = datasets.Features({name: datasets.Value("string") for name in ("id", "text", "source", "kind", "meta")})
# What the readers could not turn into a document travels in the same Arrow table as a row with a non-empty `skip`
# reason, so that a load served from the datasets cache still reports every skip.
_READ_FEATURES = datasets.Features({**FEATURES, "skip": datasets.Value("string")})
_GLOB_CHARS = re.compile(r"[*?\[]")
_CONTRACT_WORDS = re.compile(r"\b(agreement|contract|lease|licen[cs]e|amendment|exhibit)\b", re.IGNORECASE)
_OPINION_WORDS = re.compile(r"\b(court|opinion|appellants?|appellees?|petitioners?|respondents?|j\.)\b", re.IGNORECASE)


@dataclass
class SkipReport:
    """What was not loaded: how many of each reason, and the first few places (path, or path:record) of each."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    max_examples = 3  # places kept per reason

    def add(self, reason: str, where: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < self.max_examples:
            shown.append(where)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __str__(self) -> str:
        if not self.counts:
            return "nothing skipped"
        parts = (f"{n} {reason} (e.g. {', '.join(self.examples[reason])})" for reason, n in sorted(self.counts.items()))
        return "; ".join(parts)


def load_documents(cfg: DataConfig) -> tuple[datasets.Dataset, SkipReport]:
    """The documents of `cfg.paths` (or the demo corpus when it is empty), and what was skipped on the way."""
    if not cfg.paths:
        return _demo_corpus(cfg.synthetic_documents, cfg.seed), SkipReport()
    files = find_files(cfg.paths)
    stamps = [(path, os.stat(path).st_size, os.stat(path).st_mtime_ns) for path in files]
    # The cache key covers every file's identity and this module's code, so an edited file or reader reloads.
    key = hashlib.sha256(json.dumps([stamps, cfg.text_field]).encode() + Path(__file__).read_bytes()).hexdigest()
    read = datasets.Dataset.from_generator(
        _read_files,
        features=_READ_FEATURES,
        cache_dir=str(Path(cfg.cache_dir).expanduser() / "documents"),
        gen_kwargs={"files": files, "text_field": cfg.text_field},
        num_proc=min(cfg.num_proc, len(files)) if cfg.num_proc > 1 else None,
        fingerprint=key[:32],
    )
    return _separate_skips(read)


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


def _demo_corpus(num_documents: int, seed: int) -> datasets.Dataset:
    if num_documents < 1:
        raise ValueError(f"data.synthetic_documents: expected at least 1 document, got {num_documents}")
    from legalpt.data.synthetic import generate_documents  # only the demo corpus needs the generator

    records = [
        {
            "id": str(doc["id"]),
            "text": doc["text"],
            "source": doc["source"],
            "kind": doc["kind"],
            "meta": json.dumps(doc["meta"], default=str),
        }
        for doc in generate_documents(num_documents, seed)
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


def _read_files(files: list[str], text_field: str) -> Iterator[dict[str, str]]:
    for path in files:
        yield from _read_file(path, text_field)


def _read_file(path: str, text_field: str) -> Iterator[dict[str, str]]:
    suffix = Path(path).suffix.lower()
    if suffix not in _READERS:
        yield _skip("unknown extension", path)
    elif os.path.getsize(path) == 0:
        yield _skip("empty file", path)
    else:
        yield from _READERS[suffix](path, text_field)


def _read_txt(path: str, text_field: str) -> Iterator[dict[str, str]]:
    try:
        text = Path(path).read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError:
        yield _skip("undecodable bytes", path)
        return
    yield _document(text, doc_id=path, source=path, kind=_guess_kind(Path(path).name, text), meta={}, where=path)


def _read_json(path: str, text_field: str) -> Iterator[dict[str, str]]:
    try:
        content = Path(path).read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError:
        yield _skip("undecodable bytes", path)
        return
    try:
        value = json.loads(content)
    except json.JSONDecodeError as error:
        if error.msg == "Extra data":  # a first value, then more: JSON Lines named .json
            yield from _read_jsonl(path, text_field)
        else:
            yield _skip("invalid json", path)
        return
    if isinstance(value, list):
        for index, record in enumerate(value):
            yield _from_record(record, f"{path}:{index}", path, text_field)
    else:
        yield _from_record(value, path, path, text_field)


def _read_jsonl(path: str, text_field: str) -> Iterator[dict[str, str]]:
    with open(path, "rb") as lines:  # line by line, so one bad line costs one record and big files stream
        for number, raw in enumerate(lines, start=1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8-sig")
            except UnicodeDecodeError:
                yield _skip("undecodable bytes", where)
                continue
            if not line.strip():
                continue  # a blank line holds no record
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                yield _skip("invalid json", where)
                continue
            yield _from_record(record, where, path, text_field)


def _read_parquet(path: str, text_field: str) -> Iterator[dict[str, str]]:
    try:
        table = pq.ParquetFile(path)
    except (pa.ArrowException, OSError):
        yield _skip("unreadable parquet", path)
        return
    if text_field not in table.schema_arrow.names:
        yield _skip("missing text field", path)
        return
    index = 0
    for batch in table.iter_batches(batch_size=1024):
        for record in batch.to_pylist():
            yield _from_record(record, f"{path}:{index}", path, text_field)
            index += 1


_READERS = {".txt": _read_txt, ".json": _read_json, ".jsonl": _read_jsonl, ".parquet": _read_parquet}


def _from_record(record: Any, where: str, path: str, text_field: str) -> dict[str, str]:
    if not isinstance(record, dict):
        return _skip("record not an object", where)
    if _is_cap_case(record):
        return _from_cap_case(record, where, path)
    if text_field not in record:
        return _skip("missing text field", where)
    text = record[text_field]
    if text is None:
        return _skip("empty text", where)
    if not isinstance(text, str):
        return _skip("text not a string", where)
    doc_id = str(record["id"]) if record.get("id") is not None else where
    kind = record.get("kind")
    if not isinstance(kind, str) or not kind:
        kind = _guess_kind(Path(path).name, text)
    meta = {key: value for key, value in record.items() if key not in (text_field, "id", "kind")}
    return _document(text, doc_id=doc_id, source=path, kind=kind, meta=meta, where=where)


def _is_cap_case(record: dict) -> bool:
    casebody = record.get("casebody")
    data = casebody.get("data") if isinstance(casebody, dict) else None
    return isinstance(data, dict) and isinstance(data.get("opinions"), list)


def _from_cap_case(case: dict, where: str, path: str) -> dict[str, str]:
    data = case["casebody"]["data"]
    opinions = [op for op in data["opinions"] if isinstance(op, dict) and isinstance(op.get("text"), str)]
    head = data.get("head_matter") if isinstance(data.get("head_matter"), str) else ""
    text = "\n\n".join(part for part in [head, *(op["text"] for op in opinions)] if part.strip())
    court = case.get("court")
    meta = {
        "name": case.get("name_abbreviation") or case.get("name"),
        "decision_date": case.get("decision_date"),
        "court": court.get("name") if isinstance(court, dict) else court,
        "citations": [c.get("cite") for c in case.get("citations") or [] if isinstance(c, dict)],
        "opinion_types": [op.get("type") for op in opinions],
    }
    doc_id = str(case["id"]) if case.get("id") is not None else where
    return _document(text, doc_id=doc_id, source=path, kind="opinion", meta=meta, where=where)


def _document(text: str, doc_id: str, source: str, kind: str, meta: dict, where: str) -> dict[str, str]:
    if not text.strip():
        return _skip("empty text", where)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from JSON escapes: not storable as UTF-8
        return _skip("undecodable bytes", where)
    meta_json = json.dumps(meta, default=str)
    return {"id": doc_id, "text": text, "source": source, "kind": kind, "meta": meta_json, "skip": ""}


def _skip(reason: str, where: str) -> dict[str, str]:
    return {"id": where, "text": "", "source": where, "kind": "", "meta": "{}", "skip": reason}


def _guess_kind(name: str, text: str) -> str:
    head = f"{name}\n{text[:2000]}"
    contract, opinion = len(_CONTRACT_WORDS.findall(head)), len(_OPINION_WORDS.findall(head))
    if contract == opinion:
        return "other"
    return "contract" if contract > opinion else "opinion"
