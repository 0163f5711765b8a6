"""Document sources: files, folders and globs of legal text, datasets read through `datasets.load_dataset` (hub or
local, streamed or not), or the built-in demo corpus, as one `datasets.Dataset`.

Every document becomes a record `{id, text, source, kind, meta}`: `source` is the file it came from (the source's
name for a dataset, "synthetic" for the demo corpus), `kind` is one of `KINDS` (a source's configured kind, else
`guess_kind`), and `meta` is a JSON string (Arrow needs one schema, and every format carries different metadata).
File formats: .txt (one document per file), .jsonl/.json (records with a text field), .csv and .parquet (a text
column), .html/.htm (markup to text, footnotes moved to the end: see `html_text`), .pdf (the text of all pages) and
.docx (paragraphs and table cells, in order), each also compressed as .gz or .zst (`x.jsonl.gz`: decompressed by the
outer extension, read by the inner one). Caselaw Access Project case JSON is recognised by its structure wherever a
record is expected: one document per case, its head matter followed by each opinion. Text is UTF-8, else
Windows-1252 when that decodes to printable text. Dataset records become documents through their source's field
mapping (`SourceConfig`: text, id and meta fields); several sources are interleaved by weight
(`legalpt.data.mixture`).

Nothing is dropped silently: what cannot become a document (an empty, binary, undecodable, unreadable or corrupt
file, a line over `MAX_LINE_BYTES`, a record without its text field, a record the mixture had no room for, ...) is
counted by reason, with example locations, in a `SkipReport`, and loading goes on with the next record or file.
"""

from __future__ import annotations

import csv
import glob
import gzip
import hashlib
import io
import itertools
import json
import os
import re
import zipfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import datasets
import docx
import lxml.html
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pypdf
import zstandard
from docx.opc.exceptions import PackageNotFoundError
from lxml import etree

from legalpt.config import DataConfig, SourceConfig
from legalpt.data import mixture
from legalpt.data.mixture import interleave, normalize_weights

FEATURES = datasets.Features({name: datasets.Value("string") for name in ("id", "text", "source", "kind", "meta")})
# What the readers could not turn into a document travels in the same Arrow table as a row with a non-empty `skip`
# reason, so that a load served from the datasets cache still reports every skip.
_READ_FEATURES = datasets.Features({**FEATURES, "skip": datasets.Value("string")})
_GLOB_CHARS = re.compile(r"[*?\[]")
# A line longer than this in .txt/.jsonl/.csv is skipped ("line too long") without being held in memory: such a line
# is a broken export, not a document, and reading it would cost memory in proportion to its length.
MAX_LINE_BYTES = 32 * 2**20
FILES = "files"  # the name of the source that data.paths makes
_MISSING = object()  # a field absent from a record (None is a present, empty value)


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


def count_characters(documents: datasets.Dataset) -> int:
    """Characters of the `text` column, counted by Arrow without materialising the texts."""
    return pc.sum(pc.utf8_length(documents.with_format("arrow")["text"])).as_py() or 0


def load_documents(cfg: DataConfig) -> tuple[datasets.Dataset, SkipReport]:
    """The documents of `cfg.paths` and `cfg.sources`, mixed by weight (`legalpt.data.mixture`), or the demo corpus
    when both are empty; and what was skipped on the way."""
    sources = data_sources(cfg)
    if not sources:
        return _demo_corpus(cfg.synthetic_documents, cfg.seed), SkipReport()
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
    ).hexdigest()
    read = datasets.Dataset.from_generator(
        mixed_rows,
        features=_READ_FEATURES,
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
    """The files `paths` name, read into a cached dataset with the `_READ_FEATURES` columns (skips as rows)."""
    files = find_files(paths)
    stamps = [(path, os.stat(path).st_size, os.stat(path).st_mtime_ns) for path in files]
    # The cache key covers every file's identity and this module's code, so an edited file or reader reloads.
    key = hashlib.sha256(
        json.dumps([stamps, text_field, MAX_LINE_BYTES]).encode() + Path(__file__).read_bytes()
    ).hexdigest()
    return datasets.Dataset.from_generator(
        read_files,
        features=_READ_FEATURES,
        cache_dir=str(Path(cfg.cache_dir).expanduser() / "documents"),
        gen_kwargs={"files": files, "text_field": text_field, "max_line_bytes": MAX_LINE_BYTES},
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
                yield row if row["skip"] else _skip("beyond mixture share", row["id"])


def _source_rows(
    name: str, source: SourceConfig, data: datasets.Dataset | datasets.IterableDataset
) -> Iterator[dict[str, str]]:
    """One source's rows (`_READ_FEATURES`), at most `max_documents` documents; skip rows pass through."""
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
        return _skip("missing text field", where)
    if isinstance(text, list):  # a dotted path through a list: the parts of one document, in order
        if not all(part is None or isinstance(part, str) for part in text):
            return _skip("text not a string", where)
        text = "\n\n".join(part for part in text if part and part.strip())
    if text is None:
        return _skip("empty text", where)
    if not isinstance(text, str):
        return _skip("text not a string", where)
    if source.distinct_field:
        value = json.dumps(_lookup(record, source.distinct_field), default=str)
        if value in seen:
            return _skip("repeated record", where)
        seen.add(value)
    doc_id = _lookup(record, source.id_field) if source.id_field else None
    doc_id = where if doc_id is _MISSING or doc_id is None else str(doc_id)
    meta = {field: record[field] for field in source.meta_fields if field in record}
    kind = source.kind or guess_kind(text)
    return _document(text, doc_id=doc_id, source=name, kind=kind, meta=meta, where=where)


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


def _demo_corpus(num_documents: int, seed: int) -> datasets.Dataset:
    if num_documents < 1:
        raise ValueError(f"data.synthetic_documents: expected at least 1 document, got {num_documents}")
    from legalpt.data.demo import generate_documents  # only the demo corpus needs the generator

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


def read_files(files: list[str], text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    """The records of every file in order (the generator behind the datasets built from local files)."""
    for path in files:
        yield from _read_file(path, text_field, max_line_bytes)


def _read_file(path: str, text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    name = Path(path)
    compression = name.suffix.lower() if name.suffix.lower() in _DECOMPRESSORS else None
    suffix = Path(name.stem).suffix.lower() if compression else name.suffix.lower()
    if suffix not in _READERS:
        yield _skip("unknown extension", path)
        return
    try:
        raw = open(path, "rb")  # noqa: SIM115 - closed below, after the reader is done with it
    except OSError:
        yield _skip("unreadable file", path)
        return
    with raw:
        try:
            stream = _DECOMPRESSORS[compression](raw) if compression else raw
            if not stream.peek(1):
                yield _skip("empty file", path)
            elif suffix in _TEXT_SUFFIXES and _looks_binary(stream.peek(_SAMPLE_BYTES)[:_SAMPLE_BYTES]):
                yield _skip("binary file", path)
            else:
                yield from _READERS[suffix](path, stream, text_field, max_line_bytes)
        except (OSError, EOFError, zstandard.ZstdError):  # a broken archive, or a disk error mid-read
            # The records read before the break are kept; the rest of the file is one counted skip.
            yield _skip("corrupt compressed file" if compression else "unreadable file", path)


def _gunzip(raw: BinaryIO) -> io.BufferedReader:
    return io.BufferedReader(gzip.GzipFile(fileobj=raw, mode="rb"), buffer_size=_SAMPLE_BYTES)


def _unzstd(raw: BinaryIO) -> io.BufferedReader:
    return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw), buffer_size=_SAMPLE_BYTES)


def _read_txt(path: str, stream: BinaryIO, text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    lines = []
    for line in _lines(stream, max_line_bytes):
        if line is None:
            yield _skip("line too long", path)
            return
        lines.append(line)
    text = _decode(b"".join(lines))
    if text is None:
        yield _skip("undecodable bytes", path)
        return
    yield _document(text, doc_id=path, source=path, kind=guess_kind(text, Path(path).name), meta={}, where=path)


def _read_json(path: str, stream: BinaryIO, text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    # A JSON value has no line structure to stream by, so the file is read whole; its size is the document's.
    data = stream.read()
    content = _decode(data)
    if content is None:
        yield _skip("undecodable bytes", path)
        return
    try:
        value = json.loads(content)
    except json.JSONDecodeError as error:
        if error.msg == "Extra data":  # a first value, then more: JSON Lines named .json
            yield from _read_jsonl(path, io.BytesIO(data), text_field, max_line_bytes)
        else:
            yield _skip("invalid json", path)
        return
    if isinstance(value, list):
        for index, record in enumerate(value):
            yield _from_record(record, f"{path}:{index}", path, text_field)
    else:
        yield _from_record(value, path, path, text_field)


def _read_jsonl(path: str, stream: BinaryIO, text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    # Line by line, so one bad line costs one record and big files stream.
    for number, raw in enumerate(_lines(stream, max_line_bytes), start=1):
        where = f"{path}:{number}"
        line = _decode(raw) if raw is not None else None
        if raw is None:
            yield _skip("line too long", where)
        elif line is None:
            yield _skip("undecodable bytes", where)
        elif line.strip():  # a blank line holds no record
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                yield _skip("invalid json", where)
                continue
            yield _from_record(record, where, path, text_field)


def _read_csv(path: str, stream: BinaryIO, text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    # Legal texts overflow the csv module's 128 KiB default field limit; the line cap bounds memory instead.
    csv.field_size_limit(_MAX_CSV_FIELD)
    skipped: list[dict[str, str]] = []  # bad lines found while the csv reader pulls text, reported after each row
    last = 0  # the file line the csv reader has read up to: where its current row ends

    def text_lines() -> Iterator[str]:
        nonlocal last
        for last, raw in enumerate(_lines(stream, max_line_bytes), start=1):
            line = _decode(raw) if raw is not None else None
            if line is None:
                skipped.append(_skip("line too long" if raw is None else "undecodable bytes", f"{path}:{last}"))
            else:
                yield line

    rows = csv.DictReader(text_lines())
    try:
        if text_field not in (rows.fieldnames or []):
            yield from skipped
            yield _skip("missing text field", path)
            return
        for row in rows:
            yield from skipped
            skipped.clear()
            record = {key: value for key, value in row.items() if key is not None}  # None holds surplus cells
            yield _from_record(record, f"{path}:{last}", path, text_field)
    except csv.Error:
        yield _skip("invalid csv", f"{path}:{last}")
    yield from skipped


def _read_parquet(path: str, stream: BinaryIO, text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    try:
        # A plain file is read batch by batch; a decompressed one needs random access, so it is held in memory.
        table = pq.ParquetFile(stream if isinstance(getattr(stream, "raw", None), io.FileIO) else _whole(stream))
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


def _read_html(path: str, stream: BinaryIO, text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    content = _decode(stream.read())
    if content is None:
        yield _skip("undecodable bytes", path)
        return
    try:
        # Bytes, so that lxml accepts an XML encoding declaration; the text is already known to be UTF-8 clean.
        root = lxml.html.document_fromstring(content.encode("utf-8"), parser=_HTML_PARSER)
    except (etree.ParserError, ValueError):
        yield _skip("invalid html", path)
        return
    title = root.findtext(".//title")
    text = html_text(root)
    meta = {"title": title.strip()} if title and title.strip() else {}
    yield _document(text, doc_id=path, source=path, kind=guess_kind(text, Path(path).name), meta=meta, where=path)


def _read_pdf(path: str, stream: BinaryIO, text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    data = _whole(stream)  # outside the try: a broken archive is not a broken PDF
    try:
        reader = pypdf.PdfReader(data)
        if reader.is_encrypted and not reader.decrypt(""):  # many PDFs are encrypted with an empty user password
            raise pypdf.errors.FileNotDecryptedError("password required")
        # Pages are separated by a form feed on its own line, so that cleaning can find page headers and footers.
        text = "\n\f\n".join(page.extract_text() for page in reader.pages)
    except Exception:  # pypdf raises many exception types on malformed files; each is one bad PDF
        yield _skip("unreadable pdf", path)
        return
    if not text.replace("\f", "").strip():
        yield _skip("pdf without text", path)  # a scan without a text layer: OCR is out of scope
        return
    meta = {"pages": len(reader.pages)}
    yield _document(text, doc_id=path, source=path, kind=guess_kind(text, Path(path).name), meta=meta, where=path)


def _read_docx(path: str, stream: BinaryIO, text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    data = _whole(stream)
    try:
        document = docx.Document(data)
        blocks = [_docx_block(block) for block in document.iter_inner_content()]
    except (zipfile.BadZipFile, KeyError, ValueError, PackageNotFoundError, etree.XMLSyntaxError):
        yield _skip("unreadable docx", path)
        return
    text = "\n".join(blocks)
    title = document.core_properties.title
    meta = {"title": title} if title else {}
    yield _document(text, doc_id=path, source=path, kind=guess_kind(text, Path(path).name), meta=meta, where=path)


def _docx_block(block: docx.text.paragraph.Paragraph | docx.table.Table) -> str:
    """A paragraph's text, or a table as one line per row with its cells separated by tabs."""
    if isinstance(block, docx.text.paragraph.Paragraph):
        return block.text
    rows = []
    for row in block.rows:
        cells = list(dict.fromkeys(row.cells))  # a merged cell appears once per grid column it spans
        rows.append("\t".join(cell.text for cell in cells))
    return "\n".join(rows)


def html_text(root: lxml.html.HtmlElement) -> str:
    """The readable text of an HTML document: scripts, styles and comments dropped, blocks on their own lines.

    Footnote bodies (block elements whose class or id contains "footnote") are moved to the end, in document order,
    after a blank line, so that a footnote printed inline does not split the sentence around it; footnote markers
    (inline elements such as `<sup class="footnotemark">`) stay in place.
    """
    for element in root.xpath("//script | //style | //noscript | //template | //head | //comment()"):
        element.drop_tree()  # keeps the tail text
    footnotes = [element for element in root.iter() if _is_footnote(element)]
    outermost = [element for element in footnotes if not any(_is_footnote(a) for a in element.iterancestors())]
    notes = [_block_text(element) for element in outermost]
    for element in outermost:
        element.drop_tree()
    return "\n\n".join(part for part in [_block_text(root), *notes] if part)


def _is_footnote(element: etree._Element) -> bool:
    if not isinstance(element.tag, str) or element.tag not in _BLOCK_TAGS:
        return False
    names = f"{element.get('class', '')} {element.get('id', '')}".lower()
    return "footnote" in names


def _block_text(element: etree._Element) -> str:
    """Text of an element: whitespace runs collapsed outside <pre>, a line break around each block element."""
    parts: list[str] = []
    in_pre = 0
    for event, node in etree.iterwalk(element, events=("start", "end")):
        if not isinstance(node.tag, str):  # a processing instruction or entity left by the parser
            continue
        tag = node.tag.lower()
        if event == "start":
            in_pre += tag == "pre"
            parts.append(_BLOCK_TAGS.get(tag, ""))
            parts.append(_inline(node.text, in_pre))
        else:
            in_pre -= tag == "pre"
            parts.append(_BLOCK_TAGS.get(tag, "") + _AFTER_TAGS.get(tag, ""))
            if node is not element:
                parts.append(_inline(node.tail, in_pre))
    text = _BREAK_RUN.sub(_break, "".join(parts))
    return "\n".join(line.strip(" \t") for line in text.split("\n")).strip("\n")


def _break(run: re.Match) -> str:
    """One separator for a run of block edges and whitespace: adjacent blocks share their breaks, not add them."""
    return "\n\n" if _PARAGRAPH in run[0] or run[0].count("\n") > 1 else "\n"


def _inline(text: str | None, in_pre: int) -> str:
    if not text:
        return ""
    text = text.translate(_NO_MARKS)
    return text if in_pre else _HTML_SPACE.sub(" ", text)


def _lines(stream: BinaryIO, max_line_bytes: int) -> Iterator[bytes | None]:
    """The lines of a stream, with None for each line over `max_line_bytes`, which is passed over without holding it."""
    while line := stream.readline(max_line_bytes + 1):
        if len(line) > max_line_bytes and not line.endswith(b"\n"):
            while (rest := stream.readline(_SAMPLE_BYTES)) and not rest.endswith(b"\n"):
                pass
            yield None
        else:
            yield line


def _whole(stream: BinaryIO) -> io.BytesIO:
    return io.BytesIO(stream.read())


def _looks_binary(sample: bytes) -> bool:
    """NUL bytes, or more than 5% control bytes other than whitespace, mark a file that is not text."""
    if b"\x00" in sample:
        return True
    controls = sum(sample.count(bytes([c])) for c in _CONTROL_BYTES)
    return controls > 0.05 * len(sample)


def _decode(data: bytes) -> str | None:
    """UTF-8 (with or without BOM), else Windows-1252 when that gives printable text, else None."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    try:
        text = data.decode("cp1252")
    except UnicodeDecodeError:  # cp1252 leaves five bytes undefined
        return None
    printable = sum(c.isprintable() or c in "\t\n\r\f" for c in text)
    return text if printable >= 0.95 * len(text) else None


_DECOMPRESSORS = {".gz": _gunzip, ".zst": _unzstd}
_READERS = {
    ".txt": _read_txt,
    ".json": _read_json,
    ".jsonl": _read_jsonl,
    ".csv": _read_csv,
    ".parquet": _read_parquet,
    ".html": _read_html,
    ".htm": _read_html,
    ".pdf": _read_pdf,
    ".docx": _read_docx,
}
_TEXT_SUFFIXES = {".txt", ".json", ".jsonl", ".csv", ".html", ".htm"}
_SAMPLE_BYTES = 1 << 16  # bytes looked at to tell text from binary; also the read size when passing a long line
_MAX_CSV_FIELD = 2**31 - 1  # the largest value csv.field_size_limit accepts on every platform
_CONTROL_BYTES = bytes(c for c in range(32) if chr(c) not in "\t\n\r\f\b\x1b") + b"\x7f"
_HTML_SPACE = re.compile(r"\s+")
_HTML_PARSER = lxml.html.HTMLParser(encoding="utf-8", remove_comments=True, remove_pis=True)
_AFTER_TAGS = {"br": "\n", "td": "\t", "th": "\t"}  # elements that only end with a separator
# Block elements mark their edges with a control character (removed from the page's own text, where it is junk);
# each run of marks becomes one line break, or a paragraph break when a paragraph-like block is among them.
_LINE, _PARAGRAPH = "\x01", "\x02"
_NO_MARKS = str.maketrans("", "", _LINE + _PARAGRAPH)
_BLOCK_TAGS = {
    **dict.fromkeys(["p", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "pre", "table", "ul", "ol"], _PARAGRAPH),
    **dict.fromkeys(["section", "article", "aside", "footer", "header", "center", "dl", "hr", "address"], _PARAGRAPH),
    **dict.fromkeys(["div", "li", "tr", "dd", "dt", "caption", "figure", "figcaption", "main", "nav"], _LINE),
}
_BREAK_RUN = re.compile(r"[\x01\x02\s]*[\x01\x02][\x01\x02\s]*")


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
        kind = guess_kind(text, Path(path).name)
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
    if "\x00" in text:  # NUL bytes past the sample checked at the start of the file
        return _skip("binary file", where)
    meta_json = json.dumps(meta, default=str)
    return {"id": doc_id, "text": text, "source": source, "kind": kind, "meta": meta_json, "skip": ""}


def _skip(reason: str, where: str) -> dict[str, str]:
    return {"id": where, "text": "", "source": where, "kind": "", "meta": "{}", "skip": reason}


def guess_kind(text: str, name: str = "") -> str:
    """ "contract", "opinion", "statute" or "other": the kind whose typical phrases weigh most in the text's first
    `_KIND_CHARS` characters (and in the file `name`), when that weight is clear; else "other".

    Each cue counts at most `_CUE_CAP` times, so one phrase repeated down a page cannot outvote the rest; a kind wins
    with at least `_KIND_MIN_SCORE` and `_KIND_MARGIN` times the runner-up. Opinions cite statutes and contracts
    quote courts, hence the margin.
    """
    head = text[:_KIND_CHARS]
    scores = {kind: _KIND_NAME_SCORE * bool(pattern.search(name)) for kind, pattern in _KIND_NAMES.items()}
    for kind, cues in _KIND_CUES.items():
        scores[kind] += sum(weight * _count(cue, head) for cue, weight in cues)
    best, runner_up = sorted(scores, key=scores.get, reverse=True)[:2]
    if scores[best] >= _KIND_MIN_SCORE and scores[best] >= _KIND_MARGIN * scores[runner_up]:
        return best
    return "other"


def _count(cue: re.Pattern, text: str) -> int:
    """Matches of `cue` in `text`, up to `_CUE_CAP` (the scan stops there)."""
    return sum(1 for _ in itertools.islice(cue.finditer(text), _CUE_CAP))


KINDS = ("contract", "opinion", "statute", "other")
_KIND_CHARS = 6_000
_CUE_CAP = 3
_KIND_MIN_SCORE = 6
_KIND_MARGIN = 1.5
_KIND_NAME_SCORE = 4
_M = re.MULTILINE
_KIND_NAMES = {
    "contract": re.compile(r"agreement|contract|lease|licen[cs]e|amendment", re.IGNORECASE),
    "opinion": re.compile(r"opinion|\bv\.? ", re.IGNORECASE),
    "statute": re.compile(r"statute|u\.?s\.?c|code|regulation|\bact\b", re.IGNORECASE),
}
# (pattern, weight): phrases that mark each kind; case matters where the capitalised form is the signal.
_KIND_CUES: dict[str, list[tuple[re.Pattern, float]]] = {
    "contract": [
        (re.compile(r"\b[A-Z ]*AGREEMENT\b"), 2),
        (re.compile(r"\bWHEREAS\b"), 3),
        (re.compile(r"\bNOW,? THEREFORE\b", re.IGNORECASE), 3),
        (re.compile(r"IN WITNESS WHEREOF", re.IGNORECASE), 3),
        (re.compile(r"\b(this|the) Agreement\b"), 2),
        (re.compile(r"\b(agreement|contract)\b", re.IGNORECASE), 1),
        (re.compile(r"\b(agreement|contract) (is )?(made |entered into )?(by and )?between\b", re.IGNORECASE), 3),
        (re.compile(r"\b(hereby )?agrees? (to|that)\b|\bParty [A-Z]\b"), 1),
        (re.compile(r"\bhereinafter\b", re.IGNORECASE), 1),
        (re.compile(r"\b(hereto|hereunder|hereof|hereby)\b"), 1),
        (re.compile(r"\bthe [Pp]arties\b"), 1),
        (re.compile(r"\((the |this )?[\"\u201c][A-Z][\w .-]*[\"\u201d]\)"), 2),  # defined terms: (the "Licensee")
        (re.compile(r"\bEffective Date\b"), 2),
        (re.compile(r"\b(Licensee|Licensor|Lessee|Lessor|Distributor|Supplier|Buyer|Seller|Customer|Vendor)\b"), 1),
        (re.compile(r"\b(terminat|indemnif|warrant)\w*", re.IGNORECASE), 1),
        (re.compile(r"^\s*(By|Name|Title):", _M), 2),  # signature blocks
    ],
    "opinion": [
        (re.compile(r"(^|\s)v\.(\s|$)", _M), 3),  # the caption: Smith v. Jones
        (re.compile(r"\bOPINION\b"), 2),
        (re.compile(r"\bPER CURIAM\b", re.IGNORECASE), 3),
        (re.compile(r"delivered the opinion", re.IGNORECASE), 3),
        (re.compile(r"\b(Chief Justice|Justice|Judge|Circuit Judge)\b|, (C\. )?J\.[,:\s]"), 1),
        (re.compile(r"\b(affirm|revers|remand|vacat)(ed|e|es)\b", re.IGNORECASE), 1),
        (re.compile(r"\b(Appellants?|Appellees?|Petitioners?|Respondents?|Plaintiffs?|Defendants?)\b"), 1),
        (re.compile(r"\b[Ww]e (hold|conclude|affirm|reverse|agree|disagree|decline)\b"), 2),
        (re.compile(r"\b(Court of Appeals|Supreme Court|District Court|Circuit)\b", re.IGNORECASE), 1),
        (
            re.compile(
                r"\b\d+ (U\.S\.|S\. ?Ct\.|L\. ?Ed\.|F\.( ?Supp\.)?|N\.[EW]\.|S\.[EW]\.|So\.|P\.)( ?[234]d| ?4th)? \d+"
            ),
            1,
        ),
        (re.compile(r"\b(dissent|concurr|certiorari)\w*", re.IGNORECASE), 1),
    ],
    "statute": [
        (re.compile(r"\u00a7"), 1),
        (re.compile(r"\b(U\.S\.C\.|C\.F\.R\.|Stat\.)"), 1),
        (re.compile(r"\bBe it enacted\b", re.IGNORECASE), 4),
        (re.compile(r"\b(Pub\. ?L\.|Public Law)\b"), 2),
        (re.compile(r"\b(enacted|amended|repealed)\b"), 1),
        (re.compile(r"^\s*(\u00a7+ ?\d|Sec(tion|\.) \d)", _M), 2),  # section headings at line starts
        (re.compile(r"\bthis (title|chapter|subchapter|part|Act|Code)\b"), 2),
        (re.compile(r"\b(subsection|subparagraph|paragraph|clause) \(\w+\)"), 2),
        (re.compile(r"^\s*(CHAPTER|TITLE|PART|SUBCHAPTER) [\dIVXLC]+\b", _M), 2),
    ],
}
