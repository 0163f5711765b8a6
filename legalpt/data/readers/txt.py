"""Plain text files (.txt): one document per file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from legalpt.data.kinds import guess_kind
from legalpt.data.readers.decode import capped_lines, decode_text
from legalpt.data.readers.rows import document_row, skip_row


def read_txt(path: str, stream: BinaryIO, text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    lines = []
    for line in capped_lines(stream, max_line_bytes):
        if line is None:
            yield skip_row("line too long", path)
            return
        lines.append(line)
    text = decode_text(b"".join(lines))
    if text is None:
        yield skip_row("undecodable bytes", path)
        return
    yield document_row(text, doc_id=path, source=path, kind=guess_kind(text, Path(path).name), meta={}, where=path)
