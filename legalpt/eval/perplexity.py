"""Held-out language-modelling loss and perplexity, token-weighted over packed batches.

One definition used by the trainer's periodic evaluation and by `legalpt-eval`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from itertools import islice

import torch

IGNORE_INDEX = -100  # label of tokens that are not predicted (document starts, padding)


@torch.no_grad()
def heldout_loss(
    model: torch.nn.Module,
    batches: Iterable[dict],
    max_batches: int = 0,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
) -> dict[str, float]:
    """Mean next-token cross-entropy (nats) and perplexity over `batches` (0 = all of them).

    Each batch is a packed batch with `labels`; HF shifts labels inside the model, so a token counts when the label
    after it is not IGNORE_INDEX. `reduce_sum` sums across processes (accelerate's reduce) so every rank agrees.
    """
    was_training = model.training
    model.eval()
    nll = torch.zeros((), dtype=torch.float64)
    tokens = torch.zeros((), dtype=torch.float64)
    for batch in islice(batches, max_batches or None):
        count = (batch["labels"][:, 1:] != IGNORE_INDEX).sum()
        loss = model(**batch).loss
        nll += (loss.double() * count).cpu()
        tokens += count.cpu()
    model.train(was_training)
    device = next(model.parameters()).device
    nll, tokens = reduce_sum(nll.to(device)), reduce_sum(tokens.to(device))
    if tokens.item() == 0:
        raise ValueError("held-out evaluation saw no predicted tokens: the held-out split is empty")
    mean = (nll / tokens).item()
    return {"loss": mean, "perplexity": math.exp(mean), "tokens": int(tokens.item())}
