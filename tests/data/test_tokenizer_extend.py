"""Tokenizer extension with legal tokens: the tokens chosen, their round trip, their embedding rows, tokens per byte."""

import json
import re
from collections import Counter
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from legalpt.config import DataConfig, ModelConfig, compose
from legalpt.data import tokenizer as tokenizer_module
from legalpt.data.pipeline import format_stats, prepare, split_corpus
from legalpt.data.tokenizer import (
    compare_tokenizers,
    extend_tokenizer,
    legal_tokens,
    tokens_per_byte,
    train_bpe,
)
from legalpt.model import build_model, extend_embeddings
from legalpt.train.trainer import train

REPORTERS = ["F.3d", "F. Supp. 2d", "U.S.", "S. Ct."]
# Overrides of the tiny model preset: these tests look only at embedding rows, which one narrow layer holds
SMALL = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64, "attn_implementation": "eager"}


@pytest.fixture
def texts(rng) -> list[str]:
    """Documents of random words separated by single spaces, with case citations to the four REPORTERS."""
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 12))) for _ in range(300)]
    words += ["indemnification", "notwithstanding", "Licensee", "hereinafter"]
    documents = []
    for _ in range(30):
        parts = rng.choices(words, k=rng.randint(100, 300))
        for _ in range(rng.randint(2, 6)):
            citation = f"{rng.randint(1, 999)} {rng.choice(REPORTERS)} {rng.randint(1, 1999)}"
            parts.insert(rng.randrange(len(parts)), citation)
        documents.append(" ".join(parts))
    return documents


@pytest.fixture
def base(texts) -> PreTrainedTokenizerFast:
    return train_bpe(texts, 400)


def test_reporter_abbreviations_become_one_token_and_text_round_trips(tmp_path, texts, base):
    extended, added = extend_tokenizer(base, texts, 64, str(tmp_path))
    assert {f" {r}" for r in REPORTERS} <= set(added["reporters"])
    assert len(added["reporters"]) + len(added["terms"]) <= 64 and added["terms"]
    assert len(extended) == len(base) + len(added["reporters"]) + len(added["terms"])
    assert extended.get_vocab().items() >= base.get_vocab().items()  # old ids keep their meaning

    citation = "See Smith v. Jones, 530 F. Supp. 2d 112, aff'd 12 F.3d 7, cert. denied 347 U.S. 483 (1954)."
    ids = extended(citation, add_special_tokens=False)["input_ids"]
    for reporter in ("F. Supp. 2d", "F.3d", "U.S."):
        assert len(base(f" {reporter}", add_special_tokens=False)["input_ids"]) > 1
        assert extended.convert_tokens_to_ids(f" {reporter}") in ids
    assert len(ids) < len(base(citation, add_special_tokens=False)["input_ids"])

    # Every new id decodes to its text and that text encodes back to the id; whole texts stay lossless.
    for i in range(len(base), len(extended)):
        assert extended(extended.decode([i]), add_special_tokens=False)["input_ids"] == [i]
    for text in [*texts[:3], citation, "Unseen: ½ ∑ 漢字 🙂 \t\n F.3d at the start U.S.C. §"]:
        assert extended.decode(extended(text, add_special_tokens=False)["input_ids"]) == text


def test_terms_are_the_words_that_save_the_most_tokens(rng, texts, base):
    budget = 12
    added = legal_tokens(base, texts, budget)
    # Reference: the texts are single-space separated, so str.split finds each word; a word after a space carries
    # it, the first word of a document does not. Citations are not words (digits, dots).
    counts, documents = Counter(), Counter()
    for text in texts:
        first, *rest = text.split(" ")
        found = [first] + [f" {word}" for word in rest]
        counts.update(found)
        documents.update(set(found))
    counts = {w: n for w, n in counts.items() if re.fullmatch(r" ?[a-zA-Z]{2,}", w) and documents[w] >= 2}
    savings = {w: n * (len(base(w, add_special_tokens=False)["input_ids"]) - 1) for w, n in counts.items()}
    best = sorted((s for s in savings.values() if s > 0), reverse=True)
    budget_left = budget - len(added["reporters"])
    assert [savings[w] for w in added["terms"]] == best[:budget_left]

    # Saved tokens, not frequency or length alone: 4 × (6 - 1) = 20 beats 9 × (3 - 1) = 18, though 9 × 3 > 4 × 6;
    # and a word of one document only is not chosen, though it would save 3 × (9 - 1) = 24.
    assert [len(base(w)["input_ids"]) for w in (" QZQZQ", " QZ", " QZQZQZQZ")] == [6, 3, 9]  # no Q, Z in the base
    halves = [["QZQZQ"] * 2 + ["QZ"] * 5 + ["QZQZQZQZ"] * 3, ["QZQZQ"] * 2 + ["QZ"] * 4]
    for words in halves:
        rng.shuffle(words)
    documents = ["a " + " ".join(words) for words in halves]
    assert legal_tokens(base, documents, 1) == {"reporters": [], "terms": [" QZQZQ"]}
    assert legal_tokens(base, documents, 5)["terms"] == [" QZQZQ", " QZ"]


def test_extension_is_cached(tmp_path, texts, base, monkeypatch):
    first, added = extend_tokenizer(base, texts, 32, str(tmp_path))
    assert len(list((tmp_path / "tokenizers").glob("legal-*.json"))) == 1

    def no_mining(*args, **kwargs):
        raise AssertionError("the cached choice should have been loaded")

    monkeypatch.setattr(tokenizer_module, "legal_tokens", no_mining)
    second, again = extend_tokenizer(base, texts, 32, str(tmp_path))
    assert again == added and second.get_vocab() == first.get_vocab()
    with pytest.raises(ValueError, match=r"data\.extra_tokens"):
        extend_tokenizer(base, texts, 0, str(tmp_path))


def test_tokens_per_byte_on_known_strings(texts):
    words = Tokenizer(models.WordLevel({"[unk]": 0, "héllo": 1, "wörld": 2, "§": 3}, unk_token="[unk]"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    word_level = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[unk]")
    # 3 tokens in 6 + 1 + 6 + 1 + 2 = 16 UTF-8 bytes; then 1 token in 6 bytes.
    assert tokens_per_byte(word_level, ["héllo wörld §"]) == pytest.approx(3 / 16)
    assert tokens_per_byte(word_level, ["héllo wörld §", "héllo"]) == pytest.approx(4 / 22)
    # A byte-level BPE without merges spends one token per byte, special-token strings in the text included.
    bytes_only = train_bpe(texts, 259)
    assert tokens_per_byte(bytes_only, [texts[0], "<|endoftext|> ½ 漢字"]) == 1.0
    assert compare_tokenizers({"a": bytes_only, "b": word_level}, ["héllo wörld §"]) == {
        "a": 1.0,
        "b": pytest.approx(3 / 16),
    }
    with pytest.raises(ValueError, match="texts"):
        tokens_per_byte(word_level, [""])


@pytest.mark.parametrize("tied", [True, False])
def test_new_embedding_rows_are_the_mean_of_their_pieces(tmp_path, texts, base, tied, tiny_model_config):
    extended, _ = extend_tokenizer(base, texts, 40, str(tmp_path))
    model = build_model(tiny_model_config(**SMALL, tie_word_embeddings=tied), base)
    before_in = model.get_input_embeddings().weight.detach().clone()
    before_out = model.get_output_embeddings().weight.detach().clone()

    extend_embeddings(model, base, extended)
    after_in = model.get_input_embeddings().weight
    after_out = model.get_output_embeddings().weight
    assert after_in.shape[0] == after_out.shape[0] == model.config.vocab_size == len(extended)
    assert (after_in is after_out) == tied
    assert torch.equal(after_in[: len(base)], before_in) and torch.equal(after_out[: len(base)], before_out)
    for i in range(len(base), len(extended)):
        pieces = base(extended.convert_ids_to_tokens(i), add_special_tokens=False)["input_ids"]
        assert len(pieces) > 1
        torch.testing.assert_close(after_in[i], before_in[pieces].mean(0))
        torch.testing.assert_close(after_out[i], before_out[pieces].mean(0))
    ids = torch.tensor([extended(texts[0][:400], add_special_tokens=False)["input_ids"]])
    assert ids.max() >= len(base) and torch.isfinite(model(input_ids=ids).logits).all()


def test_build_model_extends_a_checkpoint(tmp_path, texts, base, tiny_model_config):
    extended, _ = extend_tokenizer(base, texts, 16, str(tmp_path))
    original = build_model(tiny_model_config(**SMALL, tie_word_embeddings=False), base)
    original.save_pretrained(tmp_path / "checkpoint")
    cfg = ModelConfig(pretrained=str(tmp_path / "checkpoint"), attn_implementation="eager")
    with pytest.raises(ValueError, match="embeds only"):
        build_model(cfg, extended)
    model = build_model(cfg, extended, base)
    assert model.config.vocab_size == model.get_input_embeddings().num_embeddings == len(extended)
    i = len(base)
    pieces = base(extended.decode([i]), add_special_tokens=False)["input_ids"]
    expected = original.get_output_embeddings().weight[pieces].mean(0)
    torch.testing.assert_close(model.get_output_embeddings().weight[i], expected)

    unrelated = train_bpe(texts[::-1][:5], 300)
    with pytest.raises(ValueError, match="new_tokenizer"):
        extend_embeddings(model, base, unrelated)


def test_prepare_extends_and_reports_tokens_per_byte(tmp_path, texts):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "docs.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in texts))
    cfg = DataConfig(
        paths=[str(folder)], cache_dir=str(tmp_path / "cache"), vocab_size=400, seq_len=128, heldout_fraction=0.2
    )
    plain = prepare(cfg)
    assert plain.base_tokenizer is None and plain.stats["added_tokens"] is None
    extended = prepare(DataConfig(**{**vars(cfg), "extend_tokenizer": True, "extra_tokens": 48}))
    added = extended.stats["added_tokens"]
    assert len(extended.tokenizer) == len(plain.tokenizer) + len(added["reporters"]) + len(added["terms"])
    assert extended.base_tokenizer.get_vocab() == plain.tokenizer.get_vocab()
    assert extended.train.num_rows < plain.train.num_rows  # fewer tokens, fewer rows

    report = json.loads((Path(extended.stats["rows_dir"]) / "report.json").read_text())
    measured = report["tokens_per_byte"]
    assert measured["text"] == "heldout" and set(measured["tokenizers"]) == {"base", "extended"}
    heldout = list(split_corpus(cfg).splits["heldout"]["text"])
    num_bytes = sum(len(text.encode()) for text in heldout)
    for name, tokenizer in (("base", plain.tokenizer), ("extended", extended.tokenizer)):
        tokens = sum(len(ids) for ids in tokenizer(heldout, add_special_tokens=False)["input_ids"])
        assert measured["tokenizers"][name] == pytest.approx(tokens / num_bytes)
    assert measured["tokenizers"]["extended"] < measured["tokenizers"]["base"]
    assert report["added_tokens"] == added and report["vocab_size"] == len(extended.tokenizer)
    assert "tokens/B   on heldout text: base 0." in format_stats(extended.stats)


def test_continued_pretraining_with_an_extended_tokenizer(tmp_path):
    common = ["model=tiny", "data.synthetic_documents=6", "data.seq_len=64", "data.vocab_size=400", "logger=none",
              f"data.cache_dir={tmp_path / 'cache'}", "train.steps=1", "train.batch_size=2",
              "train.eval_batches=1"]  # fmt: skip
    first = train(compose("train", [*common, f"train.output_dir={tmp_path / 'base'}"]))
    base = AutoTokenizer.from_pretrained(first.export_dir)
    extend = ["data.extend_tokenizer=true", "data.extra_tokens=24", f"model.pretrained={first.export_dir}"]
    continued = train(compose("train", [*common, *extend, f"train.output_dir={tmp_path / 'continued'}"]))
    tokenizer = AutoTokenizer.from_pretrained(continued.export_dir)
    model = AutoModelForCausalLM.from_pretrained(continued.export_dir)
    assert len(base) < len(tokenizer) <= len(base) + 24
    assert model.config.vocab_size == model.get_input_embeddings().num_embeddings == len(tokenizer)
