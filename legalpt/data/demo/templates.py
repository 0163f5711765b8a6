"""Phrase text and how a document fills it in: the phrase files (package data under `phrases/`) and their parser,
the template filler, and the small value formats every kind of document uses (dates, dollar amounts, roman numerals,
enumerated lists).

A template is a phrase with fields: "{field}" draws from the pool of that name, "{Field}" draws the same with a
capital letter, and fixed or lazy values ("{ref:term}") come from the document.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from importlib import resources

LATEST_YEAR = 2024  # latest year of a contract or a cited edition; fixed, so the output never depends on today
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")  # fmt: skip
COUNTS = {
    "days": ["five (5)", "ten (10)", "fifteen (15)", "thirty (30)", "forty-five (45)", "sixty (60)", "ninety (90)"],
    "years": ["one (1) year", "two (2) years", "three (3) years", "five (5) years"],
    "percent": ["five percent (5%)", "ten percent (10%)", "fifteen percent (15%)", "twenty-five percent (25%)"],
}


def load_phrases(name: str) -> dict[str, dict[str, list[str]]]:
    """The phrase groups of `phrases/<name>.txt`, read from the installed package (a wheel holds them too)."""
    text = (resources.files(__package__) / "phrases" / f"{name}.txt").read_text(encoding="utf-8")
    return parse_phrases(text)


def parse_phrases(text: str) -> dict[str, dict[str, list[str]]]:
    """Phrase blocks: "## group" opens a group, "# pool" a pool inside it, "- text" adds an entry, "* text" an
    enumerated item (kept with its "* " marker), and a line indented by two spaces continues the entry above it."""
    groups: dict[str, dict[str, list[str]]] = {}
    for line in text.strip().splitlines():
        if line.startswith("## "):
            group = groups.setdefault(line[3:], {})
        elif line.startswith("# "):
            pool = group.setdefault(line[2:], [])
        elif line.startswith("- "):
            pool.append(line[2:])
        elif line.startswith("* "):
            pool.append(line)
        elif line.startswith("  "):
            pool[-1] += " " + line.strip()
        elif line:
            raise ValueError(f"unparsable phrase line: {line!r}")
    return groups


class Lazy:
    """A template value computed each time it is formatted; the format spec (`term` in `{ref:term}`) is the argument."""

    __slots__ = ("draw",)

    def __init__(self, draw: Callable[[str], str]) -> None:
        self.draw = draw

    def __format__(self, spec: str) -> str:
        return self.draw(spec)


class Filler(dict):
    """Fills templates for one document: fixed values live in the dict, other fields are drawn from `pools` (and
    their own fields filled in turn)."""

    def __init__(self, rng: random.Random, pools: dict[str, list[str]], **fixed: object) -> None:
        super().__init__(fixed)
        self.rng = rng
        self.pools = pools

    def __missing__(self, key: str) -> str:
        options = self.pools.get(key)
        if options is not None:
            return self.rng.choice(options).format_map(self)
        text = self.rng.choice(self.pools[key[0].lower() + key[1:]]).format_map(self)
        return text[0].upper() + text[1:]

    def fill(self, template: str) -> str:
        return template.format_map(self)

    def sentence(self, template: str) -> str:
        text = template.format_map(self)
        if ".." in text:  # a value that ends with a period ("Id.", "Inc.") before the sentence's own period
            text = text.replace("..", ".")
        return text[0].upper() + text[1:]


def date_in(rng: random.Random, year: int) -> str:
    """A day of `year` (never past the 28th, so every month has it)."""
    return f"{rng.choice(MONTHS)} {rng.randint(1, 28)}, {year}"


def dollars(rng: random.Random, low: int, high: int) -> str:
    """A dollar amount between 10**low and 10**high, rounded to two significant digits like a negotiated figure."""
    value = int(10 ** rng.uniform(low, high))
    unit = 10 ** max(0, int(math.log10(value)) - 1)
    return f"${value // unit * unit:,}"


def roman(number: int) -> str:
    out = []
    for value, letters in ((10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")):
        count, number = divmod(number, value)
        out.append(letters * count)
    return "".join(out)


def with_article(word: str) -> str:
    """The word with its indefinite article: "a Delaware", "an Illinois"."""
    return f"{'an' if word[0] in 'AEIOU' else 'a'} {word}"


def enumerate_items(items: list[str]) -> str:
    """(a) first;\\n(b) second; and\\n(c) third."""
    lines = [f"({chr(ord('a') + i)}) {item};" for i, item in enumerate(items)]
    lines[-1] = lines[-1][:-1] + "."
    if len(lines) > 1:
        lines[-2] += " and"
    return "\n".join(lines)
