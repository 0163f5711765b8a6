"""Tests of the built-in demo corpus: determinism, schema, lengths, generation speed, citations that eyecite
recovers as inserted, and the structure of the contracts."""

import json
import os
import random
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import eyecite
import pytest
from eyecite.models import FullCaseCitation, FullLawCitation, IdCitation, ShortCaseCitation, SupraCitation
from reporters_db import EDITIONS, REPORTERS

from legalpt.data.synthetic import MAX_CHARS, MIN_CHARS, generate_documents

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def default_corpus() -> tuple[list[dict], float]:
    """The corpus `legalpt-train` builds by default (160 documents, seed 0), and the CPU seconds it took."""
    start = time.process_time()
    documents = generate_documents(160, seed=0)
    return documents, time.process_time() - start


def fresh_seed() -> int:
    return random.randrange(1_000_000)


def roman_to_int(numeral: str) -> int:
    values = {"I": 1, "V": 5, "X": 10, "L": 50}
    total = 0
    for letter, following in zip(numeral, [*numeral[1:], ""], strict=True):
        value = values[letter]
        total += -value if following and values[following] > value else value
    return total


def edition_years(edition: str) -> tuple[int, int]:
    """reporters-db's publication years of an edition, found by scanning every reporter (an open end is 9999)."""
    for reporters in REPORTERS.values():
        for reporter in reporters:
            dates = reporter["editions"].get(edition)
            if dates is not None:
                return dates["start"].year, dates["end"].year if dates["end"] else 9999
    raise KeyError(edition)


def test_same_arguments_give_the_same_documents_in_any_process():
    seed = fresh_seed()
    first = generate_documents(6, seed=seed)
    assert generate_documents(6, seed=seed) == first
    assert generate_documents(3, seed=seed) == first[:3]  # document i depends on nothing after it
    others = generate_documents(6, seed=seed + 1)
    assert all(a["text"] != b["text"] for a, b in zip(first, others, strict=True))

    code = (
        "import json; from legalpt.data.synthetic import generate_documents; "
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


def test_eyecite_recovers_the_inserted_citations():
    seed = fresh_seed()
    # eyecite reads ~40k characters a second here: a few short and middling opinions keep this test quick.
    opinions = [d for d in generate_documents(40, seed=seed) if d["kind"] == "opinion" and len(d["text"]) < 50_000]
    opinions = opinions[:6]
    inserted = recovered = spurious = 0
    kinds = Counter()
    for opinion in opinions:
        where = f"seed {seed}, {opinion['id']}"
        citations = eyecite.get_citations(opinion["text"])
        kinds.update(type(c).__name__ for c in citations)
        full = [c for c in citations if isinstance(c, FullCaseCitation)]
        found = Counter((int(c.groups["volume"]), c.corrected_reporter(), int(c.groups["page"])) for c in full)
        recorded = opinion["meta"]["citations"]
        want = Counter((c["volume"], c["reporter"], c["page"]) for c in recorded)
        inserted += sum(want.values())
        recovered += sum((want & found).values())
        spurious += sum((found - want).values())
        assert all(c.corrected_reporter() in EDITIONS for c in full), where
        for cite in recorded:
            first, last = edition_years(cite["reporter"])
            assert first <= cite["year"] <= last, (where, cite)

        # Short forms refer back to a full citation earlier in the same opinion.
        for short in (c for c in citations if isinstance(c, ShortCaseCitation)):
            volume, reporter, pin = int(short.groups["volume"]), short.corrected_reporter(), int(short.groups["page"])
            earlier = [c for c in full if c.span()[0] < short.span()[0]]
            assert any(
                int(c.groups["volume"]) == volume
                and c.corrected_reporter() == reporter
                and int(c.groups["page"]) <= pin
                for c in earlier
            ), (where, short.matched_text())
        for supra in (c for c in citations if isinstance(c, SupraCitation)):
            names = " ".join(c["case_name"] for c in recorded)
            assert supra.metadata.antecedent_guess in names, (where, supra.metadata.antecedent_guess)
        first_cite = min(citations, key=lambda c: c.span()[0])
        assert not isinstance(first_cite, IdCitation), where  # "Id." needs something to refer to
        # eyecite reads U.S. Code sections that are plain numbers ("42 U.S.C. § 1983", not "§ 2000e-2").
        code = [c for c in citations if isinstance(c, FullLawCitation) and c.groups.get("reporter") == "U.S.C."]
        laws = {(c.groups["title"], c.groups["section"]) for c in code}
        for statute in opinion["meta"]["statutes"]:
            numbered = re.fullmatch(r"(\d+) U\.S\.C\. § (\d+)(\(.*)?", statute)
            if numbered:
                assert numbered.group(1, 2) in laws, (where, statute)
    assert inserted >= 50, f"seed {seed}: only {inserted} citations inserted"
    assert recovered / inserted >= 0.95, f"seed {seed}: eyecite recovered {recovered} of {inserted}"
    assert spurious <= 0.05 * inserted, f"seed {seed}: {spurious} citations eyecite found were never inserted"
    assert kinds["IdCitation"] > 0 and kinds["SupraCitation"] > 0 and kinds["ShortCaseCitation"] > 0, kinds


def test_a_reporter_cite_names_one_case_in_the_whole_corpus():
    """Over many corpora of some 2,600 full citations each (an old generator that drew pages freely gave two cases one
    cite in most of them), every (volume, reporter, page) belongs to one case: one name, year and court."""
    first = fresh_seed()
    cites = 0
    for seed in range(first, first + 12):
        owners: dict[tuple[int, str, int], set[tuple[str, int, str]]] = {}
        for opinion in (d for d in generate_documents(40, seed=seed) if d["kind"] == "opinion"):
            for cite in opinion["meta"]["citations"]:
                key = (cite["volume"], cite["reporter"], cite["page"])
                owners.setdefault(key, set()).add((cite["case_name"], cite["year"], cite["court"]))
                cites += 1
        shared = {key: cases for key, cases in owners.items() if len(cases) > 1}
        assert not shared, f"seed {seed}: {shared}"
    assert cites >= 12 * 1_000, cites  # enough cites that free draws would collide


def test_opinions_have_a_caption_syllabus_and_numbered_parts():
    seed = fresh_seed()
    for opinion in (d for d in generate_documents(16, seed=seed) if d["kind"] == "opinion"):
        text, where = opinion["text"], f"seed {seed}, {opinion['id']}"
        court = text.split("\n", 1)[0]
        assert "COURT" in court and court == court.upper(), where
        assert re.search(r"^(Case )?No\. \S+$", text, re.M), where
        assert re.search(r"\nv\.\n", text) and re.search(r"^Decided \w+ \d{1,2}, \d{4}$", text, re.M), where
        assert "\n\nSyllabus\n\n" in text and "\n\nHeld: " in text, where
        assert re.search(r"(delivered the opinion of the Court\.|Circuit Judge:|District Judge\.)\n\nI\n\n", text), (
            where
        )
        assert "\n\nII\n\n" in text, where


def test_contracts_have_their_structural_elements():
    seed = fresh_seed()
    contracts = [d for d in generate_documents(24, seed=seed) if d["kind"] == "contract"]
    for contract in contracts:
        text, where = contract["text"], f"seed {seed}, {contract['id']}"
        assert text.count("\n\nWHEREAS, ") >= 2 and "\n\nRECITALS\n\n" in text, where
        assert "NOW, THEREFORE, in consideration of" in text, where

        articles = [(roman_to_int(n), title) for n, title in re.findall(r"^ARTICLE ([IVXL]+)\n(.+)$", text, re.M)]
        assert [n for n, _ in articles] == list(range(1, len(articles) + 1)), where
        assert articles[0][1] == "DEFINITIONS" and len(articles) >= 4, where
        sections = re.findall(r"^Section (\d+)\.(\d+) [A-Z]", text, re.M)
        by_article = {}
        for major, minor in sections:
            by_article.setdefault(int(major), []).append(int(minor))
        assert sorted(by_article) == [n for n, _ in articles], where  # every article has sections, numbered by it
        assert all(minors == list(range(1, len(minors) + 1)) for minors in by_article.values()), where

        body_start = text.index("\nARTICLE II\n")
        terms = re.findall(r'^"([A-Z][^"]+)" (?:means|has the meaning)', text[:body_start], re.M)
        assert terms, where
        for term in terms:
            assert re.search(rf"\b{re.escape(term)}\b", text[body_start:]), (where, term)

        headings = {f"{major}.{minor}" for major, minor in sections}
        references = re.findall(r"(?<!^)Section (\d+\.\d+)", text, re.M)
        assert references, where
        assert set(references) <= headings, (where, set(references) - headings)

        signatures = text.index("IN WITNESS WHEREOF")
        for party in contract["meta"]["parties"]:
            assert re.search(rf"{re.escape(party.upper())}\n\nBy: _+\nName: .+\nTitle: .+", text[signatures:]), where
        assert signatures < text.index("\nSCHEDULE A\n"), where  # schedules follow the signature page
        for label in set(re.findall(r"\b(Schedule [A-Z]|Exhibit [A-Z])\b", text)):
            assert f"\n{label.upper()}\n" in text, (where, label)


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
