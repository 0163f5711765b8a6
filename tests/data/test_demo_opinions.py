"""Tests of the demo opinions and their citations: citations that eyecite recovers as inserted, a reporter cite that
names one case in the whole corpus, and the structure of an opinion."""

import random
import re
from collections import Counter

import eyecite
from eyecite.models import FullCaseCitation, FullLawCitation, IdCitation, ShortCaseCitation, SupraCitation
from reporters_db import EDITIONS, REPORTERS

from legalpt.data.demo import generate_documents


def fresh_seed() -> int:
    return random.randrange(1_000_000)


def edition_years(edition: str) -> tuple[int, int]:
    """reporters-db's publication years of an edition, found by scanning every reporter (an open end is 9999)."""
    for reporters in REPORTERS.values():
        for reporter in reporters:
            dates = reporter["editions"].get(edition)
            if dates is not None:
                return dates["start"].year, dates["end"].year if dates["end"] else 9999
    raise KeyError(edition)


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
