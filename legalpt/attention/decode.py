"""A KV cache read where it lies, as varlen documents, and decoding steps over transformers' head-major cache.

`flash_attn_with_kvcache` (kvcache.py) hands our varlen kernels a cache without copying it: the cache's memory is one
key axis, each batch entry's visible slots a document with its queries, and the slots between two entries' (left
padding, unused tails and rows) a document without queries, whose keys no query sees and no kernel visits
(`readable_in_place`, `cache_batch`).

A decoding step (one query per entry, so that it sees every visible key: causal or not, and no left window) over a
cache kept head-major ((B, Hk, S, D) in memory, as transformers keeps it) is cut another way (`GroupedDecode`): each
(entry, key head) is a one-head document whose queries are the query heads that share the key head (its GQA group),
so a kernel tile reads those keys once for the whole group (`can_group`). With few entries, a document's keys are
split over several documents (split-KV: flash-attn's `num_splits`, 0 = enough to fill the GPU), each with its own
copy of the group's queries, and the parts are merged by their logsumexp.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from legalpt.attention.backends import AttentionBatch
from legalpt.attention.masks import MaskSpec

if TYPE_CHECKING:
    from legalpt.attention.kvcache import Slots

BLOCKS_PER_SM = 2  # split-KV heuristic: documents enough for this many blocks per SM ...
MIN_SPLIT_KEYS = 512  # ... while every part keeps this many keys (a part is a kernel's key loop, then a merge)


def add_document(bounds_k: list[int], bounds_q: list[int], first: int, end: int, queries: int) -> None:
    """Append a document of keys [first, end) and `queries` queries, after one without queries for the keys
    between the last document and `first`."""
    if first > bounds_k[-1]:
        bounds_k.append(first)
        bounds_q.append(bounds_q[-1])
    bounds_k.append(end)
    bounds_q.append(bounds_q[-1] + queries)


def documents(
    q: Tensor, k: Tensor, v: Tensor, bounds_q: list[int] | tuple[int, ...], bounds_k: list[int] | tuple[int, ...],
    max_seqlen_q: int, max_seqlen_k: int, spec: MaskSpec, scale: float, softcap: float,
) -> AttentionBatch:  # fmt: skip
    """The varlen batch of documents with those query and key boundaries."""
    cu_seqlens_q, cu_seqlens_k = (on_device(tuple(b), q.device) for b in (bounds_q, bounds_k))
    return AttentionBatch(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, spec, scale, softcap)


def readable_in_place(k_cache: Tensor, v_cache: Tensor, rows: list[int]) -> bool:
    """Whether the entries' documents can lie in the cache itself: rows in increasing order, a contiguous cache."""
    increasing = all(a < b for a, b in itertools.pairwise(rows))
    return increasing and k_cache.is_contiguous() and v_cache.is_contiguous()


def cache_batch(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Slots, spec: MaskSpec, scale: float, softcap: float
) -> AttentionBatch:
    """The cache's rows as one key axis: entry b's slots [cache_leftpad, cache_seqlens + Sk_new) of its row are a
    document with its Sq queries, every run of slots between two entries' a document without queries. The new keys
    are appended before the backend reads them (views: nothing is copied)."""
    batch_size, seqlen_q = q.shape[:2]
    seqlen_cache = k_cache.shape[1]
    bounds_k, bounds_q = [0], [0]
    for row, start, end in zip(slots.rows, slots.starts, slots.ends, strict=True):
        add_document(bounds_k, bounds_q, row * seqlen_cache + start, row * seqlen_cache + end, seqlen_q)
    k_keys, v_keys = (cache.view(-1, *cache.shape[2:])[: bounds_k[-1]] for cache in (k_cache, v_cache))
    q_packed = q.reshape(batch_size * seqlen_q, *q.shape[2:])  # (B * Sq, H, D)
    return documents(q_packed, k_keys, v_keys, bounds_q, bounds_k, seqlen_q, _longest(bounds_k), spec, scale, softcap)


def can_group(q: Tensor, k_cache: Tensor, v_cache: Tensor, rows: list[int], spec: MaskSpec) -> bool:
    """Whether `GroupedDecode` can run the call: one query per entry, no left window, a head-major cache, and the
    entries' cache rows in increasing order."""
    head_major = all(c.permute(0, 2, 1, 3).is_contiguous() for c in (k_cache, v_cache))
    increasing = all(a < b for a, b in itertools.pairwise(rows))
    return q.shape[1] == 1 and spec.window[0] == -1 and head_major and increasing


@dataclass(frozen=True)
class GroupedDecode:
    """A decoding step as documents of (entry, key head, part), planned once for every layer of the step (`batch`
    gives a layer's inputs as views of its cache), and the merge of the parts."""

    cu_seqlens_q: Tensor
    cu_seqlens_k: Tensor
    keys: int  # slots read, from the start of the head-major cache's (entry, key head) rows
    max_seqlen_k: int
    parts: int  # split-KV parts of each (entry, key head)
    heads: int  # query heads
    kv_heads: int
    spec: MaskSpec  # without positions: a lone last query sees every key of its document
    scale: float
    softcap: float

    @classmethod
    def plan(
        cls, q: Tensor, k_cache: Tensor, slots: Slots, spec: MaskSpec, scale: float, softcap: float, num_splits: int
    ) -> GroupedDecode:
        """q (B, 1, H, D) over the caches' visible slots (`slots`, new keys included: appended before the run)."""
        batch_size, heads = q.shape[0], q.shape[2]
        kv_heads, seqlen_cache = k_cache.shape[2], k_cache.shape[1]
        group = heads // kv_heads
        parts = num_splits or split_heuristic(q.device, batch_size * kv_heads, max(slots.lengths, default=0))
        key = (tuple(slots.rows), tuple(slots.starts), tuple(slots.ends), kv_heads, seqlen_cache, parts, group)
        bounds_q, bounds_k, max_seqlen_k = _grouped_bounds(*key)
        cu_seqlens_q, cu_seqlens_k = (on_device(b, q.device) for b in (bounds_q, bounds_k))
        no_positions = dataclasses.replace(spec, causal=False, window=(-1, -1))
        return cls(cu_seqlens_q, cu_seqlens_k, bounds_k[-1], max_seqlen_k, parts, heads, kv_heads, no_positions, scale,
                   softcap)  # fmt: skip

    def batch(self, q: Tensor, k_cache: Tensor, v_cache: Tensor) -> AttentionBatch:
        """The varlen batch of one layer: q (B, 1, H, D) over its caches (B, S, Hk, D), head-major in memory."""
        group, head_dim = self.heads // self.kv_heads, q.shape[-1]
        # (keys, 1, D): the head-major cache's rows of (entry, key head) as one view, made in one op: at small
        # batches a decoding step costs its layers' host time
        k_keys, v_keys = (c.as_strided((self.keys, 1, head_dim), (head_dim, head_dim, 1)) for c in (k_cache, v_cache))
        queries = q.reshape(-1, 1, head_dim)  # (B * H, 1, D): entry, key head, then the group's query heads
        if self.parts > 1:  # (B * Hk * parts * group, 1, D): each part with a copy of its group's queries
            queries = queries.view(-1, self.kv_heads, 1, group, head_dim).expand(-1, -1, self.parts, -1, -1)
            queries = queries.reshape(-1, 1, head_dim)
        return AttentionBatch(queries, k_keys, v_keys, self.cu_seqlens_q, self.cu_seqlens_k, group, self.max_seqlen_k,
                              self.spec, self.scale, self.softcap)  # fmt: skip

    def merge(self, out: Tensor, lse: Tensor) -> tuple[Tensor, Tensor]:
        """The backend's (B * Hk * parts * group, 1, D) outputs and (1, same) logsumexps as (B, 1, H, D) and
        (B, H, 1): the parts merged by their logsumexp (a part that saw no key weighs nothing)."""
        group, head_dim = self.heads // self.kv_heads, out.shape[-1]
        if self.parts == 1:  # nothing to merge; a backend without a logsumexp runs only this
            return out.view(-1, 1, self.heads, head_dim), None if lse is None else lse.view(-1, self.heads, 1)
        out = out.view(-1, self.kv_heads, self.parts, group, head_dim)  # (B, Hk, parts, group, D)
        lse = lse.view(-1, self.kv_heads, self.parts, group)  # (B, Hk, parts, group)
        merged = torch.logsumexp(lse, dim=2, keepdim=True)  # -inf where no part saw a key
        weights = torch.where(torch.isfinite(merged), (lse - merged).exp(), 0.0)  # (B, Hk, parts, group)
        combined = (out.float() * weights[..., None]).sum(2).to(out.dtype)  # (B, Hk, group, D)
        return combined.reshape(-1, 1, self.heads, head_dim), merged.reshape(-1, self.heads, 1)


@functools.lru_cache(maxsize=4)
def _grouped_bounds(
    rows: tuple[int, ...], starts: tuple[int, ...], ends: tuple[int, ...], kv_heads: int, seqlen_cache: int,
    parts: int, group: int,
) -> tuple[tuple[int, ...], tuple[int, ...], int]:  # fmt: skip
    """(query, key) boundaries of the documents of (entry, key head, part) over a head-major cache, and their longest
    key run; cached, as every layer of a decoding step asks for the same."""
    bounds_k, bounds_q = [0], [0]
    for row, start, end in zip(rows, starts, ends, strict=True):
        step = -(-(end - start) // parts)  # keys per part; the last parts of a short entry may hold none
        for head in range(kv_heads):
            base = (row * kv_heads + head) * seqlen_cache
            for part in range(parts):
                first = min(start + part * step, end)
                add_document(bounds_k, bounds_q, base + first, base + min(first + step, end), group)
    return tuple(bounds_q), tuple(bounds_k), _longest(bounds_k)


@functools.lru_cache(maxsize=8)
def on_device(bounds: tuple[int, ...], device: torch.device) -> Tensor:
    """Host integers (document boundaries, cache rows and slots) as int32 on `device`, copied once for all the layers
    of a step that ask for them; on a GPU from pinned memory, so that the copy does not make the host wait for the
    kernels queued before it. Callers only read the tensor: it is shared."""
    host = torch.tensor(bounds, dtype=torch.int32)
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host.to(device)


def _longest(bounds: list[int] | tuple[int, ...]) -> int:
    """The longest run between consecutive boundaries."""
    return max(b - a for a, b in itertools.pairwise(bounds))


def split_heuristic(device: torch.device, documents: int, longest: int) -> int:
    """Parts per (entry, key head) when num_splits is 0: on a GPU, enough documents for BLOCKS_PER_SM blocks on
    every SM, each part at least MIN_SPLIT_KEYS keys; elsewhere 1."""
    if device.type != "cuda" or documents == 0:
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    wanted = -(-BLOCKS_PER_SM * sms // documents)
    return max(1, min(wanted, longest // MIN_SPLIT_KEYS))
