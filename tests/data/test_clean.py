"""Cleaning: each step on crafted text and switched off, idempotence, and citations surviving (eyecite before/after)."""

import dataclasses
import json
import random
import re
from collections import Counter
from pathlib import Path

import datasets
import eyecite
import pytest
from eyecite.models import FullCaseCitation

from legalpt.config import CleanConfig
from legalpt.data.clean import clean_batch, clean_text
from legalpt.data.demo import generate_documents

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
STEPS = [f.name for f in dataclasses.fields(CleanConfig) if f.name != "enabled"]
CITATIONS = ["347 U.S. 483, 495 (1954)", "Id. at 5", "100 F. Supp. 2d 200", "42 U.S.C. § 1983", "Compl. ¶ 12"]
HEADER = "MARLOWE v. ORCHARD FREIGHT CORP., No. 21-cv-1234"


def only(step: str) -> CleanConfig:
    """A config with just `step` switched on."""
    return CleanConfig(**{name: name == step for name in STEPS})


def without(step: str) -> CleanConfig:
    return CleanConfig(**{step: False})


def case_citations(text: str) -> Counter:
    """Full case citations eyecite finds in `text`, as (volume, reporter, page) with their counts."""
    return Counter(
        (c.groups.get("volume"), c.corrected_reporter(), c.groups.get("page"))
        for c in eyecite.get_citations(text)
        if isinstance(c, FullCaseCitation)
    )


def retention(pairs: list[tuple[str, str]]) -> tuple[int, int]:
    """(citations found both before and after, citations found before) summed over (before, after) text pairs."""
    kept = total = 0
    for before, after in pairs:
        found = case_citations(before)
        kept += sum((found & case_citations(after)).values())
        total += sum(found.values())
    return kept, total


@pytest.fixture(scope="module")
def seed() -> int:
    seed = random.randrange(2**16)
    print(f"seed={seed}")
    return seed


@pytest.fixture(scope="module")
def opinions(seed: int) -> list[str]:
    """Generated opinions (the citation-bearing half of the demo corpus)."""
    return [d["text"] for d in generate_documents(10, seed) if d["kind"] == "opinion"]


def dirty(text: str, rng: random.Random, lines_per_page: int = 12) -> str:
    """`text` laid out as printed pages: long words broken by a hyphen at line ends, <p> and <i> tags and &amp;
    entities, pleading line numbers on every line of a page, a running header, "Page n of N" footers and form feeds."""
    lines = []
    for line in text.split("\n"):
        words = line.split(" ")
        breakable = [i for i, w in enumerate(words) if len(w) >= 9 and w.isalpha() and w.islower()]
        if breakable and rng.random() < 0.5:
            i = rng.choice(breakable)
            cut = rng.randrange(2, len(words[i]) - 2)
            if words[i][:cut] in ("self", "quasi", "non", "cross", "well"):  # these keep their hyphen
                cut += 1
            if words[i][cut:] in ("and", "or", "nor", "to"):  # and these read as a suspended hyphen
                cut -= 1
            lines.append(" ".join([*words[:i], words[i][:cut] + "-"]))
            line = " ".join([words[i][cut:], *words[i + 1 :]])
        if rng.random() < 0.3:
            line = line.replace(" & ", " &amp; ").replace(" and ", " <i>and</i> ", 1)
        lines.append(line)
    pages = [lines[i : i + lines_per_page] for i in range(0, len(lines), lines_per_page)]
    printed = []
    for number, page in enumerate(pages, 1):
        page += [""] * (lines_per_page - len(page))  # pleading paper numbers every line, to the last
        body = [f"{'<p>' * (rng.random() < 0.3)}{n} {line}" for n, line in enumerate(page, 1)]
        printed.append("\n".join([HEADER, "", *body, "", f"Page {number} of {len(pages)}"]))
    return "\f".join(printed)


def test_markup_decodes_entities_and_drops_known_tags():
    text = "<p>Held:</p> the <i>Brown</i> court &amp; &sect; 1983 and &amp;sect; 5 <br/>(2 &lt; 3) <Confidential>"
    assert clean_text(text, only("markup")) == "Held:\n the Brown court & § 1983 and § 5 \n(2 < 3) <Confidential>"
    assert clean_text(text, without("markup")) == clean_text(text, only("whitespace"))


def test_unicode_normalises_quotes_spaces_and_ligatures_but_keeps_sections_and_dashes():
    text = "\u201cTerm\u201d isn\u2019t de\ufb01ned\u00a0in \u00a7\u00a01983 \u00b6\u20094; "
    text += "pp. 12\u201314 \u2014 non\u2011compete co\u00adop; 347 U.S. 483\u00b2 \uff08\uff11\uff09"
    expected = '"Term" isn\'t defined in § 1983 ¶ 4; pp. 12–14 — non-compete coop; 347 U.S. 483\u00b2 (1)'
    assert clean_text(text, only("unicode_nfkc")) == expected
    assert clean_text(text, only("whitespace")) == text


def test_dehyphenation_joins_broken_words_only():
    text = (
        "the agree-\nment is self-\nexecuting; 42 U.S.C. §§ 1981-\n1983; Smith-\nJones; pre-\nand post-closing; "
        "the sub-\nlicense and any sub-license; the re-\n\nport"
    )
    expected = (
        "the agreement is self-executing; 42 U.S.C. §§ 1981-\n1983; Smith-\nJones; pre- and post-closing; "
        "the sub-license and any sub-license; the re-\n\nport"
    )
    assert clean_text(text, only("dehyphenate")) == expected
    assert "agree-\nment" in clean_text(text, without("dehyphenate"))


def test_page_furniture_drops_running_headers_footers_and_page_numbers():
    body = [f"Paragraph {i} of the opinion, citing 347 U.S. 483." for i in range(18)]
    body[9:9] = ["1", "DISCUSSION"]  # a section number mid-page: content
    pages = [body[:6], body[6:14], body[14:]]
    texts = ["\n".join([HEADER, *page, f"Page {p} of 3"]) for p, page in enumerate(pages, 1)]
    texts[1] += "\n- 2 -"
    texts[2] = "3\n" + texts[2]
    table = "\n".join(["Product Price"] * 4)  # repeated, but nowhere near a page break: content
    schedule = ["SCHEDULE A", "Prices are in U.S. dollars.", "Taxes are extra.", table, "End of Schedule A."]
    text = "\f".join(texts) + "\n\n" + "\n".join(schedule)
    cleaned = clean_text(text, only("page_furniture"))
    assert cleaned == "\n".join([*body, "", *schedule])
    assert HEADER in clean_text(text, without("page_furniture"))


def test_pleading_line_numbers_are_dropped_only_in_runs():
    page = [f"{n:>2} {'line of the complaint' if n % 3 else ''}" for n in range(1, 29)]
    text = "\n".join([*page, "28 U.S.C. § 1331 gives jurisdiction.", "1 2 3 go"])
    expected = [("line of the complaint" if n % 3 else "") for n in range(1, 29)]
    assert clean_text(text, only("line_numbers")) == "\n".join([*expected, *text.split("\n")[-2:]])
    assert clean_text(text, without("line_numbers")).startswith("1 line of the complaint\n2 line")


def test_whitespace_collapses_runs_and_blank_lines():
    text = "  Section\t 1.  Terms.   \n\n\n\n  (a)  Scope \r\nend  "
    assert clean_text(text, only("whitespace")) == "Section 1. Terms.\n\n(a) Scope\nend"
    assert clean_text(text, CleanConfig(enabled=False)) == text


@pytest.mark.parametrize("step", STEPS)
def test_no_step_touches_citations(step: str):
    text = " ".join(f"See {c}." for c in CITATIONS)
    for chosen in (only(step), CleanConfig()):
        cleaned = clean_text(text, chosen)
        assert all(c in cleaned for c in CITATIONS), cleaned


def test_bad_arguments_raise():
    with pytest.raises(TypeError, match="text"):
        clean_text(b"bytes", CleanConfig())
    with pytest.raises(TypeError, match="cfg"):
        clean_text("text", {"enabled": True})
    with pytest.raises(ValueError, match="text"):
        clean_batch({"content": ["x"]}, CleanConfig())


def test_clean_batch_cleans_the_text_column_through_datasets_map():
    table = datasets.Dataset.from_dict({"text": ["a  b", "<p>c</p>", "agree-\nment"], "id": ["1", "2", "3"]})
    cleaned = table.map(clean_batch, batched=True, batch_size=2, fn_kwargs={"cfg": CleanConfig()})
    assert cleaned["text"] == ["a b", "c", "agreement"]
    assert cleaned["id"] == ["1", "2", "3"]


def test_dirty_opinions_come_back_clean_with_their_citations(opinions: list[str], seed: int):
    rng = random.Random(seed)
    cfg = CleanConfig()
    pairs = []
    for text in opinions:
        noisy = dirty(text, rng)
        cleaned = clean_text(noisy, cfg)
        assert cleaned == clean_text(text, cfg)  # every injected piece of noise removed, nothing else lost
        assert clean_text(cleaned, cfg) == cleaned
        for noise in (HEADER, "Page 1 of", "\f", "<p>", "<i>", "&amp;"):
            assert noise not in cleaned
        pairs.append((text, cleaned))
    kept, total = retention(pairs)
    print(f"dirty generated opinions: {kept}/{total} full case citations kept")
    assert total > 0 and kept >= 0.99 * total


def test_generated_opinions_keep_their_citations(opinions: list[str]):
    cfg = CleanConfig()
    cleaned = [clean_text(text, cfg) for text in opinions]
    assert [clean_text(text, cfg) for text in cleaned] == cleaned
    kept, total = retention(list(zip(opinions, cleaned, strict=True)))
    print(f"generated opinions: {kept}/{total} full case citations kept")
    assert total > 0 and kept >= 0.99 * total


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/data is absent")
def test_real_documents_keep_their_citations():
    texts = [path.read_text(encoding="utf-8") for path in sorted((SHARED_DATA / "contracts").glob("*.txt"))]
    for path in sorted((SHARED_DATA / "opinions").glob("*.json")):
        texts += [o["text"] for o in json.loads(path.read_text())["casebody"]["data"]["opinions"]]
    cfg = CleanConfig()
    cleaned = [clean_text(text, cfg) for text in texts]
    assert [clean_text(text, cfg) for text in cleaned] == cleaned
    # EDGAR's "Source: <filer>, <form>, <date>" page footers all go, with or without page numbers beside them.
    footers = [len(re.findall(r"^Source: .+, .+, [0-9/]+$", text, re.MULTILINE)) for text in (*texts, *cleaned)]
    before, after = sum(footers[: len(texts)]), sum(footers[len(texts) :])
    print(f"real documents: {before - after}/{before} EDGAR page footers removed")
    assert before > 0 and after == 0
    kept, total = retention(list(zip(texts, cleaned, strict=True)))
    print(f"real documents: {kept}/{total} full case citations kept")
    assert total > 0 and kept >= 0.99 * total


SIGNATURE_PAGE = [
    "IN WITNESS WHEREOF, the parties have executed this Agreement as of the date first written above.",
    "ACME CORP",
    "By: /s/ John Doe",
    "Name: John Doe",
    "Title: Chief Executive Officer",
]


def test_signature_pages_and_list_items_that_repeat_by_pages_stay():
    pages = [[f"Clause {n} of the agreement text.", "(b) [***]"] for n in range(3)]
    pages += [[f"ACME AFFILIATE {n} LLC", *SIGNATURE_PAGE] for n in range(4)]
    text = "\n\n".join("\n\n".join([*page, f"- {n} -"]) for n, page in enumerate(pages, 1))
    cleaned = [line for line in clean_text(text, only("page_furniture")).split("\n") if line]
    assert cleaned == [line for page in pages for line in page]  # the page numbers alone went


def test_edgar_footers_page_forms_and_a_number_splitting_a_sentence_go():
    body = "\n\n".join(
        [
            "First clause of the agreement.",
            "Page 2/110",
            "Second clause.",
            "iv",
            "Source: ACME CORP, 10-K, 3/1/2019",
            "The parties shall deliver the goods to the",
            "7",
            "buyer within thirty days.",
            "- 3 -",
            "Last clause.",
        ]
    )
    expected = [
        "First clause of the agreement.",
        "Second clause.",
        "The parties shall deliver the goods to the buyer within thirty days.",
        "Last clause.",
    ]
    assert clean_text(body, CleanConfig()) == "\n\n".join(expected)


def test_bare_page_numbers_counting_up_go_but_footnote_marks_stay():
    paragraphs = [f"Paragraph {n} of the contract, which runs on." for n in range(6)]
    paginated = "\n\n".join(f"{p}\n\n{n}" for n, p in enumerate(paragraphs, 1))
    assert clean_text(paginated, CleanConfig()) == "\n\n".join(paragraphs)
    marked = "\n".join(f"{p}\n{n}" for n, p in enumerate(paragraphs, 1))  # CAP's layout: marks, no blank lines
    notes = "\n".join(f"{n}. See the record at {n}." for n in range(1, 7))
    assert clean_text(f"{marked}\n{notes}", CleanConfig()) == f"{marked}\n{notes}"


def test_whitespace_never_makes_a_citation_of_a_table_of_contents_row():
    rows = "1.77 US  16\n2.3 So.\t21\nSee 347 U.S.  483 (1954)."
    cleaned = clean_text(rows, only("whitespace"))
    assert {str(c) for c in eyecite.get_citations(cleaned)} <= {str(c) for c in eyecite.get_citations(rows)}
    assert case_citations(cleaned) == Counter({("347", "U.S.", "483"): 1})
    assert clean_text("a  b\t\tc   d", only("whitespace")) == "a b c d"
