"""PDF files: the text of all pages, one document per file; a PDF without a text layer (a scan) is skipped, since
OCR is out of scope."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pypdf

from legalpt.data.kinds import guess_kind
from legalpt.data.readers.decode import read_whole
from legalpt.data.readers.rows import document_row, skip_row


def read_pdf(path: str, stream: BinaryIO, text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    data = read_whole(stream)  # outside the try: a broken archive is not a broken PDF
    try:
        reader = pypdf.PdfReader(data)
        if reader.is_encrypted and not reader.decrypt(""):  # many PDFs are encrypted with an empty user password
            raise pypdf.errors.FileNotDecryptedError("password required")
        # Pages are separated by a form feed on its own line, so that cleaning can find page headers and footers.
        text = "\n\f\n".join(page.extract_text() for page in reader.pages)
    except Exception:  # pypdf raises many exception types on malformed files; each is one bad PDF
        yield skip_row("unreadable pdf", path)
        return
    if not text.replace("\f", "").strip():
        yield skip_row("pdf without text", path)  # a scan without a text layer: OCR is out of scope
        return
    meta = {"pages": len(reader.pages)}
    yield document_row(text, doc_id=path, source=path, kind=guess_kind(text, Path(path).name), meta=meta, where=path)
