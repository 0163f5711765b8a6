"""Word files (.docx): paragraphs and table cells in document order, one document per file, its title as metadata."""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import docx
from docx.opc.exceptions import PackageNotFoundError
from lxml import etree

from legalpt.data.kinds import guess_kind
from legalpt.data.readers.decode import read_whole
from legalpt.data.readers.rows import document_row, skip_row


def read_docx(path: str, stream: BinaryIO, text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    data = read_whole(stream)
    try:
        document = docx.Document(data)
        blocks = [_docx_block(block) for block in document.iter_inner_content()]
    except (zipfile.BadZipFile, KeyError, ValueError, PackageNotFoundError, etree.XMLSyntaxError):
        yield skip_row("unreadable docx", path)
        return
    text = "\n".join(blocks)
    title = document.core_properties.title
    meta = {"title": title} if title else {}
    yield document_row(text, doc_id=path, source=path, kind=guess_kind(text, Path(path).name), meta=meta, where=path)


def _docx_block(block: docx.text.paragraph.Paragraph | docx.table.Table) -> str:
    """A paragraph's text, or a table as one line per row with its cells separated by tabs."""
    if isinstance(block, docx.text.paragraph.Paragraph):
        return block.text
    rows = []
    for row in block.rows:
        cells = list(dict.fromkeys(row.cells))  # a merged cell appears once per grid column it spans
        rows.append("\t".join(cell.text for cell in cells))
    return "\n".join(rows)
