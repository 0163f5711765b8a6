"""Readers: local files to rows (`rows.READ_FEATURES`), one module per format.

Formats, by extension: .txt (one document per file), .jsonl/.json (records with a text field), .csv and .parquet (a
text column), .html/.htm (markup to text, footnotes moved to the end), .pdf (the text of all pages) and .docx
(paragraphs and table cells, in order), each also compressed as .gz or .zst (`x.jsonl.gz`: decompressed by the outer
extension, read by the inner one). Caselaw Access Project case JSON is recognised by its structure wherever a record
is expected (`cap`). Text is UTF-8, else Windows-1252 when that decodes to printable text (`decode`).

Nothing is dropped silently: what cannot become a document (an empty, binary, undecodable, unreadable or corrupt
file, a line over `MAX_LINE_BYTES`, a record without its text field, ...) is a skip row that says why and where
(`rows.skip_row`), and reading goes on with the next record or file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import zstandard

from legalpt.data import kinds
from legalpt.data.readers.compressed import DECOMPRESSORS
from legalpt.data.readers.csv import read_csv
from legalpt.data.readers.decode import SAMPLE_BYTES, looks_binary
from legalpt.data.readers.docx import read_docx
from legalpt.data.readers.html import read_html
from legalpt.data.readers.json import read_json, read_jsonl
from legalpt.data.readers.parquet import read_parquet
from legalpt.data.readers.pdf import read_pdf
from legalpt.data.readers.rows import skip_row
from legalpt.data.readers.txt import read_txt

# A line longer than this in .txt/.jsonl/.csv is skipped ("line too long") without being held in memory: such a line
# is a broken export, not a document, and reading it would cost memory in proportion to its length.
MAX_LINE_BYTES = 32 * 2**20
_READERS = {  # inner extension -> reader
    ".txt": read_txt,
    ".json": read_json,
    ".jsonl": read_jsonl,
    ".csv": read_csv,
    ".parquet": read_parquet,
    ".html": read_html,
    ".htm": read_html,
    ".pdf": read_pdf,
    ".docx": read_docx,
}
_TEXT_SUFFIXES = {".txt", ".json", ".jsonl", ".csv", ".html", ".htm"}


def code_fingerprint() -> str:
    """A hash of the readers' code and of the kind guess: part of the cache key of every dataset built from read
    files, so that an edited reader reloads."""
    digest = hashlib.sha256()
    for path in [*sorted(Path(__file__).parent.glob("*.py")), Path(kinds.__file__)]:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def read_files(files: list[str], text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    """The records of every file in order (the generator behind the datasets built from local files)."""
    for path in files:
        yield from read_file(path, text_field, max_line_bytes)


def read_file(path: str, text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    """The rows of one file, by the reader of its (inner) extension; a file no reader can open is one skip row."""
    name = Path(path)
    compression = name.suffix.lower() if name.suffix.lower() in DECOMPRESSORS else None
    suffix = Path(name.stem).suffix.lower() if compression else name.suffix.lower()
    if suffix not in _READERS:
        yield skip_row("unknown extension", path)
        return
    try:
        raw = open(path, "rb")  # noqa: SIM115 - closed below, after the reader is done with it
    except OSError:
        yield skip_row("unreadable file", path)
        return
    with raw:
        try:
            stream = DECOMPRESSORS[compression](raw) if compression else raw
            if not stream.peek(1):
                yield skip_row("empty file", path)
            elif suffix in _TEXT_SUFFIXES and looks_binary(stream.peek(SAMPLE_BYTES)[:SAMPLE_BYTES]):
                yield skip_row("binary file", path)
            else:
                yield from _READERS[suffix](path, stream, text_field, max_line_bytes)
        except (OSError, EOFError, zstandard.ZstdError):  # a broken archive, or a disk error mid-read
            # The records read before the break are kept; the rest of the file is one counted skip.
            yield skip_row("corrupt compressed file" if compression else "unreadable file", path)
