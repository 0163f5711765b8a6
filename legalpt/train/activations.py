"""Activation memory of the decoder layers: checkpointing (`train.activation_checkpointing`, `train.checkpoint_every`),
offloading to CPU memory (`train.offload_activations`) and the MLP in chunks of tokens (`train.mlp_chunk_tokens`).

A checkpointed module keeps only its inputs in forward and recomputes the rest in backward (torch.utils.checkpoint,
non-reentrant): `full` checkpoints every decoder layer, `selective` layers 0, k, 2k, ..., `attention` only the
attention modules (the MLP keeps its activations). With `train.save_attention` a recomputed layer keeps its attention
output and logsumexp: torch's selective checkpointing saves the outputs of the ops in ATTENTION_OPS (legalpt's op,
whatever its kernel backend, and SDPA's fused kernels), so that the recompute runs the projections and the MLP but not
attention, whose cost grows with the row's length squared. A layer whose attention runs as no such op (SDPA's math
fallback, legalpt's flex backend) recomputes it all the same, with a warning. Offloading moves what the layers save
for backward to (pinned) CPU memory as it is saved and back when backward needs it
(torch.autograd.graph.save_on_cpu); with checkpointing that is each layer's input alone.

What then bounds the longest rows is the one layer that backward recomputes at a time, and most of it is the MLP's
intermediates, several times the hidden size per token. `train.mlp_chunk_tokens` runs each MLP over that many tokens
at a time, each chunk checkpointed on its own: the MLP keeps only its input, and its backward recomputes one chunk's
intermediates at a time (sequence tiling; the MLP sees each token alone, so the result is the same). The price is one
more MLP forward per step, and in a recomputed layer a third (the layer's recompute runs the chunks only to keep
their inputs): small beside attention at the lengths that need it. Without gradients (evaluation, generation) the
chunks run one after the other, recomputing nothing, so that evaluation fits wherever training does.

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
from legalpt.config import ACTIVATION_CHECKPOINTING, RECOMPUTED_LAYERS

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
    if save_attention:
        _check_save_attention(model, mode, offload)
    device = next(model.parameters()).device
    if offload and device.type != "cuda":
        # Saved activations are in CPU memory already: copying them there again would only cost time.
        log.warning("train.offload_activations: the model is on %s, not CUDA; activations stay where they are", device)
        offload = False
    policy = SaveAttention() if save_attention else None
    for index, layer in enumerate(decoder_layers(model)):
        if mode == "attention":
            attention = getattr(layer, "self_attn", None)
            if not isinstance(attention, torch.nn.Module):
                raise ValueError(f"train.activation_checkpointing=attention: {type(layer).__name__} has no self_attn")
            _wrap(attention, recompute=True, offload=False)  # the layer's offload covers it
        recompute = mode == "full" or (mode == "selective" and index % every == 0)
        if recompute or offload:
            _wrap(layer, recompute=recompute, offload=offload, policy=policy)


def chunk_mlps(model: PreTrainedModel, tokens: int) -> None:
    """Run every decoder layer's MLP over `tokens` tokens at a time (`train.mlp_chunk_tokens`), each chunk recomputed
    in backward, in place."""
    if tokens < 1:
        raise ValueError(f"train.mlp_chunk_tokens: expected an integer >= 1, got {tokens}")
    for layer in decoder_layers(model):
        mlp = getattr(layer, "mlp", None)
        if not isinstance(mlp, torch.nn.Module):
            raise ValueError(f"train.mlp_chunk_tokens: {type(layer).__name__} has no mlp module")
        if hasattr(mlp, "experts"):  # a router's outputs and load-balancing statistics are per call, not per token
            raise ValueError(f"train.mlp_chunk_tokens: expected dense MLPs, got the mixture of experts "
                             f"{type(mlp).__name__}; use 0")  # fmt: skip
        _chunk(mlp, tokens)


def _chunk(mlp: torch.nn.Module, tokens: int) -> None:
    def forward(hidden: torch.Tensor) -> torch.Tensor:  # (B, S, D)
        run = partial(type(mlp).forward, mlp)  # looked up per call, as in _wrap
        if hidden.shape[:-1].numel() <= tokens:
            return run(hidden)
        parts = hidden.reshape(-1, hidden.shape[-1]).split(tokens)  # (tokens, D) each, rows of the batch joined
        if torch.is_grad_enabled():
            out = torch.cat([checkpoint(run, part, use_reentrant=False) for part in parts])
        else:
            out = torch.cat([run(part) for part in parts])
        return out.view(*hidden.shape[:-1], out.shape[-1])

    mlp.forward = forward


def _check_save_attention(model: PreTrainedModel, mode: str, offload: bool) -> None:
    if mode not in RECOMPUTED_LAYERS:
        raise ValueError(f"train.activation_checkpointing: expected full or selective with train.save_attention=true, "
                         f"got {mode!r}")  # fmt: skip
    if offload:  # selective checkpointing's saved outputs bypass save_on_cpu's hooks: they would stay on the GPU
        raise ValueError("train.offload_activations: expected false with train.save_attention=true, got true")
    dropout = getattr(model.config, "attention_dropout", 0.0) or 0.0
    if dropout > 0:  # a skipped op draws no random numbers: the recompute's later dropout masks would differ
        raise ValueError(f"train.save_attention: expected a model without attention dropout, got attention_dropout="
                         f"{dropout}")  # fmt: skip


# The attention ops (every overload) whose outputs train.save_attention keeps: legalpt's, SDPA's fused kernels
ATTENTION_OPS = frozenset(
    (
        torch.ops.legalpt.attention_forward,
        torch.ops.aten._scaled_dot_product_flash_attention,
        torch.ops.aten._scaled_dot_product_cudnn_attention,
        torch.ops.aten._scaled_dot_product_efficient_attention,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu,
    )
)


class SaveAttention:
    """Selective checkpointing's policy for train.save_attention: the outputs of ATTENTION_OPS saved, everything else
    recomputed; it warns once if a checkpointed forward ran none of them (nothing saved: attention is recomputed)."""

    def __init__(self):
        self.saved = self.warned = False

    def __call__(self, ctx, op, *args, **kwargs) -> CheckpointPolicy:
        if getattr(op, "overloadpacket", op) in ATTENTION_OPS:
            self.saved = True
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    def check(self) -> None:
        if not (self.saved or self.warned):
            self.warned = True
            log.warning("train.save_attention: the layers' attention ran as no op it saves (SDPA's math fallback or "
                        "legalpt's flex backend?); it is recomputed in backward as without the option")  # fmt: skip


def _wrap(module: torch.nn.Module, recompute: bool, offload: bool, policy: SaveAttention | None = None) -> None:
    """Replace `module.forward` by one that recomputes it in backward (keeping attention's outputs by `policy`,
    if given) and/or offloads what it saves."""
    # Only with a policy: Dynamo takes any context_fn passed, noop_context_fn included, for selective checkpointing
    selective = {"context_fn": partial(create_selective_checkpoint_contexts, policy)} if policy else {}

    def forward(*args, **kwargs):
        # The class's forward, looked up per call: FSDP2 swaps the instance's class for a subclass.
        run = partial(type(module).forward, module)
        with save_on_cpu(pin_memory=True) if offload else nullcontext():
            if not (recompute and module.training and torch.is_grad_enabled()):
                return run(*args, **kwargs)
            args, kwargs = _recomputable(args, kwargs)
            out = checkpoint(run, *args, use_reentrant=False, **selective, **kwargs)
            if policy is not None and not torch.compiler.is_compiling():  # a compiled graph saves by the policy too
                policy.check()
            return out

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
