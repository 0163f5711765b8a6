"""Caches keyed by tensors' identity and version: what the layers of one step compute from the same tensors
(cu_seqlens, a layout, a padding mask), computed once.

A tensor enters a key by its id, its version counter (which in-place edits advance) and its shape; weak references
guard against a freed tensor's id coming back. An inference tensor has no version counter, so nothing computed from
it is kept. An edit made through `.data` or numpy does not advance the version: pass a new tensor after one.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import torch
from torch import Tensor

T = TypeVar("T")


def version(t: Tensor) -> int | None:
    """A tensor's version counter; None for an inference tensor, which has none."""
    return None if t.is_inference() else t._version


class TensorCache(Generic[T]):
    """The last `size` values computed from (tensors, extra key), least recently used dropped first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[tuple, tuple[list[weakref.ref], T]] = OrderedDict()

    def get(self, tensors: Sequence[Tensor], extra: tuple, make: Callable[[], T]) -> T:
        """The value cached for these tensors as they are now and `extra`, or `make()`'s, kept. While torch.compile
        traces, `make()`'s alone: the tensors are the tracer's, and reading their versions would break the graph."""
        if torch.compiler.is_compiling():
            return make()
        versions = [version(t) for t in tensors]
        if None in versions:
            return make()
        key = (extra, *((id(t), v, tuple(t.shape)) for t, v in zip(tensors, versions, strict=True)))
        hit = self._entries.get(key)
        if hit is not None and all(ref() is t for ref, t in zip(hit[0], tensors, strict=True)):
            self._entries.move_to_end(key)
            return hit[1]
        value = make()
        self._entries[key] = ([weakref.ref(t) for t in tensors], value)
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return value
