"""Tests of the built-in demo corpus as a whole: determinism in any process, schema, lengths, generation speed, and
the arguments it refuses."""

import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from legalpt.data.demo import MAX_CHARS, MIN_CHARS, generate_documents

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def default_corpus() -> tuple[list[dict], float]:
    """The corpus `legalpt-train` builds by default (160 documents, seed 0), and the CPU seconds it took."""
    start = time.process_time()
    documents = generate_documents(160, seed=0)
    return documents, time.process_time() - start


def fresh_seed() -> int:
    return random.randrange(1_000_000)


def test_same_arguments_give_the_same_documents_in_any_process():
    seed = fresh_seed()
    first = generate_documents(6, seed=seed)
    assert generate_documents(6, seed=seed) == first
    assert generate_documents(3, seed=seed) == first[:3]  # document i depends on nothing after it
    others = generate_documents(6, seed=seed + 1)
    assert all(a["text"] != b["text"] for a, b in zip(first, others, strict=True))

    code = (
        "import json; from legalpt.data.demo import generate_documents; "
        f"print(json.dumps(generate_documents(6, {seed})))"
    )
    for hash_seed in ("1", "2"):  # str hashing differs between these processes; the corpus must not
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert json.loads(out.stdout) == json.loads(json.dumps(first)), f"seed {seed}, PYTHONHASHSEED={hash_seed}"


def test_records_have_the_schema_and_alternate_kinds():
    seed = fresh_seed()
    documents = generate_documents(9, seed=seed)
    assert len(documents) == 9
    assert len({d["id"] for d in documents}) == 9
    for document in documents:
        assert set(document) == {"id", "text", "source", "kind", "meta"}
        assert isinstance(document["id"], str) and isinstance(document["text"], str)
        assert document["source"] == "synthetic"
        assert isinstance(document["meta"], dict)
        json.dumps(document["meta"])  # metadata must survive a JSON round trip into Arrow
    assert Counter(d["kind"] for d in documents) == {"contract": 5, "opinion": 4}
    assert generate_documents(1, seed=seed)[0]["kind"] == "contract"


def test_lengths_span_short_and_very_long_documents(default_corpus):
    documents, _ = default_corpus
    for name, estimate in (("chars/4", lambda t: len(t) / 4), ("whitespace", lambda t: len(t.split()))):
        tokens = sorted(estimate(d["text"]) for d in documents)
        assert 700 <= tokens[0] <= 1600, f"{name}: shortest document has {tokens[0]:.0f} tokens"
        assert tokens[-1] >= 30_000, f"{name}: longest document has {tokens[-1]:.0f} tokens"
        # A spread, not two clusters: log-uniform lengths put a fair share in every decade.
        assert sum(t < 5_000 for t in tokens) >= 30 and sum(t > 10_000 for t in tokens) >= 30, name
    for kind in ("contract", "opinion"):
        lengths = [len(d["text"]) for d in documents if d["kind"] == kind]
        assert min(lengths) < 10_000 and max(lengths) > 150_000, kind


def test_generation_is_fast(default_corpus):
    _, cpu_seconds = default_corpus
    assert cpu_seconds < 5.0, f"160 documents took {cpu_seconds:.2f} s of CPU"


@pytest.mark.parametrize("count", [0, -3])
def test_a_count_below_one_is_refused(count):
    with pytest.raises(ValueError, match="num_documents"):
        generate_documents(count)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"num_documents": 2.0}, "num_documents"),
    ({"num_documents": "3"}, "num_documents"),
    ({"num_documents": True}, "num_documents"),
    ({"num_documents": 2, "seed": "0"}, "seed"),
    ({"num_documents": 2, "seed": 1.5}, "seed"),
])  # fmt: skip
def test_arguments_of_the_wrong_type_are_refused(kwargs, name):
    with pytest.raises(TypeError, match=name):
        generate_documents(**kwargs)


def test_every_length_stays_near_the_target_range():
    seed = fresh_seed()
    for document in generate_documents(40, seed=seed):
        assert 0.75 * MIN_CHARS <= len(document["text"]) <= 1.25 * MAX_CHARS, (seed, document["id"])
