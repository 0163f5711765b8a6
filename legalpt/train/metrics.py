"""Training throughput: real tokens per second, model FLOPs and MFU, peak GPU memory.

A real token is a token of a packed segment that holds at least one training target: padding never does (its labels
are all IGNORE_INDEX), and neither does the rare one-token chunk at a row's end, which is neither predicted nor
context for any prediction, so it is as wasted as a pad. Throughput counts real tokens, not row slots.

Model FLOPs of a step (MFU's numerator; recomputation by activation checkpointing is not counted, as in PaLM):
6 · N · tokens for the matmuls, N the parameters other than the input embedding (a lookup, not a matmul; the LM head
counts once even when tied), of which a frozen one (a LoRA base) counts 4 instead of 6: its backward computes the
input's gradient but not its own; plus per layer 12 · pairs · heads · head_dim for attention: QKᵀ and PV are 2 FLOPs
per (query, key) pair and head dimension each, forward, and the backward costs twice the forward. `pairs` are the
(query, key) pairs the causal mask lets through within each document, under the layer's sliding window if it has one.

Everything per step is counted on the device where the batch lies, so the loop never waits for the GPU; `Throughput`
reads the sums, reduced over ranks, at logging time only. MFU divides by the device's dense bf16 peak, from the GPU's
name or `train.peak_tflops`; on a CPU or an unknown GPU it is not reported rather than guessed.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from transformers import PreTrainedModel

from legalpt.data.pack import IGNORE_INDEX

log = logging.getLogger(__name__)

# Dense (no 2:4 sparsity) bf16 tensor-core peaks, TFLOP/s, from NVIDIA's data sheets; the first pattern that
# matches torch.cuda.get_device_name() wins, so the specific variants come before the family.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    (r"H100 PCIe", 756.5),
    (r"H[12]00 NVL", 835.5),
    (r"\b(GH200|H100|H200|H800)\b", 989.4),  # SXM / HGX boards
    (r"\b(A100|A800)\b", 312.0),
    (r"\bL40S\b", 362.1),
    (r"\bL4\b", 121.0),
    (r"\bB200\b", 2250.0),
)
_GIB = 2**30


@dataclass(frozen=True)
class Peak:
    """What MFU divides by: a device's dense bf16 peak, and where that number came from."""

    name: str  # e.g. "NVIDIA H200 (dense bf16 table)" or "train.peak_tflops"
    tflops: float


def peak_for_name(device_name: str) -> Peak | None:
    """The table's peak for a GPU called `device_name`, or None for a GPU not in the table."""
    for pattern, tflops in PEAK_BF16_TFLOPS:
        if re.search(pattern, device_name):
            return Peak(f"{device_name} (dense bf16 table)", tflops)
    return None


def device_peak(device: torch.device, override_tflops: float | None) -> Peak | None:
    """`train.peak_tflops` when set, else the table's peak of a CUDA device; None for a CPU or an unknown GPU."""
    if override_tflops is not None:
        return Peak("train.peak_tflops", override_tflops)
    if device.type != "cuda":
        return None
    return peak_for_name(torch.cuda.get_device_name(device))


def visible_pairs(lengths: torch.Tensor, window: int | None) -> torch.Tensor:
    """(query, key) pairs a causal mask lets through in documents of `lengths` (n,) int64 → (n,) int64.

    Query i sees keys i - window < j <= i (transformers' sliding window), i.e. min(i + 1, window) keys, so a
    document of L tokens has m(m + 1)/2 pairs over its first m = min(L, window) queries and `window` per query after."""
    first = lengths if window is None else lengths.clamp(max=window)
    full = 0 if window is None else (lengths - first) * window
    return first * (first + 1) // 2 + full


def segment_lengths(labels: torch.Tensor, cu_seq_lens: torch.Tensor) -> torch.Tensor:
    """Lengths (n,) int64 of the packed segments that hold a target (0 for the others): labels (1, T) from
    `collate_packed`, cu_seq_lens (n + 1,) its segment offsets."""
    offsets = cu_seq_lens.to(labels.device, torch.long)
    has_target = F.pad((labels[0] != IGNORE_INDEX).cumsum(0), (1, 0))  # (T + 1,) targets before each position
    targets = has_target[offsets[1:]] - has_target[offsets[:-1]]  # (n,)
    return (offsets[1:] - offsets[:-1]) * (targets > 0)


@dataclass(frozen=True)
class ModelFlops:
    """A decoder's training FLOPs as a function of its real tokens and visible (query, key) pairs."""

    matmul_params: int  # N: parameters other than the input embedding, the LM head counted once
    num_heads: int  # query heads (grouped key/value heads do not change the score and PV matmuls)
    head_dim: int
    windows: tuple[int | None, ...]  # sliding window of each layer; None = full causal attention
    frozen_params: int = 0  # of N, those without a gradient (a LoRA base): no weight-gradient matmul in the backward

    @classmethod
    def of(cls, model: PreTrainedModel) -> ModelFlops:
        """Read N and the attention shape off an HF causal LM (unwrapped: not DDP's wrapper)."""
        config = model.config
        embedding = model.get_input_embeddings().weight
        head = model.get_output_embeddings()
        tied = head is not None and head.weight is embedding
        # parameters() yields a tied tensor once, so a tied head is added back as the matmul it still is.
        matmul_params = sum(p.numel() for p in model.parameters()) - embedding.numel() * (not tied)
        frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
        frozen -= embedding.numel() * (not tied and not embedding.requires_grad)
        num_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        sliding = getattr(config, "sliding_window", None)
        # Qwen2-style configs name each layer's kind; Mistral's apply its window to every layer.
        kinds = getattr(config, "layer_types", None) or ["sliding_attention"] * config.num_hidden_layers
        windows = tuple(sliding if kind == "sliding_attention" else None for kind in kinds)
        return cls(matmul_params, num_heads, head_dim, windows, frozen)

    def count(self, batch: dict, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """(2,) int64 on the batch's device: its real tokens, and its visible pairs summed over layers; `lengths`:
        its `segment_lengths` when given (a context-parallel share holds a part of the row's labels only)."""
        if lengths is None:
            lengths = segment_lengths(batch["labels"], batch["cu_seq_lens_q"])  # (n,)
        # One count per distinct window, not per layer: a few small kernels per micro-batch, whatever the depth.
        pairs = sum(visible_pairs(lengths, window).sum() * layers for window, layers in Counter(self.windows).items())
        return torch.stack([lengths.sum(), pairs])

    def flops(self, tokens: int, layer_pairs: int) -> int:
        """Forward + backward FLOPs of `tokens` real tokens whose layers see `layer_pairs` pairs in all."""
        matmuls = 6 * self.matmul_params - 2 * self.frozen_params
        return matmuls * tokens + 12 * self.num_heads * self.head_dim * layer_pairs


class Throughput:
    """Counts the training batches that stream past it and reports the window since its last report."""

    def __init__(self, flops: ModelFlops, peak: Peak | None, accelerator: Accelerator):
        self.flops, self.peak, self.accelerator = flops, peak, accelerator
        self.counts = torch.zeros(2, dtype=torch.long, device=accelerator.device)  # real tokens, layer pairs
        if accelerator.device.type == "cuda":  # peaks of this run, not of the process (a benchmark trains several)
            torch.cuda.reset_peak_memory_stats(accelerator.device)
        self.start = time.perf_counter()
        if peak is None:
            log.info("MFU not reported: no dense bf16 peak known for %s (set train.peak_tflops)", accelerator.device)
        else:
            log.info("MFU against %s: %.1f TFLOP/s per device", peak.name, peak.tflops)

    def counted(self, batches: Iterator[dict]) -> Iterator[dict]:
        """`batches`, each counted (asynchronously, on its device) as it is handed out. A batch's `segment_lengths`
        entry (legalpt.train.context: the row's, on one process of its group, zeros on the others) is taken out of it
        and counted instead of its labels."""
        for batch in batches:
            lengths = batch.pop("segment_lengths", None)
            self.counts += self.flops.count(batch, lengths).to(self.counts.device, non_blocking=True)
            yield batch

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Leave out the time of the block (evaluation, saving). The device finishes the steps queued before it
        first, or their time would be left out too."""
        if self.accelerator.device.type == "cuda":
            torch.cuda.synchronize(self.accelerator.device)
        paused = time.perf_counter()
        try:
            yield
        finally:
            self.start += time.perf_counter() - paused

    def read(self) -> dict[str, float | str]:
        """Metrics of the window since the last read (all ranks together), then start a new window.

        One host sync: the counts are reduced over ranks and read before the clock is, so the window includes the
        device's work on the steps it queued."""
        tokens, layer_pairs = self.accelerator.reduce(self.counts, "sum").tolist()
        seconds = time.perf_counter() - self.start
        devices = self.accelerator.num_processes
        tflops = self.flops.flops(tokens, layer_pairs) / seconds / devices / 1e12  # achieved, per device
        values: dict[str, float | str] = {"train/tokens_per_s": tokens / seconds, "train/tflops": tflops}
        if self.peak is not None:
            values |= {"train/mfu": tflops / self.peak.tflops, "train/mfu_peak": self.peak.name,
                       "train/mfu_peak_tflops": self.peak.tflops}  # fmt: skip
        device = self.accelerator.device
        if device.type == "cuda":  # the largest of the ranks' peaks since the run started
            peak_bytes = torch.tensor([torch.cuda.max_memory_allocated(device)], dtype=torch.float64, device=device)
            values["train/peak_gib"] = self.accelerator.gather(peak_bytes).max().item() / _GIB
        self.counts.zero_()
        self.start = time.perf_counter()
        return values
