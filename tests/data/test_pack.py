"""Packing: every token exactly once and in order, exact row lengths, document boundaries, collate correctness."""

import random

import datasets
import pytest
import torch

from legalpt.data.pack import IGNORE_INDEX, collate_packed, pack_dataset, pack_documents

EOS, PAD = 1, 2  # document token ids are drawn from [3, 1000), so every id tells what it is


def random_documents(rng: random.Random, seq_len: int) -> list[list[int]]:
    lengths = [rng.randint(1, 2 * seq_len) for _ in range(rng.randint(5, 20))]
    # The edge cases: a document that spans at least three rows, one that exactly fills a row with its eos, tiny ones.
    lengths += [3 * seq_len + rng.randint(1, seq_len), seq_len - 1, 0, 1]
    rng.shuffle(lengths)
    return [[rng.randrange(3, 1000) for _ in range(n)] for n in lengths]


def segments_of(rows: list[dict]) -> list[tuple[int, bool, list[int]]]:
    """(row index, whether it starts its row, tokens) of every segment, in order."""
    out = []
    for r, row in enumerate(rows):
        start = 0
        for length in row["seq_lens"]:
            out.append((r, start == 0, row["input_ids"][start : start + length]))
            start += length
    return out


@pytest.mark.parametrize("seq_len", [2, 7, 64])
def test_every_token_once_in_order_with_boundaries(rng, seq_len):
    documents = random_documents(rng, seq_len)
    rows = list(pack_documents(documents, seq_len, EOS, PAD))

    assert all(len(row["input_ids"]) == seq_len and sum(row["seq_lens"]) == seq_len for row in rows)
    assert all(row["num_pad"] == 0 for row in rows[:-1])
    expected = [t for doc in documents for t in [*doc, EOS]]
    assert len(rows) == -(-len(expected) // seq_len)  # as few rows as the tokens need
    last = rows[-1]
    assert last["num_pad"] == len(rows) * seq_len - len(expected)
    num_pad = last["num_pad"]
    if num_pad:  # the padding is a segment of its own, at the end of the last row
        assert last["seq_lens"][-1] == num_pad and last["input_ids"][seq_len - num_pad :] == [PAD] * num_pad

    # Exactly once, in order: the rows without their padding are the documents, each followed by eos.
    flat = [t for row in rows for t in row["input_ids"][: seq_len - row["num_pad"]]]
    assert flat == expected
    assert PAD not in flat

    # Boundaries: each segment holds one document's tokens; a document that does not end in a segment (no eos yet)
    # fills its row and continues at the start of the next one.
    owner = [i for i, doc in enumerate(documents) for _ in range(len(doc) + 1)]
    position, rows_of, continues = 0, {}, False
    for r, starts_row, tokens in segments_of(rows):
        if tokens[0] == PAD:
            assert set(tokens) == {PAD} and r == len(rows) - 1 and not continues
            continue
        owners = set(owner[position : position + len(tokens)])
        assert len(owners) == 1, "a segment spans two documents"
        doc = owners.pop()
        if continues:
            assert starts_row and rows_of[doc][-1] == r - 1
        rows_of.setdefault(doc, []).append(r)
        continues = tokens[-1] != EOS
        position += len(tokens)
    assert len(rows_of) == len(documents)
    longest = max(range(len(documents)), key=lambda i: len(documents[i]))
    assert len(rows_of[longest]) >= 3


def test_rows_that_fill_exactly_have_no_padding():
    rows = list(pack_documents([[5, 6, 7], [8, 9, 10, 11, 12, 13, 14]], 4, EOS, PAD))
    assert [row["input_ids"] for row in rows] == [[5, 6, 7, EOS], [8, 9, 10, 11], [12, 13, 14, EOS]]
    assert [row["seq_lens"] for row in rows] == [[4], [4], [4]]
    assert [row["num_pad"] for row in rows] == [0, 0, 0]
    rows = list(pack_documents([[5, 6], [7, 8, 9]], 4, EOS, PAD))
    assert rows == [
        {"input_ids": [5, 6, EOS, 7], "seq_lens": [3, 1], "context_lens": [0, 0], "num_pad": 0},
        {"input_ids": [8, 9, EOS, PAD], "seq_lens": [3, 1], "context_lens": [0, 0], "num_pad": 1},
    ]
    assert list(pack_documents([], 4, EOS, PAD)) == []
    with pytest.raises(ValueError, match="seq_len"):
        list(pack_documents([[5]], 1, EOS, PAD))


def reference_batch(rows: list[dict]) -> dict[str, list]:
    """The flattened batch, one token at a time."""
    ids, labels, positions, cu = [], [], [], [0]
    for row in rows:
        start = 0
        pad_from = len(row["input_ids"]) - row["num_pad"]
        for length in row["seq_lens"]:
            for k in range(length):
                token = row["input_ids"][start + k]
                ids.append(token)
                labels.append(IGNORE_INDEX if k == 0 or start + k >= pad_from else token)
                positions.append(k)
            start += length
            cu.append(cu[-1] + length)
    return {"input_ids": ids, "labels": labels, "position_ids": positions, "cu": cu}


def test_collate_matches_the_segments(rng):
    seq_len = 16
    rows = list(pack_documents(random_documents(rng, seq_len), seq_len, EOS, PAD))
    for batch_rows in (rows[:1], rows[:3], rows[-4:]):  # the last batch holds the padded row
        batch = collate_packed(batch_rows)
        expected = reference_batch(batch_rows)
        total = seq_len * len(batch_rows)
        for key in ("input_ids", "labels", "position_ids"):
            assert batch[key].shape == (1, total) and batch[key].dtype == torch.int64
            assert batch[key][0].tolist() == expected[key], key
        for key in ("cu_seq_lens_q", "cu_seq_lens_k"):
            assert batch[key].dtype == torch.int32 and batch[key].tolist() == expected["cu"]
        longest = max(length for row in batch_rows for length in row["seq_lens"])
        assert batch["max_length_q"] == batch["max_length_k"] == longest
        assert isinstance(batch["max_length_q"], int)


def test_collate_takes_tensor_rows_from_a_dataset(rng):
    seq_len = 8
    rows = list(pack_documents(random_documents(rng, seq_len), seq_len, EOS, PAD))
    dataset = datasets.Dataset.from_list(rows).with_format("torch")
    from_tensors = collate_packed([dataset[i] for i in range(len(rows) - 3, len(rows))])
    from_lists = collate_packed(rows[-3:])
    assert all(torch.equal(torch.as_tensor(from_tensors[k]), torch.as_tensor(from_lists[k])) for k in from_lists)


def test_collate_rejects_bad_rows():
    with pytest.raises(ValueError, match="rows"):
        collate_packed([])
    with pytest.raises(ValueError, match=r"rows\[1\]"):
        collate_packed([{"input_ids": [5, 6], "seq_lens": [2], "num_pad": 0}, {"input_ids": [5], "seq_lens": [2]}])


def test_pack_dataset_rows_and_stats(tmp_path, rng):
    seq_len = 32
    documents = random_documents(rng, seq_len)
    tokenized = datasets.Dataset.from_dict({"input_ids": documents})
    packed, stats = pack_dataset(tokenized, seq_len, EOS, PAD, str(tmp_path))
    expected_rows = list(pack_documents(documents, seq_len, EOS, PAD))
    assert packed.to_list() == expected_rows
    tokens = sum(len(doc) + 1 for doc in documents)
    assert (stats.documents, stats.tokens, stats.rows) == (len(documents), tokens, len(expected_rows))
    assert stats.pad_tokens == len(expected_rows) * seq_len - tokens
    assert stats.longest_document == max(len(doc) for doc in documents)
    assert stats.padding_pct == pytest.approx(100 * stats.pad_tokens / (len(expected_rows) * seq_len))
    assert stats.to_dict()["padding_pct"] == stats.padding_pct

    # A selection of documents (an indices mapping, as a split is) packs only those.
    subset, subset_stats = pack_dataset(tokenized.select([2, 0]), seq_len, EOS, PAD, str(tmp_path))
    assert subset.to_list() == list(pack_documents([documents[2], documents[0]], seq_len, EOS, PAD))
    assert subset_stats.documents == 2
