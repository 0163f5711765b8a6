"""Page furniture: the lines that printing a document on pages adds to its text, found by `furniture_mask` and dropped
by `drop_page_furniture`.

Both work on `page_lines(text)`: the text's lines, with every form feed on a line of its own. Furniture is:

- a page-number form, wherever it stands: "Page 3", "Page 3 of 17", "3 of 17", "Page 2/110", "- 3 -", "-ii-";
- EDGAR's filing footer "Source: ACME CORP, 10-K, 3/1/2019", wherever it stands;
- a bare page number ("12", "iv", or "12 10.23" with an exhibit number beside it), but only where something says it
  is one (elsewhere it may be a section number, a table cell or a footnote mark): it is next to a form feed, a
  page-number form or an EDGAR footer, it is near a running header or footer, or, set apart by a blank line, it is
  one of a run of at least `_MIN_PAGE_RUN` numbers counting up page by page or it stands between the two halves of a
  sentence. Numbers whose footnote texts ("3. See ...") follow them are footnote marks and stay;
- a running header or footer: a line of at least `_MIN_HEADER_CHARS` characters with `_MIN_REPEATS` or more copies
  at one place on the page (the same count of lines, at most `_NEAR`, after or before a page break), most of its
  copies there. Signature-block lines ("IN WITNESS WHEREOF", "By:", "/s/", "Name:", a company name over "By:"), list
  items ("(a) ...", "1. ..."), recitals ("NOW, THEREFORE") and rules ("-----") never are: they repeat because the
  document repeats them (a signature page for each affiliate), not because pages do.

Dropping furniture brings the text either side of it together: a word hyphenated across a page break loses the blank
lines between its halves (so that dehyphenation joins it), and the two halves of a sentence become one line.
"""

from __future__ import annotations

import re
from collections import Counter
from itertools import pairwise

_MIN_REPEATS = 3  # copies of a line before it can be a running header or footer
_NEAR = 2  # non-blank lines between a running header/footer and its page break
_MIN_HEADER_CHARS = 8  # shorter repeated lines are section labels ("A", "II", "Held:"), not running headers
_MIN_PAGE_RUN = 3  # page numbers counting up before a run of bare numbers is taken for pagination
_MAX_PAGE_STEP = 2  # a run of page numbers may skip one page (a full-page table or a signature page)
_MAX_PASSES = 4  # bound on the passes to a fixed point (one or two in practice)
_BREAK = "\f"

_PAGE_FORM = re.compile(
    r"(?:page|pg\.)[ \t]*(?:[0-9]{1,4}|[ivxlc]{1,7})(?:[ \t]*(?:of|/)[ \t]*[0-9]{1,4})?"
    r"|[0-9]{1,4}[ \t]+of[ \t]+[0-9]{1,4}"
    r"|[-\u2013\u2014][ \t]*(?:[0-9]{1,4}|[ivxlc]{1,7})[ \t]*[-\u2013\u2014]",
    re.IGNORECASE,
)
_EDGAR_FOOTER = re.compile(r"Source: [^\n]+, [^,\n]+, [0-9]{1,2}/[0-9]{1,2}/[0-9]{4}")
# A bare page number, or one beside an exhibit number that every page repeats ("7 10.23", "10.23 7").
_NUMBERED = re.compile(r"([0-9]{1,4})|([0-9]{1,4})[ \t]+([0-9]+(?:\.[0-9]+)+)|([0-9]+(?:\.[0-9]+)+)[ \t]+([0-9]{1,4})")
_ROMAN = re.compile(r"(x{0,3})(ix|iv|v?i{0,3})")  # lower-case only: "II" and "IV" on their own are section labels
_ROMAN_VALUES = {"i": 1, "v": 5, "x": 10}
_FOOTNOTE_TEXT = re.compile(r"[ \t]*([0-9]{1,4})[ \t]*\.(?![0-9])")
_SENTENCE_END = re.compile(r"""[.:;!?)\]"'\u201d*]\s*$""")
_SIGNATURE = re.compile(
    r"[ \t]*(?:in witness whereof|by:|by[ \t]*/s/|/s/|name:|title:|its:|dated?:|\[?signature)|.*/s/", re.IGNORECASE
)
_SIGNER = re.compile(r"[ \t]*(?:by:|by[ \t]*/s/|/s/)", re.IGNORECASE)  # the line under a company name in a block
_LIST_ITEM = re.compile(r"[ \t]*(?:\(?[0-9]{1,3}[.)]|\(?[A-Za-z][.)]|\([ivxlc]{1,6}\)|[\u2022\u00b7*-])[ \t]")
_RECITAL = re.compile(r"[ \t]*(?:now,?[ \t]+therefore|whereas\b|witnesseth)", re.IGNORECASE)
_WORDY = re.compile(r"[A-Za-z0-9]")  # a line without letters or digits (a rule, "* * *") is no running header
_ENDS_HYPHENATED = re.compile(r"[A-Za-z]-[^\S\n]*$")


def page_lines(text: str) -> list[str]:
    """The lines `furniture_mask` classifies: `text`'s, with every form feed on a line of its own."""
    return re.sub(r"[^\S\n\f]*\f[^\S\n\f]*", "\n\f\n", text).split("\n")


def drop_page_furniture(text: str) -> str:
    """`text` without its page furniture (see the module docstring)."""
    lines = page_lines(text)
    return _join(lines, furniture_mask(lines))


def furniture_mask(lines: list[str]) -> list[bool]:
    """For each of `lines` (from `page_lines`), whether it is page furniture. Dropping lines brings others closer to
    page breaks, so the rules run again on what is left, to a fixed point: cleaning stays idempotent."""
    mask = [False] * len(lines)
    for _ in range(_MAX_PASSES):
        left = [i for i, dropped in enumerate(mask) if not dropped]
        found = _furniture_once([lines[i] for i in left])
        if not any(found):
            break
        for i, is_furniture in zip(left, found, strict=True):
            mask[i] = mask[i] or is_furniture
    return mask


def _furniture_once(lines: list[str]) -> list[bool]:
    # The document's start and end are page breaks too: one at each end, dropped from the answer.
    stripped = [_BREAK, *(line if line == _BREAK else " ".join(line.split()) for line in lines), _BREAK]
    blank = [not line for line in stripped]
    breaks = [line == _BREAK or _is_page_form(line) for line in stripped]
    numbers = {i: value for i, line in enumerate(stripped) if not breaks[i] and (value := _page_number(line))}
    # Away from form feeds, a page number is set apart from the text by a blank line; a footnote mark or a number
    # in a table may stand alone on its line but sits among the lines of text.
    apart = {i: value for i, value in numbers.items() if "" in (stripped[i - 1], stripped[i + 1])}
    sure = _beside_breaks(stripped, breaks, numbers) | _page_runs(stripped, apart) | _between_halves(stripped, apart)
    maybe = [i in numbers and i not in sure for i in range(len(stripped))]
    breaks = [b or i in sure for i, b in enumerate(breaks)]
    # A number not known to be a page number still marks a possible page break for finding running headers; it goes
    # if one is near it.
    offsets = _offsets(blank, [b or m for b, m in zip(breaks, maybe, strict=True)])
    running = _running(stripped, offsets, _protected(stripped))
    is_running = [line in running for line in stripped]
    near_running = _near(blank, is_running)
    drop = [b or r or (m and n) for b, r, m, n in zip(breaks, is_running, maybe, near_running, strict=True)]
    return drop[1:-1]


def _is_page_form(line: str) -> bool:
    return _PAGE_FORM.fullmatch(line) is not None or _EDGAR_FOOTER.fullmatch(line) is not None


def _page_number(line: str) -> tuple[str, int] | None:
    """(what stands beside the number, the number) where `line` may be a page number, else None."""
    if len(line) > 16:
        return None
    numbered = _NUMBERED.fullmatch(line)
    if numbered:
        bare, number, tag, tag_first, number_last = numbered.groups()
        return ("", int(bare)) if bare else (tag or tag_first, int(number or number_last))
    roman = _ROMAN.fullmatch(line)
    if roman and line not in ("", "v", "x"):  # "v" alone is more often "versus" in a caption
        return "roman", sum(_ROMAN_VALUES[c] for c in line) - 2 * ("iv" in line or "ix" in line)
    return None


def _beside_breaks(stripped: list[str], breaks: list[bool], numbers: dict[int, tuple[str, int]]) -> set[int]:
    """Numbers next to a form feed, a page-number form or an EDGAR footer (blank lines aside): a page's first or last
    line."""
    filled = [i for i, line in enumerate(stripped) if line][1:-1]  # the document's ends are no evidence
    return {
        i
        for before, i, after in zip(filled, filled[1:], filled[2:], strict=False)
        if i in numbers and (breaks[before] or breaks[after])
    }


def _page_runs(stripped: list[str], numbers: dict[int, tuple[str, int]]) -> set[int]:
    """Numbers in runs that count up page by page (text between each two), unless footnote texts follow the run."""
    content = [0]  # lines of text (neither blank nor a number) before each line
    for i, line in enumerate(stripped):
        content.append(content[-1] + (bool(line) and i not in numbers))
    runs: list[list[int]] = []
    open_runs: dict[str, list[list[int]]] = {}  # by what stands beside the numbers, runs that may go on
    for i, (tag, value) in numbers.items():
        run = next(
            (
                run
                for run in reversed(open_runs.get(tag, []))
                if 0 < value - numbers[run[-1]][1] <= _MAX_PAGE_STEP and content[i] > content[run[-1] + 1]
            ),
            None,
        )
        if run is None:
            run = []
            runs.append(run)
            open_runs.setdefault(tag, []).append(run)
        run.append(i)
    footnotes = _footnote_texts(stripped)
    pages = set()
    for run in runs:
        following = sum(any(j > run[-1] for j in footnotes.get(numbers[i][1], ())) for i in run)
        roman = numbers[run[0]][0] == "roman"  # footnotes are numbered in arabic
        if len(run) >= _MIN_PAGE_RUN and (roman or 2 * following < len(run)):
            pages.update(run)
    return pages


def _footnote_texts(stripped: list[str]) -> dict[int, list[int]]:
    """Where each footnote number's text may start: lines such as "3. See ..." or "3 . See ..."."""
    texts: dict[int, list[int]] = {}
    for i, line in enumerate(stripped):
        if match := _FOOTNOTE_TEXT.match(line):
            texts.setdefault(int(match.group(1)), []).append(i)
    return texts


def _between_halves(stripped: list[str], numbers: dict[int, tuple[str, int]]) -> set[int]:
    """Bare numbers between the two halves of a sentence: the line before does not end one, the line after starts
    in lower case. A footnote mark sits there too, so a number whose footnote text follows it stays."""
    filled = [i for i, line in enumerate(stripped) if line]
    footnotes = _footnote_texts(stripped)
    found = set()
    for before, i, after in zip(filled, filled[1:], filled[2:], strict=False):
        tag, value = numbers.get(i, ("none", 0))
        if (
            tag == ""
            and stripped[after][:1].islower()
            and stripped[before] != _BREAK
            and not _SENTENCE_END.search(stripped[before])
            and not any(j > i for j in footnotes.get(value, ()))
        ):
            found.add(i)
    return found


def _protected(stripped: list[str]) -> set[str]:
    """Lines that repeat because the document repeats them: signature blocks, list items, recitals and rules."""
    kept = {
        line
        for line in stripped
        if _SIGNATURE.match(line) or _LIST_ITEM.match(line) or _RECITAL.match(line) or not _WORDY.search(line)
    }
    filled = [line for line in stripped if line]
    kept.update(line for line, below in pairwise(filled) if _SIGNER.match(below))
    return kept


def _running(stripped: list[str], offsets: list[int | None], protected: set[str]) -> set[str]:
    """Running headers and footers: long enough, not protected, and most copies (at least `_MIN_REPEATS`) at one
    place on the page: the same number of lines after a page break or before one. A table row or a clause that a
    document repeats stands at varying places."""
    copies = Counter(stripped)
    placed = Counter((line, offset) for line, offset in zip(stripped, offsets, strict=True) if offset is not None)
    return {
        line
        for (line, _), count in placed.items()
        if len(line) >= _MIN_HEADER_CHARS and count >= _MIN_REPEATS and 2 * count > copies[line]
        and line != _BREAK and line not in protected
    }  # fmt: skip


def _offsets(blank: list[bool], breaks: list[bool]) -> list[int | None]:
    """Where each line stands on its page: n for the n-th non-blank line after a page break, -n for the n-th before
    one (n at most `_NEAR`), else None."""
    after = _count_from(blank, breaks, range(len(blank)))
    before = _count_from(blank, breaks, range(len(blank) - 1, -1, -1))
    return [a if a <= _NEAR else -b if b <= _NEAR else None for a, b in zip(after, before, strict=True)]


def _count_from(blank: list[bool], breaks: list[bool], order: range) -> list[int]:
    """For each line, the non-blank lines from the last page break in `order` up to and including it."""
    counts = [0] * len(blank)
    count = _NEAR + 1
    for i in order:
        count = 0 if breaks[i] else count + (not blank[i])
        counts[i] = count
    return counts


def _near(blank: list[bool], marked: list[bool]) -> list[bool]:
    """Whether each line is within `_NEAR` non-blank lines of a marked line, looking both ways."""
    near = [False] * len(blank)
    for order in (range(len(blank)), range(len(blank) - 1, -1, -1)):
        distance = _NEAR + 1
        for i in order:
            if marked[i]:
                distance = 0
            elif not blank[i]:
                distance += 1
            near[i] = near[i] or distance <= _NEAR
    return near


def _join(lines: list[str], drop: list[bool]) -> str:
    """The lines not dropped. Across dropped lines, a word hyphenated at a page break loses the blank lines of the
    page layout between its halves (for `_dehyphenate` to join it), and a sentence broken there becomes one line."""
    kept: list[str] = []
    after_break = False
    for line, dropped in zip(lines, drop, strict=True):
        if dropped:
            after_break = True
        elif not line.strip():
            kept.append(line)
        else:
            if after_break:
                content = len(kept)
                while content and not kept[content - 1].strip():
                    content -= 1
                before = kept[content - 1] if content else ""
                if _ENDS_HYPHENATED.search(before):
                    del kept[content:]
                elif before.strip() and line.lstrip()[:1].islower() and not _SENTENCE_END.search(before):
                    del kept[content - 1 :]
                    line = f"{before.rstrip()} {line.lstrip()}"
            kept.append(line)
            after_break = False
    return "\n".join(kept)
