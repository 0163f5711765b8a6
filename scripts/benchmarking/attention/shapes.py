"""The shapes the attention benchmark measures, their selection on the command line, and their exact FLOP count.

Head dims 64 and 128 with heads = hidden / head dim; a dense sweep of seqlens at batch x seqlen = a fixed number of
tokens, causal and not; the same with grouped-query attention (GQA_GROUP query heads per key/value head, as the 1b
preset's 32 query and 4 key heads at d64); causal sliding windows W (window_size=(W - 1, 0)) at long seqlens; global
tokens plus a window; a causal pack of documents of seeded random lengths, with and without GQA at d64; and
peak-memory shapes (batch 1, causal, head dim 128).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import torch

from legalpt.attention.masks import MaskSpec, element_mask

BWD_FLOPS = 2.5  # backward FLOPs per forward FLOP
MODE_FLOPS = {"fwd": 1.0, "bwd": BWD_FLOPS, "fwd+bwd": 1.0 + BWD_FLOPS}  # FLOPs of each mode per forward FLOP
_PAIRS_PER_CHUNK = 1 << 24  # (query, key) pairs evaluated at once when counting the visible ones
GQA_GROUP = 8  # query heads per key/value head of the GQA shapes


@dataclass(frozen=True)
class Scale:
    """The sizes of a run: full ones on the GPU, tiny ones (at most 512 tokens) for a CPU dry run."""

    hidden: int  # heads * head_dim
    tokens: int  # batch * seqlen of the dense sweep and of the varlen pack
    seqlens: tuple[int, ...]  # the dense sweep
    gqa: tuple[int, ...]  # seqlens of the GQA sweep (dense and causal)
    windows: tuple[int, ...]  # sliding-window sizes W
    long: tuple[int, ...]  # seqlens of the window shapes
    global_tokens: int
    doc_lens: tuple[int, int]  # range of the varlen document lengths
    memory: tuple[int, ...]  # seqlens of the peak-memory shapes (batch 1, causal, head dim 128)


GPU_SCALE = Scale(2048, 16384, (1024, 2048, 4096, 8192, 16384), (4096, 8192, 16384), (1024, 4096), (16384, 65536), 64,
                  (128, 8192), (8192, 32768, 131072))  # fmt: skip
CPU_SCALE = Scale(256, 512, (128, 256, 512), (256, 512), (64,), (512,), 8, (16, 128), ())


@dataclass(frozen=True)
class Shape:
    group: str  # sweep | window | global | varlen | memory
    mask: str  # dense | causal | window-W | globalG+window-W | varlen-causal
    head_dim: int
    heads: int
    batch: int
    seqlen: int  # per row; varlen: the packed total
    causal: bool
    window: tuple[int, int] = (-1, -1)
    global_tokens: int = 0
    doc_lens: tuple[int, ...] = ()  # varlen documents
    heads_k: int = 0  # key/value heads; 0 = heads (GQA below heads)

    @property
    def spec(self) -> MaskSpec:
        return MaskSpec(self.causal, self.window, self.global_tokens)

    @property
    def kv_heads(self) -> int:
        return self.heads_k or self.heads


def plan(scale: Scale, quick: bool) -> list[Shape]:
    """The shapes of a run, in order; `quick`: head dim 128 dense and causal mid-sweep, and the first window."""
    if quick:
        seqlen = scale.seqlens[len(scale.seqlens) // 2]
        window = scale.windows[0]
        return [
            *(_dense(scale, 128, seqlen, causal) for causal in (False, True)),
            _window(scale, 128, scale.long[0], window, 0),
        ]
    shapes = [_dense(scale, d, s, c) for d in (64, 128) for c in (False, True) for s in scale.seqlens]
    shapes += [_dense(scale, d, s, c, gqa=True) for d in (64, 128) for c in (False, True) for s in scale.gqa]
    shapes += [_window(scale, d, s, w, 0) for d in (64, 128) for w in scale.windows for s in scale.long]
    shapes += [_window(scale, d, scale.long[-1], scale.windows[0], scale.global_tokens) for d in (64, 128)]
    lens = _doc_lens(scale.tokens, *scale.doc_lens)
    shapes += [
        Shape("varlen", "varlen-causal", d, scale.hidden // d, 1, scale.tokens, True, doc_lens=lens, heads_k=k)
        for d, k in ((64, 0), (64, _gqa_heads(scale.hidden // 64)), (128, 0))
    ]
    shapes += [Shape("memory", "causal", 128, 16, 1, s, True) for s in scale.memory]
    return shapes


def selected(
    shapes: list[Shape], masks: list[str] | None, head_dims: list[int] | None, seqlens: list[int] | None = None
) -> list[Shape]:
    """The shapes with the given masks, head dims and seqlens (all where None), in the order given: head dim first,
    then mask, then seqlen, the plan's order within. A run cut off by a time limit has then measured what was listed
    first."""

    def rank(chosen: list | None, value: object) -> int:
        return chosen.index(value) if chosen else 0

    kept = [
        s
        for s in shapes
        if s.mask in (masks or [s.mask])
        and s.head_dim in (head_dims or [s.head_dim])
        and s.seqlen in (seqlens or [s.seqlen])
    ]
    return sorted(kept, key=lambda s: (rank(head_dims, s.head_dim), rank(masks, s.mask), rank(seqlens, s.seqlen)))


def _dense(scale: Scale, head_dim: int, seqlen: int, causal: bool, gqa: bool = False) -> Shape:
    """A shape of the dense sweep, or with `gqa` of the GQA sweep."""
    heads, mask, batch = scale.hidden // head_dim, "causal" if causal else "dense", scale.tokens // seqlen
    if not gqa:
        return Shape("sweep", mask, head_dim, heads, batch, seqlen, causal)
    return Shape("gqa", mask, head_dim, heads, batch, seqlen, causal, heads_k=_gqa_heads(heads))


def _gqa_heads(heads: int) -> int:
    """Key/value heads of a GQA shape with `heads` query heads (one at least: the CPU's shapes have few heads)."""
    return max(1, heads // GQA_GROUP)


def _window(scale: Scale, head_dim: int, seqlen: int, window: int, global_tokens: int) -> Shape:
    """Causal sliding window of W keys, as transformers maps sliding_window=W: window_size=(W - 1, 0)."""
    mask = f"global{global_tokens}+window-{window}" if global_tokens else f"window-{window}"
    group = "global" if global_tokens else "window"
    heads = scale.hidden // head_dim
    return Shape(group, mask, head_dim, heads, 1, seqlen, True, (window - 1, 0), global_tokens)


def _doc_lens(tokens: int, low: int, high: int) -> tuple[int, ...]:
    """Document lengths drawn uniformly in [low, high] (seed 0) until `tokens`, the last one cut to fit."""
    draw, lens = random.Random(0), []
    while sum(lens) < tokens:
        lens.append(min(draw.randint(low, high), tokens - sum(lens)))
    return tuple(lens)


def forward_flops(shape: Shape, pairs: int) -> int:
    """FLOPs of one forward that visits `pairs` (query, key) pairs per head: QK^T and PV, 2 * head_dim each."""
    return 4 * pairs * shape.head_dim * shape.heads


def visible_pairs(shape: Shape, device: torch.device) -> int:
    """Number of (query, key) pairs the mask lets attend, summed over the batch (or documents), exact."""
    docs = Counter(shape.doc_lens) if shape.doc_lens else Counter({shape.seqlen: shape.batch})
    return sum(count * _document_pairs(shape.spec, n, device) for n, count in docs.items())


def _document_pairs(spec: MaskSpec, seqlen: int, device: torch.device) -> int:
    """Visible pairs of one document of seqlen queries and keys, by the element rule in chunks of rows: O(N) memory."""
    j = torch.arange(seqlen, device=device, dtype=torch.int32)[None, :]
    rows = max(1, _PAIRS_PER_CHUNK // seqlen)
    total = torch.zeros((), dtype=torch.int64, device=device)
    for start in range(0, seqlen, rows):
        i = torch.arange(start, min(start + rows, seqlen), device=device, dtype=torch.int32)[:, None]
        total += element_mask(spec, i, j, 0).sum()
    return int(total)
