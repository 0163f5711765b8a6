"""The demo corpus joined into long documents (`join_documents`, data.synthetic_min_chars, data=demo_long)."""

import random

import pytest

from legalpt.config import ConfigError, DataConfig, compose, to_config
from legalpt.data.demo import generate_documents, join_documents
from legalpt.data.sources import load_documents
from legalpt.data.stream import stream_records


def fake_documents(rng: random.Random, count: int) -> list[dict]:
    """Records shaped like the demo corpus's, with random kinds and lengths."""
    return [
        {"id": f"d{i}", "text": "x" * rng.randint(1, 50), "source": "synthetic", "kind": rng.choice("ab"), "meta": {}}
        for i in range(count)
    ]


@pytest.mark.parametrize("count", [1, 7, 60])
def test_joined_records_partition_each_kind_in_order(rng, count):
    documents = fake_documents(rng, count)
    min_chars = rng.randint(1, 120)
    joined = join_documents(documents, min_chars)
    by_id = {d["id"]: d for d in documents}
    for kind in {d["kind"] for d in documents}:
        # the kind's documents, in order, each in exactly one record: records are runs of consecutive ones
        records = [r for r in joined if r["kind"] == kind]
        assert [i for r in records for i in r["meta"]["parts"]] == [d["id"] for d in documents if d["kind"] == kind]
        total = sum(len(d["text"]) for d in documents if d["kind"] == kind)
        for n, record in enumerate(records):
            parts = [by_id[i] for i in record["meta"]["parts"]]
            assert record["text"] == "\n\n".join(p["text"] for p in parts)
            assert record["id"] == f"{parts[0]['id']}+{len(parts) - 1}" and record["source"] == "synthetic"
            assert {p["kind"] for p in parts} == {kind}
            sizes = [len(p["text"]) for p in parts]
            reached = next((k for k in range(1, len(sizes) + 1) if sum(sizes[:k]) >= min_chars), None)
            if n < len(records) - 1:  # the shortest run that reaches min_chars
                assert reached == len(sizes)
            elif total >= min_chars:  # the kind's last record: such a run, then fewer than min_chars of leftovers
                assert reached is not None and sum(sizes[reached:]) < min_chars
            else:
                assert len(records) == 1
    firsts = [r["meta"]["parts"][0] for r in joined]
    assert firsts == sorted(firsts, key=lambda i: int(i[1:]))


@pytest.mark.parametrize("min_chars", [0, -3, 2.5, True])
def test_a_bad_length_is_refused(min_chars):
    with pytest.raises(ValueError, match="min_chars"):
        join_documents(generate_documents(2), min_chars)


def test_the_demo_corpus_joins_in_memory_and_streaming(tmp_path):
    cfg = DataConfig(synthetic_documents=10, synthetic_min_chars=150_000, cache_dir=str(tmp_path / "cache"))
    documents = list(load_documents(cfg)[0])
    expected = join_documents(generate_documents(10), 150_000)
    assert [d["text"] for d in documents] == [d["text"] for d in expected]
    lasts = {d["kind"]: d["id"] for d in documents}  # each kind's last record may fall short
    assert all(len(d["text"]) >= 150_000 for d in documents if d["id"] not in lasts.values())
    streamed = [r for r in stream_records(cfg) if not r["skip"]]
    assert [r["text"] for r in streamed] == [d["text"] for d in expected]


def test_the_preset_and_its_check():
    data = to_config(compose("train", ["data=demo_long"])).data
    assert (data.synthetic_documents, data.synthetic_min_chars) == (320, 2_500_000)
    with pytest.raises(ConfigError, match=r"data\.synthetic_min_chars"):
        to_config(compose("train", ["data.synthetic_min_chars=-1"]))
