"""Activation memory of the decoder layers: checkpointing (`train.activation_checkpointing`, `train.checkpoint_every`)
and offloading to CPU memory (`train.offload_activations`).

A checkpointed module keeps only its inputs in forward and recomputes the rest in backward (torch.utils.checkpoint,
non-reentrant): `full` checkpoints every decoder layer, `selective` layers 0, k, 2k, ..., `attention` only the
attention modules (the MLP keeps its activations). With `train.save_attention` a recomputed layer keeps its attention
output and logsumexp (torch's selective checkpointing saves the attention op's outputs, by op: legalpt's and SDPA's
kernels alike), so that the recompute runs the projections and the MLP but not attention, whose cost grows with the
row's length squared. Offloading moves what the layers save for backward to (pinned)
CPU memory as it is saved and back when backward needs it (torch.autograd.graph.save_on_cpu); with checkpointing
that is each layer's input alone, the longest contexts' remaining cost.

Each module's `forward` is replaced on the instance and module hooks stay outside the checkpoint (as transformers'
own gradient checkpointing does), so this is applied to the plain HF model before accelerate.prepare and composes with
DDP and FSDP2's per-layer hooks; parameters, their names and the state dict are unchanged, so checkpoints and the
HF export do not depend on the mode.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from functools import partial

import torch
from torch.autograd.graph import save_on_cpu
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
from transformers import Cache, PreTrainedModel

from legalpt.attention import ops  # noqa: F401 (registers torch.ops.legalpt.attention_forward)
from legalpt.config import ACTIVATION_CHECKPOINTING

log = logging.getLogger(__name__)


def decoder_layers(model: PreTrainedModel) -> torch.nn.ModuleList:
    """The decoder blocks of an HF causal LM (`model.model.layers` in the Llama, Mistral and Qwen2 families)."""
    layers = getattr(model.get_decoder(), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"train.activation_checkpointing: {type(model).__name__} has no decoder `layers` list")
    return layers


def apply_activation_checkpointing(
    model: PreTrainedModel, mode: str, every: int = 2, offload: bool = False, save_attention: bool = False
) -> None:
    """Checkpoint `model`'s decoder layers by `mode` (none | full | selective | attention), in place; `every`: the
    stride of selective; `offload`: saved activations to CPU memory (only where the parameters are on CUDA);
    `save_attention`: recomputed layers keep their attention outputs (full and selective)."""
    if mode not in ACTIVATION_CHECKPOINTING:
        raise ValueError(f"train.activation_checkpointing: expected one of {', '.join(ACTIVATION_CHECKPOINTING)}, "
                         f"got {mode!r}")  # fmt: skip
    if every < 1:
        raise ValueError(f"train.checkpoint_every: expected an integer >= 1, got {every}")
    if save_attention and mode not in ("full", "selective"):
        raise ValueError(f"train.activation_checkpointing: expected full or selective with train.save_attention=true, "
                         f"got {mode!r}")  # fmt: skip
    device = next(model.parameters()).device
    if offload and device.type != "cuda":
        # Saved activations are in CPU memory already: copying them there again would only cost time.
        log.warning("train.offload_activations: the model is on %s, not CUDA; activations stay where they are", device)
        offload = False
    for index, layer in enumerate(decoder_layers(model)):
        if mode == "attention":
            attention = getattr(layer, "self_attn", None)
            if not isinstance(attention, torch.nn.Module):
                raise ValueError(f"train.activation_checkpointing=attention: {type(layer).__name__} has no self_attn")
            _wrap(attention, recompute=True, offload=False)  # the layer's offload covers it
        recompute = mode == "full" or (mode == "selective" and index % every == 0)
        if recompute or offload:
            _wrap(layer, recompute=recompute, offload=offload, save_attention=save_attention)


# The attention ops whose outputs train.save_attention keeps: legalpt's, and SDPA's backends (CUDA and CPU)
ATTENTION_OPS = frozenset(
    (
        torch.ops.legalpt.attention_forward.default,
        torch.ops.aten._scaled_dot_product_flash_attention.default,
        torch.ops.aten._scaled_dot_product_cudnn_attention.default,
        torch.ops.aten._scaled_dot_product_efficient_attention.default,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    )
)


def _save_attention(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Selective checkpointing's policy: attention's outputs saved, everything else recomputed."""
    return CheckpointPolicy.MUST_SAVE if op in ATTENTION_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _wrap(module: torch.nn.Module, recompute: bool, offload: bool, save_attention: bool = False) -> None:
    """Replace `module.forward` by one that recomputes it in backward (keeping attention's outputs where
    `save_attention`) and/or offloads what it saves."""
    # only when asked: Dynamo traces checkpoint's default context, not a context_fn passed (noop_context_fn included)
    selective = {"context_fn": partial(create_selective_checkpoint_contexts, _save_attention)} if save_attention else {}

    def forward(*args, **kwargs):
        # The class's forward, looked up per call: FSDP2 swaps the instance's class for a subclass.
        run = partial(type(module).forward, module)
        with save_on_cpu(pin_memory=True) if offload else nullcontext():
            if not (recompute and module.training and torch.is_grad_enabled()):
                return run(*args, **kwargs)
            args, kwargs = _recomputable(args, kwargs)
            return checkpoint(run, *args, use_reentrant=False, **selective, **kwargs)

    module.forward = forward


def _recomputable(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments of a checkpointed call.

    A KV cache is dropped: the recompute in backward would append the keys and values a second time (a training
    forward has no earlier cache, so attention sees the same keys either way). The hidden states go positional:
    checkpoint saves positional tensors for backward, where offloading reaches them, and only references keyword
    ones, which would stay on the GPU."""
    kwargs = {name: None if isinstance(value, Cache) else value for name, value in kwargs.items()}
    if kwargs.get("use_cache"):
        kwargs["use_cache"] = False
    if not args and "hidden_states" in kwargs:
        args = (kwargs.pop("hidden_states"),)
    return args, kwargs
