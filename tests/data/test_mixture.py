"""Weighted mixture: proportions held over every prefix, determinism, the end rule, and the mixture inside loading."""

import json
import random
from pathlib import Path

import pytest

from legalpt.config import DataConfig, SourceConfig
from legalpt.data.mixture import interleave, normalize_weights
from legalpt.data.pipeline import split_corpus
from legalpt.data.sources import load_documents


def lengths(rng: random.Random, n: int, low: int, high: int) -> list[int]:
    return [rng.randint(low, high) for _ in range(n)]


def check_prefix_shares(order: list[tuple[int, int]], weights: list[float]) -> None:
    """Every prefix's share of each stream within (k-1)·L/T of its normalized weight (the bound in mixture.py),
    counted here from the emitted items alone."""
    total_weight = sum(weights)
    taken = [0] * len(weights)
    longest = 0
    for count, (index, size) in enumerate(order, start=1):
        taken[index] += size
        longest = max(longest, size)
        total = sum(taken)
        for stream, weight in enumerate(weights):
            bound = (len(weights) - 1) * longest / total
            assert abs(taken[stream] / total - weight / total_weight) <= bound + 1e-12, (count, stream)


def test_prefix_shares_stay_within_the_bound(rng):
    k = rng.randint(2, 4)
    weights = [rng.uniform(0.02, 1.0) for _ in range(k)]
    streams = [lengths(rng, 4000, 1, rng.randint(2, 3000)) for _ in range(k)]
    order = list(interleave(streams, weights, size=int))
    check_prefix_shares(order, weights)
    # Each stream's items come out in their own order, none repeated or lost before the end.
    for index, stream in enumerate(streams):
        emitted = [size for i, size in order if i == index]
        assert emitted == stream[: len(emitted)]
    # The mixture ends only when the stream whose turn it was has nothing left.
    assert any(sum(1 for i, _ in order if i == index) == len(stream) for index, stream in enumerate(streams))


def test_legal_with_replay_holds_a_few_percent(rng):
    """Long legal documents against short replay pages at 5%: once a fifth of the run is past, the replay share of
    characters stays within half a percentage point of 5% (the bound gives 60k / ~20M characters = 0.3 points)."""
    legal = lengths(rng, 3000, 5_000, 60_000)
    replay = lengths(rng, 20_000, 200, 8_000)
    order = list(interleave([legal, replay], [0.95, 0.05], size=int))
    total = sum(size for _, size in order)
    taken, seen = 0, 0
    for index, size in order:
        seen += size
        taken += size if index == 1 else 0
        if seen >= 0.2 * total:
            assert abs(taken / seen - 0.05) <= 0.005
    # By documents the replay is far above 5%, which is why weights count characters.
    assert sum(index == 1 for index, _ in order) / len(order) > 0.2


def test_deterministic_and_only_lengths_matter(rng):
    a, b = lengths(rng, 300, 1, 500), lengths(rng, 300, 1, 500)
    first = [i for i, _ in interleave([a, b], [0.3, 0.7], size=int)]
    again = [i for i, _ in interleave([iter(a), iter(b)], [3, 7], size=int)]
    assert first == again


def test_zero_size_items_pass_through_and_the_end_rule():
    # Stream 0 runs out on its turn: the mixture ends, though stream 1 has more.
    order = list(interleave([[5, 0, 5], [5, 5, 5, 5, 5, 5]], [0.5, 0.5], size=int))
    assert order == [(0, 5), (1, 5), (0, 0), (0, 5), (1, 5)]
    assert list(interleave([[3, 4]], [2.0], size=int)) == [(0, 3), (0, 4)]  # one stream: all of it, in order
    assert list(interleave([[], [1]], [1, 1], size=int)) == []


@pytest.mark.parametrize("weights", [[], [1, 0], [1, -2], [1, float("nan")], [1, float("inf")], [1, "2"]])
def test_bad_weights(weights):
    with pytest.raises(ValueError, match="weight"):
        normalize_weights(weights)
    if weights:
        with pytest.raises(ValueError, match="weight"):
            list(interleave([[1]] * len(weights), weights, size=int))


def test_normalized_weights_sum_to_one(rng):
    weights = [rng.uniform(0.1, 10) for _ in range(5)]
    normalized = normalize_weights(weights)
    assert sum(normalized) == pytest.approx(1)
    assert [w / normalized[i] for i, w in enumerate(weights)] == pytest.approx([weights[0] / normalized[0]] * 5)


def write_jsonl(folder: Path, texts: list[str]) -> Path:
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in texts) + "\n")
    return folder


def test_load_documents_mixes_sources_and_counts_the_rest(tmp_path, rng):
    words = ["clause", "court", "held", "page", "river", "data"]
    legal = [" ".join(rng.choices(words, k=rng.randint(300, 3000))) for _ in range(60)]
    replay = [" ".join(rng.choices(words, k=rng.randint(20, 300))) for _ in range(400)]
    cfg = DataConfig(
        paths=[str(write_jsonl(tmp_path / "legal", legal))],
        sources={"replay": SourceConfig(name=str(write_jsonl(tmp_path / "replay", replay)), kind="other", weight=0.1)},
        cache_dir=str(tmp_path / "cache"),
    )
    documents, report = load_documents(cfg)
    rows = documents.to_list()
    from_replay = [row["source"] == "replay" for row in rows]
    # Shares of characters over every prefix, checked against the bound with the weights 1 (files) and 0.1.
    order = [(int(is_replay), len(row["text"])) for row, is_replay in zip(rows, from_replay, strict=True)]
    check_prefix_shares(order, [1.0, 0.1])
    used_legal, used_replay = len(rows) - sum(from_replay), sum(from_replay)
    assert [row["text"] for row in rows if row["source"] != "replay"] == legal[:used_legal]
    assert [row["text"] for row in rows if row["source"] == "replay"] == replay[:used_replay]
    # What the mixture did not take is counted, not dropped silently: every record is accounted for.
    assert report.counts.get("beyond mixture share", 0) == len(legal) + len(replay) - len(rows)
    assert documents.num_rows + report.total == len(legal) + len(replay)
    assert all(row["kind"] == "other" for row, is_replay in zip(rows, from_replay, strict=True) if is_replay)
    again, _ = load_documents(cfg)  # served from the cache, same order
    assert again.to_list() == rows


def test_the_pipeline_splits_the_mixed_corpus(tmp_path, rng):
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(500)]
    legal = [f"Agreement {i}. " + " ".join(rng.choices(words, k=400)) for i in range(20)]  # no two near-duplicates
    replay = [f"Page {i}. " + " ".join(rng.choices(words, k=50)) for i in range(40)]
    cfg = DataConfig(
        sources={
            "legal": SourceConfig(name=str(write_jsonl(tmp_path / "legal", legal)), kind="contract", weight=0.9),
            "replay": SourceConfig(name=str(write_jsonl(tmp_path / "replay", replay)), kind="other", weight=0.1),
        },
        cache_dir=str(tmp_path / "cache"),
    )
    corpus = split_corpus(cfg)
    kept = corpus.documents.to_list()
    assert {row["source"] for row in kept} == {"legal", "replay"}
    replay_share = sum(len(r["text"]) for r in kept if r["source"] == "replay") / sum(len(r["text"]) for r in kept)
    assert abs(replay_share - 0.1) <= max(len(t) for t in legal) / sum(len(r["text"]) for r in kept)
    assert corpus.loaded + corpus.skipped.total == len(legal) + len(replay)
    assert corpus.dedup["exact_duplicates"] + corpus.dedup["near_duplicates"] == 0 and len(kept) == corpus.loaded
