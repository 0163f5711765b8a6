"""Bytes to text for the readers: lines read under a length cap, binary files told from text, and decoding (UTF-8,
else Windows-1252 when that gives printable text)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import BinaryIO

SAMPLE_BYTES = 1 << 16  # bytes looked at to tell text from binary; also the read size when passing a long line
_CONTROL_BYTES = bytes(c for c in range(32) if chr(c) not in "\t\n\r\f\b\x1b") + b"\x7f"


def capped_lines(stream: BinaryIO, max_line_bytes: int) -> Iterator[bytes | None]:
    """The lines of a stream, with None for each line over `max_line_bytes`, which is passed over without holding it."""
    while line := stream.readline(max_line_bytes + 1):
        if len(line) > max_line_bytes and not line.endswith(b"\n"):
            while (rest := stream.readline(SAMPLE_BYTES)) and not rest.endswith(b"\n"):
                pass
            yield None
        else:
            yield line


def read_whole(stream: BinaryIO) -> io.BytesIO:
    return io.BytesIO(stream.read())


def looks_binary(sample: bytes) -> bool:
    """NUL bytes, or more than 5% control bytes other than whitespace, mark a file that is not text."""
    if b"\x00" in sample:
        return True
    controls = sum(sample.count(bytes([c])) for c in _CONTROL_BYTES)
    return controls > 0.05 * len(sample)


def decode_text(data: bytes) -> str | None:
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
