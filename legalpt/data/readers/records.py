"""Records as documents: a JSON object, a CSV row or a Parquet row becomes a document through its text field (its
`id` and `kind` fields when present, every other field as metadata); a Caselaw Access Project case is recognised by
its structure and read as one (`cap`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from legalpt.data.kinds import guess_kind
from legalpt.data.readers.cap import from_cap_case, is_cap_case
from legalpt.data.readers.rows import document_row, skip_row


def from_record(record: Any, where: str, path: str, text_field: str) -> dict[str, str]:
    """The row of record `where` of file `path`: a document, or a skip row saying why not."""
    if not isinstance(record, dict):
        return skip_row("record not an object", where)
    if is_cap_case(record):
        return from_cap_case(record, where, path)
    if text_field not in record:
        return skip_row("missing text field", where)
    text = record[text_field]
    if text is None:
        return skip_row("empty text", where)
    if not isinstance(text, str):
        return skip_row("text not a string", where)
    doc_id = str(record["id"]) if record.get("id") is not None else where
    kind = record.get("kind")
    if not isinstance(kind, str) or not kind:
        kind = guess_kind(text, Path(path).name)
    meta = {key: value for key, value in record.items() if key not in (text_field, "id", "kind")}
    return document_row(text, doc_id=doc_id, source=path, kind=kind, meta=meta, where=where)
