"""Document cleaning that keeps legal text intact: `clean_text` for one document, `clean_batch` for `datasets.map`.

Steps run in this order, each switched by a `CleanConfig` field; line endings (CRLF, CR, U+2028/2029) always become
"\\n" first because every step after works on lines.

1. markup: entities are decoded (repeatedly, so "&amp;sect;" ends as "§") and HTML tags of a known name are dropped
   (a block tag inside a line becomes a line break). Only known tag names are touched: "<Confidential>" survives.
2. unicode_nfkc: NFKC (keeps § and ¶; turns ligatures, full-width forms and odd spaces into plain ones; leaves
   superscripts, which it would fuse with a page number before them: "483²" → "4832"), curly quotes
   to straight ones, hyphen look-alikes to "-", soft hyphens and zero-width characters removed. En and em dashes stay:
   they carry meaning (ranges, asides) and eyecite reads them.
3. line_numbers: pleading-paper numbers are dropped, but only where at least `_MIN_RUN` consecutive lines start with
   1, 2, 3, ... (at most 28), so "28 U.S.C. § 1331" at the start of a line is never taken for one.
4. page_furniture: form feeds become line breaks; decorated page numbers ("- 3 -", "Page 3 of 17", "-ii-") are
   dropped; a bare number line is dropped next to a form feed or to a running header or footer (elsewhere it may be
   a section or footnote number). A line of at least `_MIN_HEADER_CHARS` characters repeated at least
   `_MIN_REPEATS` times is dropped when most of its copies sit within `_NEAR` lines of a page break (a form feed, a
   page number, or the document's start or end): that catches running headers such as a case caption or EDGAR's
   "Source: ..." footer without touching repeated table rows or signature lines. A word hyphenated across a page
   break is brought back together. Repeated lines in a document without page numbers or form feeds stay.
5. dehyphenate: "agree-\\nment" → "agreement". Only letters before the hyphen and a lower-case word after it are
   joined, so numbers ("§§ 1981-\\n1983") and names ("Smith-\\nJones") never are. The hyphen is kept where the word
   is a compound: the hyphenated form is seen elsewhere in the document and the joined one is not; neither is seen
   and it starts with a prefix that keeps its hyphen ("self-", "non-"); or the hyphen is suspended
   ("pre-\\nand post-closing").
6. whitespace: runs of spaces and tabs become one space, lines are stripped, runs of blank lines become one blank
   line, and the document is stripped.
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections import Counter
from collections.abc import Mapping

import datasets

from legalpt.config import CleanConfig
from legalpt.data.sources import count_characters

_MAX_DECODE_PASSES = 4  # rounds of entity decoding ("&amp;amp;sect;" needs three)
_MIN_RUN = 5  # consecutive numbered lines before they count as pleading line numbers
_MAX_PLEADING_LINE = 28  # pleading paper has 28 (sometimes 26) numbered lines a page
_MIN_REPEATS = 3  # copies of a line before it can be a running header or footer
_NEAR = 2  # non-blank lines between a running header/footer and its page break
_MAX_FURNITURE_PASSES = 4  # bound on the passes to a fixed point (one or two in practice)
_MIN_HEADER_CHARS = 8  # shorter repeated lines are section labels ("A", "II", "Held:"), not running headers

_BLOCK_TAGS = "p|br|div|li|ul|ol|tr|table|h[1-6]|blockquote|pre|hr|center|section|article|footnote|opinion|casebody"
_INLINE_TAGS = "i|b|u|em|strong|span|a|sup|sub|font|small|big|td|th|tbody|thead|html|body|head|title|img|s|strike|cite"
_TAG = re.compile(rf"</?(?:({_BLOCK_TAGS})|{_INLINE_TAGS})(?:\s[^<>\n]*)?/?>|<!--.*?-->", re.IGNORECASE | re.DOTALL)
_ENTITY = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")

_LINE_BREAKS = re.compile(r"\r\n?|[\u2028\u2029\x85]")
_TYPOGRAPHY = {
    **dict.fromkeys("\u2018\u2019\u201a\u201b\u2032", "'"),
    **dict.fromkeys("\u201c\u201d\u201e\u201f\u2033", '"'),
    **dict.fromkeys("\u2010\u2011\u2212", "-"),
    **dict.fromkeys("\u00ad\u200b\u200c\u200d\u2060\ufeff", ""),
}
_SCRIPTS = re.compile("([\u00b2\u00b3\u00b9\u2070-\u209f]+)")
_TYPOGRAPHIC = re.compile(f"[{''.join(_TYPOGRAPHY)}]")

_PLEADING = re.compile(r"[^\S\n]*([0-9]{1,2})(?=\s|$)[^\S\n]*")
_DECORATED_PAGE = re.compile(
    r"[^\S\n]*(?:page[^\S\n]+[0-9]{1,4}(?:[^\S\n]+of[^\S\n]+[0-9]{1,4})?|[0-9]{1,4}[^\S\n]+of[^\S\n]+[0-9]{1,4}"
    r"|[-\u2013\u2014][^\S\n]*(?:[0-9]{1,4}|[ivxlc]{1,7})[^\S\n]*[-\u2013\u2014])[^\S\n]*",
    re.IGNORECASE,
)
_BARE_NUMBER = re.compile(r"[^\S\n]*[0-9]{1,4}[^\S\n]*")
_ENDS_HYPHENATED = re.compile(r"[A-Za-z]-[^\S\n]*$")
_BREAK = "\f"  # marks a page break inside `_drop_page_furniture`'s line list

# Found by the hyphen and line break (a literal that the regex engine scans for quickly), then the words either side.
_HYPHEN_BREAK = re.compile(r"(?<=[A-Za-z])-[^\S\n]*\n[^\S\n]*(?=[a-z])")
_WORD_BEFORE = re.compile(r"[A-Za-z]+$")
_WORD_AFTER = re.compile(r"[a-z]+(?![A-Za-z])")
_LONGEST_WORD = 64  # letters looked at before a hyphen
_WORD = re.compile(r"[A-Za-z]+(?:-[A-Za-z]+)*")
# Prefixes that (nearly) always keep their hyphen; "inter", "pre", "co", "ex" ... are left out because in legal
# English they mostly form closed words ("interprets", "provide", "covenant", "exclusive").
_COMPOUND_PREFIXES = frozenset({"self", "quasi", "non", "cross", "well"})
_SUSPENDED = frozenset({"and", "or", "nor", "to"})

_SPACE_RUN = re.compile(r"  +")
_BLANK_LINES = re.compile(r"\n{3,}")


def clean_text(text: str, cfg: CleanConfig) -> str:
    """`text` with the steps switched on in `cfg` applied (see the module docstring); unchanged when disabled."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not isinstance(cfg, CleanConfig):
        raise TypeError(f"cfg must be a CleanConfig, got {type(cfg).__name__}")
    if not cfg.enabled:
        return text
    text = _LINE_BREAKS.sub("\n", text)
    if cfg.markup:
        text = _strip_markup(text)
    if cfg.unicode_nfkc and not text.isascii():
        text = _normalize_unicode(text)
    if cfg.line_numbers:
        text = _drop_line_numbers(text)
    if cfg.page_furniture:
        text = _drop_page_furniture(text)
    if cfg.dehyphenate:
        text = _dehyphenate(text)
    if cfg.whitespace:
        text = _collapse_whitespace(text)
    return text


def clean_batch(batch: Mapping[str, list], cfg: CleanConfig) -> dict[str, list[str]]:
    """For `datasets.map(batched=True)`: `{"text": cleaned texts}`; `map` keeps the batch's other columns as they are
    (returning only the changed column spares it rewriting them)."""
    if not isinstance(batch, Mapping) or "text" not in batch:
        raise ValueError(f"batch must be a mapping with a 'text' column, got {type(batch).__name__}")
    return {"text": [clean_text(text, cfg) for text in batch["text"]]}


def clean_documents(documents: datasets.Dataset, cfg: CleanConfig, num_proc: int = 1) -> tuple[datasets.Dataset, dict]:
    """Clean the `text` of every document (cached by datasets); a document left empty is removed and counted."""
    if not cfg.enabled or documents.num_rows == 0:
        return documents, {"enabled": cfg.enabled}
    cleaned = documents.map(
        clean_batch, batched=True, fn_kwargs={"cfg": cfg}, num_proc=num_proc if num_proc > 1 else None,
        desc="cleaning",
    )  # fmt: skip
    emptied = cleaned.filter(lambda batch: [bool(t) for t in batch["text"]], batched=True, desc="dropping emptied")
    return emptied, {
        "enabled": True,
        "characters_in": count_characters(documents),
        "characters_out": count_characters(emptied),
        "emptied": cleaned.num_rows - emptied.num_rows,
    }


def _strip_markup(text: str) -> str:
    # Decode to a fixed point so that doubly escaped text ("&amp;lt;p&amp;gt;") is as clean after one pass as after
    # two; the bound stops pathological inputs from looping. A decoded "&#13;" is a line ending like any other.
    for _ in range(_MAX_DECODE_PASSES):
        decoded = _ENTITY.sub(lambda m: html.unescape(m.group()), text)
        if decoded == text:
            break
        text = _LINE_BREAKS.sub("\n", decoded)
    return _TAG.sub(_tag_replacement, text)


def _tag_replacement(match: re.Match) -> str:
    """A block tag breaks the line unless it already sits at a line's start or end; other tags just go."""
    text, start, end = match.string, match.start(), match.end()
    at_line_edge = start == 0 or text[start - 1] == "\n" or end == len(text) or text[end] == "\n"
    return "\n" if match.group(1) and not at_line_edge else ""


def _normalize_unicode(text: str) -> str:
    # NFKC everywhere but on superscript and subscript characters, which it would fuse with the number before them:
    # a footnote mark in "347 U.S. 483²" would turn the page into 4832.
    pieces = _SCRIPTS.split(text)  # text, mark, text, mark, ..., text
    pieces[::2] = [unicodedata.normalize("NFKC", piece) for piece in pieces[::2]]
    text = "".join(pieces)
    return _TYPOGRAPHIC.sub(lambda m: _TYPOGRAPHY[m.group()], text)


def _drop_line_numbers(text: str) -> str:
    lines = text.split("\n")
    numbers = [_leading_number(line) for line in lines]
    keep_from = [0] * len(lines)  # where each line's text starts once its pleading number is dropped
    start = 0
    while start < len(lines):
        end = start + 1
        if numbers[start] == 1:
            while end < len(lines) and numbers[end] == numbers[end - 1] + 1 <= _MAX_PLEADING_LINE:
                end += 1
            if end - start >= _MIN_RUN:
                for i in range(start, end):
                    keep_from[i] = _PLEADING.match(lines[i]).end()
        start = end
    return "\n".join(line[cut:] for line, cut in zip(lines, keep_from, strict=True))


def _leading_number(line: str) -> int:
    match = _PLEADING.match(line)
    return int(match.group(1)) if match else 0


def _drop_page_furniture(text: str) -> str:
    # Dropping lines brings others closer to page breaks, so repeat to a fixed point: cleaning stays idempotent.
    for _ in range(_MAX_FURNITURE_PASSES):
        dropped = _drop_page_furniture_once(text)
        if dropped == text:
            break
        text = dropped
    return text


def _drop_page_furniture_once(text: str) -> str:
    # Lines, with page breaks as `_BREAK` entries: form feeds and the page numbers dropped here. A bare number line
    # away from a form feed is a possible page break: it counts as one for finding running headers and footers, and
    # goes only if one of them is next to it.
    pages = text.split("\f")
    lines: list[str] = [_BREAK]  # the document's start and end are page breaks too
    possible: list[bool] = [False]
    for page_index, page in enumerate(pages):
        if page_index:
            lines.append(_BREAK)
            possible.append(False)
        page_lines = page.split("\n")
        filled = [i for i, line in enumerate(page_lines) if line.strip()]
        edges = {filled[0], filled[-1]} if filled and len(pages) > 1 else set()
        for i, line in enumerate(page_lines):
            bare = _BARE_NUMBER.fullmatch(line) is not None
            lines.append(_BREAK if _DECORATED_PAGE.fullmatch(line) or (bare and i in edges) else line)
            possible.append(bare and i not in edges)
    lines.append(_BREAK)
    possible.append(False)
    blank = [not line.strip() for line in lines]
    near = _near(blank, [line == _BREAK or soft for line, soft in zip(lines, possible, strict=True)])
    copies = Counter(line.strip() for line in lines)
    near_copies = Counter(line.strip() for line, is_near in zip(lines, near, strict=True) if is_near)
    furniture = {
        line
        for line, count in near_copies.items()
        if len(line) >= _MIN_HEADER_CHARS and count >= _MIN_REPEATS and count * 2 > copies[line] and line != _BREAK
    }
    is_furniture = [line == _BREAK or line.strip() in furniture for line in lines]
    near_furniture = _near(blank, is_furniture)
    drop = [f or (soft and n) for f, soft, n in zip(is_furniture, possible, near_furniture, strict=True)]
    return _join_pages(lines, drop)


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


def _join_pages(lines: list[str], drop: list[bool]) -> str:
    """The lines not dropped. Where a word was hyphenated across a page break, the blank lines of the page layout
    between its halves go too, so that `_dehyphenate` can join it."""
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
                if content and _ENDS_HYPHENATED.search(kept[content - 1]):
                    del kept[content:]
            kept.append(line)
            after_break = False
    return "\n".join(kept)


def _dehyphenate(text: str) -> str:
    vocabulary: set[str] = set()

    def join(match: re.Match) -> str:
        """What replaces the hyphen and line break: nothing, a hyphen, or a hyphen and a space."""
        first = _WORD_BEFORE.search(text, max(0, match.start() - _LONGEST_WORD), match.start())
        second = _WORD_AFTER.match(text, match.end())
        if first is None or second is None:  # a word longer than _LONGEST_WORD, or "-\nabc1": leave it alone
            return match.group()
        first, second = first.group(), second.group()
        if second in _SUSPENDED:
            return "- "
        if not vocabulary:
            vocabulary.update(_WORD.findall(text))
        if f"{first}{second}" in vocabulary:  # the document's own spelling decides first
            return ""
        return "-" if f"{first}-{second}" in vocabulary or first.lower() in _COMPOUND_PREFIXES else ""

    return _HYPHEN_BREAK.sub(join, text)


def _collapse_whitespace(text: str) -> str:
    # Plain str.replace where it will do: several times faster than a regex that stops at every space.
    text = _SPACE_RUN.sub(" ", text.replace("\t", " ").replace("\v", " "))
    text = text.replace("\n ", "\n").replace(" \n", "\n")
    return _BLANK_LINES.sub("\n\n", text).strip()
