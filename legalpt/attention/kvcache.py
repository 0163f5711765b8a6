"""`flash_attn_with_kvcache`: new queries over a KV cache, with flash-attn 2.x's signature and semantics.

The new keys and values (if given) are written into the cache in place at `cache_seqlens`, then the queries of
batch entry b attend to keys [cache_leftpad[b], cache_seqlens[b] + Sk_new) of cache row cache_batch_idx[b]: one
document of the element rule (masks.py), so causal and the window are aligned bottom-right on those keys.

Computation: the chosen backend's varlen path, the same code as `flash_attn_varlen_func` (the reference's online
softmax on CPU; our kernels on a GPU), one document per batch entry, the cache read where it lies when its layout
allows (decode.py: flash-attn's layout with rows in order; transformers' head-major layout when decoding, each GQA
group in one query tile and the keys split in `num_splits` parts) and gathered into a packed copy otherwise. The
results do not depend on `num_splits` beyond rounding. The checks and that plan are worked out once for the layers of
a decoding step, which pass arguments alike (`_Call`): a layer's host work is then views of its cache and a launch.
Rotary embeddings, a paged cache (`block_table`) and ALiBi raise instead of being ignored. No backward, as in
flash-attn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from legalpt.attention import api, decode
from legalpt.attention.backends import AttentionBatch, Backend
from legalpt.attention.masks import MaskSpec
from legalpt.attention.ops import KernelBackend
from legalpt.attention.tensor_cache import TensorCache

_LAYOUT = "(batch, seqlen, heads, head_dim)"


@dataclass(frozen=True)
class Slots:
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
    given = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
             block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved, alibi_slopes, num_splits,
             return_softmax_lse, backend)  # fmt: skip
    call = _Call.cached(given, positions=(cache_seqlens, cache_batch_idx, cache_leftpad))
    batch_size, seqlen_q = q.shape[:2]
    with torch.no_grad():
        if call.grouped:
            batch = call.grouped.batch(q, k_cache, v_cache)
        elif decode.readable_in_place(k_cache, v_cache, call.slots.rows):
            batch = decode.cache_batch(q, k_cache, v_cache, call.slots, call.spec, call.scale, softcap)
        else:
            batch = _packed_batch(q, k_cache, v_cache, k, v, call.slots, call.spec, call.scale, softcap)
        chosen, run = call.backend(backend, batch)
        grouped = call.grouped
        if grouped and grouped.parts > 1 and not chosen.returns_lse:  # parts merge by their logsumexp: keep one
            grouped = decode.GroupedDecode.plan(q, k_cache, call.slots, call.spec, call.scale, softcap, num_splits=1)
            batch, run = grouped.batch(q, k_cache, v_cache), chosen.attention  # not laid out like the plan's
        if k is not None:  # after every check: a refused call leaves the cache as it was
            _append(k_cache, v_cache, k, v, call.slots)
        out, lse = run(batch)
        if grouped:
            out, lse = grouped.merge(out, lse)
    out = out.view(q.shape)
    if not return_softmax_lse:
        return out
    if grouped:
        return out, lse
    return out, lse.view(q.shape[2], batch_size, seqlen_q).transpose(0, 1).contiguous()  # (H, B*Sq) -> (B, H, Sq)


@dataclass(frozen=True)
class _Call:
    """What a call's arguments decide, checked: where each entry's keys sit, the mask, the softmax scale, and the
    plan of a decoding step over a head-major cache (else None). The layers of a step pass arguments alike (shapes,
    dtypes, options, the same cache_seqlens, cache_batch_idx and cache_leftpad tensors), so it is worked out once per
    step (per kind of layer, where layers differ in an option such as the window). The backends its calls run on are
    kept too, filled on first use (`backend`): the one mutable part of it."""

    slots: Slots
    spec: MaskSpec
    scale: float
    grouped: decode.GroupedDecode | None
    return_lse: bool
    backends: dict[str, tuple[Backend, Callable]] = field(default_factory=dict)  # `backend`'s, by name asked for

    @classmethod
    def cached(cls, args: tuple, positions: tuple) -> _Call:
        """`_Call.check(*args)`, kept for calls whose tensors have the same shapes, strides, dtypes and devices,
        whose cache_seqlens, cache_batch_idx and cache_leftpad are the same tensors (unchanged: tensor_cache.py),
        and whose other arguments are equal, of the same types. (The backend's name is read per call: `backend`.)
        `positions`: cache_seqlens, cache_batch_idx and cache_leftpad, out of `args`."""
        tensors = [x for x in positions if isinstance(x, Tensor)]
        key = tuple(_signature(x) for x in args)
        try:
            hash(key)
        except TypeError:  # an argument of a type no call accepts: the checks say which
            return cls.check(*args)
        return _calls.get(tensors, key, lambda: cls.check(*args))

    @classmethod
    def check(
        cls, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
        block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved, alibi_slopes, num_splits,
        return_softmax_lse, backend,
    ) -> _Call:  # fmt: skip
        """Check every argument (the values of cache_seqlens, cache_batch_idx and cache_leftpad included: a host
        sync when they are on a GPU) and plan the call."""
        _check_tensors(q, k_cache, v_cache, k, v)
        _check_flags(rotary_cos, rotary_sin, block_table, rotary_interleaved, num_splits, return_softmax_lse, backend)
        slots = _read_slots(q, k_cache, k, cache_seqlens, cache_batch_idx, cache_leftpad)
        batch_size, seqlen_q = q.shape[:2]
        spec, scale = api._check_options(
            q, 0.0, softmax_scale, causal, window_size, softcap, alibi_slopes, False, False, 0, 1, None, (128, 128),
            seqlen_q, max(slots.lengths, default=0), batch_size,
        )  # fmt: skip
        grouped = None
        if decode.can_group(q, k_cache, v_cache, slots.rows, spec):
            grouped = decode.GroupedDecode.plan(q, k_cache, slots, spec, scale, softcap, num_splits)
        return cls(slots, spec, scale, grouped, return_softmax_lse)

    def backend(self, backend: str | None, batch: AttentionBatch) -> tuple[Backend, Callable]:
        """The backend that runs the call (`backend`, the environment variable or the default), checked on `batch`,
        and its attention: a kernel backend's `prepared` one. Kept per name asked for: the batches of the calls that
        share this plan are alike."""
        name = api._backend_name(backend)
        kept = self.backends.get(name)
        if kept is None:
            chosen = api._resolve_backend(name, self.return_lse, batch, "return_softmax_lse")
            kept = chosen, chosen.prepared() if isinstance(chosen, KernelBackend) else chosen.attention
            self.backends[name] = kept
        return kept


def _signature(x: object) -> tuple:
    """What a call's checks and plan read of an argument: a tensor's shape, strides, dtype and device (not its
    values); else the argument with its type (True and 1 are equal, yet only one is a valid `causal`), item by item
    for a list or tuple."""
    if isinstance(x, Tensor):
        return (Tensor, x.shape, x.stride(), x.dtype, x.device)
    if isinstance(x, (list, tuple)):
        return (type(x), *(_signature(item) for item in x))
    return (type(x), x)


def _check_tensors(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Tensor | None, v: Tensor | None) -> None:
    """Types, ranks, dtypes, devices and shapes of q, the caches and the new keys and values."""
    api._check_rank(q, k_cache, v_cache, 4, _LAYOUT, ("q", "k_cache", "v_cache"))
    api._check_batch(q)
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
) -> Slots:
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
    return Slots(rows, starts, [n + new for n in seqlens], seqlens)


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
    return _host_values.get([x], (name,), x.tolist)  # a host sync on a GPU: once per step, whatever the layers


_calls: TensorCache[_Call] = TensorCache(8)  # a decoding step's (and its prompt's) calls, per kind of layer
_host_values: TensorCache[list[int]] = TensorCache(8)  # the values of cache_seqlens, cache_batch_idx, cache_leftpad


def _append(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, slots: Slots) -> None:
    """Write k, v (B, Sk_new, Hk, D) into the caches at slots [cache_seqlens, cache_seqlens + Sk_new) of each row."""
    device = k_cache.device
    rows = decode.on_device(tuple(slots.rows), device).long()[:, None]  # (B, 1)
    at = decode.on_device(tuple(slots.appended_at), device).long()[:, None] + torch.arange(k.shape[1], device=device)
    k_cache[rows, at] = k
    v_cache[rows, at] = v


def _packed_batch(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Tensor | None,
    v: Tensor | None,
    slots: Slots,
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
    longest = max(slots.lengths, default=0)
    return AttentionBatch(
        q_packed, k_packed, v_packed, cu_seqlens_q, cu_seqlens_k, seqlen_q, longest, spec, scale, softcap
    )


def _packed_keys(cache: Tensor, new: Tensor | None, slots: Slots, cu_seqlens: Tensor) -> Tensor:
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
