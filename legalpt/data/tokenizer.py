"""Tokenizers: a checkpoint's own (through AutoTokenizer), or a byte-level BPE trained on the corpus and cached;
either one optionally extended with legal tokens; and their tokens per byte on legal text.

The trained BPE has three special tokens: <|bos|>, <|endoftext|> (eos, closes every packed document) and <|pad|>.
It is cached under `<cache_dir>/tokenizers/`, keyed by the corpus fingerprint and the vocabulary size, so a second
run on the same corpus loads it instead of training. Every tokenizer returned has an eos and a pad token.

Extension adds two kinds of token to a BPE tokenizer, each chosen greedily by the tokens it saves on the mining
text, measured by tokenizing that text with and without it:
- reporter abbreviations of reporters-db seen in citations of the corpus, as added tokens: they span what the
  pre-tokenizer splits ("F. Supp. 2d"), so they are matched in the raw text before pre-tokenization;
- BPE merges learned on the corpus's words, continuing the base tokenizer's training. The words are the base
  pre-tokenizer's pieces (with their leading space), so a new token only joins tokens inside one word; appended after
  the old merges, a merge can only shorten an encoding, never lengthen one. Words of e-mails, URLs, paths, numbers,
  ids and mixed-case strings are not mined.
Every CHECK_EVERY-th document is kept out of mining, and the extension is applied only when it lowers the tokens per
byte of those documents. The choice and its check are cached beside the trained BPEs. New ids follow the old ones, so
the old ids keep their meaning, and `legalpt.model.extend_embeddings` gives a model rows for them.
"""

from __future__ import annotations

import copy
import hashlib
import heapq
import itertools
import json
import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import datasets
import reporters_db
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from legalpt.config import MIN_BPE_VOCAB, DataConfig
from legalpt.data.sources import corpus_fingerprint, text_batches

BOS, EOS, PAD = "<|bos|>", "<|endoftext|>", "<|pad|>"
MINE_CHARACTERS = 16_000_000  # characters of the corpus mined for legal tokens (enough for stable counts, and fast)
MEASURE_CHARACTERS = 4_000_000  # characters of text that tokens per byte are measured on
CHECK_EVERY = 5  # documents 1, 6, 11, ... are not mined: the extension is checked on them
# A string found in one document only is that document's name or jargon, not the corpus's, whatever it would save.
_MIN_DOCUMENTS = 2
_MIN_SAVING = 2  # tokens a new token must save on the mining text to be worth an id
_CONTEXT = 32  # characters around a reporter abbreviation that its saving is measured on, widened to a space
# A word as a pre-tokenizer gives it: two or more letters, with the leading space (byte level) or "▁" (metaspace).
_LETTER_WORD = re.compile(r"[ ▁]?([^\W\d_]{2,})")
# A whitespace-separated chunk with an "@", a slash, an underscore, a digit or a dot between letters: an e-mail, URL,
# path, number, id or dotted code, whose letters are parts of an address or a code, not words.
_JUNK_CHUNK = re.compile(r"(?<!\S)\S*?(?:[@/\\_\d]|[^\W\d_]\.[^\W\d_])\S*")


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
) -> tuple[PreTrainedTokenizerFast, dict[str, Any]]:
    """`tokenizer` extended with up to `extra_tokens` legal tokens mined from `texts` (`legal_tokens`), and what was
    chosen and checked: {"reporters", "terms", "merges", "check": {"documents", "base", "extended", "applied"}}.

    The check measures tokens per byte, before and after, on the documents not mined (every CHECK_EVERY-th); when
    the extension does not lower it, `tokenizer` itself is returned. The result is cached under
    `<cache_dir>/tokenizers/`."""
    if extra_tokens < 1:
        raise ValueError(f"data.extra_tokens: expected at least 1 token to add, got {extra_tokens}")
    _check_extensible(tokenizer)
    recipe = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    source = f"{tokenizer.backend_tokenizer.to_str()}-{corpus_fingerprint(texts)}-{extra_tokens}-{recipe}"
    key = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = Path(cache_dir).expanduser() / "tokenizers" / f"legal-{key}.json"
    if path.exists():
        added = json.loads(path.read_text())
        extended = with_legal_tokens(tokenizer, added)
    else:
        mining, check = _split_for_check(texts)
        added = legal_tokens(tokenizer, mining, extra_tokens)
        extended = with_legal_tokens(tokenizer, added)
        added["check"] = _check_extension(tokenizer, extended, check)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps(added, indent=1))
        os.replace(partial, path)
    return (extended if added["check"]["applied"] else tokenizer), added


def legal_tokens(tokenizer: PreTrainedTokenizerFast, texts: Sequence[str], budget: int) -> dict[str, list]:
    """Up to `budget` new tokens for `texts`: {"reporters": [...], "merges": [[left, right, saved], ...], "terms":
    [...]} (a merge's term is its token as text), chosen greedily by tokens saved on `texts`.

    Reporter abbreviations come first: those found between a volume and a page number ("347 U.S. 483") in at least
    two documents, each saving at least _MIN_SAVING tokens where it occurs. Merges follow, on the words found in at
    least two documents."""
    backend = tokenizer.backend_tokenizer
    reporters = _choose_reporters(backend, texts, budget)
    taken = _added_pattern(reporters)
    counts, documents = Counter(), Counter()
    for text in texts:
        # Where an abbreviation is one token, its words are not there to merge.
        found = Counter(_words(backend, taken.sub(_blank, text) if taken else text))
        counts.update(found)
        documents.update(found.keys())
    words = sorted(word for word in counts if documents[word] >= _MIN_DOCUMENTS)
    pieces = [[token.value for token in backend.model.tokenize(word)] for word in words]
    merges = continue_bpe(pieces, [counts[word] for word in words], tokenizer.get_vocab(), budget - len(reporters))
    decode = backend.decoder.decode if backend.decoder else "".join
    return {"reporters": reporters, "merges": merges, "terms": [decode([left + right]) for left, right, _ in merges]}


def with_legal_tokens(tokenizer: PreTrainedTokenizerFast, added: Mapping[str, list]) -> PreTrainedTokenizerFast:
    """A copy of `tokenizer` with `added`'s reporter abbreviations as added tokens, then its merges appended to the
    BPE model (after the old ones, so they apply only where no old merge does), with ids after every old id."""
    extended = copy.deepcopy(tokenizer)
    # normalized=False: matched in the text as written, so decoding gives back that text.
    extended.add_tokens([AddedToken(s, normalized=False) for s in added["reporters"]])
    state = json.loads(extended.backend_tokenizer.to_str())
    model = state["model"]
    # Loading a tokenizer gives an added token the model's id for its text, else the next id after the model's: with
    # merges' ids after the added tokens' (a checkpoint's special tokens follow its BPE vocabulary), the added tokens
    # would move. Held in the model's vocabulary too, they keep their ids; no merge makes them, so BPE is unchanged.
    for token in state["added_tokens"]:
        model["vocab"].setdefault(token["content"], token["id"])
    next_id = max(model["vocab"].values()) + 1
    as_strings = bool(model["merges"]) and isinstance(model["merges"][0], str)  # the older "left right" format
    for left, right, _ in added["merges"]:
        model["vocab"][left + right] = next_id
        next_id += 1
        model["merges"].append(f"{left} {right}" if as_strings else [left, right])
    # The wrapper keeps its special tokens and settings; only the Rust tokenizer under it changes.
    extended._tokenizer = Tokenizer.from_str(json.dumps(state))
    if not extended.get_vocab().items() >= tokenizer.get_vocab().items():
        raise ValueError(f"tokenizer: {tokenizer.name_or_path!r} did not keep its ids when extended")
    return extended


def continue_bpe(
    words: list[list[str]], counts: Sequence[int], vocab: Iterable[str], budget: int
) -> list[list[str | int]]:
    """BPE training continued from `words`, each a word's tokens under the base tokenizer, seen `counts` times: up to
    `budget` merges [left, right, saved], each of the adjacent pair whose merge saves the most tokens now (ties by
    the pair), as long as it saves at least _MIN_SAVING. A merge must make a token not in `vocab`: joining into an
    existing token could let old merges continue from it, which the counts here would not see. `words` is updated."""
    saves: Counter = Counter()  # pair -> tokens its merge would save now
    holders: dict[tuple[str, str], set[int]] = defaultdict(set)  # pair -> the words that hold it
    for i, word in enumerate(words):
        for pair, n in _pairs(word).items():
            saves[pair] += n * counts[i]
            holders[pair].add(i)
    heap = [(-n, pair) for pair, n in saves.items()]
    heapq.heapify(heap)
    known, merges = set(vocab), []
    while heap and len(merges) < budget:
        negative, pair = heapq.heappop(heap)
        if -negative != saves[pair] or pair[0] + pair[1] in known:
            continue  # an outdated count (the pair's current one is in the heap too), or no new token
        if -negative < _MIN_SAVING:
            break
        merged = pair[0] + pair[1]
        changed = set()
        for i in holders.pop(pair):
            before = _pairs(words[i])
            words[i] = _merge(words[i], pair, merged)
            after = _pairs(words[i])
            for other in before.keys() | after.keys():
                if delta := (after[other] - before[other]) * counts[i]:
                    saves[other] += delta
                    changed.add(other)
                if after[other]:
                    holders[other].add(i)
                elif other != pair:
                    holders[other].discard(i)
        for other in changed:
            heapq.heappush(heap, (-saves[other], other))
        known.add(merged)
        merges.append([pair[0], pair[1], -negative])
    return merges


def _pairs(word: Sequence[str]) -> Counter:
    """The adjacent pairs of `word`, each counted as often as merging it would apply: left to right, without overlap
    ("a a a" merges once), as a BPE encoder merges one pair."""
    found, previous = Counter(), None
    for pair in itertools.pairwise(word):
        if pair == previous:
            previous = None  # overlaps the same pair just counted
            continue
        found[pair] += 1
        previous = pair
    return found


def _merge(word: list[str], pair: tuple[str, str], merged: str) -> list[str]:
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(merged)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def _words(backend: Tokenizer, text: str) -> Iterator[str]:
    """The pieces of `text` that the pre-tokenizer of `backend` makes of its words (letters only, one case pattern:
    lower, Title or UPPER), leaving out the chunks of e-mails, URLs, paths, numbers and ids."""
    text = _JUNK_CHUNK.sub(_blank, text)
    if backend.normalizer is not None:
        text = backend.normalizer.normalize_str(text)
    for piece, (start, end) in backend.pre_tokenizer.pre_tokenize_str(text):
        match = _LETTER_WORD.fullmatch(text, start, end)
        if match and (letters := match.group(1)) and (letters.islower() or letters.isupper() or letters.istitle()):
            yield piece


def _choose_reporters(backend: Tokenizer, texts: Sequence[str], budget: int) -> list[str]:
    """Up to `budget` reporter abbreviations, greedily by the tokens each saves as an added token around its
    occurrences (anywhere, as an added token matches), given those chosen before it."""
    documents = Counter()
    for text in texts:
        documents.update({match.group(1) for match in _reporter_pattern().finditer(text)})
    candidates = sorted(name for name, n in documents.items() if n >= _MIN_DOCUMENTS)
    contexts = {name: [piece for text in texts for piece in _contexts(text, name)] for name in candidates}
    chosen: list[str] = []

    def saving(name: str) -> int:
        return _count_tokens(backend, contexts[name], chosen) - _count_tokens(backend, contexts[name], [*chosen, name])

    # Lazy greedy: a saving measured before other abbreviations were chosen bounds the saving now.
    heap = [(-saving(name), name) for name in candidates]
    heapq.heapify(heap)
    while heap and len(chosen) < budget:
        _, name = heapq.heappop(heap)
        now = saving(name)
        if heap and now < -heap[0][0]:
            heapq.heappush(heap, (-now, name))
        elif now < _MIN_SAVING:
            break
        else:
            chosen.append(name)
    return chosen


def _contexts(text: str, string: str) -> list[str]:
    """The stretches of `text` around each occurrence of `string`, _CONTEXT characters on each side widened to a
    space (overlapping stretches joined): an added token changes how the text is split next to it, not further."""
    spans: list[list[int]] = []
    start = text.find(string)
    while start >= 0:
        left = max(text.rfind(" ", 0, max(start - _CONTEXT, 0)), 0)
        right = text.find(" ", start + len(string) + _CONTEXT)
        right = len(text) if right < 0 else right
        if spans and left <= spans[-1][1]:
            spans[-1][1] = right
        else:
            spans.append([left, right])
        start = text.find(string, start + 1)
    return [text[left:right] for left, right in spans]


def _count_tokens(backend: Tokenizer, texts: Sequence[str], added: Sequence[str]) -> int:
    """Tokens of `texts` under `backend` with the strings `added` as added tokens, matched as the tokenizers library
    matches them: in the raw text, leftmost and longest first, one token each, the text between encoded on its own."""
    pieces, matches = list(texts), 0
    if pattern := _added_pattern(added):
        split = [pattern.split(text) for text in texts]
        matches = sum(len(parts) - 1 for parts in split)
        pieces = [part for parts in split for part in parts if part]
    return matches + sum(len(encoding.ids) for encoding in _plain(backend).encode_batch_fast(pieces, False))


def _added_pattern(added: Sequence[str]) -> re.Pattern | None:
    """A pattern that finds the strings `added` as the tokenizers library finds added tokens: leftmost, and the
    longest of those starting there (an alternation tries its branches in order); None for no strings."""
    return re.compile("|".join(map(re.escape, sorted(added, key=len, reverse=True)))) if added else None


def _blank(match: re.Match) -> str:
    """Spaces as long as the match: the words around a blanked stretch keep their leading-space form."""
    return " " * len(match.group())


def _plain(backend: Tokenizer) -> Tokenizer:
    """A copy of `backend` that reads special-token strings in the text as text, as packing encodes documents."""
    backend = copy.deepcopy(backend)
    backend.encode_special_tokens = True
    return backend


def _split_for_check(texts: datasets.Dataset | Sequence[str]) -> tuple[list[str], list[str]]:
    """The documents to mine (up to MINE_CHARACTERS) and those to check the extension on (every CHECK_EVERY-th from
    the second, up to MEASURE_CHARACTERS)."""
    mining, check, mined, checked = [], [], 0, 0
    for i, text in enumerate(text for batch in text_batches(texts) for text in batch):
        if i % CHECK_EVERY == 1:
            if checked < MEASURE_CHARACTERS:
                check.append(text)
                checked += len(text)
        elif mined < MINE_CHARACTERS:
            mining.append(text)
            mined += len(text)
        elif checked >= MEASURE_CHARACTERS:
            break
    return mining, check


def _check_extension(
    base: PreTrainedTokenizerFast, extended: PreTrainedTokenizerFast, check: Sequence[str]
) -> dict[str, Any]:
    """Tokens per byte of the `check` documents under `base` and `extended`; applied: `extended` is lower."""
    if not check:
        return {"documents": 0, "base": None, "extended": None, "applied": False}
    before, after = tokens_per_byte(base, check), tokens_per_byte(extended, check)
    return {"documents": len(check), "base": before, "extended": after, "applied": after < before}


def _check_extensible(tokenizer: PreTrainedTokenizerFast) -> None:
    """Extension appends merges to a BPE model whose tokens join by plain concatenation, on a pre-tokenizer's words."""
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    model = state["model"]
    name = tokenizer.name_or_path or "the trained BPE"
    if model["type"] != "BPE" or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise ValueError(
            f"data.extend_tokenizer: expected a BPE tokenizer without subword prefix or suffix to append merges to; "
            f"{name!r} has a {model['type']} model"
        )
    if state["pre_tokenizer"] is None:
        raise ValueError(f"data.extend_tokenizer: expected a tokenizer with a pre-tokenizer (words to mine); "
                         f"{name!r} has none")  # fmt: skip


def tokens_per_byte(tokenizer: PreTrainedTokenizerFast, texts: Iterable[str]) -> float:
    """Tokens per UTF-8 byte of `texts` (lower is better compression), encoded as packing encodes documents: no special
    tokens added, and special-token strings in the text read as text."""
    backend = _plain(tokenizer.backend_tokenizer)
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


def _head(texts: datasets.Dataset | Sequence[str], characters: int) -> Iterable[str]:
    """The texts, in order, until `characters` characters are reached (the last one whole)."""
    seen = 0
    for batch in text_batches(texts):
        for text in batch:
            if seen >= characters:
                return
            seen += len(text)
            yield text
