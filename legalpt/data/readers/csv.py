"""CSV files: one record per row, with a header naming the text column; fields may hold commas, quotes and line
breaks, and may be longer than the csv module's default limit."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from typing import BinaryIO

from legalpt.data.readers.decode import capped_lines, decode_text
from legalpt.data.readers.records import from_record
from legalpt.data.readers.rows import skip_row

_MAX_CSV_FIELD = 2**31 - 1  # the largest value csv.field_size_limit accepts on every platform


def read_csv(path: str, stream: BinaryIO, text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    # Legal texts overflow the csv module's 128 KiB default field limit; the line cap bounds memory instead.
    csv.field_size_limit(_MAX_CSV_FIELD)
    skipped: list[dict[str, str]] = []  # bad lines found while the csv reader pulls text, reported after each row
    last = 0  # the file line the csv reader has read up to: where its current row ends

    def text_lines() -> Iterator[str]:
        nonlocal last
        for last, raw in enumerate(capped_lines(stream, max_line_bytes), start=1):
            line = decode_text(raw) if raw is not None else None
            if line is None:
                skipped.append(skip_row("line too long" if raw is None else "undecodable bytes", f"{path}:{last}"))
            else:
                yield line

    rows = csv.DictReader(text_lines())
    try:
        if text_field not in (rows.fieldnames or []):
            yield from skipped
            yield skip_row("missing text field", path)
            return
        for row in rows:
            yield from skipped
            skipped.clear()
            record = {key: value for key, value in row.items() if key is not None}  # None holds surplus cells
            yield from_record(record, f"{path}:{last}", path, text_field)
    except csv.Error:
        yield skip_row("invalid csv", f"{path}:{last}")
    yield from skipped
