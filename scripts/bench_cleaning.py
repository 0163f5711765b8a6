"""Cleaning quality: page furniture told from text on a labelled set, and citations kept through cleaning.

The labelled set has every line (`legalpt.data.furniture.page_lines`) marked furniture or text:

    real       the EDGAR contracts and CAP opinions of --data (contracts/*.txt, opinions/*.json), labelled by rules
               written for this set, independent of the cleaner's: the page-number forms and EDGAR "Source:" footers
               are furniture; in a contract a line that is only a page number is furniture, in an opinion it is a
               footnote mark (text); `REVIEWED` lists, by document, the lines read one by one where those rules
               fall short (running legends that are furniture, numbers that are table cells)
    synthetic  the text lines of those documents and of demo documents laid out as pages in turn in each
               `STYLES` layout: running headers and footers, "Page 2/110", "- 3 -", bare and roman ("iv") page
               numbers, EDGAR footers, form feeds, a sentence split by a page break, a list item above the footer
               on several pages, a table of contents with rows such as "1.77 US  16" and a signature page for each
               of several affiliates; the lines added as page furniture are furniture, all others text

Precision is the share of the lines the cleaner drops that are furniture, recall the share of furniture it drops.
Citations: eyecite runs on each document before and after `clean_text` (default config); a citation is its type
and normalized text, and cleaning must add none and keep at least `TARGETS["citations_kept"]` of them. The record
goes to <out>/cleaning-cpu<cores>-<yyyymmdd>.json (scripts/benchmarking/record.py names and heads it).

    python scripts/bench_cleaning.py                    # the whole set
    python scripts/bench_cleaning.py --real 6 --demo 2  # a reduced set
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import eyecite
from benchmarking import record

from legalpt.config import CleanConfig
from legalpt.data.clean import clean_text
from legalpt.data.demo import generate_documents
from legalpt.data.furniture import furniture_mask, page_lines

DATA = record.ROOT.parent / "shared" / "data"
TARGETS = {"precision": 0.995, "recall": 0.98, "citations_kept": 0.999}
STYLES = ("caption_formfeed", "dash", "edgar", "page_slash", "bare", "page_of")

# The labeller's own rules (not the cleaner's): what a page number or an EDGAR footer looks like in this set.
_PAGE_FORM = re.compile(r"(?:page \d+(?: of \d+)?|page \d+/\d+|- ?(?:\d+|[ivx]+) ?-)", re.IGNORECASE)
_EDGAR = re.compile(r"Source: .+, .+, \d+/\d+/\d{4}")
_PAGE_NUMBER = re.compile(r"\d{1,3}|[ivx]{1,4}|\d{1,3} 10\.23")

# Lines read one by one, by document (a prefix of its file name): running legends and slide footers printed on every
# page ("furniture", by prefix), and lines that look like page numbers but are not ("text", the whole line, or
# "text_lines", by index in `page_lines`).
REVIEWED: dict[str, dict[str, tuple]] = {
    "CERES,INC": {
        "furniture": (
            "Confidential Treatment Requested and the Redacted Material",  # legend on every page
            "CERES-IGER SCHEDULE 1",  # running header of the schedule's pages
            "Confidential Project # and name",  # footer of the report template's slides
            "Made in two (2) copies.",  # footer of the model agreement's pages, even mid-sentence
            "Attachment A - RESEARCH AND DEVELOPMENT PLAN Breeding Project Plan",  # header of the plan's pages
        ),
        "text_lines": (2537, 4047, 4099),  # "7", "5", "6": task numbers in the work plan's tables
    },
    "INNOVIVA": {"text": ("2",)},  # the "2" of "Beta-2" and "β2", set below their lines by the extraction
    "KINGPHARMACEUTICALS": {"furniture": ("Portions of this Exhibit were omitted and have been filed separately",)},
    "LOOKSMART": {"furniture": ("Tender Offer Statement on Schedule TO - July 16, 2012 Exhibit (d)(i)",)},
}


@dataclass
class Labelled:
    """A document as lines, each marked furniture or text, and what each line is (for the per-case counts)."""

    name: str
    kind: str  # "contract", "opinion" or "synthetic"
    lines: list[str] = field(default_factory=list)
    furniture: list[bool] = field(default_factory=list)
    cases: list[str] = field(default_factory=list)

    def add(self, line: str, case: str) -> None:
        self.lines.append(line)
        self.furniture.append(case.startswith("furniture"))
        self.cases.append(case)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="folder with contracts/ and opinions/")
    parser.add_argument("--real", type=int, default=None, help="real documents to use (default: all)")
    parser.add_argument("--demo", type=int, default=8, help="demo documents laid out as synthetic pages")
    parser.add_argument("--seed", type=int, default=0, help="seed of the demo documents and the page layouts")
    parser.add_argument("--out", type=Path, default=record.RESULTS, help="folder of the JSON record")
    args = parser.parse_args(argv)
    for name in ("real", "demo"):
        if (getattr(args, name) or 0) < 0:
            parser.error(f"--{name} must be >= 0; got {getattr(args, name)}")
    return args


def real_documents(folder: Path, limit: int | None = None) -> list[tuple[str, str, str]]:
    """(name, kind, text) of the contracts and opinions in `folder`: contracts first, then opinions, `limit` in all
    taken alternately from both so that a reduced set has some of each."""
    contracts = [(p.name, "contract", p.read_text(encoding="utf-8")) for p in sorted(folder.glob("contracts/*.txt"))]
    opinions = []
    for path in sorted(folder.glob("opinions/*.json")):
        for i, opinion in enumerate(json.loads(path.read_text())["casebody"]["data"]["opinions"]):
            opinions.append((f"{path.stem}#{i}", "opinion", opinion["text"]))
    if limit is None:
        return contracts + opinions
    mixed = [doc for pair in zip(contracts, opinions, strict=False) for doc in pair]
    mixed += contracts[len(opinions) :] + opinions[len(contracts) :]
    return mixed[:limit]


def label_real(name: str, kind: str, text: str) -> Labelled:
    """`text`'s lines labelled by the labeller's rules and `REVIEWED`."""
    reviewed = next((lines for prefix, lines in REVIEWED.items() if name.startswith(prefix)), {})
    doc = Labelled(name, kind)
    for index, line in enumerate(page_lines(text)):
        plain = " ".join(line.split())
        if plain in reviewed.get("text", ()) or index in reviewed.get("text_lines", ()):
            case = "text"
        elif any(plain.startswith(prefix) for prefix in reviewed.get("furniture", ())):
            case = "furniture:legend"
        elif line == "\f" or _PAGE_FORM.fullmatch(plain) or (kind == "contract" and _PAGE_NUMBER.fullmatch(plain)):
            case = "furniture:page_number"
        elif _EDGAR.fullmatch(plain):
            case = "furniture:edgar_footer"
        else:
            case = "text"
        doc.add(line, case)
    return doc


def text_paragraphs(doc: Labelled) -> list[str]:
    """The non-blank text lines of a labelled document, the material of synthetic pages."""
    return [
        line.strip() for line, furniture in zip(doc.lines, doc.furniture, strict=True) if line.strip() and not furniture
    ]


def synthetic_document(name: str, paragraphs: list[str], style: str, rng: random.Random) -> Labelled:
    """`paragraphs` laid out as pages in `style`: a table of contents first (roman page numbers), then the body
    (arabic ones, a sentence split across one page break, a list item above the footer on several pages), then a
    signature page for each of several affiliates."""
    doc = Labelled(name, "synthetic")
    body = [paragraphs[i : i + 5] for i in range(0, len(paragraphs), 5)]
    _split_a_sentence(body, rng)
    for page in rng.sample(range(len(body)), min(3, len(body))):
        body[page].append(("list_item", "(b) [***]"))
    signatures = [_signature_page(affiliate) for affiliate in ("ACME HOLDINGS LLC", "ACME FINANCE LLC", "ACME IP LLC")]
    pages = [*_contents_pages(), *body, *signatures]
    front = 4  # the contents pages, numbered i to iv
    for index, page in enumerate(pages):
        number = _roman(index + 1) if index < front else str(index - front + 1)
        _lay_out(doc, page, style, number, len(pages) - front, first=index == 0)
    return doc


def _split_a_sentence(body: list[list], rng: random.Random) -> None:
    """Move the second half of a long paragraph at a page end to the next page's start, cut before a lower-case
    word that does not follow the end of a sentence."""
    for page in rng.sample(range(len(body) - 1), len(body) - 1):
        words = body[page][-1].split(" ")
        cuts = [i for i in range(4, len(words) - 4) if words[i][:1].islower() and words[i - 1][-1:].isalpha()]
        if cuts:
            cut = rng.choice(cuts)
            body[page][-1] = ("split_sentence", " ".join(words[:cut]))
            body[page + 1].insert(0, ("split_sentence", " ".join(words[cut:])))
            return


def _contents_pages() -> list[list]:
    """Four pages of a table of contents whose rows read as citations once their column gap is one space."""
    titles = ["US", "So.", "Cal.", "F.", "Pac.", "Territory", "Term", "Fees", "A.2d", "N.E."]
    rows = [("toc", f"{article}.{section + 70} {titles[section % len(titles)]}  {article * 3 + section}")
            for article in range(1, 5) for section in range(8)]  # fmt: skip
    return [[("text", "TABLE OF CONTENTS"), *rows[:8]], rows[8:16], rows[16:24], rows[24:]]


def _signature_page(affiliate: str) -> list:
    lines = [
        "IN WITNESS WHEREOF, the parties have caused this Agreement to be executed as of the date first written above.",
        affiliate, "By: /s/ Jane Q. Roe", "Name: Jane Q. Roe", "Title: Authorized Signatory",
        "ACME CORP", "By: /s/ John Doe", "Name: John Doe", "Title: Chief Executive Officer",
        "[Signature Page to Master Services Agreement]",
    ]  # fmt: skip
    return [("signature", line) for line in lines]


def _lay_out(doc: Labelled, page: list, style: str, number: str, total: int, first: bool) -> None:
    """One page of `doc` in `style`: header, paragraphs with blank lines between, footer."""
    header = {
        "caption_formfeed": "MARLOWE v. ORCHARD FREIGHT CORP., No. 21-cv-1234",
        "page_slash": "Acme Corp. - Confidential",
    }
    footer = {
        "caption_formfeed": [number],
        "dash": [f"- {number} -"],
        "edgar": [number, "", "Source: ACME CORP, 10-K, 3/1/2019", "", ""],
        "page_slash": [f"Page {number}/{total}"],
        "bare": [number],
        "page_of": [f"Page {number} of {total}", "Confidential treatment requested by Acme Corp."],
    }[style]
    if style == "caption_formfeed" and not first:
        doc.add("\f", "furniture:form_feed")
    if style in header:
        doc.add(header[style], "furniture:running_header")
        doc.add("", "text")
    for item in page:
        case, line = item if isinstance(item, tuple) else ("text", item)
        doc.add(line, case)
        doc.add("", "text")
    for line in footer:
        kind = (
            "edgar_footer"
            if line.startswith("Source:")
            else "running_footer"
            if "Confidential" in line
            else "page_number"
        )
        doc.add(line, f"furniture:{kind}" if line else "text")


def _roman(number: int) -> str:
    return "i" * number if number < 4 else ["iv", "v", "vi"][number - 4]


def labelled_set(args: argparse.Namespace) -> list[Labelled]:
    """The real documents of `args.data` (where it exists), and synthetic pages made of their text and of demo
    documents, one layout style after another."""
    real = [label_real(*doc) for doc in real_documents(args.data, args.real)] if args.data.is_dir() else []
    sources = [(doc.name, text_paragraphs(doc)) for doc in real if doc.kind == "contract"]
    demo = generate_documents(args.demo, args.seed) if args.demo else []
    sources += [(f"demo-{i}", doc["text"].split("\n")) for i, doc in enumerate(demo)]
    rng = random.Random(args.seed)
    synthetic = []
    for i, (name, lines) in enumerate(sources):
        paragraphs = [line.strip() for line in lines if line.strip()][:60]
        if len(paragraphs) >= 10:
            style = STYLES[i % len(STYLES)]
            synthetic.append(synthetic_document(f"{style}:{name}", paragraphs, style, rng))
    return real + synthetic


def score(docs: list[Labelled]) -> dict:
    """Furniture precision and recall over the non-blank lines of `docs` (a form feed alone on its line is not
    counted: it carries nothing), with the lines dropped and the lines there for each case."""
    counts = Counter()
    cases: dict[str, Counter] = {}
    for doc in docs:
        for line, furniture, case, dropped in zip(
            doc.lines, doc.furniture, doc.cases, furniture_mask(doc.lines), strict=True
        ):
            if not line.strip() or line == "\f":
                continue
            counts[(furniture, dropped)] += 1
            cases.setdefault(f"{doc.kind}/{case}", Counter())["dropped" if dropped else "kept"] += 1
    true, false_drop, missed = counts[(True, True)], counts[(False, True)], counts[(True, False)]
    return {
        "documents": len(docs),
        "lines": sum(counts.values()),
        "furniture_lines": true + missed,
        "dropped_lines": true + false_drop,
        "text_dropped": false_drop,
        "furniture_kept": missed,
        "precision": round(true / max(true + false_drop, 1), 5),
        "recall": round(true / max(true + missed, 1), 5),
        "cases": {case: dict(count) for case, count in sorted(cases.items())},
    }


def citations(docs: list[Labelled], cfg: CleanConfig) -> dict:
    """eyecite's citations in each document before and after cleaning: how many are kept, and any that cleaning
    made (type and normalized text)."""
    kept = total = 0
    added: list[str] = []
    for doc in docs:
        before, after = _citations(doc.text), _citations(clean_text(doc.text, cfg))
        kept += sum((before & after).values())
        total += sum(before.values())
        added += [f"{doc.name}: {name}" for name in (after - before).elements()]
    return {"before": total, "kept": kept, "kept_share": round(kept / max(total, 1), 5), "added": added}


def _citations(text: str) -> Counter:
    return Counter(f"{type(c).__name__} {c.corrected_citation()}" for c in eyecite.get_citations(text))


def measure(args: argparse.Namespace, argv: list[str] | None) -> dict:
    docs = labelled_set(args)
    parts = {
        "real": [d for d in docs if d.kind != "synthetic"],
        "synthetic": [d for d in docs if d.kind == "synthetic"],
    }
    furniture = {"all": score(docs), **{name: score(part) for name, part in parts.items() if part}}
    cited = {name: citations(part, CleanConfig()) for name, part in parts.items() if part}
    kept, before = sum(c["kept"] for c in cited.values()), sum(c["before"] for c in cited.values())
    added = sum(len(c["added"]) for c in cited.values())
    met = {
        "precision": furniture["all"]["precision"] >= TARGETS["precision"],
        "recall": furniture["all"]["recall"] >= TARGETS["recall"],
        "citations_kept": kept >= TARGETS["citations_kept"] * before,
        "no_citation_added": added == 0,
    }
    head = record.header(
        "cleaning", "cpu", __file__, argv, data=str(args.data), real=args.real, demo=args.demo, seed=args.seed
    )
    return {"header": head, "targets": TARGETS, "met": met, "furniture": furniture, "citations": cited}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.getLogger("eyecite").setLevel(logging.ERROR)  # it warns of every overlap it resolves
    result = measure(args, argv)
    path = record.write(args.out, result)
    print(f"wrote {path}")
    for name, part in result["furniture"].items():
        right, found = part["dropped_lines"] - part["text_dropped"], part["furniture_lines"] - part["furniture_kept"]
        print(
            f"{name:9} precision {part['precision']:.4f} ({right}/{part['dropped_lines']}) recall "
            f"{part['recall']:.4f} ({found}/{part['furniture_lines']}) over {part['documents']} documents"
        )
    for name, cited in result["citations"].items():
        print(f"{name:9} citations kept {cited['kept']}/{cited['before']}, added {len(cited['added'])}")
    print(f"met: {result['met']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
