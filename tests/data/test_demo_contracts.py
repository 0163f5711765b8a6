"""Tests of the demo contracts: recitals, numbered articles and sections, defined terms used in the body,
cross-references to sections that exist, signature blocks and schedules."""

import random
import re

from legalpt.data.demo import generate_documents


def fresh_seed() -> int:
    return random.randrange(1_000_000)


def roman_to_int(numeral: str) -> int:
    values = {"I": 1, "V": 5, "X": 10, "L": 50}
    total = 0
    for letter, following in zip(numeral, [*numeral[1:], ""], strict=True):
        value = values[letter]
        total += -value if following and values[following] > value else value
    return total


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
