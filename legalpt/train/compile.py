"""torch.compile of the decoder layers (`train.compile`, `train.compile_mode`), one layer at a time.

As torchtitan does, each decoder layer is compiled on its own rather than the whole model: Dynamo traces one layer,
and the layers of one shape share its graph (their parameters are graph inputs), so compilation costs one layer, not
the depth of the model. legalpt attention stays inside that graph as one opaque node, the custom ops
`torch.ops.legalpt.attention_forward/backward` (legalpt.attention.ops), so a layer compiles without graph breaks.

The layer's `forward` is replaced on the instance, as activation checkpointing does (it runs inside the compiled
forward): module hooks, DDP's and FSDP2's, stay outside the graph, and parameter names and the state dict are
unchanged, so checkpoints and the HF export do not depend on `train.compile`.

Packed batches vary from step to step in their number of documents: `cu_seq_lens_q/k` change length and
`max_length_q/k` change value. They are marked dynamic from the first compilation, so that later steps reuse its graph
instead of recompiling (Dynamo would otherwise specialize on the first batch and recompile on the second).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import torch
from torch._dynamo.utils import counters
from transformers import PreTrainedModel

from legalpt.config import COMPILE_MODES
from legalpt.train.activations import decoder_layers

log = logging.getLogger(__name__)

# Dynamo's names of the packing arguments, as keyword arguments of a compiled forward (re.match on the source name)
PACKED_SOURCES = r".*\['(cu_seq_lens|max_length)_[qk]'\]"


def compile_decoder_layers(model: PreTrainedModel, mode: str = "default", backend: str | Callable = "inductor") -> None:
    """Compile each decoder layer of `model` in place; apply after activation checkpointing and before DDP/FSDP.

    `mode`: torch.compile's mode (one of COMPILE_MODES; inductor only); `backend`: torch.compile's backend (tests
    use aot_eager, which traces and differentiates the same graph without generating kernels)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"train.compile_mode: expected one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    _mark_packing_dynamic()
    # Under activation checkpointing, transformers' attention forward (its hub-kernel wrapper from the `kernels`
    # package) sets a global and restores it before returning; Dynamo refuses such a side effect inside checkpoint
    # unless allowed not to replay it in the recompute, and this one leaves nothing to replay.
    torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
    options = {"mode": mode} if backend == "inductor" else {}
    for layer in decoder_layers(model):
        layer.forward = torch.compile(layer.forward, backend=backend, **options)


def _mark_packing_dynamic() -> None:
    """Add the packing arguments to Dynamo's dynamic sources (a process-wide setting, read at every compilation)."""
    sources = [s for s in torch.compiler.config.dynamic_sources.split(",") if s.strip()]
    if PACKED_SOURCES not in sources:
        torch.compiler.config.dynamic_sources = ",".join([*sources, PACKED_SOURCES])


def graph_breaks() -> Counter[str]:
    """Dynamo's graph breaks in this process so far, by reason; empty when every compiled layer is one graph."""
    return Counter(counters["graph_break"])


def report_first_step(step: int, seconds: float) -> None:
    """Log how long the first compiled step took and warn about any graph break (each costs speed, not results)."""
    log.info("step %d took %.1f s, compilation of the decoder layers included (train.compile)", step, seconds)
    breaks = graph_breaks()
    if breaks:
        reasons = "\n".join(f"  {count}x {reason.splitlines()[0]}" for reason, count in breaks.most_common())
        log.warning("train.compile: %d graph breaks in the decoder layers:\n%s", breaks.total(), reasons)
