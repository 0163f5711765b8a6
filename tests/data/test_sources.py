"""Loading documents: every format, CAP case JSON, folders/globs/odd names, skip accounting, errors, real samples."""

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from legalpt.config import DataConfig
from legalpt.data.sources import SkipReport, corpus_fingerprint, find_files, load_documents

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.fixture
def rng():
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    return random.Random(seed)


def random_text(rng: random.Random, words: int = 40) -> str:
    return " ".join("".join(rng.choices("abcdefghijklmnopqrstuvwxyzé§", k=rng.randint(1, 9))) for _ in range(words))


def load(tmp_path: Path, *paths, **overrides):
    cfg = DataConfig(paths=[str(p) for p in paths], cache_dir=str(tmp_path / "cache"), **overrides)
    documents, report = load_documents(cfg)
    return list(documents), report


def cap_case(rng: random.Random, case_id: int, opinions: int = 2, head: bool = True) -> dict:
    data = {
        "attorneys": ["Counsel for appellant"],
        "opinions": [{"type": t, "author": "J.", "text": random_text(rng)} for t in ["majority", "dissent"][:opinions]],
    }
    if head:
        data["head_matter"] = random_text(rng)
    return {
        "id": case_id,
        "name_abbreviation": f"Smith v. Jones {case_id}",
        "decision_date": "1991-03-27",
        "citations": [{"type": "official", "cite": f"{case_id} U.S. 340"}],
        "court": {"name": "Supreme Court of the United States"},
        "casebody": {"status": "ok", "data": data},
    }


def cap_text(case: dict) -> str:
    data = case["casebody"]["data"]
    parts = [data["head_matter"]] if "head_matter" in data else []
    return "\n\n".join(parts + [op["text"] for op in data["opinions"]])


def test_each_plain_format(tmp_path, rng):
    texts = [random_text(rng) for _ in range(9)]
    (tmp_path / "a.txt").write_text(texts[0], encoding="utf-8")
    (tmp_path / "b.jsonl").write_text(
        "\n".join(json.dumps({"id": f"b{i}", "text": t, "court": "x"}) for i, t in enumerate(texts[1:3])) + "\n\n"
    )
    (tmp_path / "c.json").write_text(json.dumps([{"text": texts[3]}, {"text": texts[4], "kind": "contract"}]))
    (tmp_path / "d.json").write_text(json.dumps({"text": texts[5]}))
    pq.write_table(pa.table({"text": [texts[6]], "year": [1999]}), tmp_path / "e.parquet")
    (tmp_path / "f.json").write_text("\n".join(json.dumps({"text": t}) for t in texts[7:]))  # JSON Lines, named .json

    documents, report = load(tmp_path, tmp_path / "*.*")
    assert report.total == 0 and str(report) == "nothing skipped"
    assert [d["text"] for d in documents] == texts
    by_text = {d["text"]: d for d in documents}
    assert by_text[texts[0]]["id"] == str(tmp_path / "a.txt") == by_text[texts[0]]["source"]
    assert [by_text[t]["id"] for t in texts[1:3]] == ["b0", "b1"]
    assert json.loads(by_text[texts[1]]["meta"]) == {"court": "x"}
    assert by_text[texts[3]]["id"] == f"{tmp_path / 'c.json'}:0"
    assert by_text[texts[4]]["kind"] == "contract"
    assert json.loads(by_text[texts[6]]["meta"]) == {"year": 1999}
    assert all(d["kind"] in ("contract", "opinion", "other") for d in documents)


def test_text_field_is_configurable(tmp_path, rng):
    texts = [random_text(rng) for _ in range(3)]
    (tmp_path / "a.jsonl").write_text(json.dumps({"body": texts[0], "text": "not this"}) + "\n")
    pq.write_table(pa.table({"body": texts[1:]}), tmp_path / "b.parquet")
    documents, report = load(tmp_path, tmp_path / "a.jsonl", tmp_path / "b.parquet", text_field="body")
    assert [d["text"] for d in documents] == texts and report.total == 0


def test_cap_case_json_and_jsonl(tmp_path, rng):
    cases = [cap_case(rng, 100 + i, opinions=1 + i % 2, head=i != 2) for i in range(4)]
    (tmp_path / "one case.json").write_text(json.dumps(cases[0], indent=2))
    (tmp_path / "cases.jsonl").write_text("\n".join(json.dumps(c) for c in cases[1:3]))
    (tmp_path / "list.json").write_text(json.dumps([cases[3]]))

    documents, report = load(tmp_path, tmp_path / "one case.json", tmp_path / "cases.jsonl", tmp_path / "list.json")
    assert report.total == 0
    assert [d["text"] for d in documents] == [cap_text(c) for c in cases]
    assert [d["id"] for d in documents] == ["100", "101", "102", "103"]
    assert {d["kind"] for d in documents} == {"opinion"}
    meta = json.loads(documents[1]["meta"])
    assert meta["citations"] == ["101 U.S. 340"] and meta["opinion_types"] == ["majority", "dissent"]
    assert meta["court"] == "Supreme Court of the United States" and meta["name"] == "Smith v. Jones 101"


def test_folders_globs_and_spaces(tmp_path, rng):
    files = [tmp_path / "corpus" / "a file.txt", tmp_path / "corpus" / "sub dir" / "b [v2].txt", tmp_path / "c.txt"]
    texts = {}
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        texts[str(path)] = random_text(rng)
        path.write_text(texts[str(path)])

    # A folder, a recursive glob and a literal name with glob characters, overlapping: each file is loaded once.
    documents, report = load(tmp_path, tmp_path / "corpus", str(tmp_path / "**" / "*.txt"), files[1])
    assert report.total == 0
    assert sorted(d["source"] for d in documents) == sorted(texts)
    assert all(texts[d["source"]] == d["text"] for d in documents)
    assert find_files([str(tmp_path / "corpus" / "*.txt")]) == [str(files[0])]


def test_every_skip_reason_is_counted(tmp_path, rng):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    good = [random_text(rng) for _ in range(3)]
    (corpus / "good.txt").write_text(good[0])
    (corpus / "scan.pdf").write_bytes(b"%PDF-1.4")
    (corpus / "notes").write_text("no extension")
    (corpus / "empty.txt").write_bytes(b"")
    (corpus / "blank.txt").write_text("  \n\t ")
    (corpus / "latin1.txt").write_bytes("caf\xe9 \xa7 2".encode("latin-1"))
    lines = [
        json.dumps({"text": good[1]}),
        json.dumps({"body": "wrong field"}),
        json.dumps({"text": ""}),
        json.dumps({"text": None}),
        json.dumps({"text": 42}),
        json.dumps(["not", "an", "object"]),
        '{"text": "broken',
        json.dumps({"text": "\ud800 lone surrogate"}),
    ]
    (corpus / "records.jsonl").write_bytes(("\n".join(lines) + "\n").encode() + b'{"text": "\xff\xfe"}\n')
    (corpus / "bad.parquet").write_bytes(b"not parquet at all")
    (corpus / "truncated.json").write_text('{\n  "text": "cut off\n  here')
    pq.write_table(pa.table({"body": ["x"]}), corpus / "other column.parquet")
    pq.write_table(pa.table({"text": [good[2], ""]}), corpus / "rows.parquet")

    documents, report = load(tmp_path, corpus)
    assert sorted(d["text"] for d in documents) == sorted(good)
    assert report.counts == {
        "unknown extension": 2,
        "empty file": 1,
        "empty text": 4,  # blank.txt, "", null, the empty parquet row
        "undecodable bytes": 3,  # latin1.txt, the \xff line, the lone surrogate
        "missing text field": 2,
        "text not a string": 1,
        "record not an object": 1,
        "invalid json": 2,
        "unreadable parquet": 1,
    }
    assert report.total == 17
    assert report.examples["empty file"] == [str(corpus / "empty.txt")]
    assert report.examples["invalid json"] == [f"{corpus / 'records.jsonl'}:7", str(corpus / "truncated.json")]
    assert sorted(report.examples["unknown extension"]) == sorted([str(corpus / "notes"), str(corpus / "scan.pdf")])
    assert "2 invalid json" in str(report)

    # A load served from the cache reports the same skips.
    again, cached_report = load(tmp_path, corpus)
    assert cached_report == report and [d["text"] for d in again] == [d["text"] for d in documents]


def test_skip_report_keeps_few_examples():
    report = SkipReport()
    for i in range(10):
        report.add("empty file", f"f{i}")
    assert report.counts == {"empty file": 10} and report.examples["empty file"] == ["f0", "f1", "f2"]


def test_edited_file_is_reloaded(tmp_path, rng):
    path = tmp_path / "doc.txt"
    first, second = random_text(rng), random_text(rng, words=60)
    path.write_text(first)
    assert [d["text"] for d in load(tmp_path, path)[0]] == [first]
    path.write_text(second)
    assert [d["text"] for d in load(tmp_path, path)[0]] == [second]


def test_missing_paths_raise(tmp_path):
    (tmp_path / "empty folder").mkdir()
    with pytest.raises(FileNotFoundError, match=r"nope\.txt"):
        load(tmp_path, tmp_path / "nope.txt")
    with pytest.raises(FileNotFoundError, match=r"\*\.jsonl"):
        load(tmp_path, tmp_path / "*.jsonl")
    with pytest.raises(FileNotFoundError, match="empty folder"):
        load(tmp_path, tmp_path / "empty folder")
    with pytest.raises(TypeError, match=r"data\.paths"):
        find_files(str(tmp_path))


def test_corpus_fingerprint_follows_content(tmp_path, rng):
    texts = [random_text(rng) for _ in range(3)]
    for i, text in enumerate(texts):
        (tmp_path / f"{i}.txt").write_text(text)
    documents = load_documents(DataConfig(paths=[str(tmp_path / "*.txt")], cache_dir=str(tmp_path / "cache")))[0]
    assert corpus_fingerprint(documents) == corpus_fingerprint(texts)
    assert corpus_fingerprint([*texts[:2], texts[2] + " "]) != corpus_fingerprint(texts)
    assert corpus_fingerprint(texts[::-1]) != corpus_fingerprint(texts)


def test_demo_corpus(tmp_path):
    pytest.importorskip("legalpt.data.synthetic")
    documents, report = load(tmp_path, synthetic_documents=4, seed=3)
    assert len(documents) == 4 and report.total == 0
    assert {d["source"] for d in documents} == {"synthetic"}
    assert {d["kind"] for d in documents} <= {"contract", "opinion"}
    assert all(d["text"].strip() and isinstance(json.loads(d["meta"]), dict) for d in documents)
    with pytest.raises(ValueError, match="synthetic_documents"):
        load(tmp_path, synthetic_documents=0)


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="the shared sample documents are absent")
def test_real_contracts_and_opinions(tmp_path):
    contracts = sorted((SHARED_DATA / "contracts").glob("*.txt"))
    opinions = sorted((SHARED_DATA / "opinions").glob("*.json"))
    documents, report = load(tmp_path, SHARED_DATA / "contracts", SHARED_DATA / "opinions" / "*.json")
    assert report.total == 0
    assert len(documents) == len(contracts) + len(opinions)
    by_source = {d["source"]: d for d in documents}
    for path in contracts:  # names with spaces, commas and parentheses
        assert by_source[str(path)]["text"] == path.read_text(encoding="utf-8")
    assert sum(by_source[str(p)]["kind"] == "contract" for p in contracts) >= 0.9 * len(contracts)
    for path in opinions:
        case = json.loads(path.read_text())
        document = by_source[str(path)]
        assert document["kind"] == "opinion" and document["id"] == str(case["id"])
        assert document["text"] == cap_text(case)
        assert json.loads(document["meta"])["citations"] == [c["cite"] for c in case["citations"]]
