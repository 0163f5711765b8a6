"""Document kinds: `KINDS`, and `guess_kind`, which tells a contract, a court opinion or a statute from its opening
text (and its file name) when a source does not say what it holds.

`legalpt.config` checks a source's `kind` against `KINDS` before any heavy import, so this module imports nothing
beyond the standard library."""

from __future__ import annotations

import itertools
import re

KINDS = ("contract", "opinion", "statute", "other")


def guess_kind(text: str, name: str = "") -> str:
    """ "contract", "opinion", "statute" or "other": the kind whose typical phrases weigh most in the text's first
    `_KIND_CHARS` characters (and in the file `name`), when that weight is clear; else "other".

    Each cue counts at most `_CUE_CAP` times, so one phrase repeated down a page cannot outvote the rest; a kind wins
    with at least `_KIND_MIN_SCORE` and `_KIND_MARGIN` times the runner-up. Opinions cite statutes and contracts
    quote courts, hence the margin. An opinion printed without its head matter still shows itself: by its byline
    ("BIRD, C. J."), an "In re" caption, an ORDER heading, the words of procedure and attorney discipline, and its
    references back (Id., supra).
    """
    head = text[:_KIND_CHARS]
    scores = {kind: _KIND_NAME_SCORE * bool(pattern.search(name)) for kind, pattern in _KIND_NAMES.items()}
    for kind, cues in _KIND_CUES.items():
        scores[kind] += sum(weight * _count(cue, head) for cue, weight in cues)
    best, runner_up = sorted(scores, key=scores.get, reverse=True)[:2]
    if scores[best] >= _KIND_MIN_SCORE and scores[best] >= _KIND_MARGIN * scores[runner_up]:
        return best
    return "other"


def _count(cue: re.Pattern, text: str) -> int:
    """Matches of `cue` in `text`, up to `_CUE_CAP` (the scan stops there)."""
    return sum(1 for _ in itertools.islice(cue.finditer(text), _CUE_CAP))


_KIND_CHARS = 6_000
_CUE_CAP = 3
_KIND_MIN_SCORE = 6
_KIND_MARGIN = 1.5
_KIND_NAME_SCORE = 4
_M = re.MULTILINE
_KIND_NAMES = {
    "contract": re.compile(r"agreement|contract|lease|licen[cs]e|amendment", re.IGNORECASE),
    "opinion": re.compile(r"opinion|\bv\.? ", re.IGNORECASE),
    "statute": re.compile(r"statute|u\.?s\.?c|code|regulation|\bact\b", re.IGNORECASE),
}
# An opinion's byline: "BIRD, C. J.", "HAMLEY, Circuit Judge:", "Justice O'Connor".
_BYLINE = (
    r"[A-Z][A-Za-z'\u2019. -]{1,40}, (C\. ?J\.|P\. ?J\.|J\.|JJ\.|((Chief|Senior|Presiding|Associate) )?"
    r"((Circuit|District|Bankruptcy) )?(Judge|Justice))"
    r"|(MR\. |Mr\. )?(CHIEF |Chief )?(JUSTICE|Justice) [A-Z][\w'\u2019-]+"
)
_PROCEDURE = (
    r"trial court|lower court|court below|on appeal|appeals? from|the jury|convicted|conviction|sentenced|testified"
    r"|prosecutor|indictment|habeas|en banc"
)
_DISCIPLINE = (
    r"disbar\w*|suspended from the practice of law|(publicly )?reprimand(ed)?|Rules of Professional "
    r"(Conduct|Responsibility)|Disciplinary (Counsel|Board|Commission|Proceedings?)|Grievance (Commission|Committee)"
    r"|Bar Counsel"
)
_REPORTERS = (
    r"U\.S\.|S\. ?Ct\.|L\. ?Ed\.|F\.( ?Supp\.)?|N\.[EW]\.|S\.[EW]\.|So\.|P\.|A\.|Cal\.( ?App\.)?|Cal\. ?Rptr\.|"
    r"N\.Y\.(S\.)?|Ill\.( ?App\.)?|Mass\.|Pa\.|Wis\.|Mich\.|Ohio St\.|Wash\.|Minn\.|Mo\.|Tex\.|Fla\.|Ga\.|N\.J\."
)  # reporters of the United States, the federal courts and the busiest state courts
# (pattern, weight): phrases that mark each kind; case matters where the capitalised form is the signal.
_KIND_CUES: dict[str, list[tuple[re.Pattern, float]]] = {
    "contract": [
        (re.compile(r"\b[A-Z ]*AGREEMENT\b"), 2),
        (re.compile(r"\bWHEREAS\b"), 3),
        (re.compile(r"\bNOW,? THEREFORE\b", re.IGNORECASE), 3),
        (re.compile(r"IN WITNESS WHEREOF", re.IGNORECASE), 3),
        (re.compile(r"\b(this|the) Agreement\b"), 2),
        (re.compile(r"\b(agreement|contract)\b", re.IGNORECASE), 1),
        (re.compile(r"\b(agreement|contract) (is )?(made |entered into )?(by and )?between\b", re.IGNORECASE), 3),
        (re.compile(r"\b(hereby )?agrees? (to|that)\b|\bParty [A-Z]\b"), 1),
        (re.compile(r"\bhereinafter\b", re.IGNORECASE), 1),
        (re.compile(r"\b(hereto|hereunder|hereof|hereby)\b"), 1),
        (re.compile(r"\bthe [Pp]arties\b"), 1),
        (re.compile(r"\((the |this )?[\"\u201c][A-Z][\w .-]*[\"\u201d]\)"), 2),  # defined terms: (the "Licensee")
        (re.compile(r"\bEffective Date\b"), 2),
        (re.compile(r"\b(Licensee|Licensor|Lessee|Lessor|Distributor|Supplier|Buyer|Seller|Customer|Vendor)\b"), 1),
        # "warrant" alone is as often a search warrant in an opinion
        (re.compile(r"\b(terminat\w*|indemnif\w*|warrant(y|ies)|represents and warrants)", re.IGNORECASE), 1),
        (re.compile(r"^\s*(By|Name|Title):", _M), 2),  # signature blocks
    ],
    "opinion": [
        (re.compile(r"(^|\s)v\.(\s|$)", _M), 3),  # the caption: Smith v. Jones
        (re.compile(r"\bOPINION\b|^[ \t]*Opinion[ \t]*$", _M), 2),
        (re.compile(r"\bPER CURIAM\b", re.IGNORECASE), 3),
        (re.compile(r"delivered the opinion", re.IGNORECASE), 3),
        (re.compile(r"\b(Chief Justice|Justices?|Judges?)\b|, (C\. )?J\.[,:\s]"), 1),
        # A short header is often only this: the byline "BIRD, C. J." / "HAMLEY, Circuit Judge:" / "Justice Stone",
        # the panel "Before A, B, and C, Circuit Judges.", the caption "In re Roe", a heading "ORDER".
        (re.compile(rf"^[ \t]*({_BYLINE})[,.:]?[ \t]*$", _M), 3),
        (re.compile(r"^[ \t]*Before:? [^\n]{0,200}\b(Judges|JJ\.|Justices)", _M), 2),
        (re.compile(r"^[ \t]*(In re|IN RE|In the Matter of|IN THE MATTER OF|Ex parte|EX PARTE)\b", _M), 3),
        (
            re.compile(
                r"^[ \t]*(ORDER|ORDER OF [A-Z ]+|MEMORANDUM( OPINION)?( AND ORDER)?|OPINION AND ORDER)[ \t]*$", _M
            ),
            2,
        ),
        (re.compile(r"\bIT IS (HEREBY |FURTHER )?ORDERED\b|\bSO ORDERED\b|\bit is (hereby |further )?ordered\b"), 3),
        (re.compile(r"\b(affirm|revers|remand|vacat)(ed|e|es)\b", re.IGNORECASE), 1),
        (re.compile(r"\b(Appellants?|Appellees?|Petitioners?|Respondents?|Plaintiffs?|Defendants?)\b"), 1),
        (re.compile(r"\b[Ww]e (hold|conclude|affirm|reverse|agree|disagree|decline|note|find|remand|vacate)\b"), 2),
        (re.compile(r"\b(Court of Appeals|Supreme Court|District Court|Circuit)\b", re.IGNORECASE), 1),
        (re.compile(rf"\b({_PROCEDURE})\b", re.IGNORECASE), 1),
        (re.compile(rf"\b({_DISCIPLINE})\b"), 2),  # attorney discipline, a common short-header opinion
        (re.compile(r"\bId\.,? at \d|\bIbid\.|\bsupra\b|\([Aa]nte, (p|at)\b"), 2),  # references back: opinions only
        (re.compile(rf"\b\d+ ({_REPORTERS})( ?[234]d| ?[45]th)? \d+"), 1),
        (re.compile(r"\b(dissent\w*|concur(s|red|ring|rences?)?|certiorari)\b", re.IGNORECASE), 1),
        (re.compile(r"\b[Tt]he majority(['\u2019]s\b| opinion\b)"), 2),  # a concurrence or dissent
    ],
    "statute": [
        (re.compile(r"\u00a7"), 1),
        (re.compile(r"\b(U\.S\.C\.|C\.F\.R\.|Stat\.)"), 1),
        (re.compile(r"\bBe it enacted\b", re.IGNORECASE), 4),
        (re.compile(r"\b(Pub\. ?L\.|Public Law)\b"), 2),
        (re.compile(r"\b(enacted|amended|repealed)\b"), 1),
        (re.compile(r"^\s*(\u00a7+ ?\d|Sec(tion|\.) \d)", _M), 2),  # section headings at line starts
        (re.compile(r"\bthis (title|chapter|subchapter|part|Act|Code)\b"), 2),
        (re.compile(r"\b(subsection|subparagraph|paragraph|clause) \(\w+\)"), 2),
        (re.compile(r"^\s*(CHAPTER|TITLE|PART|SUBCHAPTER) [\dIVXLC]+\b", _M), 2),
    ],
}
