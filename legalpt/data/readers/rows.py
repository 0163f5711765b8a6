"""The rows every reader yields: a document `{id, text, source, kind, meta}` or a skip saying why a file or record
could not become one, in one Arrow schema (`READ_FEATURES`, where `skip` is "" for a document); and `SkipReport`,
which counts the skips by reason."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import datasets

FEATURES = datasets.Features({name: datasets.Value("string") for name in ("id", "text", "source", "kind", "meta")})
# What the readers could not turn into a document travels in the same Arrow table as a row with a non-empty `skip`
# reason, so that a load served from the datasets cache still reports every skip.
READ_FEATURES = datasets.Features({**FEATURES, "skip": datasets.Value("string")})


@dataclass
class SkipReport:
    """What was not loaded: how many of each reason, and the first few places (path, or path:record) of each."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    max_examples = 3  # places kept per reason

    def add(self, reason: str, where: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < self.max_examples:
            shown.append(where)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __str__(self) -> str:
        if not self.counts:
            return "nothing skipped"
        parts = (f"{n} {reason} (e.g. {', '.join(self.examples[reason])})" for reason, n in sorted(self.counts.items()))
        return "; ".join(parts)


def document_row(text: str, doc_id: str, source: str, kind: str, meta: dict, where: str) -> dict[str, str]:
    """The row of a document; or a skip row at `where` when the text is empty or cannot be stored as UTF-8 text."""
    if not text.strip():
        return skip_row("empty text", where)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from JSON escapes: not storable as UTF-8
        return skip_row("undecodable bytes", where)
    if "\x00" in text:  # NUL bytes past the sample checked at the start of the file
        return skip_row("binary file", where)
    meta_json = json.dumps(meta, default=str)
    return {"id": doc_id, "text": text, "source": source, "kind": kind, "meta": meta_json, "skip": ""}


def skip_row(reason: str, where: str) -> dict[str, str]:
    """The row of a skip: `reason` says why, `where` (path, or path:record) says what, and becomes the row's id."""
    return {"id": where, "text": "", "source": where, "kind": "", "meta": "{}", "skip": reason}
