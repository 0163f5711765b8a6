"""Weighted mixture of document streams: a deterministic interleaving whose proportions hold over every prefix.

Weights are shares of *characters*, not of documents: a court opinion runs to tens of thousands of characters and a
web page to a few thousand, so 5% of documents from a replay source would be well under 1% of what the model reads.
Characters are known when documents are mixed, before any tokenizer exists (the tokenizer may be trained on the
mixed corpus), and for one tokenizer they stand for tokens up to a per-source constant.

The rule: the next document comes from the stream furthest below its share, the one with the least
`characters taken / weight` (ties to the first). By induction, after T characters every stream has taken between
`w·T − (k−1)·L` and `w·T + L` of them (k streams, normalized weight w, L the longest document taken), so each
share stays within `(k−1)·L / T` of its weight on every prefix, and the order depends on the lengths alone.
The mixture ends when the stream whose turn it is runs out: going on without it would break the proportions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


def normalize_weights(weights: Sequence[float], names: Sequence[str] | None = None) -> list[float]:
    """The weights scaled to sum to 1; each must be a finite number above 0."""
    names = names or [str(i) for i in range(len(weights))]
    if not weights:
        raise ValueError("weights: expected at least one weight, got none")
    for name, weight in zip(names, weights, strict=True):
        if not (isinstance(weight, int | float) and math.isfinite(weight) and weight > 0):
            raise ValueError(f"weight of source {name!r}: expected a finite number above 0, got {weight!r}")
    total = sum(weights)
    return [weight / total for weight in weights]


def interleave(
    streams: Sequence[Iterable[T]], weights: Sequence[float], size: Callable[[T], int]
) -> Iterator[tuple[int, T]]:
    """(stream index, item) pairs from `streams`, each stream's share of the summed `size` following its weight.

    Items of size 0 (skip records, say) are passed through as they come and do not count. Streams are read lazily,
    one item ahead at most, so an endless stream (a streaming hub dataset) costs only what the mixture takes.
    """
    weights = normalize_weights(weights)
    if len(streams) != len(weights):
        raise ValueError(f"weights: expected one per stream ({len(streams)}), got {len(weights)}")
    iterators = [iter(stream) for stream in streams]
    taken = [0] * len(iterators)  # characters taken from each stream
    while True:
        index = min(range(len(iterators)), key=lambda i: (taken[i] / weights[i], i))
        for item in iterators[index]:
            yield index, item
            if counted := size(item):
                taken[index] += counted
                break
        else:
            return
