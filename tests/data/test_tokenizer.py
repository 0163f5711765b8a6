"""Tokenizers: BPE training on the corpus, its cache, checkpoint tokenizers loaded offline, pad and eos handling."""

import json
import random
import time

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from legalpt.config import MIN_BPE_VOCAB, DataConfig
from legalpt.data import tokenizer as tokenizer_module
from legalpt.data.tokenizer import BOS, EOS, PAD, get_tokenizer, train_bpe


@pytest.fixture
def texts():
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    rng = random.Random(seed)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 10))) for _ in range(400)]
    words += ["Section", "§", "Agreement", "Licensee", "F.3d", "v.", "supra", "id."]
    return [" ".join(rng.choices(words, k=rng.randint(200, 600))) + f"\n({i}) Tués ¶ 7." for i in range(60)]


def config(tmp_path, **overrides) -> DataConfig:
    return DataConfig(cache_dir=str(tmp_path / "cache"), **overrides)


def test_trained_bpe_round_trips_and_has_special_tokens(tmp_path, texts):
    tokenizer = get_tokenizer(config(tmp_path, vocab_size=600), texts)
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    assert 259 < len(tokenizer) <= 600
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (BOS, EOS, PAD)
    assert len({tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}) == 3
    for text in [*texts[:5], "Unseen: ½ ∑ 漢字 🙂 \t\n  spaces"]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.eos_token_id not in ids  # documents get their eos from packing, not from the tokenizer
        assert tokenizer.decode(ids) == text  # byte level: lossless, no unknown tokens
    # Merges were learned: frequent corpus words take fewer tokens than bytes.
    assert len(tokenizer(texts[0])["input_ids"]) < 0.6 * len(texts[0].encode())


def test_trained_tokenizer_is_cached(tmp_path, texts, monkeypatch):
    cfg = config(tmp_path, vocab_size=2000)
    texts = texts * 5  # enough text that training takes a measurable while
    start = time.perf_counter()
    first = get_tokenizer(cfg, texts)
    trained = time.perf_counter() - start
    assert list((tmp_path / "cache" / "tokenizers").glob("bpe-*.json")) != []

    def no_training(*args, **kwargs):
        raise AssertionError("the cached tokenizer should have been loaded")

    monkeypatch.setattr(tokenizer_module, "train_bpe", no_training)
    start = time.perf_counter()
    second = get_tokenizer(cfg, list(texts))
    loaded = time.perf_counter() - start
    assert loaded < trained / 3, (loaded, trained)
    assert second.get_vocab() == first.get_vocab()
    assert second(texts[3])["input_ids"] == first(texts[3])["input_ids"]
    assert (second.eos_token_id, second.pad_token_id) == (first.eos_token_id, first.pad_token_id)

    # Another corpus or another size is another tokenizer.
    monkeypatch.undo()
    get_tokenizer(cfg, texts[1:])
    get_tokenizer(config(tmp_path, vocab_size=1000), texts)
    assert len(list((tmp_path / "cache" / "tokenizers").glob("bpe-*.json"))) == 3


def test_pretrained_tokenizer_from_a_saved_folder(tmp_path, texts):
    trained = get_tokenizer(config(tmp_path, vocab_size=500), texts)
    trained.save_pretrained(tmp_path / "checkpoint")
    for cfg, pretrained in [
        (config(tmp_path, tokenizer=str(tmp_path / "checkpoint")), None),
        (config(tmp_path), str(tmp_path / "checkpoint")),
        (config(tmp_path, tokenizer=str(tmp_path / "checkpoint")), "/no/such/model"),  # data.tokenizer wins
    ]:
        loaded = get_tokenizer(cfg, [], pretrained)
        assert loaded(texts[0])["input_ids"] == trained(texts[0])["input_ids"]
        assert (loaded.eos_token, loaded.pad_token) == (EOS, PAD)


def test_missing_pad_becomes_eos_and_missing_eos_is_an_error(tmp_path):
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.add_special_tokens(["</s>"])
    backend.add_tokens(list("abc "))
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>").save_pretrained(tmp_path / "no pad")
    PreTrainedTokenizerFast(tokenizer_object=backend).save_pretrained(tmp_path / "no eos")

    tokenizer = get_tokenizer(config(tmp_path), [], str(tmp_path / "no pad"))
    assert tokenizer.pad_token == "</s>" and tokenizer.pad_token_id == tokenizer.eos_token_id
    with pytest.raises(ValueError, match="no eos token"):
        get_tokenizer(config(tmp_path), [], str(tmp_path / "no eos"))


def test_the_smallest_vocabulary_is_the_bytes_and_the_special_tokens(texts):
    # No merge fits in it; a smaller size would still get every byte and special token, so it would not be honoured.
    smallest = train_bpe(texts, MIN_BPE_VOCAB)
    assert len(smallest) == MIN_BPE_VOCAB and not json.loads(smallest.backend_tokenizer.to_str())["model"]["merges"]
    with pytest.raises(ValueError, match=rf"data\.vocab_size: expected at least {MIN_BPE_VOCAB}"):
        train_bpe(texts, MIN_BPE_VOCAB - 1)


def test_bad_training_input(tmp_path, texts):
    with pytest.raises(ValueError, match=r"data\.vocab_size"):
        get_tokenizer(config(tmp_path, vocab_size=100), texts)
    with pytest.raises(ValueError, match="at least one text"):
        get_tokenizer(config(tmp_path), [])
