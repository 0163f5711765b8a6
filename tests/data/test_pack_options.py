"""Packing options: bos/eos per document, chunk overlap as loss-free context, and prepare's output folder."""

import dataclasses
import json
import random
from pathlib import Path

import datasets
import pytest

from legalpt.config import DataConfig
from legalpt.data.pack import IGNORE_INDEX, collate_packed, pack_dataset, pack_documents
from legalpt.data.pipeline import prepare

BOS, EOS, PAD = 1, 2, 3  # document token ids are drawn from [4, 1000), so every id tells what it is


def random_documents(rng: random.Random, seq_len: int) -> list[list[int]]:
    lengths = [rng.randint(1, 2 * seq_len) for _ in range(rng.randint(5, 20))]
    lengths += [3 * seq_len + rng.randint(1, seq_len), seq_len - 1, seq_len, 1]  # spans rows, fills rows, tiny
    rng.shuffle(lengths)
    return [[rng.randrange(4, 1000) for _ in range(n)] for n in lengths]


def with_affixes(document: list[int], bos: bool, eos: bool) -> list[int]:
    return [BOS] * bos + document + [EOS] * eos


@pytest.mark.parametrize("seq_len", [2, 7, 64])
@pytest.mark.parametrize(("bos", "eos"), [(False, True), (True, True), (True, False), (False, False)])
@pytest.mark.parametrize("overlap", [0, 1, 5, "max"])
def test_every_token_is_a_target_once_in_order(rng, seq_len, bos, eos, overlap):
    overlap = seq_len - 1 if overlap == "max" else min(overlap, seq_len - 1)
    documents = random_documents(rng, seq_len)
    rows = list(pack_documents(documents, seq_len, EOS if eos else None, PAD, BOS if bos else None, overlap))
    assert all(len(row["input_ids"]) == seq_len and sum(row["seq_lens"]) == seq_len for row in rows)
    assert all(len(row["context_lens"]) == len(row["seq_lens"]) for row in rows)
    assert all(row["num_pad"] == 0 for row in rows[:-1])

    # Read the rows back segment by segment: a segment's context must be the tokens of its document just before
    # it, and the rest must continue that document where the last segment stopped; nothing else is allowed.
    expected = [with_affixes(doc, bos, eos) for doc in documents]
    position = [0] * len(expected)
    current, continuations, fresh = 0, 0, []
    for row in rows:
        start = 0
        for length, context in zip(row["seq_lens"], row["context_lens"], strict=True):
            tokens = row["input_ids"][start : start + length]
            start += length
            if tokens[0] == PAD:  # the padding: a segment of its own that ends the last row
                assert tokens == [PAD] * row["num_pad"] and row is rows[-1] and start == seq_len and not context
                continue
            while position[current] == len(expected[current]):
                current += 1  # a finished document; empty ones (no tokens, no affixes) have no segment
            done = position[current]
            assert context <= overlap and (context == min(overlap, done))
            assert tokens[:context] == expected[current][done - context : done]
            assert tokens[context:] == expected[current][done : done + length - context]
            continuations += done > 0
            fresh += tokens[context:]
            position[current] += length - context
    assert position == [len(tokens) for tokens in expected]  # every document whole, nothing dropped

    # Targets: every token once, in order, except those nothing before them in their segment can predict: a
    # document's first token, and without overlap the first token of each continued chunk.
    batch = collate_packed(rows)
    targets = [t for t in batch["labels"][0].tolist() if t != IGNORE_INDEX]
    wanted = [t for tokens in expected for t in tokens[1:]]
    if overlap:
        assert targets == wanted
    else:
        assert len(wanted) - len(targets) == continuations and is_subsequence(targets, wanted)
    assert fresh.count(BOS) == len(documents) * bos and fresh.count(EOS) == len(documents) * eos
    assert BOS not in targets  # nothing precedes it


def is_subsequence(part: list[int], whole: list[int]) -> bool:
    items = iter(whole)
    return all(any(x == y for y in items) for x in part)


def test_overlap_rows_by_hand():
    rows = list(pack_documents([[10, 11, 12, 13, 14, 15, 16]], 4, EOS, PAD, BOS, overlap=2))
    assert rows == [
        {"input_ids": [BOS, 10, 11, 12], "seq_lens": [4], "context_lens": [0], "num_pad": 0},
        {"input_ids": [11, 12, 13, 14], "seq_lens": [4], "context_lens": [2], "num_pad": 0},
        {"input_ids": [13, 14, 15, 16], "seq_lens": [4], "context_lens": [2], "num_pad": 0},
        {"input_ids": [15, 16, EOS, PAD], "seq_lens": [3, 1], "context_lens": [2, 0], "num_pad": 1},
    ]
    labels = collate_packed(rows)["labels"][0].reshape(4, 4).tolist()
    no = IGNORE_INDEX
    assert labels == [[no, 10, 11, 12], [no, no, 13, 14], [no, no, 15, 16], [no, no, EOS, no]]
    # Without affixes a document is its tokens alone; an empty one leaves no trace.
    assert list(pack_documents([[5, 6], [], [7]], 4, None, PAD)) == [
        {"input_ids": [5, 6, 7, PAD], "seq_lens": [2, 1, 1], "context_lens": [0, 0, 0], "num_pad": 1}
    ]


@pytest.mark.parametrize(("seq_len", "overlap"), [(8, -1), (8, 8), (1, 0)])
def test_bad_overlap(seq_len, overlap):
    with pytest.raises(ValueError, match="chunk_overlap" if seq_len > 1 else "seq_len"):
        list(pack_documents([[5, 6, 7]], seq_len, EOS, PAD, overlap=overlap))


def test_pack_dataset_stats_count_context(tmp_path, rng):
    seq_len, overlap = 16, 3
    documents = random_documents(rng, seq_len)
    tokenized = datasets.Dataset.from_dict({"input_ids": documents})
    packed, stats = pack_dataset(tokenized, seq_len, EOS, PAD, str(tmp_path), bos_id=BOS, overlap=overlap)
    rows = list(pack_documents(documents, seq_len, EOS, PAD, BOS, overlap))
    assert packed.to_list() == rows
    assert stats.tokens == sum(len(doc) + 2 for doc in documents)
    assert stats.context_tokens == sum(sum(row["context_lens"]) for row in rows) > 0
    assert stats.tokens + stats.context_tokens + stats.pad_tokens == stats.rows * seq_len


def test_collate_rejects_bad_context():
    row = {"input_ids": [5, 6, 7, 8], "seq_lens": [2, 2], "num_pad": 0}
    for context_lens in ([0], [2, 0], [0, 3]):
        with pytest.raises(ValueError, match=r"rows\[0\]"):
            collate_packed([{**row, "context_lens": context_lens}])


@pytest.fixture
def corpus(tmp_path, rng) -> Path:
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(200)]
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(12):
        (folder / f"doc {i}.txt").write_text(f"Document {i}. " + " ".join(rng.choices(words, k=rng.randint(20, 300))))
    return folder


def documents_through_bos(rows: list[dict], tokenizer) -> list[str]:
    """The texts in `rows`, read through bos markers and without context tokens."""
    texts = []
    for row in rows:
        start = 0
        for length, context in zip(row["seq_lens"], row["context_lens"], strict=True):
            for token in row["input_ids"][start + context : start + length]:
                if token == tokenizer.bos_token_id:
                    texts.append([])
                elif token != tokenizer.pad_token_id:
                    texts[-1].append(token)
            start += length
    return [tokenizer.decode(ids) for ids in texts]


def test_prepare_with_bos_overlap_and_no_eos(tmp_path, corpus):
    cfg = DataConfig(paths=[str(corpus)], cache_dir=str(tmp_path / "cache"), vocab_size=300, seq_len=32)
    plain = prepare(cfg)
    options = prepare(dataclasses.replace(cfg, bos=True, eos=False, chunk_overlap=4))
    assert options.stats["rows_dir"] != plain.stats["rows_dir"]
    rows = options.train.to_list() + options.heldout.to_list()
    texts = sorted(path.read_text() for path in corpus.iterdir())
    assert sorted(documents_through_bos(rows, options.tokenizer)) == texts
    assert all(options.tokenizer.eos_token_id not in row["input_ids"] for row in rows)
    assert options.stats["train"]["context_tokens"] > 0
    with pytest.raises(ValueError, match=r"data\.chunk_overlap"):
        prepare(dataclasses.replace(cfg, paths=[str(tmp_path / "missing")], chunk_overlap=32))


def test_output_dir_holds_the_rows_and_is_reused(tmp_path, corpus):
    out = tmp_path / "my rows" / "legal"
    cfg = DataConfig(
        paths=[str(corpus)], cache_dir=str(tmp_path / "cache"), vocab_size=300, seq_len=32, output_dir=str(out)
    )
    first = prepare(cfg)
    assert Path(first.stats["rows_dir"]) == out and not first.stats["cached"]
    assert {p.name for p in out.iterdir()} >= {"train", "heldout", "report.json", "lengths.png", "stats.json"}
    assert not (tmp_path / "cache" / "packed").exists()  # nothing packed in the cache instead
    report = json.loads((out / "report.json").read_text())
    assert report["splits"]["train"]["rows"] == first.train.num_rows

    again = prepare(cfg)
    assert again.stats["cached"] and "tokenize" not in again.stats["seconds"]
    assert again.train.to_list() == first.train.to_list()

    # Other settings, same folder: rebuilt in place, and the report follows.
    longer = prepare(dataclasses.replace(cfg, seq_len=64))
    assert not longer.stats["cached"] and all(len(ids) == 64 for ids in longer.train["input_ids"])
    assert json.loads((out / "report.json").read_text())["seq_len"] == 64
    assert not [p for p in out.parent.iterdir() if p.name != "legal"]  # no partial folder left behind
    assert prepare(dataclasses.replace(cfg, seq_len=64)).stats["cached"]

    # A folder with someone else's files is refused before anything is loaded.
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"data\.output_dir"):
        prepare(dataclasses.replace(cfg, paths=[str(tmp_path / "missing")], output_dir=str(foreign)))
    assert (foreign / "notes.txt").read_text() == "mine"
