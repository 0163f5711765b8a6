"""Invented names of the demo corpus: people, companies and their addresses, and the parties of a case caption.
The words they are made of are the phrase file `phrases/names.txt`."""

from __future__ import annotations

import random
from dataclasses import dataclass

from legalpt.data.demo.jurisdictions import State
from legalpt.data.demo.templates import load_phrases

WORDS = {name: tuple(words[0].split()) for name, words in load_phrases("names")["names"].items()}
# Entity suffix -> what a contract's preamble calls that kind of entity.
_ENTITIES = {
    "Inc.": "corporation",
    "Corporation": "corporation",
    "Corp.": "corporation",
    "LLC": "limited liability company",
    "L.P.": "limited partnership",
    "Co.": "corporation",
}


def person(rng: random.Random) -> str:
    return f"{rng.choice(WORDS['first'])} {rng.choice(WORDS['last'])}"


@dataclass(frozen=True)
class Company:
    name: str  # "Northwind Logistics, Inc."
    short: str  # "Northwind Logistics"
    entity: str  # "corporation"


def company(rng: random.Random) -> Company:
    short = f"{rng.choice(WORDS['company_head'])} {rng.choice(WORDS['company_trade'])}"
    suffix = rng.choice(tuple(_ENTITIES))
    name = f"{short}, Inc." if suffix == "Inc." else f"{short} {suffix}"
    return Company(name, short, _ENTITIES[suffix])


def address(rng: random.Random, state: State) -> str:
    street = f"{rng.randint(10, 9900)} {rng.choice(WORDS['street'])} {rng.choice(('Street', 'Avenue', 'Road'))}"
    suite = f", Suite {rng.randint(1, 30) * 100}" if rng.random() < 0.6 else ""
    return f"{street}{suite}, {rng.choice(state.cities)}, {state.postal} {rng.randint(10000, 99999)}"


@dataclass(frozen=True)
class Parties:
    """The two sides of a case caption, in caption order, and the names used for them after the caption."""

    first: str
    second: str
    short: str  # the name short citations use: "Okafor, 123 F.3d at 460"
    actor: str  # in an opinion's text, the party that sued, or the defendant of a criminal case
    other: str  # the opposing party

    @property
    def name(self) -> str:
        return f"{self.first} v. {self.second}"


def case_parties(rng: random.Random, style: str, prosecutor: str = "United States") -> Parties:
    """A caption of the given style: company | person | mixed (a person or a company against a company) | municipal
    | criminal. A criminal case is "<prosecutor> v. <defendant>", and its short name is the defendant's, as the
    Bluebook has it."""
    last_names = WORDS["last"]
    if style == "criminal":
        defendant = rng.choice(last_names)
        government = "the Government" if prosecutor == "United States" else f"the {prosecutor}"
        return Parties(prosecutor, defendant, defendant, defendant, government)
    if style == "municipal":
        someone = rng.choice(last_names)
        return Parties(someone, f"City of {rng.choice(WORDS['town'])}", someone, someone, "the City")
    second = company(rng)
    if style == "person" or (style == "mixed" and rng.random() < 0.5):
        someone = rng.choice(last_names)
        return Parties(someone, second.name, someone, someone, second.short)
    first = company(rng)
    while first.short == second.short:
        first = company(rng)
    return Parties(first.name, second.name, first.short, first.short, second.short)
