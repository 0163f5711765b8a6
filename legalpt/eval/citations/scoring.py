"""Scoring one continuation: the first citation a model writes after an item's prompt against the gold citation, and
against `CitationIndex`, the citations of a reference corpus, which tells a fabricated citation (no such citation
anywhere, or a reporter reporters-db does not know) from a misattributed one (a real citation of another case).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from eyecite.models import CitationBase, FullCaseCitation

from legalpt.eval.citations.checks import check_documents
from legalpt.eval.citations.items import CitationItem
from legalpt.eval.citations.names import case_name, same_case_name
from legalpt.eval.citations.parsing import (
    FORM_OF,
    GoldCitation,
    Key,
    find_citations,
    gold_citation,
    invented_citations,
    is_keyed,
    resolutions,
)

CITATION_METRICS = (
    "well_formed",
    "exact",
    "reporter",
    "volume",
    "page",
    "year",
    "case_name",
    "fabricated",
    "unknown_reporter",
    "misattributed",
)
# Why a citation counts as fabricated, as `fabrication_reason` names it.
UNKNOWN_REPORTER = "unknown reporter"
NOT_IN_CORPUS = "not in the reference corpus"


class CitationIndex:
    """Every full case citation of a reference corpus: (volume, normalized reporter, page) -> case names cited with it.

    A key whose citations never came with a name maps to an empty set: the citation exists, its case is unknown.
    """

    def __init__(self, names: Mapping[Key, Iterable[str]] | None = None) -> None:
        self._names: dict[Key, set[str]] = {key: set(value) for key, value in (names or {}).items()}

    @classmethod
    def from_documents(cls, documents: Iterable[Mapping[str, Any]]) -> CitationIndex:
        index = cls()
        for doc in check_documents(documents):
            for citation in find_citations(doc["text"]):
                if is_keyed(citation):
                    gold = gold_citation(citation)
                    names = index._names.setdefault(gold.key, set())
                    if gold.case_name:
                        names.add(gold.case_name)
        return index

    def names(self, key: Key) -> set[str]:
        return self._names.get(key, set())

    def __contains__(self, key: object) -> bool:
        return key in self._names

    def __len__(self) -> int:
        return len(self._names)


@dataclass(frozen=True)
class _Cited:
    """What a generated citation refers to: its own fields, or those of the full citation a short form resolves to."""

    volume: str | None = None
    reporter: str | None = None
    page: str | None = None
    year: int | None = None
    name: str | None = None  # a case name the generation itself writes (not one from the prompt)
    invented: bool = False  # citation-shaped, with a reporter reporters-db does not know (reporter as written)

    @property
    def key(self) -> Key | None:
        return (self.volume, self.reporter, self.page) if self.reporter and self.page else None


def score_citation(item: CitationItem, generation: str, index: CitationIndex) -> dict[str, float]:
    """The metrics of `generation`, the text a model wrote after `item.prompt`: 1.0 / 0.0, NaN where not applicable.

    The generation is parsed by eyecite after its prompt, and the first citation that starts inside it counts.
    - well_formed: it is a full case citation with a page, or has that shape ("<volume> <reporter> <page>") with a
      reporter reporters-db does not know; for a short-form item an Id., supra or short cite is well-formed too.
      Everything below is 0 when it is not: the generation is malformed.
    - exact, reporter, volume, page: (volume, normalized reporter, page) of the citation, or of the full citation a
      short form resolves to, equal gold's; eyecite resolves a generated short form against the citations of the
      prompt and the gold full citation (a short form names its case, it does not cite it).
    - year: the cited decision year equals gold's (NaN when gold has none).
    - case_name: `same_case_name` of gold's name and the name the generation writes for its citation, or when it
      writes none, any name the index holds for the cited key (NaN when gold has no name).
    - fabricated: the cited key is in no citation of the index (always so for an unknown reporter).
    - unknown_reporter: fabricated because reporters-db does not know the reporter ("123 Fake Rptr. 456"); such a
      citation scores its volume and page, and 0 for reporter, exact, year and case_name.
    - misattributed: the cited key is in the index, only under names other than gold's (NaN when gold has no name).
    """
    if not isinstance(item, CitationItem):
        raise TypeError(f"item: expected a CitationItem, got {type(item).__name__}")
    if not isinstance(generation, str):
        raise TypeError(f"generation: expected a str, got {type(generation).__name__}")
    if not isinstance(index, CitationIndex):
        raise TypeError(f"index: expected a CitationIndex, got {type(index).__name__}")
    gold = item.gold
    scores = dict.fromkeys(CITATION_METRICS, 0.0)
    if gold.year is None:
        scores["year"] = math.nan
    if gold.case_name is None:
        scores["case_name"] = scores["misattributed"] = math.nan
    cited = _generated_citation(item, generation)
    if cited is None:
        return scores
    scores["well_formed"] = 1.0
    if cited.reporter is not None:
        scores["reporter"] = float(cited.reporter == gold.reporter)
        scores["volume"] = float(cited.volume == gold.volume)
        scores["page"] = float(cited.page == gold.page)
        scores["exact"] = float(cited.key == gold.key)
        if gold.year is not None:
            scores["year"] = float(cited.year == gold.year)
    if cited.key is not None:
        scores["fabricated"] = float(cited.key not in index)
    scores["unknown_reporter"] = float(cited.invented)
    if gold.case_name is not None:
        known = index.names(cited.key) if cited.key else set()
        names = {cited.name} if cited.name else known
        scores["case_name"] = float(any(same_case_name(name, gold.case_name) for name in names))
        scores["misattributed"] = float(bool(known) and not any(same_case_name(n, gold.case_name) for n in known))
    return scores


def fabrication_reason(scores: Mapping[str, float]) -> str | None:
    """Why `score_citation`'s scores count a citation as fabricated: UNKNOWN_REPORTER, NOT_IN_CORPUS; None if not."""
    if scores["fabricated"] != 1.0:
        return None
    return UNKNOWN_REPORTER if scores["unknown_reporter"] == 1.0 else NOT_IN_CORPUS


def _generated_citation(item: CitationItem, generation: str) -> _Cited | None:
    """What the first citation of `generation` refers to; None when there is none or it is not well-formed."""
    offset = len(item.prompt)
    text = item.prompt + generation
    citations = find_citations(text)
    # eyecite lists a bracketed parallel citation before the one it follows: the first is the leftmost.
    first = min((c for c in citations if c.span()[0] >= offset), key=lambda c: c.span()[0], default=None)
    invented = next(iter(invented_citations(text, citations, offset)), None)
    if invented is not None and (first is None or invented.start < first.span()[0]):
        return _Cited(volume=invented.volume, reporter=invented.reporter, page=invented.page, invented=True)
    form = FORM_OF.get(type(first))
    if form is None or (form != "full" and item.form == "full"):
        return None
    name = _written_name(first, offset)
    if form == "full":
        return _cited(first, name) if first.groups.get("page") is not None else None
    anchors = find_citations(_gold_text(item.gold))
    full = resolutions(anchors + citations).get(id(first))
    if isinstance(full, FullCaseCitation) and full.groups.get("page") is not None:
        return _cited(full, name)
    if form == "short":  # unresolved, but its volume and reporter still say something
        return _Cited(volume=first.groups.get("volume"), reporter=first.corrected_reporter(), name=name)
    return _Cited(name=name)


def _cited(full: FullCaseCitation, name: str | None) -> _Cited:
    return _Cited(full.groups.get("volume"), full.corrected_reporter(), full.groups["page"], full.year, name)


def _written_name(citation: CitationBase, offset: int) -> str | None:
    """The case name (or short form antecedent) eyecite attaches to `citation`, if it lies after `offset`."""
    if citation.full_span()[0] < offset:
        return None
    metadata = citation.metadata
    name = case_name(getattr(metadata, "plaintiff", None), getattr(metadata, "defendant", None))
    return name or case_name(getattr(metadata, "antecedent_guess", None), None)


def _gold_text(gold: GoldCitation) -> str:
    """The gold citation written out, so that eyecite can resolve a generated short form against it."""
    year = f" ({gold.year})" if gold.year else ""
    name = f"{gold.case_name}, " if gold.case_name else ""
    return f"{name}{' '.join(p for p in gold.key if p)}{year}."
