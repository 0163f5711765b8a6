"""deduplicate(): exact and near duplicates among generated legal documents and crafted variants of them, checked
against true shingle-set Jaccard similarities and a first-occurrence reference; documents contained in longer ones
(an agreement filed again with an exhibit), checked against true containment; switches, parallelism, bad input."""

import dataclasses
import json
import random
from pathlib import Path

import datasets
import numpy as np
import pytest
from datasketch import LeanMinHash

from legalpt.config import DedupConfig
from legalpt.data.dedup import _best_match, _lsh, deduplicate
from legalpt.data.demo import generate_documents

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
MIN_WORDS = 2_000  # long enough that 3 changed words keep the shingle Jaccard near 0.99


@pytest.fixture(scope="module")
def originals() -> list[dict]:
    """Generated documents of at least MIN_WORDS words, as pipeline records (meta a JSON string)."""
    records = [r for r in generate_documents(16, seed=7) if len(r["text"].split()) >= MIN_WORDS][:6]
    assert len(records) == 6
    return [{**r, "meta": json.dumps(r["meta"])} for r in records]


def reshape(text: str, rng: random.Random) -> str:
    """The same words with other case and whitespace: an exact duplicate after normalization."""
    return "".join(word.upper() + rng.choice([" ", "  ", "\n", "\t ", " \n\n "]) for word in text.split())


def edit(text: str, changes: int, rng: random.Random) -> str:
    """The text with `changes` words, spread evenly, replaced by random ones."""
    words = text.split()
    step = len(words) // changes
    for k in range(changes):
        words[k * step + rng.randrange(step)] = "".join(rng.choices("qxzjv", k=9))
    return " ".join(words)


def shingles(text: str, k: int = 5) -> set[tuple[str, ...]]:
    """The lowercased k-word shingles of a text."""
    words = text.lower().split()
    return set(zip(*(words[i:] for i in range(k)), strict=False))


def jaccard(a: str, b: str) -> float:
    """True Jaccard similarity of the shingle sets of two texts."""
    sa, sb = shingles(a), shingles(b)
    return len(sa & sb) / len(sa | sb)


def containment(a: str, b: str) -> float:
    """True share of the shingles of `a` found in `b`."""
    sa = shingles(a)
    return len(sa & shingles(b)) / len(sa)


def dataset(records: list[dict]) -> datasets.Dataset:
    return datasets.Dataset.from_list(records)


def variant(record: dict, text: str, tag: str) -> dict:
    return {**record, "id": f"{record['id']}-{tag}", "text": text}


@pytest.fixture
def corpus(originals, rng) -> tuple[list[dict], dict[str, str]]:
    """Originals 0-3 each with an exact duplicate (case, whitespace) and a near one (3 words changed), originals 4-5
    alone, and a heavy edit of original 5 (a third of its words changed), shuffled; plus each record's group
    (records of one group are duplicates of each other)."""
    records, group = [], {}
    for i, original in enumerate(originals):
        members = [original]
        if i < 4:
            members.append(variant(original, reshape(original["text"], rng), "exact"))
            members.append(variant(original, edit(original["text"], 3, rng), "near"))
        records += members
        group.update({m["id"]: original["id"] for m in members})
    heavy = variant(originals[5], edit(originals[5]["text"], len(originals[5]["text"].split()) // 3, rng), "heavy")
    records.append(heavy)
    group[heavy["id"]] = heavy["id"]
    rng.shuffle(records)
    return records, group


def first_of_each_group(records: list[dict], group: dict[str, str]) -> list[str]:
    seen, kept = set(), []
    for record in records:
        if group[record["id"]] not in seen:
            seen.add(group[record["id"]])
            kept.append(record["id"])
    return kept


def test_exact_and_near_duplicates_removed_first_occurrence_kept(corpus):
    records, group = corpus
    texts = {r["id"]: r["text"] for r in records}
    kept, report = deduplicate(dataset(records), DedupConfig(examples=100))
    assert kept["id"] == first_of_each_group(records, group)
    assert kept.column_names == ["id", "text", "source", "kind", "meta"]
    assert kept.to_list() == [r for r in records if r["id"] in set(kept["id"])]  # rows untouched
    assert report["documents"] == len(records) == 15
    assert report["kept"] == 7 and report["exact_duplicates"] + report["near_duplicates"] == 8
    assert report["too_short_for_near"] == 0
    assert len(report["examples"]) == 8
    for pair in report["examples"]:
        kept_text, removed_text = texts[pair["kept_id"]], texts[pair["removed_id"]]
        assert pair["kept_id"] in kept["id"] and pair["removed_id"] not in kept["id"]
        assert group[pair["kept_id"]] == group[pair["removed_id"]]
        if pair["kind"] == "exact":
            assert " ".join(kept_text.lower().split()) == " ".join(removed_text.lower().split())
            assert pair["similarity"] == 1.0
        else:
            assert pair["kind"] == "near"
            assert abs(pair["similarity"] - jaccard(kept_text, removed_text)) < 0.1
    exact_pairs = sum(p["kind"] == "exact" for p in report["examples"])
    assert exact_pairs == report["exact_duplicates"]
    # an exact duplicate is only ever removed as near when its group's first member is the 3-word edit
    assert report["exact_duplicates"] + sum(kept_id.endswith("-near") for kept_id in kept["id"]) == 4
    heavy = next(r for r in records if r["id"].endswith("-heavy"))
    assert jaccard(heavy["text"], texts[heavy["id"].removesuffix("-heavy")]) < 0.5 and heavy["id"] in kept["id"]


def test_small_edit_kept_at_high_threshold(originals, rng):
    original = originals[0]
    edited = variant(original, edit(original["text"], len(original["text"].split()) // 100, rng), "edited")
    similarity = jaccard(original["text"], edited["text"])
    assert 0.8 < similarity < 0.95
    kept, report = deduplicate(dataset([original, edited]), DedupConfig(threshold=0.99))
    assert kept["id"] == [original["id"], edited["id"]] and report["near_duplicates"] == 0
    # a low threshold makes the LSH bands short: this pair is missed as a candidate with probability < 1e-4
    kept, report = deduplicate(dataset([original, edited]), DedupConfig(threshold=0.5))
    assert kept["id"] == [original["id"]] and report["near_duplicates"] == 1


def test_switches(corpus):
    records, group = corpus
    ids = [r["id"] for r in records]
    exact_only, report = deduplicate(dataset(records), DedupConfig(near=False))
    assert report["near_duplicates"] == 0 and report["exact_duplicates"] == 4
    seen, first_texts = set(), []
    for record in records:
        normalized = " ".join(record["text"].lower().split())
        if normalized not in seen:
            seen.add(normalized)
            first_texts.append(record["id"])
    assert exact_only["id"] == first_texts
    near_only, report = deduplicate(dataset(records), DedupConfig(exact=False))
    assert report["exact_duplicates"] == 0 and report["near_duplicates"] == 8
    assert near_only["id"] == first_of_each_group(records, group)
    untouched, report = deduplicate(dataset(records), DedupConfig(exact=False, near=False))
    assert untouched["id"] == ids and report["kept"] == len(ids)


def test_short_documents_only_exact(rng):
    words = ["".join(rng.choices("abcdefgh", k=5)) for _ in range(4)]  # fewer words than one 5-word shingle
    records = [
        {"id": "a", "text": " ".join(words)},
        {"id": "b", "text": "  ".join(words).upper()},
        {"id": "c", "text": " ".join(words[:3])},
        {"id": "d", "text": ""},
        {"id": "e", "text": " \n "},
        {"id": "f", "text": " ".join(words + words[:1])},  # exactly one shingle
        {"id": "g", "text": "\t".join(words + words[:1]).title()},
    ]
    kept, report = deduplicate(dataset(records), DedupConfig())
    assert kept["id"] == ["a", "c", "d", "f"]
    assert report == {
        "documents": 7,
        "kept": 4,
        "exact_duplicates": 3,
        "near_duplicates": 0,
        "containment_duplicates": 0,
        "too_short_for_near": 3,
        "examples": [
            {"kept_id": "a", "removed_id": "b", "kind": "exact", "similarity": 1.0},
            {"kept_id": "d", "removed_id": "e", "kind": "exact", "similarity": 1.0},
            {"kept_id": "f", "removed_id": "g", "kind": "exact", "similarity": 1.0},
        ],
    }
    kept, report = deduplicate(dataset(records), DedupConfig(exact=False))
    assert kept["id"] == list("abcdef") and report["too_short_for_near"] == 5
    assert report["examples"] == [{"kept_id": "f", "removed_id": "g", "kind": "near", "similarity": 1.0}]


def test_candidates_verified_against_threshold():
    """LSH candidates are only likely matches: the one kept as a match must reach the threshold, and among equally
    similar ones the earliest wins. Signatures agreeing on k of 100 positions have estimated Jaccard k / 100."""

    def signature(agree: int, base: int) -> LeanMinHash:
        values = np.arange(100, dtype=np.uint32) + np.where(np.arange(100) < agree, 0, base).astype(np.uint32)
        return LeanMinHash(seed=1, hashvalues=values, scheme="affine32")

    query = signature(100, 0)
    kept = {3: signature(50, 1000), 5: signature(90, 2000), 9: signature(90, 3000), 12: signature(70, 4000)}
    assert _best_match(query, [12, 9, 5, 3], kept, 0.8) == (0.9, 5)
    assert _best_match(query, [12, 3], kept, 0.6) == (0.7, 12)
    assert _best_match(query, [12, 9, 5, 3], kept, 0.95) is None
    assert _best_match(query, [], kept, 0.1) is None


@pytest.mark.parametrize("num_perm", [16, 64, 128, 256])
@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99, 1.0])
def test_banding_finds_pairs_at_the_threshold(threshold, num_perm):
    """The index's bands make a pair exactly at the threshold a candidate with probability >= 95%."""
    lsh = _lsh(threshold, num_perm)
    assert lsh.b >= 2 and lsh.b * lsh.r <= num_perm
    assert 1 - (1 - threshold**lsh.r) ** lsh.b >= 0.95


def test_recall_and_precision_on_edited_copies():
    """Copies of generated documents with a controlled share of words changed: at least 95% of the copies whose true
    shingle Jaccard with their original is at or above the threshold are removed as its near duplicates, and none
    below threshold - 0.05 (nor any other document below the threshold) is removed."""
    threshold, rng = 0.8, random.Random(34)  # fixed: the measured recall is reproducible
    originals = [r for r in generate_documents(400, seed=34) if 800 <= len(r["text"].split()) <= 4000]
    originals = [{"id": r["id"], "text": r["text"]} for r in originals][:160]
    assert len(originals) == 160
    copies, truth = [], {}
    for i, original in enumerate(originals):
        # two thirds of the copies at or just above the threshold, where recall is hardest; the rest below it
        target = rng.uniform(0.8, 0.9) if i % 3 else rng.uniform(0.6, 0.76)
        shingles = len(original["text"].split()) - 4
        changes = max(1, round(shingles * (1 - target) / (5 * (1 + target))))  # one word changes 5 shingles
        copy = variant(original, edit(original["text"], changes, rng), "copy")
        copies.append(copy)
        truth[copy["id"]] = (original["id"], jaccard(original["text"], copy["text"]))
    rng.shuffle(copies)
    records = originals + copies
    # the near pass alone: a few originals lie within their copy for 90% of their shingles (the copy's edits break up
    # repeated phrases, so its shingle set is larger), which the containment pass would take
    cfg = DedupConfig(threshold=threshold, examples=len(records), containment=False)
    kept, report = deduplicate(dataset(records), cfg)
    removed = {pair["removed_id"]: pair for pair in report["examples"]}
    assert report["near_duplicates"] == len(removed) and report["exact_duplicates"] == 0
    above = [c for c, (_, similarity) in truth.items() if similarity >= threshold]
    below = [c for c, (_, similarity) in truth.items() if similarity < threshold - 0.05]
    assert len(above) >= 90 and len(below) >= 40
    assert min(truth[c][1] for c in above) < 0.82  # pairs right at the threshold are among them
    found = [c for c in above if c in removed and removed[c]["kept_id"] == truth[c][0]]
    recall, below_removed = len(found) / len(above), len(set(below) & set(removed))
    print(f"recall {recall:.3f} ({len(found)}/{len(above)}), removed below: {below_removed}/{len(below)}")
    assert recall >= 0.95 and below_removed == 0
    assert set(kept["id"]) >= {r["id"] for r in originals}
    texts = {r["id"]: r["text"] for r in records}
    for removed_id, pair in removed.items():  # every removal is a true near duplicate of the document kept
        assert jaccard(texts[pair["kept_id"]], texts[removed_id]) >= threshold
        assert abs(pair["similarity"] - jaccard(texts[pair["kept_id"]], texts[removed_id])) < 1e-4


def with_exhibit(text: str, exhibit: str) -> str:
    return f"{text}\n\nEXHIBIT A\n\n{exhibit}"


def test_agreement_plus_exhibit_is_containment(originals, rng):
    """An agreement filed again with a long exhibit: the agreement is removed as contained, in either order, while
    Jaccard alone keeps both; unrelated documents and two agreements sharing only boilerplate are kept."""
    agreement, exhibit, other, boilerplate = (o["text"] for o in originals[:4])
    filed = variant(originals[0], with_exhibit(agreement, exhibit), "with-exhibit")
    plain = {"id": "agreement", "text": agreement}
    clauses = " ".join(boilerplate.split()[:600])  # shared governing-law, notice and signature text
    first = {"id": "first", "text": f"{' '.join(other.split()[:1200])}\n{clauses}"}
    second = {"id": "second", "text": f"{' '.join(other.split()[1200:2400])}\n{clauses}"}
    unrelated = [{"id": o["id"], "text": o["text"]} for o in originals[4:6]]
    assert jaccard(agreement, filed["text"]) < 0.8 and containment(agreement, filed["text"]) == 1.0
    assert 0.3 < containment(first["text"], second["text"]) < 0.9 and containment(second["text"], first["text"]) < 0.9
    for order in ([plain, filed], [filed, plain]):
        records = [*order, first, second, *unrelated]
        rng.shuffle(records)
        kept, report = deduplicate(dataset(records), DedupConfig(examples=10))
        assert kept["id"] == [r["id"] for r in records if r["id"] != "agreement"]
        assert report["containment_duplicates"] == 1 and report["near_duplicates"] == report["exact_duplicates"] == 0
        assert report["examples"] == [
            {"kept_id": filed["id"], "removed_id": "agreement", "kind": "containment", "similarity": 1.0}
        ]
        kept, report = deduplicate(dataset(records), DedupConfig(containment=False))
        assert kept.num_rows == len(records) and report["containment_duplicates"] == 0


def test_containment_recall_and_precision():
    """Generated documents each filed again, with a controlled share of its words changed, followed by an exhibit of
    its own 0.2 to 8 times as long (words drawn at random from all of them): at least 95% of those lying within their
    filing for at least the threshold are removed as contained in it, and no document below the threshold (nor any
    other) is removed."""
    threshold, rng = 0.9, random.Random(35)  # fixed: the measured recall is reproducible
    documents = [r for r in generate_documents(200, seed=35) if 300 <= len(r["text"].split()) <= 3000]
    documents = [{"id": r["id"], "text": r["text"]} for r in documents]
    inner, words = documents[:60], " ".join(d["text"] for d in documents).split()
    assert len(inner) == 60
    records, truth = [], {}
    for i, document in enumerate(inner):
        # two thirds at or above the threshold, the rest below it
        target = rng.uniform(0.9, 0.97) if i % 3 else rng.uniform(0.7, 0.86)
        length = len(document["text"].split())
        copy = edit(document["text"], max(1, round(length * (1 - target) / 5)), rng)  # one word changes 5 shingles
        exhibit = rng.choices(words, k=round(rng.choice([0.2, 0.5, 1, 2, 4, 8]) * length))
        filed = variant(document, with_exhibit(copy, " ".join(exhibit)), "filed")
        truth[document["id"]] = (filed["id"], containment(document["text"], filed["text"]))
        records += [document, filed]
    rng.shuffle(records)
    kept, report = deduplicate(dataset(records), DedupConfig(containment_threshold=threshold, examples=len(records)))
    removed = {pair["removed_id"]: pair for pair in report["examples"]}
    assert report["containment_duplicates"] == len(removed) and report["near_duplicates"] == 0
    above = [d for d, (_, share) in truth.items() if share >= threshold]
    below = [d for d, (_, share) in truth.items() if share < threshold]
    assert len(above) >= 35 and len(below) >= 15 and min(truth[d][1] for d in above) < 0.92
    found = [d for d in above if d in removed and removed[d]["kept_id"] == truth[d][0]]
    print(f"recall {len(found) / len(above):.3f} ({len(found)}/{len(above)})")
    assert len(found) >= 0.95 * len(above) and not set(below) & set(removed)
    assert set(removed) <= set(truth) and set(kept["id"]) >= {filed for filed, _ in truth.values()}
    texts = {r["id"]: r["text"] for r in records}
    for removed_id, pair in removed.items():
        assert abs(pair["similarity"] - containment(texts[removed_id], texts[pair["kept_id"]])) < 1e-4


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="the shared sample documents are absent")
def test_real_contracts_compiled_with_an_exhibit():
    """Two real contracts filed again as one, the second as an exhibit to the first: both are removed as contained in
    the compilation; none of the 42 contracts lies within another."""
    contracts = [{"id": p.name, "text": p.read_text(encoding="utf-8")} for p in (SHARED_DATA / "contracts").glob("*")]
    a, b = sorted(contracts, key=lambda c: len(c["text"]))[20:22]  # of about the same length: Jaccard ~0.5 each
    compiled = {"id": "compiled", "text": with_exhibit(a["text"], b["text"])}
    assert max(jaccard(c["text"], compiled["text"]) for c in (a, b)) < 0.8
    sets = [shingles(c["text"]) for c in contracts]
    for i, own in enumerate(sets):
        assert max(len(own & other) / len(own) for j, other in enumerate(sets) if j != i) < 0.9
    kept, report = deduplicate(dataset([*contracts, compiled]), DedupConfig(examples=10))
    assert sorted(set(c["id"] for c in contracts) - set(kept["id"])) == sorted([a["id"], b["id"]])
    assert report["containment_duplicates"] == 2 and {p["kept_id"] for p in report["examples"]} == {"compiled"}


def test_examples_limit_num_proc_and_determinism(corpus):
    records, _ = corpus
    cfg = DedupConfig(examples=3)
    kept, report = deduplicate(dataset(records), cfg)
    assert len(report["examples"]) == 3
    again, report_again = deduplicate(dataset(records), cfg)
    parallel, report_parallel = deduplicate(dataset(records), cfg, num_proc=2)
    assert again["id"] == parallel["id"] == kept["id"]
    assert report_again == report_parallel == report
    _, report = deduplicate(dataset(records), dataclasses.replace(cfg, examples=0))
    assert report["examples"] == [] and report["kept"] == kept.num_rows


def test_empty_dataset():
    empty = datasets.Dataset.from_dict({"id": [], "text": [], "source": [], "kind": [], "meta": []})
    kept, report = deduplicate(empty, DedupConfig(), num_proc=2)
    assert kept.num_rows == 0 and kept.column_names == empty.column_names
    assert report == {
        "documents": 0,
        "kept": 0,
        "exact_duplicates": 0,
        "near_duplicates": 0,
        "containment_duplicates": 0,
        "too_short_for_near": 0,
        "examples": [],
    }


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"threshold": 0.0}, ValueError, "dedup.threshold"),
        ({"threshold": 1.5}, ValueError, "dedup.threshold"),
        ({"shingle_words": 0}, ValueError, "dedup.shingle_words"),
        ({"num_perm": 1}, ValueError, "dedup.num_perm"),
        ({"examples": -1}, ValueError, "dedup.examples"),
        ({"near": "yes"}, TypeError, "dedup.near"),
        ({"containment": 1}, TypeError, "dedup.containment"),
        ({"containment_threshold": 0}, ValueError, "dedup.containment_threshold"),
        ({"containment_threshold": 1.01}, ValueError, "dedup.containment_threshold"),
    ],
)
def test_bad_config(change, error, match):
    with pytest.raises(error, match=match):
        deduplicate(dataset([{"id": "a", "text": "x"}]), dataclasses.replace(DedupConfig(), **change))


def test_bad_arguments():
    with pytest.raises(TypeError, match=r"documents must be a datasets\.Dataset"):
        deduplicate([{"id": "a", "text": "x"}], DedupConfig())
    with pytest.raises(ValueError, match="missing \\['id'\\]"):
        deduplicate(dataset([{"text": "x"}]), DedupConfig())
    with pytest.raises(ValueError, match="num_proc"):
        deduplicate(dataset([{"id": "a", "text": "x"}]), DedupConfig(), num_proc=0)
    with pytest.raises(TypeError, match="cfg must be a DedupConfig"):
        deduplicate(dataset([{"id": "a", "text": "x"}]), {"exact": True})
