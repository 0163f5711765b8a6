"""HTML files (.html, .htm): the readable text of the page, one document per file, its title as metadata. Scripts,
styles and comments are dropped, block elements start new lines, footnotes are moved to the end, and star-page labels
are dropped (`html_text`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import lxml.html
from lxml import etree

from legalpt.data.kinds import guess_kind
from legalpt.data.readers.decode import decode_text
from legalpt.data.readers.rows import document_row, skip_row

_HTML_SPACE = re.compile(r"\s+")
_HTML_PARSER = lxml.html.HTMLParser(encoding="utf-8", remove_comments=True, remove_pis=True)
_AFTER_TAGS = {"br": "\n", "td": "\t", "th": "\t"}  # elements that only end with a separator
# Block elements mark their edges with a control character (removed from the page's own text, where it is junk);
# each run of marks becomes one line break, or a paragraph break when a paragraph-like block is among them.
_LINE, _PARAGRAPH = "\x01", "\x02"
_NO_MARKS = str.maketrans("", "", _LINE + _PARAGRAPH)
_BLOCK_TAGS = {
    **dict.fromkeys(["p", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "pre", "table", "ul", "ol"], _PARAGRAPH),
    **dict.fromkeys(["section", "article", "aside", "footer", "header", "center", "dl", "hr", "address"], _PARAGRAPH),
    **dict.fromkeys(["div", "li", "tr", "dd", "dt", "caption", "figure", "figcaption", "main", "nav"], _LINE),
}
_BREAK_RUN = re.compile(r"[\x01\x02\s]*[\x01\x02][\x01\x02\s]*")
# Star-page labels: where a page of the printed reporter begins ("*1006"), marked up by CourtListener
# (<span class="star-pagination">), CAP (<a class="page-label">, <page-number>), or printed as "[*1006]", "[**1006]".
_STAR_PAGE_CLASSES = {"star-pagination", "page-label", "page-number"}
_STAR_PAGE_TEXT = re.compile(r"\[\*{1,2}\d+\]")


def read_html(path: str, stream: BinaryIO, text_field: str, max_line_bytes: int) -> Iterator[dict[str, str]]:
    content = decode_text(stream.read())
    if content is None:
        yield skip_row("undecodable bytes", path)
        return
    try:
        # Bytes, so that lxml accepts an XML encoding declaration; the text is already known to be UTF-8 clean.
        root = lxml.html.document_fromstring(content.encode("utf-8"), parser=_HTML_PARSER)
    except (etree.ParserError, ValueError):
        yield skip_row("invalid html", path)
        return
    title = root.findtext(".//title")
    text = html_text(root)
    meta = {"title": title.strip()} if title and title.strip() else {}
    yield document_row(text, doc_id=path, source=path, kind=guess_kind(text, Path(path).name), meta=meta, where=path)


def html_text(root: lxml.html.HtmlElement) -> str:
    """The readable text of an HTML document: scripts, styles and comments dropped, blocks on their own lines.

    Star-page labels are dropped, not kept as text: they fall mid-sentence, often mid-case-name, and a label left
    beside its neighbours would still split "Rural *1007 Telephone" in a citation's case name. Each leaves a space,
    so the words around it never join ("*1006On appeal" becomes "On appeal").

    Footnote bodies (block elements whose class or id contains "footnote") are moved to the end, in document order,
    after a blank line, so that a footnote printed inline does not split the sentence around it; footnote markers
    (inline elements such as `<sup class="footnotemark">`) stay in place.
    """
    for element in root.xpath("//script | //style | //noscript | //template | //head | //comment()"):
        element.drop_tree()  # keeps the tail text
    for element in [element for element in root.iter() if _is_star_page(element)]:
        element.tail = " " + (element.tail or "")
        element.drop_tree()
    footnotes = [element for element in root.iter() if _is_footnote(element)]
    outermost = [element for element in footnotes if not any(_is_footnote(a) for a in element.iterancestors())]
    notes = [_block_text(element) for element in outermost]
    for element in outermost:
        element.drop_tree()
    return "\n\n".join(part for part in [_block_text(root), *notes] if part)


def _is_footnote(element: etree._Element) -> bool:
    if not isinstance(element.tag, str) or element.tag not in _BLOCK_TAGS:
        return False
    names = f"{element.get('class', '')} {element.get('id', '')}".lower()
    return "footnote" in names


def _is_star_page(element: etree._Element) -> bool:
    if not isinstance(element.tag, str):
        return False
    return element.tag == "page-number" or not _STAR_PAGE_CLASSES.isdisjoint(element.get("class", "").split())


def _block_text(element: etree._Element) -> str:
    """Text of an element: whitespace runs collapsed outside <pre>, a line break around each block element."""
    parts: list[str] = []
    in_pre = 0
    for event, node in etree.iterwalk(element, events=("start", "end")):
        if not isinstance(node.tag, str):  # a processing instruction or entity left by the parser
            continue
        tag = node.tag.lower()
        if event == "start":
            in_pre += tag == "pre"
            parts.append(_BLOCK_TAGS.get(tag, ""))
            parts.append(_inline(node.text, in_pre))
        else:
            in_pre -= tag == "pre"
            parts.append(_BLOCK_TAGS.get(tag, "") + _AFTER_TAGS.get(tag, ""))
            if node is not element:
                parts.append(_inline(node.tail, in_pre))
    text = _BREAK_RUN.sub(_break, "".join(parts))
    return "\n".join(line.strip(" \t") for line in text.split("\n")).strip("\n")


def _break(run: re.Match) -> str:
    """One separator for a run of block edges and whitespace: adjacent blocks share their breaks, not add them."""
    return "\n\n" if _PARAGRAPH in run[0] or run[0].count("\n") > 1 else "\n"


def _inline(text: str | None, in_pre: int) -> str:
    if not text:
        return ""
    text = _STAR_PAGE_TEXT.sub(" ", text.translate(_NO_MARKS))
    return text if in_pre else _HTML_SPACE.sub(" ", text)
