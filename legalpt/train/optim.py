"""AdamW with decoupled weight decay on matrices only, and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch

from legalpt.config import TrainConfig


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW that decays weight matrices and embeddings but not norms and biases (decaying gains hurts)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    # The fused kernel exists only for accelerator tensors; on CPU the foreach path is the fast one.
    fused = all(p.device.type == "cuda" for p in params)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), fused=fused or None)


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of `cfg.lr` at optimizer step `step`: linear warmup, then cosine down to `min_lr_ratio`."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """Per-optimizer-step schedule, stepped by the trainer (not accelerate) so it means the same at any world size."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
