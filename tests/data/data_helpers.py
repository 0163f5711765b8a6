"""Helpers of the data tests: random documents, and files read as `data=files` reads them."""

from __future__ import annotations

import random
from pathlib import Path

from legalpt.config import DataConfig
from legalpt.data.sources import load_documents

WORDS = ["the", "lessee", "court", "held", "notice", "river", "shall", "page", "motion", "data", "agreed", "section"]


def random_text(rng: random.Random, words: int = 40) -> str:
    """Random words of random letters, some of them multi-byte."""
    return " ".join("".join(rng.choices("abcdefghijklmnopqrstuvwxyzé§", k=rng.randint(1, 9))) for _ in range(words))


def text(rng: random.Random, low: int = 20, high: int = 200) -> str:
    """Between `low` and `high` legal-sounding words."""
    return " ".join(rng.choices(WORDS, k=rng.randint(low, high)))


def load(tmp_path: Path, *paths, **overrides):
    """The documents and skip report of reading `paths` as `data=files` would."""
    cfg = DataConfig(paths=[str(p) for p in paths], cache_dir=str(tmp_path / "cache"), **overrides)
    documents, report = load_documents(cfg)
    return list(documents), report
