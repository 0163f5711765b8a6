"""Tokenizers: a checkpoint's own (through AutoTokenizer), or a byte-level BPE trained on the corpus and cached.

The trained BPE has three special tokens: <|bos|>, <|endoftext|> (eos, closes every packed document) and <|pad|>.
It is cached under `<cache_dir>/tokenizers/`, keyed by the corpus fingerprint and the vocabulary size, so a second
run on the same corpus loads it instead of training. Every tokenizer returned has an eos and a pad token.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import datasets
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from legalpt.config import DataConfig
from legalpt.data.sources import corpus_fingerprint, text_batches

BOS, EOS, PAD = "<|bos|>", "<|endoftext|>", "<|pad|>"
_BYTES = 256  # the byte-level alphabet every trained vocabulary starts from


def get_tokenizer(
    cfg: DataConfig, texts_or_dataset: datasets.Dataset | Sequence[str], pretrained: str | None = None
) -> PreTrainedTokenizerFast:
    """`cfg.tokenizer`, else `pretrained`'s tokenizer, else a BPE of `cfg.vocab_size` trained on the texts (cached)."""
    name = cfg.tokenizer or pretrained
    if name:
        tokenizer = AutoTokenizer.from_pretrained(name)
        if not isinstance(tokenizer, PreTrainedTokenizerFast):
            raise TypeError(f"data.tokenizer: {name!r} has no fast (tokenizers-backed) tokenizer")
    else:
        tokenizer = _cached_bpe(texts_or_dataset, cfg.vocab_size, Path(cfg.cache_dir).expanduser() / "tokenizers")
    if tokenizer.eos_token_id is None:
        raise ValueError(f"data.tokenizer: {tokenizer.name_or_path!r} has no eos token, which ends every document")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # pad positions carry no loss, so any id will do
    return tokenizer


def check_vocab_size(vocab_size: int) -> None:
    """A trained vocabulary holds at least the 256 bytes and the three special tokens."""
    if vocab_size < _BYTES + 3:
        raise ValueError(f"data.vocab_size: expected at least {_BYTES + 3} (bytes + special tokens), got {vocab_size}")


def train_bpe(texts: datasets.Dataset | Sequence[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE with at most `vocab_size` tokens (fewer when the texts run out of merges)."""
    check_vocab_size(vocab_size)
    if len(texts) == 0:
        raise ValueError("texts_or_dataset: expected at least one text to train the tokenizer on")
    tokenizer = Tokenizer(models.BPE())
    # Byte level: any text encodes without unknown tokens, and decoding gives back the exact text.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(text_batches(texts), trainer)
    return _wrap(tokenizer, name="")


def _cached_bpe(texts: datasets.Dataset | Sequence[str], vocab_size: int, cache: Path) -> PreTrainedTokenizerFast:
    check_vocab_size(vocab_size)
    # This module's code is part of the key: change the training recipe, and old tokenizers are not reused.
    recipe = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    key = hashlib.sha256(f"{corpus_fingerprint(texts)}-{vocab_size}-{recipe}".encode()).hexdigest()[:16]
    path = cache / f"bpe-{key}.json"
    if path.exists():
        return _wrap(Tokenizer.from_file(str(path)), name=str(path))
    tokenizer = train_bpe(texts, vocab_size)
    cache.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")  # write, then rename: readers never see half a file
    tokenizer.backend_tokenizer.save(str(partial))
    os.replace(partial, path)
    tokenizer.name_or_path = str(path)
    return tokenizer


def _wrap(tokenizer: Tokenizer, name: str) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=PAD, name_or_path=name
    )
