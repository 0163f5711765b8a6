"""Argument checks shared by the citation tasks: documents, tokenizers, integers, saved records and scores."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from typing import Any

from transformers import PreTrainedTokenizerBase


def check_documents(documents: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    if isinstance(documents, (str, Mapping)) or not isinstance(documents, Iterable):
        raise TypeError(f"documents: expected records with 'id' and 'text', got {type(documents).__name__}")
    documents = list(documents)
    for i, doc in enumerate(documents):
        if not isinstance(doc, Mapping) or not isinstance(doc.get("text"), str) or doc.get("id") is None:
            raise ValueError(f"documents[{i}]: expected a record with an 'id' and a str 'text'")
    return documents


def check_tokenizer(tokenizer: PreTrainedTokenizerBase) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError(
            f"tokenizer: expected a fast (tokenizers-backed) tokenizer, which reports character offsets, "
            f"got {type(tokenizer).__name__}"
        )


def check_int(name: str, value: int, minimum: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")


def fields_of(cls: type, record: Mapping[str, Any], name: str) -> dict[str, Any]:
    expected = {f.name for f in fields(cls)}
    if not isinstance(record, Mapping) or set(record) != expected:
        got = sorted(record) if isinstance(record, Mapping) else type(record).__name__
        raise ValueError(f"{name}: expected the fields {sorted(expected)} of {cls.__name__}, got {got}")
    return dict(record)


def check_scored(
    items: Sequence[Any], scores: Sequence[Mapping[str, Any]], item_type: type, metrics: Sequence[str]
) -> tuple[list[Any], list[Mapping[str, Any]]]:
    items, scores = list(items), list(scores)
    if len(items) != len(scores):
        raise ValueError(f"scores: expected one per item ({len(items)}), got {len(scores)}")
    for i, (item, score) in enumerate(zip(items, scores, strict=True)):
        if not isinstance(item, item_type):
            raise TypeError(f"items[{i}]: expected a {item_type.__name__}, got {type(item).__name__}")
        if not isinstance(score, Mapping) or any(m not in score for m in metrics):
            raise ValueError(f"scores[{i}]: expected a mapping with the keys {list(metrics)}")
    return items, scores
