"""Tokenizer extension with legal tokens: the tokens chosen and the tokens they save, word boundaries, junk, the check
on unmined documents, their round trip, their embedding rows, tokens per byte."""

import json
import re
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from legalpt.config import DataConfig, ModelConfig, compose
from legalpt.data import tokenizer as tokenizer_module
from legalpt.data.pipeline import format_stats, prepare, split_corpus, split_documents
from legalpt.data.sources import load_documents
from legalpt.data.tokenizer import (
    BOS,
    CHECK_EVERY,
    EOS,
    PAD,
    compare_tokenizers,
    extend_tokenizer,
    legal_tokens,
    tokens_per_byte,
    train_bpe,
    with_legal_tokens,
)
from legalpt.model import build_model, extend_embeddings
from legalpt.train.trainer import train

CONTRACTS = Path(__file__).resolve().parents[3] / "shared" / "data" / "contracts"
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

    # An abbreviation's id decodes to its text and that text encodes back to the id; every merge's token is used on
    # the corpus, or joined into a longer one by a later merge; whole texts stay lossless.
    for reporter in added["reporters"]:
        i = extended.convert_tokens_to_ids(reporter)
        assert i >= len(base) and extended(extended.decode([i]), add_special_tokens=False)["input_ids"] == [i]
    used = {i for ids in extended(texts, add_special_tokens=False)["input_ids"] for i in ids}
    for k, (left, right, _) in enumerate(added["merges"]):
        later = {piece for merge in added["merges"][k + 1 :] for piece in merge[:2]}
        assert extended.convert_tokens_to_ids(left + right) in used or left + right in later
    for text in [*texts[:3], citation, "Unseen: ½ ∑ 漢字 🙂 \t\n F.3d at the start U.S.C. §"]:
        assert extended.decode(extended(text, add_special_tokens=False)["input_ids"]) == text


def token_count(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> int:
    return sum(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])


def test_merges_are_the_pairs_that_save_the_most_tokens_on_the_text(rng):
    # Words of letters only, each in every document: every word of the text is mined, so the savings a merge claims
    # are the tokens it saves on the whole text, which the real tokenizer measures.
    words = ["".join(rng.choices("abcdefgh", k=rng.randint(3, 7))) for _ in range(12)]
    documents = ["lorem " + " ".join(rng.sample(words, len(words)) + rng.choices(words, k=40)) for _ in range(4)]
    base = train_bpe(documents, 270)
    added = legal_tokens(base, documents, 4)
    assert added["reporters"] == [] and len(added["merges"]) == 4

    for k, (left, right, saved) in enumerate(added["merges"]):
        before = with_legal_tokens(base, {"reporters": [], "merges": added["merges"][:k]})
        vocab = before.get_vocab()
        # Every two adjacent tokens of one word that would make a new token could be the next merge: try each.
        candidates = set()
        for encoding in before.backend_tokenizer.encode_batch(documents, add_special_tokens=False):
            tokens, word_ids = encoding.tokens, encoding.word_ids
            pairs = zip(tokens, tokens[1:], word_ids, word_ids[1:], strict=False)
            candidates |= {(a, b) for a, b, wa, wb in pairs if wa == wb and a + b not in vocab}
        real = {}
        for pair in candidates:
            after = with_legal_tokens(base, {"reporters": [], "merges": [*added["merges"][:k], [*pair, 0]]})
            real[pair] = token_count(before, documents) - token_count(after, documents)
        assert real[(left, right)] == saved == max(real.values())
    extended = with_legal_tokens(base, added)
    assert token_count(base, documents) - token_count(extended, documents) == sum(s for *_, s in added["merges"])
    assert added["terms"] == [extended.decode([extended.convert_tokens_to_ids(a + b)]) for a, b, _ in added["merges"]]


def test_extension_never_lengthens_an_encoding(tmp_path, rng):
    # The base knows the long words; the corpus mines their stems. A stem made one token wherever its text occurs
    # would split " advertisements" (one token) into " advertise" + "ments".
    general = ["advertisements trademarks, sublicensees; the and " * 100] * 3
    base = train_bpe(general, 600)
    assert len(base(" advertisements")["input_ids"]) == 1 < len(base(" advertise")["input_ids"])
    stems = ["advertise", "licensee", "indemnify", "trademark", "the", "and", "of"]
    mining = [" ".join(rng.choices(stems, k=200)) + "\n(Licensee) Advertise, licensee@advertise.com" for _ in range(6)]
    extended, added = extend_tokenizer(base, mining, 40, str(tmp_path))
    assert {" advertise", " trademark"} <= set(added["terms"])
    unseen = [
        "the advertisements and trademarks, " * 5,
        "Sublicensees (advertisements) trademarks; ADVERTISEMENTS of licensees",
        "mail advertisement@trademark.example or see https://advertise.example/licensee",
        "readvertise untrademarked unadvertised, indemnifying the Licensee's advertisers",
    ]
    for text in unseen:
        assert len(extended(text)["input_ids"]) <= len(base(text)["input_ids"]), text
    assert token_count(extended, mining) < token_count(base, mining) and added["check"]["applied"]


def test_junk_is_not_mined(rng):
    # Words use the letters a to m; e-mails, URLs, paths, numbers, ids and mixed-case strings use n to z, and are
    # far more frequent: no new token may hold one of their letters.
    def junk_word(k: int) -> str:
        return "".join(rng.choices("nopqrstuvwxyz", k=k))

    junk = [
        f"{junk_word(5)}@{junk_word(6)}.{junk_word(3)}",
        f"https://www.{junk_word(7)}.{junk_word(3)}/{junk_word(5)}",
        f"/{junk_word(4)}/{junk_word(6)}/{junk_word(5)}",
        f"C:\\{junk_word(5).title()}\\{junk_word(6)}",
        f"{rng.randint(10**5, 10**9)}",
        f"{junk_word(3)}{rng.randint(10, 99)}{junk_word(3)}",
        f"{junk_word(3)}.{junk_word(4)}",
        f"{junk_word(3)}{junk_word(3).upper()}{junk_word(2)}",
        f"{junk_word(3).title()}{junk_word(4).title()}",
    ]
    words = ["".join(rng.choices("abcdefghijklm", k=rng.randint(3, 8))) for _ in range(20)]
    documents = [" ".join(rng.choices(junk, k=300) + rng.choices(words, k=100)) for _ in range(5)]
    rng.shuffle(documents)
    base = train_bpe(documents, 300)
    added = legal_tokens(base, documents, 64)
    assert added["terms"], "the words should be mined"
    for term in added["terms"]:
        assert re.fullmatch(r" ?[a-m]+", term), term


def alphabet_documents(rng, n: int, foreign: set[int]) -> list[str]:
    """`n` documents of words of the letters a to m, except those at the indices `foreign`: letters n to z."""
    ours = ["".join(rng.choices("abcdefghijklm", k=rng.randint(3, 8))) for _ in range(30)]
    theirs = ["".join(rng.choices("nopqrstuvwxyz", k=rng.randint(3, 8))) for _ in range(30)]
    return [" ".join(rng.choices(theirs if i in foreign else ours, k=200)) for i in range(n)]


def test_an_extension_that_does_not_help_unmined_documents_is_not_applied(tmp_path, rng):
    check = set(range(1, 12, CHECK_EVERY))  # the documents the extension is checked on, not mined
    for foreign, applied in ((check, False), (set(), True)):
        documents = alphabet_documents(rng, 12, foreign)
        base = train_bpe(documents, 320)
        extended, added = extend_tokenizer(base, documents, 24, str(tmp_path))
        assert added["merges"], "the mined documents have words worth merging"
        checked = [documents[i] for i in sorted(check)]
        expected = token_count(base, checked) / sum(len(text.encode()) for text in checked)
        assert added["check"]["documents"] == len(check) and added["check"]["base"] == pytest.approx(expected)
        assert added["check"]["applied"] == applied == (added["check"]["extended"] < added["check"]["base"])
        if applied:
            assert len(extended) == len(base) + len(added["merges"])
            assert added["check"]["extended"] == pytest.approx(tokens_per_byte(extended, checked))
        else:  # the merges, of letters a to m, cannot change words of n to z
            assert extended is base and added["check"]["extended"] == added["check"]["base"]


def test_prepare_reports_an_extension_that_was_not_applied(tmp_path, rng):
    cfg = DataConfig(
        paths=[str(tmp_path / "docs.jsonl")], cache_dir=str(tmp_path / "cache"), vocab_size=320, seq_len=128,
        heldout_fraction=0.1, extend_tokenizer=True, extra_tokens=24,
    )  # fmt: skip
    # The split is a seeded permutation of the document indices: find the training documents that are checked on.
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps({"text": f"document {i}"}) for i in range(20)))
    train, _ = split_documents(load_documents(cfg)[0], cfg.heldout_fraction, cfg.seed)
    checked = {int(train[i]["text"].split()[1]) for i in range(1, train.num_rows, CHECK_EVERY)}
    documents = alphabet_documents(rng, 20, checked)
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps({"text": text}) for text in documents))

    data = prepare(cfg)
    added = data.stats["added_tokens"]
    assert added["merges"] and not added["check"]["applied"] and added["check"]["documents"] == len(checked)
    assert data.base_tokenizer is None and data.stats["vocab_size"] == len(data.tokenizer) <= cfg.vocab_size
    assert set(data.stats["tokens_per_byte"]["tokenizers"]) == {"base"}
    report = json.loads((Path(data.stats["rows_dir"]) / "report.json").read_text())
    assert report["added_tokens"]["check"] == added["check"]
    figures = f"{added['check']['base']:.4f} → {added['check']['extended']:.4f}"
    assert f"not extended, 0 reporter abbreviations and {len(added['terms'])} word tokens do not help" in format_stats(
        data.stats
    )
    assert figures in format_stats(data.stats)


def test_special_tokens_after_the_bpe_vocabulary_keep_their_ids(tmp_path, texts):
    # A checkpoint's layout (Llama 3's): special tokens as added tokens after the BPE vocabulary, not in it.
    state = json.loads(train_bpe(texts, 400).backend_tokenizer.to_str())
    vocab = state["model"]["vocab"]
    words = sorted((token for token in vocab if token not in (BOS, EOS, PAD)), key=vocab.get)
    state["model"]["vocab"] = {token: i for i, token in enumerate(words)}
    for i, token in enumerate(state["added_tokens"]):
        token["id"] = len(words) + i
    specials = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    base = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(state)), **specials)
    assert base.convert_tokens_to_ids([BOS, EOS, PAD]) == [len(words), len(words) + 1, len(words) + 2]

    extended, added = extend_tokenizer(base, texts, 32, str(tmp_path))
    assert added["check"]["applied"] and added["reporters"] and added["merges"]
    extended.save_pretrained(tmp_path / "saved")
    for tokenizer in (extended, AutoTokenizer.from_pretrained(tmp_path / "saved")):
        assert tokenizer.get_vocab().items() >= base.get_vocab().items()  # old ids keep their meaning
        assert sorted(tokenizer.get_vocab().values()) == list(
            range(len(base) + len(added["reporters"]) + len(added["merges"]))
        )
        assert tokenizer.eos_token_id == base.eos_token_id
        assert tokenizer(texts[0])["input_ids"] == extended(texts[0])["input_ids"]


def test_only_bpe_tokenizers_with_a_pre_tokenizer_are_extended(tmp_path, texts):
    words = Tokenizer(models.WordLevel({"[unk]": 0, "a": 1}, unk_token="[unk]"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    with pytest.raises(ValueError, match=r"data\.extend_tokenizer: expected a BPE tokenizer.*WordLevel"):
        extend_tokenizer(PreTrainedTokenizerFast(tokenizer_object=words), texts, 8, str(tmp_path))
    whole = Tokenizer(models.BPE())
    with pytest.raises(ValueError, match=r"data\.extend_tokenizer: expected a tokenizer with a pre-tokenizer"):
        extend_tokenizer(PreTrainedTokenizerFast(tokenizer_object=whole), texts, 8, str(tmp_path))


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
        pieces = base(extended.decode([i]), add_special_tokens=False)["input_ids"]
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
    check = added["check"]
    assert check["applied"] and check["extended"] < check["base"]
    assert f"unmined documents {check['base']:.4f} → {check['extended']:.4f}" in format_stats(extended.stats)


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


@pytest.mark.skipif(not CONTRACTS.is_dir(), reason="the shared sample contracts are absent")
def test_extension_lowers_tokens_per_byte_of_unseen_contracts(tmp_path):
    texts = [path.read_text() for path in sorted(CONTRACTS.glob("*.txt"))]
    mined, unseen = texts[:30], texts[30:]
    base = train_bpe(mined, 8192)  # legalpt's defaults: data.vocab_size and data.extra_tokens
    extended, added = extend_tokenizer(base, mined, 1024, str(tmp_path))
    assert added["check"]["applied"] and len(extended) == len(base) + len(added["reporters"]) + len(added["merges"])
    assert tokens_per_byte(extended, unseen) < tokens_per_byte(base, unseen)
    for text in unseen:
        assert len(extended(text)["input_ids"]) <= len(base(text)["input_ids"])
    for term in added["terms"]:  # no e-mail, URL, path, number or id fragments: letters, with their leading space
        assert re.fullmatch(r" ?[^\W\d_]+", term), term
