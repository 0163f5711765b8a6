"""JSON files: .json (an object or a list of objects; JSON Lines named .json are read as such) and .jsonl (one
record per line, so that one bad line costs one record and big files stream)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import BinaryIO

from legalpt.data.readers.decode import capped_lines, decode_text
from legalpt.data.readers.records import from_record
from legalpt.data.readers.rows import skip_row


def read_json(path: str, stream: BinaryIO, text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    # A JSON value has no line structure to stream by, so the file is read whole; its size is the document's.
    data = stream.read()
    content = decode_text(data)
    if content is None:
        yield skip_row("undecodable bytes", path)
        return
    try:
        value = json.loads(content)
    except json.JSONDecodeError as error:
        if error.msg == "Extra data":  # a first value, then more: JSON Lines named .json
            yield from read_jsonl(path, io.BytesIO(data), text_field, max_line_bytes)
        else:
            yield skip_row("invalid json", path)
        return
    if isinstance(value, list):
        for index, record in enumerate(value):
            yield from_record(record, f"{path}:{index}", path, text_field)
    else:
        yield from_record(value, path, path, text_field)


def read_jsonl(path: str, stream: BinaryIO, text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    # Line by line, so one bad line costs one record and big files stream.
    for number, raw in enumerate(capped_lines(stream, max_line_bytes), start=1):
        where = f"{path}:{number}"
        line = decode_text(raw) if raw is not None else None
        if raw is None:
            yield skip_row("line too long", where)
        elif line is None:
            yield skip_row("undecodable bytes", where)
        elif line.strip():  # a blank line holds no record
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                yield skip_row("invalid json", where)
                continue
            yield from_record(record, where, path, text_field)
