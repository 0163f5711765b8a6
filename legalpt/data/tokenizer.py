"""Tokenizers: a checkpoint's own (through AutoTokenizer), or a byte-level BPE trained on the corpus and cached;
either one optionally extended with legal tokens; and their tokens per byte on legal text.

The trained BPE has three special tokens: <|bos|>, <|endoftext|> (eos, closes every packed document) and <|pad|>.
It is cached under `<cache_dir>/tokenizers/`, keyed by the corpus fingerprint and the vocabulary size, so a second
run on the same corpus loads it instead of training. Every tokenizer returned has an eos and a pad token.

Extension appends whole strings as added tokens (matched in the raw text before pre-tokenization, so a token may span
what the pre-tokenizer would split, as "F. Supp. 2d" does): reporter abbreviations of reporters-db seen in citations
of the corpus, then frequent words of the corpus, each ranked by the tokens it saves on the corpus. The chosen strings
are cached beside the trained BPEs. New ids follow the old ones, so the old ids keep their meaning, and
`legalpt.model.extend_embeddings` gives a model rows for them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path

import datasets
import reporters_db
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from legalpt.config import MIN_BPE_VOCAB, DataConfig
from legalpt.data.sources import corpus_fingerprint, text_batches

BOS, EOS, PAD = "<|bos|>", "<|endoftext|>", "<|pad|>"
MINE_CHARACTERS = 16_000_000  # characters of the corpus mined for legal tokens (enough for stable counts, and fast)
MEASURE_CHARACTERS = 4_000_000  # characters of text that tokens per byte are measured on
# A string found in one document only is that document's name or jargon, not the corpus's, whatever it would save.
_MIN_DOCUMENTS = 2
_WORD = re.compile(r" ?[^\W\d_]{2,}")  # a run of letters with its leading space: what a byte-level BPE sees as a word


def get_tokenizer(
    cfg: DataConfig, texts_or_dataset: datasets.Dataset | Sequence[str], pretrained: str | None = None
) -> PreTrainedTokenizerFast:
    """`cfg.tokenizer`, else `pretrained`'s tokenizer, else a BPE of `cfg.vocab_size` trained on the texts (cached)."""
    name = cfg.tokenizer or pretrained
    if name:
        tokenizer = load_tokenizer(name)
    else:
        tokenizer = _cached_bpe(texts_or_dataset, cfg.vocab_size, Path(cfg.cache_dir).expanduser() / "tokenizers")
    if tokenizer.eos_token_id is None:
        raise ValueError(f"data.tokenizer: {tokenizer.name_or_path!r} has no eos token, which ends every document")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # pad positions carry no loss, so any id will do
    return tokenizer


def check_vocab_size(vocab_size: int) -> None:
    """A trained vocabulary holds at least the 256 bytes of its alphabet and the three special tokens."""
    if vocab_size < MIN_BPE_VOCAB:
        raise ValueError(
            f"data.vocab_size: expected at least {MIN_BPE_VOCAB} (bytes + special tokens), got {vocab_size}"
        )


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


def extend_tokenizer(
    tokenizer: PreTrainedTokenizerFast, texts: datasets.Dataset | Sequence[str], extra_tokens: int, cache_dir: str
) -> tuple[PreTrainedTokenizerFast, dict[str, list[str]]]:
    """A copy of `tokenizer` with up to `extra_tokens` legal tokens mined from `texts` appended after its ids, and the
    strings added ({"reporters": [...], "terms": [...]}); the choice is cached under `<cache_dir>/tokenizers/`."""
    if extra_tokens < 1:
        raise ValueError(f"data.extra_tokens: expected at least 1 token to add, got {extra_tokens}")
    recipe = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    source = f"{tokenizer.backend_tokenizer.to_str()}-{corpus_fingerprint(texts)}-{extra_tokens}-{recipe}"
    key = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = Path(cache_dir).expanduser() / "tokenizers" / f"legal-{key}.json"
    if path.exists():
        added = json.loads(path.read_text())
    else:
        added = legal_tokens(tokenizer, texts, extra_tokens)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps(added, indent=1))
        os.replace(partial, path)
    extended = copy.deepcopy(tokenizer)
    # normalized=False: matched in the text as written, so decoding gives back that text.
    extended.add_tokens([AddedToken(s, normalized=False) for s in added["reporters"] + added["terms"]])
    return extended, added


def legal_tokens(
    tokenizer: PreTrainedTokenizerFast, texts: datasets.Dataset | Sequence[str], budget: int
) -> dict[str, list[str]]:
    """Up to `budget` strings worth one token each: reporter abbreviations, then words, found in at least two
    documents of (the first MINE_CHARACTERS of) `texts` and ranked by tokens saved = count × (tokens under
    `tokenizer` − 1).

    Abbreviations are counted between a volume and a page number ("347 U.S. 483"), words as runs of letters; both
    with their leading space, the way they appear in running text."""
    reporters, words, documents = Counter(), Counter(), Counter()
    for text in _head(texts, MINE_CHARACTERS):
        found_reporters = Counter(match.group(1) for match in _reporter_pattern().finditer(text))
        found_words = Counter(_WORD.findall(text))
        reporters.update(found_reporters)
        words.update(found_words)
        documents.update(found_reporters.keys() | found_words.keys())
    chosen_reporters = _by_savings(tokenizer, reporters, documents, budget)
    # The most frequent words are the candidates: a rare word cannot save much, however many tokens it takes.
    words = Counter(dict(words.most_common(50 * budget)))
    chosen_terms = _by_savings(tokenizer, words, documents, budget - len(chosen_reporters))
    return {"reporters": chosen_reporters, "terms": chosen_terms}


def tokens_per_byte(tokenizer: PreTrainedTokenizerFast, texts: Iterable[str]) -> float:
    """Tokens per UTF-8 byte of `texts` (lower is better compression), encoded as packing encodes documents: no special
    tokens added, and special-token strings in the text read as text."""
    backend = copy.deepcopy(tokenizer.backend_tokenizer)
    backend.encode_special_tokens = True
    texts = list(texts)
    num_bytes = sum(len(text.encode("utf-8", "surrogatepass")) for text in texts)
    if num_bytes == 0:
        raise ValueError("texts: expected some text to measure tokens per byte on, got none")
    encodings = backend.encode_batch_fast(texts, add_special_tokens=False)
    return sum(len(encoding.ids) for encoding in encodings) / num_bytes


def compare_tokenizers(
    tokenizers: Mapping[str, PreTrainedTokenizerFast], texts: datasets.Dataset | Sequence[str]
) -> dict[str, float]:
    """Tokens per byte of each named tokenizer on the same text (the first MEASURE_CHARACTERS of `texts`)."""
    sample = list(_head(texts, MEASURE_CHARACTERS))
    return {name: tokens_per_byte(tokenizer, sample) for name, tokenizer in tokenizers.items()}


def load_tokenizer(name: str) -> PreTrainedTokenizerFast:
    """A checkpoint's fast tokenizer by HF folder or hub id."""
    tokenizer = AutoTokenizer.from_pretrained(name)
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise TypeError(f"data.tokenizer: {name!r} has no fast (tokenizers-backed) tokenizer")
    return tokenizer


@cache
def _reporter_pattern() -> re.Pattern:
    # Every edition and variant spelling, longest first so "F. Supp. 2d" wins over "F."; between a volume and a page
    # number, so that "A." as an initial or "York" in a name is not counted as a reporter.
    names = sorted({*reporters_db.EDITIONS, *reporters_db.VARIATIONS_ONLY}, key=len, reverse=True)
    return re.compile(r"(?<=\d)( (?:" + "|".join(map(re.escape, names)) + r"))(?= \d)")


def _by_savings(tokenizer: PreTrainedTokenizerFast, counts: Counter, documents: Counter, budget: int) -> list[str]:
    """The `budget` strings of `counts` found in _MIN_DOCUMENTS `documents` or more that save the most tokens (ties by
    string)."""
    candidates = sorted(s for s in counts if documents[s] >= _MIN_DOCUMENTS)
    if budget <= 0 or not candidates:
        return []
    lengths = [len(ids) for ids in tokenizer(candidates, add_special_tokens=False)["input_ids"]]
    savings = {s: counts[s] * (n - 1) for s, n in zip(candidates, lengths, strict=True) if n > 1}
    return sorted(savings, key=lambda s: (-savings[s], s))[:budget]


def _head(texts: datasets.Dataset | Sequence[str], characters: int) -> Iterable[str]:
    """The texts, in order, until `characters` characters are reached (the last one whole)."""
    seen = 0
    for batch in text_batches(texts):
        for text in batch:
            if seen >= characters:
                return
            seen += len(text)
            yield text
