"""`flash_attn_with_kvcache`: new queries over a KV cache, with flash-attn 2.x's signature and semantics.

The new keys and values (if given) are written into the cache in place at `cache_seqlens`, then the queries of
batch entry b attend to keys [cache_leftpad[b], cache_seqlens[b] + Sk_new) of cache row cache_batch_idx[b]: one
document of the element rule (masks.py), so causal and the window are aligned bottom-right on those keys.

Computation: the chosen backend's varlen path, the same code as `flash_attn_varlen_func` (the reference's online
softmax on CPU; our kernels on a GPU), one document per batch entry. Where the entries use cache rows in increasing
order (no `cache_batch_idx`, or an increasing one) and the cache is contiguous, the kernels read it where it lies:
its rows are one key axis, each entry's visible slots a document with its queries, and the slots between them
(left padding, unused tails, rows no entry uses) documents without queries, whose keys nothing sees. Decoding (one
query per entry, no left window) over a cache kept head-major, as transformers keeps it, is read in place too: each
(entry, key head) is a document of one head whose queries are the query heads sharing that key head, so a kernel
tile reads the group's keys once. Otherwise the visible keys are gathered into a packed copy first.
docs/kernels.md ("Decode") says what a split-KV kernel will change; `num_splits` is accepted and has no effect until
then: the results do not depend on it. Rotary embeddings, a paged cache (`block_table`) and ALiBi raise instead of
being ignored. No backward, as in flash-attn.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

from legalpt.attention import api
from legalpt.attention.backends import AttentionBatch
from legalpt.attention.masks import MaskSpec

_LAYOUT = "(batch, seqlen, heads, head_dim)"


@dataclass(frozen=True)
class _Slots:
    """Where each batch entry's keys sit in the cache, checked and read on the host."""

    rows: list[int]  # cache row of each batch entry
    starts: list[int]  # first visible key slot (cache_leftpad)
    ends: list[int]  # first slot past the visible keys (cache_seqlens + Sk_new)
    appended_at: list[int]  # slot where the new keys go (cache_seqlens)

    @property
    def lengths(self) -> list[int]:
        return [end - start for start, end in zip(self.starts, self.ends, strict=True)]


def flash_attn_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Tensor | None = None,
    v: Tensor | None = None,
    rotary_cos: Tensor | None = None,
    rotary_sin: Tensor | None = None,
    cache_seqlens: int | Tensor | None = None,
    cache_batch_idx: Tensor | None = None,
    cache_leftpad: Tensor | None = None,
    block_table: Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Tensor | None = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    *,
    backend: str | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention of q over a KV cache, after appending k and v to it in place.

    q: (B, Sq, H, D); k_cache, v_cache: (B_cache, S_max, Hk, D) with H divisible by Hk; k, v: (B, Sk_new, Hk, D) or
    None, written at slots [cache_seqlens[b], cache_seqlens[b] + Sk_new) of row cache_batch_idx[b] (needs
    cache_seqlens). cache_seqlens: an int or int32 (B,), the keys already in each row (None: all S_max);
    cache_batch_idx: int32 (B,) cache row of each entry (None: row b, and B_cache == B); cache_leftpad: int32 (B,)
    first real slot of each row (None: 0). Returns out (B, Sq, H, D); with return_softmax_lse=True, (out,
    softmax_lse (B, H, Sq) float32). A query that sees no key gets output 0 and logsumexp -inf. backend overrides the
    default, as in `flash_attn_func`.
    """
    _check_tensors(q, k_cache, v_cache, k, v)
    _check_flags(rotary_cos, rotary_sin, block_table, rotary_interleaved, num_splits, return_softmax_lse, backend)
    slots = _read_slots(q, k_cache, k, cache_seqlens, cache_batch_idx, cache_leftpad)
    batch_size, seqlen_q = q.shape[:2]
    max_seqlen_k = max(slots.lengths, default=0)
    spec, scale = api._check_options(
        q, 0.0, softmax_scale, causal, window_size, softcap, alibi_slopes, False, False, 0, 1, None, (128, 128),
        seqlen_q, max_seqlen_k, batch_size,
    )  # fmt: skip
    grouped = _grouped_decode(q, k_cache, v_cache, slots, spec)
    with torch.no_grad():
        if grouped:
            batch = _grouped_batch(q, k_cache, v_cache, slots, spec, scale, softcap)
        elif _readable_in_place(k_cache, v_cache, slots):
            batch = _cache_batch(q, k_cache, v_cache, slots, spec, scale, softcap)
        else:
            batch = _packed_batch(q, k_cache, v_cache, k, v, slots, max_seqlen_k, spec, scale, softcap)
        chosen = api._resolve_backend(backend, return_softmax_lse, batch, "return_softmax_lse")
        if k is not None:  # after every check: a refused call leaves the cache as it was
            _append(k_cache, v_cache, k, v, slots)
        out, lse = chosen.attention(batch)
    out = out.view(q.shape)  # grouped: (B * H, 1, D) in (entry, head) order, as q's (B, 1, H, D)
    if not return_softmax_lse:
        return out
    if grouped:
        return out, lse.view(batch_size, q.shape[2], 1)  # (1, B * H) -> (B, H, 1)
    return out, lse.view(q.shape[2], batch_size, seqlen_q).transpose(0, 1).contiguous()  # (H, B*Sq) -> (B, H, Sq)


def _check_tensors(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Tensor | None, v: Tensor | None) -> None:
    """Types, ranks, dtypes, devices and shapes of q, the caches and the new keys and values."""
    api._check_rank(q, k_cache, v_cache, 4, _LAYOUT, ("q", "k_cache", "v_cache"))
    api._check_qkv(q, k_cache, v_cache, ("k_cache", "v_cache"))
    if k is None and v is None:
        return
    if k is None or v is None:
        missing, given = ("k", "v") if k is None else ("v", "k")
        raise ValueError(f"{missing}: expected a tensor when {given} is given (new keys come with values), got None")
    api._check_rank(q, k, v, 4, _LAYOUT)
    api._check_qkv(q, k, v)
    expected = (q.shape[0], k.shape[1], *k_cache.shape[2:])
    if tuple(k.shape) != expected:
        raise ValueError(
            f"k: expected shape (batch {q.shape[0]}, seqlen_new, kv_heads {k_cache.shape[2]}, head_dim "
            f"{k_cache.shape[3]}) like q and k_cache, got {tuple(k.shape)}"
        )


def _check_flags(
    rotary_cos: Tensor | None,
    rotary_sin: Tensor | None,
    block_table: Tensor | None,
    rotary_interleaved: bool,
    num_splits: int,
    return_softmax_lse: bool,
    backend: str | None,
) -> None:
    """What flash-attn offers and this function does not, the flags, and the backend's name."""
    for name, given in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if given is not None:
            raise ValueError(f"{name}: rotary embeddings are not supported, expected None (apply RoPE to q and k)")
    if block_table is not None:
        raise ValueError("block_table: a paged KV cache is not supported, expected None")
    for name, flag in (("rotary_interleaved", rotary_interleaved), ("return_softmax_lse", return_softmax_lse)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: expected a bool, got {type(flag).__name__}")
    if backend is not None:
        api._check_backend(backend, "backend")
    if not api._is_int(num_splits) or num_splits < 0:
        raise ValueError(f"num_splits: expected an int >= 0 (0 = heuristic), got {num_splits!r}")


def _read_slots(
    q: Tensor,
    k_cache: Tensor,
    k: Tensor | None,
    cache_seqlens: int | Tensor | None,
    cache_batch_idx: Tensor | None,
    cache_leftpad: Tensor | None,
) -> _Slots:
    """Check cache_seqlens, cache_batch_idx and cache_leftpad, their values included (a host sync when they are on a
    GPU: the gather needs the lengths on the host anyway), and where every entry's keys sit."""
    batch_size, (cache_rows, seqlen_cache) = q.shape[0], k_cache.shape[:2]
    new = 0 if k is None else k.shape[1]
    if cache_batch_idx is None:
        if cache_rows != batch_size:
            raise ValueError(
                f"k_cache: expected batch size {batch_size} (same as q) without cache_batch_idx, got {cache_rows}"
            )
        rows = list(range(batch_size))
    else:
        rows = _int32_values(cache_batch_idx, "cache_batch_idx", q)
        if any(not 0 <= r < cache_rows for r in rows):
            raise ValueError(f"cache_batch_idx: expected rows of k_cache in [0, {cache_rows}), got {rows}")
    if cache_seqlens is None:
        if k is not None:
            raise ValueError("cache_seqlens: expected the cache's lengths when k and v are given, got None")
        seqlens = [seqlen_cache] * batch_size
    elif isinstance(cache_seqlens, Tensor):
        seqlens = _int32_values(cache_seqlens, "cache_seqlens", q)
    elif api._is_int(cache_seqlens):
        seqlens = [int(cache_seqlens)] * batch_size
    else:
        raise TypeError(f"cache_seqlens: expected an int or a torch.Tensor, got {type(cache_seqlens).__name__}")
    if any(not 0 <= n <= seqlen_cache - new for n in seqlens):
        raise ValueError(
            f"cache_seqlens: expected values in [0, {seqlen_cache - new}] (k_cache holds {seqlen_cache} slots, "
            f"{new} new keys come), got {seqlens}"
        )
    starts = [0] * batch_size if cache_leftpad is None else _int32_values(cache_leftpad, "cache_leftpad", q)
    if any(not 0 <= s <= n for s, n in zip(starts, seqlens, strict=True)):
        raise ValueError(f"cache_leftpad: expected values in [0, cache_seqlens] ({seqlens}), got {starts}")
    return _Slots(rows, starts, [n + new for n in seqlens], seqlens)


def _int32_values(x: Tensor, name: str, q: Tensor) -> list[int]:
    """The values of an int32 (B,) tensor on q's device."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.int32:
        raise ValueError(f"{name}: expected dtype torch.int32, got {x.dtype}")
    if tuple(x.shape) != (q.shape[0],):
        raise ValueError(f"{name}: expected shape ({q.shape[0]},) (q's batch size), got {tuple(x.shape)}")
    if x.device != q.device:
        raise ValueError(f"{name}: expected device {q.device} (same as q), got {x.device}")
    return x.tolist()


def _append(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, slots: _Slots) -> None:
    """Write k, v (B, Sk_new, Hk, D) into the caches at slots [cache_seqlens, cache_seqlens + Sk_new) of each row."""
    device = k_cache.device
    rows = torch.tensor(slots.rows, device=device)[:, None]  # (B, 1)
    at = torch.tensor(slots.appended_at, device=device)[:, None] + torch.arange(k.shape[1], device=device)  # (B, Sn)
    k_cache[rows, at] = k
    v_cache[rows, at] = v


def _readable_in_place(k_cache: Tensor, v_cache: Tensor, slots: _Slots) -> bool:
    """Whether the entries' documents can lie in the cache itself: rows in increasing order, a contiguous cache."""
    increasing = all(a < b for a, b in itertools.pairwise(slots.rows))
    return increasing and k_cache.is_contiguous() and v_cache.is_contiguous()


def _grouped_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: _Slots, spec: MaskSpec) -> bool:
    """Whether `_grouped_batch` can run the call: one query per entry, so that it sees every visible key (causal or
    not; a left window would need each query's position), over a cache kept head-major ((B, Hk, S, D) in memory, as
    transformers keeps it) whose rows come in increasing order."""
    head_major = all(c.permute(0, 2, 1, 3).is_contiguous() for c in (k_cache, v_cache))
    increasing = all(a < b for a, b in itertools.pairwise(slots.rows))
    return q.shape[1] == 1 and spec.window[0] == -1 and head_major and increasing


def _grouped_batch(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: _Slots, spec: MaskSpec, scale: float, softcap: float
) -> AttentionBatch:
    """Decoding over a head-major cache read where it lies: each (entry, key head) is a document of one head, its
    keys that head's visible slots and its queries the query heads that share them (the GQA group), so one query
    tile reads a key head's keys once for the whole group. Slots between are documents without queries."""
    batch_size, heads = q.shape[0], q.shape[2]
    kv_heads, seqlen_cache = k_cache.shape[2], k_cache.shape[1]
    group = heads // kv_heads
    bounds_k, bounds_q = [0], [0]
    for row, start, end in zip(slots.rows, slots.starts, slots.ends, strict=True):
        for head in range(kv_heads):
            base = (row * kv_heads + head) * seqlen_cache
            _add_document(bounds_k, bounds_q, base + start, base + end, group)
    k_keys, v_keys = (c.permute(0, 2, 1, 3).reshape(-1, 1, c.shape[-1])[: bounds_k[-1]] for c in (k_cache, v_cache))
    queries = q.reshape(batch_size * heads, 1, q.shape[-1])  # (B * H, 1, D): entry, then key head, then its group
    no_positions = dataclasses.replace(spec, causal=False, window=(-1, -1))  # a lone last query sees every key
    return _documents(queries, k_keys, v_keys, bounds_q, bounds_k, group, no_positions, scale, softcap)


def _add_document(bounds_k: list[int], bounds_q: list[int], first: int, end: int, queries: int) -> None:
    """Append a document of keys [first, end) and `queries` queries, after one without queries for the keys
    between the last document and `first`."""
    if first > bounds_k[-1]:
        bounds_k.append(first)
        bounds_q.append(bounds_q[-1])
    bounds_k.append(end)
    bounds_q.append(bounds_q[-1] + queries)


def _documents(
    q: Tensor, k: Tensor, v: Tensor, bounds_q: list[int], bounds_k: list[int], max_seqlen_q: int, spec: MaskSpec,
    scale: float, softcap: float,
) -> AttentionBatch:  # fmt: skip
    """The varlen batch of documents with those query and key boundaries."""
    max_seqlen_k = max(b - a for a, b in itertools.pairwise(bounds_k))
    cu_seqlens_q, cu_seqlens_k = (torch.tensor(b, device=q.device, dtype=torch.int32) for b in (bounds_q, bounds_k))
    return AttentionBatch(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, spec, scale, softcap)


def _cache_batch(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: _Slots, spec: MaskSpec, scale: float, softcap: float
) -> AttentionBatch:
    """The cache's rows as one key axis: entry b's slots [cache_leftpad, cache_seqlens + Sk_new) of its row are a
    document with its Sq queries, every run of slots between two entries' a document without queries. The new keys
    are appended before the backend reads them (views: nothing is copied)."""
    batch_size, seqlen_q = q.shape[:2]
    seqlen_cache = k_cache.shape[1]
    bounds_k, bounds_q = [0], [0]
    for row, start, end in zip(slots.rows, slots.starts, slots.ends, strict=True):
        _add_document(bounds_k, bounds_q, row * seqlen_cache + start, row * seqlen_cache + end, seqlen_q)
    k_keys, v_keys = (cache.view(-1, *cache.shape[2:])[: bounds_k[-1]] for cache in (k_cache, v_cache))
    q_packed = q.reshape(batch_size * seqlen_q, *q.shape[2:])  # (B * Sq, H, D)
    return _documents(q_packed, k_keys, v_keys, bounds_q, bounds_k, seqlen_q, spec, scale, softcap)


def _packed_batch(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Tensor | None,
    v: Tensor | None,
    slots: _Slots,
    max_seqlen_k: int,
    spec: MaskSpec,
    scale: float,
    softcap: float,
) -> AttentionBatch:
    """One varlen document per batch entry: its Sq queries, and its cached keys followed by its new ones."""
    batch_size, seqlen_q = q.shape[:2]
    lengths = torch.tensor(slots.lengths)
    cu_seqlens_k = torch.nn.functional.pad(torch.cumsum(lengths, 0), (1, 0))
    q_packed = q.reshape(batch_size * seqlen_q, *q.shape[2:])  # (B * Sq, H, D)
    k_packed, v_packed = (_packed_keys(cache, new, slots, cu_seqlens_k) for cache, new in ((k_cache, k), (v_cache, v)))
    cu_seqlens_q = torch.arange(batch_size + 1, device=q.device, dtype=torch.int32) * seqlen_q
    cu_seqlens_k = cu_seqlens_k.to(q.device, torch.int32)
    return AttentionBatch(
        q_packed, k_packed, v_packed, cu_seqlens_q, cu_seqlens_k, seqlen_q, max_seqlen_k, spec, scale, softcap
    )


def _packed_keys(cache: Tensor, new: Tensor | None, slots: _Slots, cu_seqlens: Tensor) -> Tensor:
    """(T, Hk, D): entry b's slots [cache_leftpad, cache_seqlens) of its cache row, then its new keys, from
    cu_seqlens[b]. Read before the append, so a backend that refuses the batch leaves the cache untouched."""
    device, batch_size = cache.device, len(slots.rows)
    new_len = 0 if new is None else new.shape[1]
    cached = torch.tensor(slots.appended_at) - torch.tensor(slots.starts)  # (B,) cached keys per entry
    cached_first = torch.cumsum(cached, 0) - cached
    rank = torch.arange(int(cached.sum())) - torch.repeat_interleave(cached_first, cached)  # (Tc,) rank in entry
    rows = torch.repeat_interleave(torch.tensor(slots.rows), cached)
    cols = rank + torch.repeat_interleave(torch.tensor(slots.starts), cached)
    dest = rank + torch.repeat_interleave(cu_seqlens[:-1], cached)
    packed = cache.new_empty(int(cu_seqlens[-1]), *cache.shape[2:])
    packed[dest.to(device)] = cache[rows.to(device), cols.to(device)]
    if new is not None:
        new_dest = (cu_seqlens[:-1] + cached)[:, None] + torch.arange(new_len)  # (B, Sn)
        packed[new_dest.flatten().to(device)] = new.reshape(batch_size * new_len, *new.shape[2:])
    return packed
