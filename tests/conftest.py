"""Test setup shared by the whole suite: offline hubs and trackers, and the `cuda` marker's skip."""

import os

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import random

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng() -> random.Random:
    """A freshly seeded random source (torch seeded alike); the seed is printed so a failure can be replayed."""
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    torch.manual_seed(seed)
    return random.Random(seed)
