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
4. page_furniture: page numbers, EDGAR's "Source: ..." filing footers and running headers and footers are dropped,
   without touching signature blocks, list items or a number that is a section, table cell or footnote mark; the text
   either side is brought back together (`legalpt.data.furniture` owns the rules).
5. dehyphenate: "agree-\\nment" → "agreement". Only letters before the hyphen and a lower-case word after it are
   joined, so numbers ("§§ 1981-\\n1983") and names ("Smith-\\nJones") never are. The hyphen is kept where the word
   is a compound: the hyphenated form is seen elsewhere in the document and the joined one is not; neither is seen
   and it starts with a prefix that keeps its hyphen ("self-", "non-"); or the hyphen is suspended
   ("pre-\\nand post-closing").
6. whitespace: runs of spaces and tabs become one space, lines are stripped, runs of blank lines become one blank
   line, and the document is stripped. A column gap (two spaces or more, or a tab) before a number stays as it is
   where "<number> <words>" comes before it: made one space, a table-of-contents row such as "1.77 US  16" would read
   as the citation 77 U.S. 16.
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Mapping

import datasets

from legalpt.config import CleanConfig
from legalpt.data.furniture import drop_page_furniture
from legalpt.data.sources import count_characters

_MAX_DECODE_PASSES = 4  # rounds of entity decoding ("&amp;amp;sect;" needs three)
_MIN_RUN = 5  # consecutive numbered lines before they count as pleading line numbers
_MAX_PLEADING_LINE = 28  # pleading paper has 28 (sometimes 26) numbered lines a page

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

_SPACE_RUN = re.compile(r"[ \t\v]{2,}+|[\t\v]")
# "<number> <up to four words>" just before a column gap: with the gap made one space, eyecite might read a citation.
_CITATION_PRONE = re.compile(r"[0-9][ \t]+(?:(?:[A-Za-z][\w.'&]*|[0-9]+(?:d|th)\.?)[ \t]?){1,4}$")
_PRONE_LOOKBACK = 60  # characters before a column gap looked at for `_CITATION_PRONE`
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
        text = drop_page_furniture(text)
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
    text = _SPACE_RUN.sub(_space, text)
    text = text.replace("\n ", "\n").replace(" \n", "\n")
    return _BLANK_LINES.sub("\n\n", text).strip()


def _space(match: re.Match) -> str:
    """One space, but a column gap before a number stays as it is where "<number> <words>" comes before it: eyecite
    reads "1.77 US 16" as a citation, and "2.3 So.  21" too, where the row had a tab."""
    text, start, end = match.string, match.start(), match.end()
    if end < len(text) and text[end].isdigit():
        line_start = max(text.rfind("\n", 0, start) + 1, start - _PRONE_LOOKBACK)
        if _CITATION_PRONE.search(text, line_start, start):
            return match.group()
    return " "
