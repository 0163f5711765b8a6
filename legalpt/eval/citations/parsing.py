"""What eyecite reads from a text: its citations (with the year of a full citation repaired), their forms, what a
short form resolves to, and the fields of a full case citation that items and scores compare (`GoldCitation`); and
what it cannot read: citation-shaped strings whose reporter reporters-db does not know (`invented_citations`).

Citation identity is eyecite's: (volume, reporter as reporters-db normalizes it, page).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import reporters_db
from eyecite import get_citations, resolve_citations
from eyecite.models import CitationBase, FullCaseCitation, IdCitation, ShortCaseCitation, SupraCitation

from legalpt.eval.citations.names import case_name

FORMS = ("full", "short", "supra", "id")  # citation forms, as `CitationItem.form` names them
FORM_OF = {FullCaseCitation: "full", ShortCaseCitation: "short", SupraCitation: "supra", IdCitation: "id"}

Key = tuple[str | None, str, str]  # (volume, normalized reporter, page)


def find_citations(text: str) -> list[CitationBase]:
    """eyecite's citations of `text`, with the year of a full citation repaired where eyecite reads it elsewhere.

    eyecite 2.7's court pattern runs on past a year-only parenthetical to the next "(Court Year)" within reach: in
    "A v. B, 1 U.S. 1 (1990). Later text. C v. D, 2 F.3d 2 (2d Cir. 1995)" both get 1995 (freelawproject/eyecite
    #347). A full citation whose post-citation text reaches past a closing parenthesis into another citation is
    parsed again on its own, up to that citation, and takes its year, edition and extent from there.
    """
    if not text.strip():
        return []  # eyecite refuses empty text
    citations = get_citations(text)
    starts = sorted(c.span()[0] for c in citations)
    for citation in citations:
        if isinstance(citation, FullCaseCitation):
            end, reach = citation.span()[1], citation.full_span()[1]
            cut = next((s for s in starts if end < s < reach and ")" in text[end:s]), None)
            if cut is not None:
                _reparse(citation, text, cut)
    return citations


def _reparse(citation: FullCaseCitation, text: str, cut: int) -> None:
    start = citation.full_span()[0]
    alone = get_citations(text[start:cut])
    own = next((c for c in alone if start + c.span()[0] == citation.span()[0]), None)
    if isinstance(own, FullCaseCitation):
        citation.year, citation.metadata.year = own.year, own.metadata.year
        citation.edition_guess = own.edition_guess  # an edition guessed from the wrong year may be wrong too
        citation.full_span_end = start + own.full_span()[1]


def resolutions(citations: list[CitationBase]) -> dict[int, CitationBase]:
    """id(citation) -> the full citation eyecite's resolver groups it with."""
    return {id(c): resource.citation for resource, group in resolve_citations(citations).items() for c in group}


def is_keyed(citation: CitationBase) -> bool:
    """Whether `citation` is a full case citation with a page, so that it has a `Key`."""
    return isinstance(citation, FullCaseCitation) and citation.groups.get("page") is not None


@dataclass(frozen=True)
class GoldCitation:
    """The full citation an item asks for: for a short form, the one eyecite resolves it to."""

    volume: str | None  # as written ("347"); a few reporters have none
    reporter: str  # normalized through reporters-db ("F.2d", "U.S.")
    page: str  # first page ("483")
    year: int | None  # decision year eyecite read from the citation's parenthetical
    case_name: str | None  # "Brown v. Board of Education"; None when eyecite found no name
    plaintiff: str | None
    defendant: str | None

    @property
    def key(self) -> Key:
        return (self.volume, self.reporter, self.page)


def gold_citation(full: FullCaseCitation) -> GoldCitation:
    """The fields of `full` that items and scores compare."""
    plaintiff, defendant = full.metadata.plaintiff, full.metadata.defendant
    return GoldCitation(
        volume=full.groups.get("volume"),
        reporter=full.corrected_reporter(),
        page=full.groups["page"],
        year=full.year,
        case_name=case_name(plaintiff, defendant),
        plaintiff=plaintiff,
        defendant=defendant,
    )


# "<volume> <reporter-like abbreviation> <page>": capitalized words, abbreviations and edition ordinals ("Fake Rptr.",
# "So. 5th", "N.W.4d") between two numbers. eyecite only finds reporters it knows, so this is how an invented one shows.
_CITATION_SHAPE = re.compile(
    r"(?<![\w.§])(?P<volume>\d{1,5})\s+"
    r"(?P<reporter>[A-Z][A-Za-z0-9.&']*(?:\s+(?:[A-Z][A-Za-z0-9.&']*|\d+(?:st|nd|rd|th|d)\.?)){0,5})"
    r"\s+(?P<page>\d{1,6})(?![\w-])"
)
# Abbreviations that sit between two numbers without being reporters ("12 Jan. 2020", "5 No. 3").
_MONTHS = ("Jan.", "Feb.", "Mar.", "Apr.", "Jun.", "Jul.", "Aug.", "Sep.", "Sept.", "Oct.", "Nov.", "Dec.")
_NOT_REPORTERS = frozenset((*_MONTHS, "No.", "Nos.", "Vol.", "Vols.", "Ch.", "Sec.", "Art.", "Pt.", "Id."))


@dataclass(frozen=True)
class InventedCitation:
    """A citation-shaped string whose reporter reporters-db (eyecite's list) does not know: "123 Fake Rptr. 456"."""

    volume: str
    reporter: str  # as written
    page: str
    start: int  # span in the text searched
    end: int


def invented_citations(text: str, known: Sequence[CitationBase] = (), start: int = 0) -> list[InventedCitation]:
    """The citation-shaped strings of `text` from `start` on with a reporter unknown to reporters-db, outside the
    spans of the citations eyecite found (`known`), in order. A reporter needs a period to look like an abbreviation."""
    taken = [c.span() for c in known]
    found = []
    for match in _CITATION_SHAPE.finditer(text, start):
        reporter, (begin, end) = match["reporter"], match.span()
        if "." not in reporter or reporter in _NOT_REPORTERS or is_known_reporter(reporter):
            continue
        if any(begin < other_end and other_begin < end for other_begin, other_end in taken):
            continue
        found.append(InventedCitation(match["volume"], reporter, match["page"], begin, end))
    return found


def is_known_reporter(name: str) -> bool:
    """Whether reporters-db names `name` (spacing aside) as a reporter, a variation of one, a code or a journal."""
    return _squeeze(name) in _known_reporters()


@functools.cache
def _known_reporters() -> frozenset[str]:
    names = set(reporters_db.EDITIONS) | set(reporters_db.VARIATIONS_ONLY)
    for table in (reporters_db.LAWS, reporters_db.JOURNALS):
        for name, entries in table.items():
            names.add(name)
            names.update(variation for entry in entries for variation in entry.get("variations", ()))
    return frozenset(_squeeze(name) for name in names)


def _squeeze(name: str) -> str:
    return re.sub(r"\s+", "", name)
