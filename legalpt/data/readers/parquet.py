"""Parquet files: one record per row, read batch by batch."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from legalpt.data.readers.decode import read_whole
from legalpt.data.readers.records import from_record
from legalpt.data.readers.rows import skip_row


def read_parquet(path: str, stream: BinaryIO, text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    try:
        # A plain file is read batch by batch; a decompressed one needs random access, so it is held in memory.
        table = pq.ParquetFile(stream if isinstance(getattr(stream, "raw", None), io.FileIO) else read_whole(stream))
    except (pa.ArrowException, OSError):
        yield skip_row("unreadable parquet", path)
        return
    if text_field not in table.schema_arrow.names:
        yield skip_row("missing text field", path)
        return
    index = 0
    for batch in table.iter_batches(batch_size=1024):
        for record in batch.to_pylist():
            yield from_record(record, f"{path}:{index}", path, text_field)
            index += 1
