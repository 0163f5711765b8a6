"""Case names: the name of a citation's case from its parties, and whether two names name the same case.

Authors and eyecite shorten and vary names ("Feist" for "Feist Publications, Inc."), so names are compared fuzzily.
"""

from __future__ import annotations

import difflib
import re

# Words that authors and eyecite drop from a party's name, or write in many ways.
_NAME_FILLER = frozenset(
    {"a", "an", "and", "the", "of", "et", "al", "inc", "corp", "corporation", "co", "company", "llc", "lp", "ltd"}
)
_PARTY_SPLIT = re.compile(r"\s+vs?\.\s+")
_NAME_RATIO = 0.8  # difflib ratio above which two party names are the same party


def case_name(plaintiff: str | None, defendant: str | None) -> str | None:
    """The case name "Plaintiff v. Defendant" (or the party eyecite found); None when only filler is left ("Inc.")."""
    name = " v. ".join(p for p in (plaintiff, defendant) if p)
    return name if _parties(name) else None


def same_case_name(a: str, b: str) -> bool:
    """Whether two case names ("Okafor v. Redwood Medical L.P.", or a single party such as "Okafor") name the same case.

    Names split into parties at " v. "; a party is its lowercased words without punctuation and without filler that
    authors and eyecite drop or vary (the, of, and, et al., Inc., Corp., Co., LLC, L.P., Ltd., ...). Two parties are
    the same when the words of one are all among the other's (eyecite shortens "Feist Publications" to "Feist") or
    their difflib ratio is at least 0.8 (spelling and punctuation variants). Two names with two parties each match
    when plaintiffs and defendants both match; a single party matches a name when it matches either of its parties.
    """
    parties_a, parties_b = _parties(a), _parties(b)
    if not parties_a or not parties_b:
        return False
    if len(parties_a) == 2 and len(parties_b) == 2:
        return all(_same_party(x, y) for x, y in zip(parties_a, parties_b, strict=True))
    return any(_same_party(x, y) for x in parties_a for y in parties_b)


def _parties(name: str) -> list[list[str]]:
    parties = [
        [w for w in re.sub(r"[^\w\s]", "", part).lower().split() if w not in _NAME_FILLER]
        for part in _PARTY_SPLIT.split(name.strip(), maxsplit=1)
    ]
    return parties if all(parties) else [p for p in parties if p][:1]


def _same_party(x: list[str], y: list[str]) -> bool:
    if set(x) <= set(y) or set(y) <= set(x):
        return True
    return difflib.SequenceMatcher(None, " ".join(x), " ".join(y)).ratio() >= _NAME_RATIO
