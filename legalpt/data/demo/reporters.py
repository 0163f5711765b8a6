"""Case reporters the demo opinions cite: real abbreviations, with years inside both the span each edition really
covered and the dates reporters-db gives it, so that citation tools such as eyecite parse the citations as real ones.
"""

from __future__ import annotations

import random

from reporters_db import EDITIONS, REPORTERS

from legalpt.data.demo.templates import LATEST_YEAR

# Edition -> (first year, last year, first volume, last volume): roughly the span each edition really covered, so that
# a cited year maps to a plausible volume. The years actually drawn are this span intersected with reporters-db's.
_EDITION_SPANS: dict[str, tuple[int, int, int, int]] = {
    "U.S.": (1875, 2023, 91, 600),
    "S. Ct.": (1882, 2023, 1, 143),
    "L. Ed. 2d": (1956, 2023, 1, 215),
    "F.2d": (1924, 1993, 1, 999),
    "F.3d": (1993, 2021, 1, 999),
    "F.4th": (2021, 2024, 1, 110),
    "F. Supp.": (1932, 1988, 1, 999),
    "F. Supp. 2d": (1988, 2014, 1, 999),
    "F. Supp. 3d": (2014, 2024, 1, 720),
    "Cal. 2d": (1934, 1969, 1, 71),
    "Cal. 3d": (1969, 1991, 1, 54),
    "Cal. 4th": (1991, 2016, 1, 63),
    "N.Y.2d": (1956, 2004, 1, 100),
    "N.Y.3d": (2004, 2024, 1, 42),
    "Ill. 2d": (1954, 2011, 1, 243),
    "Mass.": (1867, 2024, 96, 495),
    "N.E.2d": (1936, 2013, 1, 999),
    "N.E.3d": (2013, 2024, 1, 240),
    "A.2d": (1938, 2010, 1, 999),
    "A.3d": (2010, 2024, 1, 320),
    "P.2d": (1931, 2000, 1, 999),
    "P.3d": (2000, 2024, 1, 550),
    "So. 2d": (1941, 2008, 1, 999),
    "So. 3d": (2008, 2024, 1, 390),
    "S.W.2d": (1928, 1999, 1, 999),
    "S.W.3d": (1999, 2024, 1, 690),
    "N.W.2d": (1942, 2023, 1, 999),
    "S.E.2d": (1939, 2024, 1, 900),
}


def _db_years(edition: str) -> tuple[int, int]:
    """The years reporters-db says `edition` was published (an open end counts as `LATEST_YEAR`)."""
    for reporter in REPORTERS[EDITIONS[edition]]:
        dates = reporter["editions"].get(edition)
        if dates is not None:
            return dates["start"].year, dates["end"].year if dates["end"] else LATEST_YEAR
    raise KeyError(edition)


def _citable_years() -> dict[str, tuple[int, int]]:
    years = {}
    for edition, (first, last, _, _) in _EDITION_SPANS.items():
        start, end = _db_years(edition)
        years[edition] = (max(first, start), min(last, end))
        if years[edition][0] > years[edition][1]:
            raise RuntimeError(f"reporters-db dates {start}-{end} of {edition!r} miss the span {first}-{last}")
    return years


_YEARS = _citable_years()  # edition -> (first, last) year a citation to it may carry


def edition_for(rng: random.Random, editions: tuple[str, ...], year: int) -> str | None:
    fits = [e for e in editions if _YEARS[e][0] <= year <= _YEARS[e][1]]
    return rng.choice(fits) if fits else None


def volume_for(rng: random.Random, edition: str, year: int) -> int:
    """The volume of `edition` that a decision of `year` would be in, interpolated over the edition's span."""
    first, last, v0, v1 = _EDITION_SPANS[edition]
    fraction = (year - first + rng.random()) / (last - first + 1)
    return max(v0, min(v1, v0 + int(fraction * (v1 - v0 + 1))))
