"""Case citations of a demo opinion: the first citation of a case is a full citation in a real reporter format
(parallel citations for some Supreme Court cases, a court and year parenthetical, sometimes an explanatory one);
later ones are Id., short cites ("347 U.S. at 495") and supra that refer back to it, as the Bluebook writes them.
Each (volume, reporter, page) names one case in the whole corpus."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from legalpt.data.demo.jurisdictions import CIRCUITS, DISTRICTS, STATES, State
from legalpt.data.demo.names import Parties, case_parties
from legalpt.data.demo.reporters import edition_for, volume_for


@dataclass(frozen=True)
class _Case:
    name: str
    short: str  # the name its short forms use
    cites: tuple[tuple[int, str, int], ...]  # (volume, edition, first page); parallel citations follow the first
    year: int
    court: str  # court abbreviation of the parenthetical; "" when the reporter implies the court


# Kind of the citing court -> how likely it cites each kind of court.
_CITED_COURTS = {
    "scotus": {"scotus": 0.75, "circuit": 0.2, "state": 0.05},
    "circuit": {"scotus": 0.4, "circuit": 0.45, "district": 0.1, "state": 0.05},
    "district": {"scotus": 0.3, "circuit": 0.4, "district": 0.3},
    "state": {"scotus": 0.25, "state": 0.65, "circuit": 0.1},
}


class Citations:
    """Writes the case citations of one opinion: a full citation the first time a case is cited, then Id., short
    cites and supra that refer back to it. Every full citation is recorded for the document's metadata."""

    def __init__(
        self,
        rng: random.Random,
        court: str,
        year: int,
        state: State,
        circuit: str,
        explain: Callable[[], str],
        taken: set[tuple[int, str, int]],
    ) -> None:
        self.rng = rng
        self.taken = taken  # every (volume, edition, page) of the corpus so far; each names one case, added here
        self.court = court  # kind of the citing court: scotus | circuit | district | state
        self.year = year  # no cited decision is later than the opinion
        self.state = state  # the home state, cited most by a state court
        self.circuit = circuit  # the home circuit, cited most by a circuit court
        self.explain = explain  # draws a proposition for an explanatory parenthetical
        self.cases: list[_Case] = []
        self.last: _Case | None = None  # the case "Id." refers to; None right after a string cite
        self.full: list[dict] = []
        self.counts = {"id": 0, "short": 0, "supra": 0}

    def cite(self, _: str = "") -> str:
        draw = self.rng.random()
        if self.last is not None and draw < 0.3:
            return self._id()
        earlier = [c for c in self.cases if c is not self.last]
        if earlier and draw < 0.65:
            return self._signal() + self._short(self.rng.choice(earlier))
        return self._signal() + self._full(self._new_case())

    def string_cite(self, _: str = "") -> str:
        parts = [self._full(self._new_case()) for _ in range(self.rng.randint(2, 3))]
        self.last = None  # "Id." after a string cite would be ambiguous
        return self.rng.choice(("See, e.g., ", "See ", "")) + "; ".join(parts)

    def _signal(self) -> str:
        return self.rng.choice(("", "", "", "See ", "See also ", "Cf. ", "See generally "))

    def _pin(self, case: _Case) -> int:
        return case.cites[0][2] + self.rng.randint(1, 40)

    def _id(self) -> str:
        self.counts["id"] += 1
        draw = self.rng.random()
        if draw < 0.25:
            return "Id."
        return f"{'See id.' if draw < 0.45 else 'Id.'} at {self._pin(self.last)}"

    def _short(self, case: _Case) -> str:
        self.last = case
        volume, edition, _ = case.cites[0]
        if self.rng.random() < 0.3:
            self.counts["supra"] += 1
            return f"{case.short}, supra, at {self._pin(case)}"
        self.counts["short"] += 1
        return f"{case.short}, {volume} {edition} at {self._pin(case)}"

    def _full(self, case: _Case) -> str:
        self.last = case
        pin = self._pin(case) if self.rng.random() < 0.7 else None
        cites = [f"{v} {e} {p}" for v, e, p in case.cites]
        if pin is not None:
            cites[0] += f", {pin}"
        paren = f"({case.court} {case.year})" if case.court else f"({case.year})"
        if self.rng.random() < 0.2:
            paren += f" ({self.rng.choice(('holding', 'explaining', 'noting'))} that {self.explain()})"
        for i, (volume, edition, page) in enumerate(case.cites):
            self.full.append({"case_name": case.name, "volume": volume, "reporter": edition, "page": page,
                              "pin": pin if i == 0 else None, "year": case.year, "court": case.court})  # fmt: skip
        return f"{case.name}, {', '.join(cites)} {paren}"

    def _new_case(self) -> _Case:
        weights = _CITED_COURTS[self.court]
        make = {"scotus": self._scotus, "circuit": self._circuit, "district": self._district, "state": self._state}
        kind = self.rng.choices(tuple(weights), tuple(weights.values()))[0]
        case = make[kind]()
        # Short forms must be unambiguous in the opinion, and a cite held by another case would make it name two.
        while any(c.short == case.short for c in self.cases) or not self.taken.isdisjoint(case.cites):
            case = make[kind]()
        self.taken.update(case.cites)
        self.cases.append(case)
        return case

    def _year(self, first: int) -> int:
        """A year from `first` to the opinion's year, biased toward recent decisions as real opinions are."""
        return self.year - int((self.year - first) * self.rng.random() ** 3)

    def _parties(self, prosecutor: str = "United States") -> Parties:
        style = self.rng.choice(("company", "company", "mixed", "mixed", "criminal", "municipal"))
        return case_parties(self.rng, style, prosecutor)

    def _scotus(self) -> _Case:
        rng = self.rng
        year = self._year(1900)
        cites = [(volume_for(rng, "U.S.", year), "U.S.", rng.randint(1, 1200))]
        if year >= 1960 and rng.random() < 0.3:
            cites += [(volume_for(rng, e, year), e, rng.randint(1, 3000)) for e in ("S. Ct.", "L. Ed. 2d")]
        parties = self._parties()
        return _Case(parties.name, parties.short, tuple(cites), year, "")

    def _circuit(self) -> _Case:
        rng = self.rng
        year = self._year(1950)
        circuits = CIRCUITS if year >= 1982 else CIRCUITS[:11]
        circuit = self.circuit if rng.random() < 0.5 and year >= 1982 else rng.choice(circuits)[1]
        edition = edition_for(rng, ("F.2d", "F.3d", "F.4th"), year)
        parties = self._parties()
        cite = (volume_for(rng, edition, year), edition, rng.randint(1, 1400))
        return _Case(parties.name, parties.short, (cite,), year, f"{circuit} Cir.")

    def _district(self) -> _Case:
        rng = self.rng
        year = self._year(1960)
        edition = edition_for(rng, ("F. Supp.", "F. Supp. 2d", "F. Supp. 3d"), year)
        parties = self._parties()
        cite = (volume_for(rng, edition, year), edition, rng.randint(1, 1600))
        return _Case(parties.name, parties.short, (cite,), year, rng.choice(DISTRICTS)[1])

    def _state(self) -> _Case:
        rng = self.rng
        state = self.state if rng.random() < 0.7 else rng.choice(STATES)
        year = self._year(1950)
        parties = self._parties(state.prosecutor)
        official = edition_for(rng, state.official, year) if rng.random() < 0.6 else None
        if official is not None:
            cite = (volume_for(rng, official, year), official, rng.randint(1, 1200))
            return _Case(parties.name, parties.short, (cite,), year, "")
        edition = edition_for(rng, state.regional, year)
        court = state.appellate if state.appellate and rng.random() < 0.3 else state.abbr
        cite = (volume_for(rng, edition, year), edition, rng.randint(1, 1400))
        return _Case(parties.name, parties.short, (cite,), year, court)
