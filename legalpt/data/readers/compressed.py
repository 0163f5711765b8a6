"""Compressed files: `x.jsonl.gz` or `x.jsonl.zst` is decompressed as a stream and read by the reader of its inner
extension."""

from __future__ import annotations

import gzip
import io
from typing import BinaryIO

import zstandard

from legalpt.data.readers.decode import SAMPLE_BYTES


def _gunzip(raw: BinaryIO) -> io.BufferedReader:
    return io.BufferedReader(gzip.GzipFile(fileobj=raw, mode="rb"), buffer_size=SAMPLE_BYTES)


def _unzstd(raw: BinaryIO) -> io.BufferedReader:
    return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw), buffer_size=SAMPLE_BYTES)


DECOMPRESSORS = {".gz": _gunzip, ".zst": _unzstd}
