"""The training loss without the full logits: next-token cross-entropy by `train.loss_impl`.

HF's causal-LM forward projects every hidden state to the vocabulary and upcasts the logits to float32 before its
loss, so a row of N tokens holds N x vocab float32 logits (and as much again for their gradient): at long context
that, not the decoder, is the peak. Both implementations here run the decoder body to its last hidden states and
take the loss through the output embedding a slice of tokens at a time:
- `chunked`: plain PyTorch, `chunk_tokens` rows at a time, each chunk recomputed in backward (non-reentrant
  checkpoint), so only one chunk's logits exist at any moment;
- `fused`: Liger-Kernel's fused linear cross-entropy (Triton; BSD-2-Clause), which computes each chunk's gradients
  during the forward and never keeps its logits, so there is no recompute; it needs a CUDA device (or Triton's
  interpreter, `TRITON_INTERPRET=1`, which the CPU tests use) and the `fused` extra.
The semantics are HF's: labels shifted within each row (the packing collator already ignores each segment's first
token), ignored labels skipped, the sum divided by `num_items_in_batch` (the mean over targets without it); the
output embedding multiplies in the precision autocast gives it.

The loss runs inside the model's own forward (`use_loss` replaces the instance's `forward`), not beside it: DDP's
forward prepares the gradient all-reduce and FSDP's hooks gather parameters there, so the trainer keeps calling
`model(**batch, num_items_in_batch=...)` through accelerate's wrappers. Parameters and state dict are untouched, so
checkpoints and the HF export are the same as with `plain`.
"""

from __future__ import annotations

import os
from functools import partial

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from legalpt.data.pack import IGNORE_INDEX

# Families whose causal-LM forward is exactly decoder → output embedding → HF's causal-LM loss: no logit scaling or
# soft-capping (Gemma's final_logit_softcapping, Cohere's logit_scale, Granite's logits_scaling would be skipped).
CHUNKED_LOSS_FAMILIES = ("llama", "mistral", "qwen2")


def chunked_cross_entropy(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    labels: torch.Tensor,
    num_items_in_batch: torch.Tensor | int | None = None,
    chunk_tokens: int = 4096,
    shift_labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """HF's causal-LM loss of the logits `head(hidden)`, computed `chunk_tokens` rows at a time.

    hidden (B, S, D) last hidden states; labels (B, S), IGNORE_INDEX where no target; position t predicts labels[t+1]
    of its own row (or shift_labels[t], as `next_token_targets` says). With grad enabled each chunk is recomputed in
    backward, so its float32 logits live only while that chunk's loss or gradient is computed."""
    if chunk_tokens < 1:
        raise ValueError(f"train.loss_chunk_tokens: expected an integer >= 1, got {chunk_tokens}")
    targets = next_token_targets(labels, shift_labels)  # (B*S,)
    rows = hidden.flatten(0, -2)  # (B*S, D)
    chunk_nll = partial(_summed_nll, head)
    if torch.is_grad_enabled():
        # preserve_rng_state=False: a linear layer and a cross-entropy draw no random numbers.
        chunk_nll = partial(checkpoint, chunk_nll, use_reentrant=False, preserve_rng_state=False)
    # split, not slicing: one SplitBackward concatenates the chunks' gradients, instead of a zero-padded full-size
    # gradient per chunk.
    nll = sum(chunk_nll(h, t) for h, t in zip(rows.split(chunk_tokens), targets.split(chunk_tokens), strict=True))
    return _mean(nll, targets, num_items_in_batch)


def fused_cross_entropy(
    hidden: torch.Tensor,
    head: torch.nn.Linear,
    labels: torch.Tensor,
    num_items_in_batch: torch.Tensor | int | None = None,
    shift_labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """HF's causal-LM loss of the logits `head(hidden)` by Liger-Kernel's fused linear cross-entropy: shapes as
    `chunked_cross_entropy`. The product runs in autocast's dtype where autocast is on (as `head(hidden)` would),
    with the weight's gradient accumulated in float32."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss  # checked importable by use_loss

    targets = next_token_targets(labels, shift_labels)  # (B*S,)
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    rows = hidden.flatten(0, -2).to(dtype)  # (B*S, D)
    weight = head.weight.to(dtype)
    bias = None if head.bias is None else head.bias.to(dtype)
    loss_fn = LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum", accum_dtype=torch.float32)
    with torch.autocast(device, enabled=False):  # the dtypes are set: autocast would only recast inside the kernel
        nll = loss_fn(weight, rows, targets, bias)
    return _mean(nll, targets, num_items_in_batch)


def next_token_targets(labels: torch.Tensor, shift_labels: torch.Tensor | None = None) -> torch.Tensor:
    """(B*S,) the target of each position: labels[t + 1] of its row (IGNORE_INDEX after the last), or `shift_labels`
    as given: HF's name for targets shifted already, as context parallelism shifts them before splitting a row."""
    if shift_labels is not None:
        return shift_labels.flatten()
    return F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].flatten()


def target_count(batch: dict) -> torch.Tensor:
    """The positions of a training batch that have a target (a 0-d tensor on its device)."""
    return (next_token_targets(batch["labels"], batch.get("shift_labels")) != IGNORE_INDEX).sum()


def _mean(nll: torch.Tensor, targets: torch.Tensor, num_items_in_batch: torch.Tensor | int | None) -> torch.Tensor:
    """The summed nll over `num_items_in_batch`, or over the targets that are not ignored when it is None."""
    if num_items_in_batch is None:
        return nll / (targets != IGNORE_INDEX).sum()
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(nll.device)
    return nll / num_items_in_batch


def _summed_nll(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy of one chunk: hidden (C, D), targets (C,); float32 logits as HF's loss upcasts them."""
    logits = head(hidden).float()  # (C, vocab)
    return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")


def check_loss_support(model: PreTrainedModel, loss_impl: str) -> None:
    """Raise ValueError unless `model`'s logits are a plain linear map of its decoder's last hidden states."""
    family = getattr(model.config, "model_type", None)
    if family not in CHUNKED_LOSS_FAMILIES:
        raise ValueError(
            f"train.loss_impl={loss_impl} supports the model families {', '.join(CHUNKED_LOSS_FAMILIES)}, not "
            f"{family!r} (its logits may be scaled or soft-capped); use train.loss_impl=plain"
        )
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(
            f"train.loss_impl={loss_impl} needs a linear output embedding; {type(model).__name__} has "
            f"{type(head).__name__}"
        )


def check_fused_loss_runs(device: torch.device) -> None:
    """Raise ValueError unless Liger-Kernel is installed and its Triton kernels can run on `device`."""
    try:
        import liger_kernel  # noqa: F401
    except ImportError as error:
        raise ValueError(
            "train.loss_impl=fused needs Liger-Kernel: pip install 'legalpt[fused]' (or use train.loss_impl=chunked)"
        ) from error
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"train.loss_impl=fused runs Liger-Kernel's Triton kernels, which need a CUDA device; the model is on "
            f"{device.type} (use train.loss_impl=chunked there)"
        )


def use_loss(model: PreTrainedModel, loss_impl: str, chunk_tokens: int = 4096) -> None:
    """Make `model(**batch, labels=..., num_items_in_batch=...)` return the `chunked` or `fused` loss, and no logits
    (`chunk_tokens`: the chunked loss's rows at a time).

    Without labels the model's own forward runs (logits for generation and scoring)."""
    check_loss_support(model, loss_impl)
    if loss_impl == "chunked":
        if chunk_tokens < 1:
            raise ValueError(f"train.loss_chunk_tokens: expected an integer >= 1, got {chunk_tokens}")
        loss_fn = partial(chunked_cross_entropy, chunk_tokens=chunk_tokens)
    elif loss_impl == "fused":
        check_fused_loss_runs(next(model.parameters()).device)
        loss_fn = fused_cross_entropy
    else:
        raise ValueError(f"train.loss_impl: expected chunked or fused to replace the model's loss, got {loss_impl!r}")

    def forward(input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None, **kwargs):
        if labels is None:
            # The class's forward, looked up per call: FSDP2 swaps the instance's class for a subclass.
            return type(model).forward(model, input_ids, **kwargs)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        shift_labels = kwargs.pop("shift_labels", None)
        kwargs.setdefault("use_cache", False)  # no cache is returned: building one would only hold every layer's K/V
        hidden = model.get_decoder()(input_ids, **kwargs).last_hidden_state  # (B, S, D)
        head = model.get_output_embeddings()
        return CausalLMOutputWithPast(loss=loss_fn(hidden, head, labels, num_items_in_batch, shift_labels=shift_labels))

    model.forward = forward
