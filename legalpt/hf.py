"""Hugging Face decoders on legalpt attention: `attn_implementation="legalpt"`.

`register()` (run by `import legalpt.hf`) adds two entries under that name to transformers' registries:

- a mask function (`AttentionMaskInterface`) that builds no dense mask. Causal and sliding-window masking are the
  kernel's `causal` and `window_size` arguments, so the mask only says which key slots hold real tokens: a (B, L)
  bool tensor, or None when every slot does.
- an attention function (`AttentionInterface`) that calls `flash_attn_func`, `flash_attn_with_kvcache` for queries
  past a left-padded cache, or `flash_attn_varlen_func` when a row holds other padding or several documents:
    * decoding with a cache (queries fewer than keys) whose padding comes first in every row, as `generate` pads:
      the keys of each row from its first real slot (`cache_leftpad`), no gather of the queries (inference only:
      the function has no backward, as in flash-attn);
    * other padding (padded batches, prefill): only real tokens are gathered, each row's forming one varlen
      document; pad queries get output 0;
    * packing: `cu_seq_lens_q/k` (and `max_length_q/k`) keyword arguments, indexing the batch flattened as in
      transformers' `FlashAttentionKwargs`; or `position_ids` that restart inside a row, where a token starts a
      document when its position is not its predecessor's plus one (transformers' own packed-sequence rule).
      Restarts and padding combine: a packed row may also be padded.
    * context parallelism: a `ring_plan` keyword argument (legalpt.attention.ring) says this process holds a share
      of one long row, attended over every process of the plan by `ring_flash_attn_varlen_func`.

Deterministic backward: under `torch.use_deterministic_algorithms(True)` (which accelerate's
`set_seed(..., deterministic=True)` and `train.deterministic` turn on), with FLASH_ATTENTION_DETERMINISTIC=1
(transformers' switch for its flash-attention path) or a `deterministic=True` keyword from the caller, the kernels'
backward runs without atomics, so that two runs of a training step give the same gradients bit for bit. A compiled
graph keeps the environment variable's value from when it was traced (torch's mode is guarded): set it first.

Sliding window: transformers lets query i see key j when i - sliding_window < j <= i, which is flash-attn's
`window_size=(sliding_window - 1, 0)` with `causal=True` (and |i - j| <= sliding_window for bidirectional layers).
When padding sits inside a row (neither left nor right), the window counts real tokens only.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface

from legalpt.attention import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from legalpt.attention.ring import RingPlan, ring_flash_attn_varlen_func
from legalpt.attention.tensor_cache import TensorCache

NAME = "legalpt"  # no "flash" in it: transformers sends such names to its hub-kernel loader


def register() -> None:
    """Make `attn_implementation="legalpt"` available to every transformers model; safe to call again."""
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, key_mask)


def window_size(sliding_window: int | None, causal: bool) -> tuple[int, int]:
    """transformers' `sliding_window` as flash-attn's (left, right) window, so results equal sdpa and eager."""
    if sliding_window is None:
        return (-1, -1)
    if sliding_window < 1:
        raise ValueError(f"sliding_window must be None or >= 1, got {sliding_window}")
    return (sliding_window - 1, 0) if causal else (sliding_window, sliding_window)


def deterministic() -> bool:
    """Whether the backward must not use atomics: torch's deterministic mode, or transformers' flash-attention
    switch (FLASH_ATTENTION_DETERMINISTIC=1)."""
    return torch.are_deterministic_algorithms_enabled() or os.environ.get("FLASH_ATTENTION_DETERMINISTIC") == "1"


def key_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    attention_mask: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
    **kwargs,
) -> torch.Tensor | None:
    """Which of the first L key slots hold real tokens, (B, L) bool; None when all `kv_length` slots do.

    Key slot j holds position `kv_offset + j`. Slots at or past `q_offset + q_length` are empty cache slots (static
    caches allocate them ahead), so L stops there and causal attention aligned bottom-right over L keys gives each
    query exactly the keys transformers' causal mask gives it. The 2D `attention_mask` ends at the last query, so its
    last L columns are the slots' padding mask; taking them again changes nothing, as needed when `generate` builds
    the mask ahead and the model then passes it through here once more.
    """
    length = min(kv_length, int(q_offset + q_length - kv_offset))  # int(): static caches keep q_offset as a tensor
    if attention_mask is None:
        if length == kv_length:
            return None
        return torch.ones(batch_size, length, dtype=torch.bool, device=device)
    if attention_mask.shape[-1] < length:
        raise ValueError(
            f"attention_mask: expected a column for each of the {length} tokens seen so far, "
            f"got shape {tuple(attention_mask.shape)}"
        )
    mask = attention_mask[:, attention_mask.shape[-1] - length :].bool()
    if length == kv_length and bool(mask.all()):
        return None
    return mask


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention call on legalpt attention: (B, H, S, D) inputs, (B, Sq, H, D) output."""
    if kwargs.get("s_aux") is not None:
        raise ValueError("legalpt attention has no attention sinks (s_aux); use attn_implementation='eager'")
    if kwargs.get("output_attentions"):
        raise ValueError("legalpt attention does not return attention weights; use attn_implementation='eager'")
    if attention_mask is not None and attention_mask.ndim != 2:
        raise ValueError(
            f"attention_mask: legalpt attention takes a 2D padding mask, got shape {tuple(attention_mask.shape)}; "
            "custom 4D masks need attn_implementation='sdpa' or 'eager'"
        )
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    options = {
        "dropout_p": dropout,
        "softmax_scale": scaling,
        "causal": causal,
        "window_size": window_size(sliding_window, causal),
        "softcap": softcap or 0.0,
        "deterministic": deterministic() if kwargs.get("deterministic") is None else bool(kwargs["deterministic"]),
    }
    if torch.is_autocast_enabled(query.device.type):
        # Under autocast RoPE leaves q and k in float32 while v comes out of its projection in the autocast dtype;
        # run in that dtype, as sdpa does under autocast.
        dtype = torch.get_autocast_dtype(query.device.type)
        query, key, value = (x.to(dtype) for x in (query, key, value))
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # (B, S, H, D)
    if kwargs.get("ring_plan") is not None:  # context parallelism (legalpt.train.context): a share of one long row
        return _ring(q, k, v, kwargs["ring_plan"], options), None
    if kwargs.get("cu_seq_lens_q") is not None:
        if attention_mask is not None:
            raise ValueError("cu_seq_lens_q: packed sequences cannot be combined with a padding attention_mask")
        return _packed(q, k, v, kwargs, options), None
    if attention_mask is not None and attention_mask.shape[1] < k.shape[1]:
        k, v = k[:, : attention_mask.shape[1]], v[:, : attention_mask.shape[1]]  # drop empty cache slots
    return _attend(q, k, v, attention_mask, kwargs.get("position_ids"), options), None


def _ring(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: RingPlan, options: dict) -> torch.Tensor:
    """This process's tokens (1, T / W, H, D) of a row sharded over the processes of `plan`, by ring attention."""
    if q.shape[0] != 1:
        raise ValueError(f"ring_plan: expected the batch flattened into one row, got {q.shape[0]} rows")
    if options["window_size"] != (-1, -1) or options["softcap"] or options["dropout_p"]:
        raise ValueError(
            "ring_plan: ring attention takes causal or full attention alone; this layer has a sliding window, softcap "
            "or dropout"
        )
    if options["causal"] != plan.causal:
        raise ValueError(f"ring_plan: planned with causal={plan.causal}, but the layer is causal={options['causal']}")
    out = ring_flash_attn_varlen_func(
        q[0], k[0], v[0], plan, softmax_scale=options["softmax_scale"], deterministic=options["deterministic"]
    )
    return out[None]


def _packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kwargs: dict, options: dict) -> torch.Tensor:
    """Documents given by `cu_seq_lens_q/k` over the batch flattened into one sequence."""
    cu_q = kwargs["cu_seq_lens_q"].to(torch.int32)
    cu_k = kwargs["cu_seq_lens_k"].to(torch.int32) if kwargs.get("cu_seq_lens_k") is not None else cu_q
    max_q = _max_length(kwargs.get("max_length_q"), cu_q)
    max_k = _max_length(kwargs.get("max_length_k"), cu_k)
    q_flat, k_flat, v_flat = (x.reshape(-1, *x.shape[2:]) for x in (q, k, v))  # (B * S, H, D)
    out = flash_attn_varlen_func(q_flat, k_flat, v_flat, cu_q, cu_k, max_q, max_k, **options)
    return out.view(q.shape)


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    options: dict,
) -> torch.Tensor:
    """Dense attention, unless padding or restarting positions split the rows into documents."""
    q_len, k_len = q.shape[1], k.shape[1]
    if q_len == k_len:  # queries and keys are the same tokens: no cache, or an empty one
        starts = _restarts(position_ids, q.shape[0], q_len)
        if mask is None and starts is None:
            return flash_attn_func(q, k, v, **options)
        return _varlen(q, k, v, mask, mask, starts, options)
    if mask is None:  # decoding past a cache without padding: the cache's own layout, nothing gathered
        return flash_attn_func(q, k, v, **options)
    pads = _left_padding(mask, q_len) if options["dropout_p"] == 0 and not q.requires_grad else None
    if pads is not None:
        return _over_cache(q, k, v, pads, options)
    return _varlen(q, k, v, _query_slots(mask, k_len - q_len), mask, None, options)


def _query_slots(mask: torch.Tensor, first: int) -> torch.Tensor:
    """The mask's columns from key slot `first` on, where the queries sit (query i in slot first + i): one view for
    all the layers of a forward, so that what is computed from it is kept for them (`_documents`)."""
    return _query_masks.get([mask], (first,), lambda: mask[:, first:])


_query_masks: TensorCache[torch.Tensor] = TensorCache(2)


def _left_padding(mask: torch.Tensor, q_len: int) -> torch.Tensor | None:
    """Padding slots per row, int32 (B,), when every row's padding comes first (as `generate` pads) and no query
    slot (the last q_len) is padding; else None. One host sync per decoding step: every layer gets the same mask,
    so the answer is kept for the others (by the mask's identity and version: tensor_cache.py)."""

    def read() -> torch.Tensor | None:
        pads = (~mask).sum(1)  # (B,)
        slots = torch.arange(mask.shape[1], device=mask.device)
        left = (mask == (slots >= pads[:, None])).all() & (pads.max() <= mask.shape[1] - q_len)
        return pads.to(torch.int32) if bool(left) else None

    return _left_paddings.get([mask], (q_len,), read)


_left_paddings: TensorCache[torch.Tensor | None] = TensorCache(2)  # a step's mask (and the prompt's)


def _over_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pads: torch.Tensor, options: dict) -> torch.Tensor:
    """Queries past a left-padded cache: the cache is read where it lies, from each row's first real slot; the
    queries need no gather and the output no scatter. transformers has already appended the new keys."""
    options = {name: value for name, value in options.items() if name not in ("dropout_p", "deterministic")}
    return flash_attn_with_kvcache(q, k, v, cache_seqlens=k.shape[1], cache_leftpad=pads, **options)


def _restarts(position_ids: torch.Tensor | None, batch: int, length: int) -> torch.Tensor | None:
    """(B, S) bool, True where a token starts a new document inside its row; None when no row restarts. A host
    sync, once per forward: every layer gets the same position_ids, and the same answer (tensor_cache.py)."""
    if position_ids is None or length == 1:
        return None

    def find() -> torch.Tensor | None:
        positions = position_ids.expand(batch, -1)
        starts = F.pad(positions.diff(dim=1) != 1, (1, 0), value=False)
        return starts if bool(starts.any()) else None

    return _restart_cache.get([position_ids], (batch, length), find)


_restart_cache: TensorCache[torch.Tensor | None] = TensorCache(2)


def _varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_keep: torch.Tensor | None,
    k_keep: torch.Tensor | None,
    starts: torch.Tensor | None,
    options: dict,
) -> torch.Tensor:
    """Varlen attention over the kept tokens (None = all): one document per row, split again at `starts`."""
    q_index, cu_q, max_q = _documents(q_keep, starts, q.shape[:2], q.device)
    k_index, cu_k, max_k = _documents(k_keep, starts, k.shape[:2], k.device)
    q_flat, k_flat, v_flat = (_gather(x, index) for x, index in ((q, q_index), (k, k_index), (v, k_index)))
    out = flash_attn_varlen_func(q_flat, k_flat, v_flat, cu_q, cu_k, max_q, max_k, **options)  # (T, H, D)
    if q_index is not None:  # padding queries get output 0
        out = out.new_zeros(q.shape[0] * q.shape[1], *out.shape[1:]).index_copy(0, q_index, out)
    return out.view(q.shape)


def _documents(
    keep: torch.Tensor | None, starts: torch.Tensor | None, shape: torch.Size, device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor, int]:
    """Flat indices of the kept tokens (None = all), then `cu_seqlens` over them and the longest document's length.

    A document starts at each row's first slot and wherever `starts` is True, and holds the kept tokens up to the
    next start; a document of padding only is empty. Host syncs, once per forward: every layer passes the same mask
    and restarts, and gets the same tensors (so the kernels' block schedules, cached by cu_seqlens, are built once).
    """
    given = [x for x in (keep, starts) if x is not None]
    extra = (tuple(shape), device, keep is None, starts is None)
    return _document_cache.get(given, extra, lambda: _find_documents(keep, starts, shape, device))


_document_cache: TensorCache[tuple[torch.Tensor | None, torch.Tensor, int]] = TensorCache(4)


def _find_documents(
    keep: torch.Tensor | None, starts: torch.Tensor | None, shape: torch.Size, device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor, int]:
    """`_documents`, computed."""
    batch, length = shape
    new = torch.arange(batch * length, device=device) % length == 0
    if starts is not None:
        new = new | starts.flatten()
    if keep is None:
        index = None
        before = torch.arange(batch * length + 1, device=device)  # kept tokens before each slot
    else:
        index = keep.flatten().nonzero().squeeze(1)  # (T,)
        before = F.pad(keep.flatten().cumsum(0), (1, 0))
    cu_seqlens = torch.cat([before[:-1][new], before[-1:]]).to(torch.int32)
    return index, cu_seqlens, int(cu_seqlens.diff().max())


def _gather(x: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """(B, S, H, D) -> (T, H, D): the tokens at `index` of the flattened batch, or all of them."""
    flat = x.reshape(-1, *x.shape[2:])
    return flat if index is None else flat.index_select(0, index)


def _max_length(given: int | torch.Tensor | None, cu_seqlens: torch.Tensor) -> int:
    """The longest document: the caller's `max_length_*` when given, else read from `cu_seqlens`."""
    return int(given) if given is not None else int(cu_seqlens.diff().max())


register()
