"""A small legal instruction set built from real documents: prompt/response pairs for supervised fine-tuning
(data.format=sft), split into train and held-out by source document.

From the CAP opinions (opinions/*.json) of --data:

    case_citation     "Give the citation for <name_abbreviation>." → its official citation (the record's citations)
    cited_case        "Give the citation for <case name>." → a case the opinion cites, found by eyecite, asked by the
                      case name eyecite reads before it ("<plaintiff> v. <defendant>", or the one name it gives)

From the EDGAR contracts (contracts/*.txt), named "the <title> of <filer>" after their file names:

    contract_section  "What does section <n> (<heading>) of <contract> provide?" → the first sentence of a numbered
                      section whose heading ends in a period ("6.01. Term. The initial term ...")
    contract_parties  "Who are the parties to <contract>?" → "<party> and <party>", the names after "between" in the
                      opening sentence
    contract_term     "What is the term of <contract>?" → the first sentence of its Term section, else the first
                      sentence that says how long the agreement runs
    governing_law     "Which law governs <contract>?" → the first sentence that says the agreement is governed by laws

Texts are read with whitespace runs collapsed to one space. Every response is made of `evidence`: spans of its
source's text taken verbatim (a contract's text; an opinion's text and metadata strings), joined by " and " for the
parties. A candidate that yields no example is counted by reason (a case citation with no case name, a section whose
first sentence runs past `MAX_SENTENCE` characters, a question asked twice, ...), never dropped silently.

Documents, not examples, are split: a seeded `--heldout-fraction` of the contracts and of the opinions (at least one
of each kind) goes to heldout.jsonl, the rest to train.jsonl, so no document contributes to both. A held-out question
that the train split also asks ("Give the citation for Baker v. Selden." from two opinions) is left out and counted.
report.json holds the documents of each split, examples per kind and split, and the skips by reason.

    python scripts/build_legal_instructions.py --out /tmp/legal_sft
    legalpt-train data.format=sft 'data.paths=[/tmp/legal_sft/train.jsonl]' model.pretrained=runs/cpt/hf ...
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import eyecite
from eyecite.models import FullCaseCitation

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SPLITS = ("train", "heldout")
KINDS = ("case_citation", "cited_case", "contract_section", "contract_parties", "contract_term", "governing_law")
MIN_SENTENCE, MAX_SENTENCE = 20, 600  # characters of a sentence given as a response
OPENING = 4000  # characters at the start of a contract searched for its parties

# A sentence ends at . ! or ? (a closing quote or bracket may follow) before a space and a capital, digit or quote,
# unless the word before the period is an abbreviation or an initial.
_END = re.compile(r"[.!?][\"”’)]?(?= [\"“(]?[A-Z0-9])")
_ABBREVIATIONS = frozenset(
    re.findall(
        r"\S+",
        "inc co corp ltd no nos mr mrs ms dr st ave sec secs art arts v vs e.g i.e etc jr sr n.a s.a l.l.c l.p cal "
        "supp seq para approx bldg rd blvd dept govt p pp ch cl u.s u.k fig",
    )
)
# Words before a letter that is a label ("Exhibit A."), not an initial ("John Q. Public"): a period after it can end
# a sentence.
_LABELS = frozenset(
    ["exhibit", "schedule", "annex", "appendix", "attachment", "article", "section", "part", "class", "series", "item"]
)
_SMALL = "and|or|of|the|to|for|in|on|by|with|a|an|as"
_WORD = r"[A-Z][A-Za-z&'/-]*"
# "6.01. Term. The initial ..." — a section number, a title-cased heading ending in a period, its body.
_SECTION = re.compile(
    rf"(?<![\w.,;:§$])(?<!Section )(?<!Sections )(?<!Article )(\d{{1,2}}(?:\.\d{{1,2}}){{0,2}})\.? "
    rf"({_WORD}(?: (?:{_WORD}|{_SMALL})){{0,7}})\. (?=[\"“(]?[A-Z])"
)
_TERM_HEADING = re.compile(r"(?:initial )?term(?: of (?:the |this )?agreement)?|term and termination|duration", re.I)
# A sentence that opens with what the agreement's term is and names a duration or an end.
_TERM_SENTENCE = re.compile(
    r"^(?:the )?(?:(?:initial )?term of this agreement|this agreement) (?:shall|will|is)\b"
    r".*\b(?:years?|months?|days?|until|expir\w*|terminat\w*)\b",
    re.I,
)
# A section number and a heading run into a sentence that starts "This Agreement": left out of the response.
_LEAD_IN = re.compile(r"^(?:\d+(?:\.\d+)*\.? )?(?:[A-Z][A-Za-z]* ){0,4}(?=(?:This|The) Agreement\b)")
_GOVERNING = re.compile(r"\bgoverned by\b.*\blaws? of\b", re.I)
_COMPANY = r"(?:,? (?i:Inc|Ltd|LLC|L\.L\.C|Corp|Co|N\.A|S\.A|L\.P|LP|PLC|Limited|GmbH|AG|B\.V)\.?)?"
# A party's name: up to a comma, a bracket, " and ", " a[n] <Capital>" (its description) or the sentence's end.
_NAME = rf"[A-Z0-9][^,();\"“]*?{_COMPANY}(?=\s*[,(]| and\b| an? [A-Z]|\.(?: |$))"
_PARTIES = re.compile(rf"\bbetween (?:\(1\) )?({_NAME})")
_SECOND = re.compile(rf"(?:\)\s*,?| ,?) and (?:\(2\) )?({_NAME})")
_SIGNALS = re.compile(r"^(?:(?:see|see also|accord|cf\.|e\.g\.|but see|and|compare|also)[,]? )+", re.I)


@dataclass(frozen=True)
class Skip:
    """Why a candidate gives no example (counted by this reason)."""

    reason: str


@dataclass
class Example:
    """One prompt/response pair, what kind it is, its source document and the verbatim spans of its response."""

    prompt: str
    response: str
    kind: str
    source: str
    evidence: list[str]


def normalize(text: str) -> str:
    """Whitespace runs collapsed to one space: the form every response is quoted from."""
    return " ".join(text.split())


def sentence_ends(text: str) -> list[int]:
    """Offsets just past each sentence end of `text` (see `_END`)."""
    ends = []
    for match in _END.finditer(text):
        before, word = (["", *text[: match.start()].rsplit(" ", 2)])[-2:]
        word = word.lstrip('("“').lower()
        initial = re.fullmatch(r"[a-z]|([a-z]\.)+[a-z]", word) and before.lower() not in _LABELS
        if word in _ABBREVIATIONS or initial:
            continue
        ends.append(match.end())
    return ends


def sentence_from(text: str, start: int, ends: list[int]) -> str | Skip:
    """The sentence of `text` that starts at `start`, or why there is none."""
    end = next((e for e in ends if e > start), len(text))
    if end - start > MAX_SENTENCE:
        return Skip(f"no sentence end within {MAX_SENTENCE} characters")
    sentence = text[start:end].strip()
    return sentence if len(sentence) >= MIN_SENTENCE else Skip(f"sentence shorter than {MIN_SENTENCE} characters")


def contract_name(stem: str) -> str:
    """The name "the <title> of <filer>" from an EDGAR exhibit's file name ("ACME_01_02_2000-EX-10.5-SUPPLY
    AGREEMENT" → "the Supply Agreement of ACME")."""
    filer = re.split(r"_| - ", stem, maxsplit=1)[0].strip()
    parts = [p for p in re.split(r" - |-|_", stem) if "agreement" in p.lower()] or [stem]
    title = re.sub(r"\s*\(\d+\)$|\d+$", "", parts[-1]).strip()
    if title.isupper():
        words = title.split()
        title = " ".join(w.lower() if i and w in ("AND", "OF", "TO") else w.capitalize() for i, w in enumerate(words))
    return f"the {title} of {filer}"


def contract_examples(name: str, raw: str) -> tuple[list[Example], Counter]:
    """Section, parties, term and governing-law questions of one contract, and the skips by reason."""
    text, subject = normalize(raw), contract_name(Path(name).stem)
    ends, skipped, examples = sentence_ends(text), Counter(), []

    def add(kind: str, prompt: str, found: str | list[str] | Skip, reason_prefix: str) -> None:
        if isinstance(found, Skip):
            skipped[f"{reason_prefix}: {found.reason}"] += 1
            return
        evidence = [found] if isinstance(found, str) else found
        examples.append(Example(prompt, " and ".join(evidence), kind, name, evidence))

    term = None
    for match in _SECTION.finditer(text):
        number, heading = match.group(1), match.group(2)
        body = sentence_from(text, match.end(), ends)
        add("contract_section", f"What does section {number} ({heading}) of {subject} provide?", body, "section")
        if term is None and _TERM_HEADING.fullmatch(heading):
            term = body
    if term is None or isinstance(term, Skip):
        found = next((s for s in _sentences(text, ends) if _TERM_SENTENCE.search(s)), None)
        term = found or Skip("no Term section or sentence")
    add("contract_term", f"What is the term of {subject}?", term, "term")
    law = next((s for s in _sentences(text, ends) if _GOVERNING.search(s)), Skip("no governing-law sentence"))
    add("governing_law", f"Which law governs {subject}?", law, "governing law")
    add("contract_parties", f"Who are the parties to {subject}?", _parties(text[:OPENING]), "parties")
    return examples, skipped


def _sentences(text: str, ends: list[int]) -> list[str]:
    """Every sentence of `text` no longer than `MAX_SENTENCE` characters."""
    starts = [0, *ends]
    spans = zip(starts, [*ends, len(text)], strict=True)
    return [_LEAD_IN.sub("", text[s:e].strip()) for s, e in spans if e - s <= MAX_SENTENCE]


def _parties(opening: str) -> list[str] | Skip:
    """The two names after "between" in a contract's opening (`opening`), or why there are none."""
    first = _PARTIES.search(opening)
    if first is None:
        return Skip("no 'between' in the opening")
    second = _SECOND.search(opening, first.end())
    if second is None:
        return Skip("no second party after 'between'")
    names = [first.group(1).strip(), second.group(1).strip()]
    if any(len(n) < 2 or len(n) > 80 for n in names):
        return Skip("a party name outside 2 to 80 characters")
    return names


def opinion_source(record: dict) -> str:
    """The text an opinion's responses are quoted from: every string of its CAP record (metadata and opinions)."""
    strings: list[str] = []

    def walk(value) -> None:
        if isinstance(value, str):
            strings.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(record)
    return normalize("\n".join(strings))


def opinion_examples(name: str, record: dict) -> tuple[list[Example], Counter]:
    """The official-citation question of one opinion and a question per case it cites, and the skips by reason."""
    skipped, examples = Counter(), []
    official = [c["cite"] for c in record.get("citations", []) if c.get("type") == "official"]
    if official and record.get("name_abbreviation"):
        prompt = ask_citation(normalize(record["name_abbreviation"]))
        examples.append(Example(prompt, normalize(official[0]), "case_citation", name, [normalize(official[0])]))
    else:
        skipped["case citation: no official citation or name"] += 1
    for opinion in record["casebody"]["data"]["opinions"]:
        text = normalize(opinion["text"])
        for citation in eyecite.get_citations(text):
            found = _cited_case(citation, text)
            if isinstance(found, Skip):
                skipped[f"cited case: {found.reason}"] += 1
                continue
            case, cite = found
            examples.append(Example(ask_citation(case), cite, "cited_case", name, [cite]))
    return examples, skipped


def ask_citation(case: str) -> str:
    """The question for a case's citation; a name that ends in a period ("Inc.") ends the question."""
    return f"Give the citation for {case}" + ("" if case.endswith(".") else ".")


def _cited_case(citation, text: str) -> tuple[str, str] | Skip:
    """(case name, citation as written) of an eyecite citation in `text`, or why it gives no question."""
    if not isinstance(citation, FullCaseCitation):
        return Skip(f"{type(citation).__name__}, not a full case citation")
    plaintiff, defendant = citation.metadata.plaintiff, citation.metadata.defendant
    if plaintiff:
        plaintiff = _SIGNALS.sub("", plaintiff)
    if not defendant:
        return Skip("no case name before the citation")
    case = f"{plaintiff} v. {defendant}" if plaintiff else defendant
    if case not in text:
        return Skip("case name not written as '<plaintiff> v. <defendant>'")
    return case, normalize(citation.matched_text())


def split_documents(names: dict[str, str], fraction: float, seed: int) -> dict[str, str]:
    """split ("train" or "heldout") of each document, by a seeded shuffle per kind of document (`names`: name →
    kind): round(fraction * count) of each kind held out, at least one where there are two."""
    rng, split = random.Random(seed), {}
    for kind in sorted(set(names.values())):
        group = sorted(name for name, k in names.items() if k == kind)
        rng.shuffle(group)
        held = min(len(group) - 1, max(1, round(len(group) * fraction))) if len(group) >= 2 else 0
        split.update({name: "heldout" if i < held else "train" for i, name in enumerate(group)})
    return split


def read_documents(data: Path) -> dict[str, tuple[str, list[Example], Counter]]:
    """(kind, examples, skips) of every contract and opinion under `data`, by file name."""
    found = {}
    for path in sorted(data.glob("contracts/*.txt")):
        found[path.name] = ("contract", *contract_examples(path.name, path.read_text(encoding="utf-8")))
    for path in sorted(data.glob("opinions/*.json")):
        found[path.name] = ("opinion", *opinion_examples(path.name, json.loads(path.read_text(encoding="utf-8"))))
    if not found:
        raise FileNotFoundError(f"--data: {data} holds no contracts/*.txt or opinions/*.json")
    return found


def build(data: Path, fraction: float, seed: int) -> tuple[dict[str, list[Example]], dict]:
    """The examples of each split and the report: documents per split, examples per kind and split, skips."""
    documents = read_documents(data)
    split = split_documents({name: kind for name, (kind, _, _) in documents.items()}, fraction, seed)
    skipped = sum((skips for _, _, skips in documents.values()), Counter())
    examples: dict[str, list[Example]] = {name: [] for name in SPLITS}
    asked: dict[str, set[str]] = {name: set() for name in SPLITS}
    for part in SPLITS:  # train first: a held-out question the train split asks is left out
        for name in (n for n in documents if split[n] == part):
            for example in documents[name][1]:
                if example.prompt in asked[part]:
                    skipped["question asked before in its split"] += 1
                elif part == "heldout" and example.prompt in asked["train"]:
                    skipped["held-out question also asked in the train split"] += 1
                else:
                    asked[part].add(example.prompt)
                    examples[part].append(example)
    report = {
        "data": str(data),
        "heldout_fraction": fraction,
        "seed": seed,
        "documents": {part: sorted(n for n in documents if split[n] == part) for part in SPLITS},
        "examples": {part: dict(Counter(e.kind for e in examples[part]).most_common()) for part in SPLITS},
        "skipped": dict(skipped.most_common()),
    }
    return examples, report


def write(examples: dict[str, list[Example]], report: dict, out: Path) -> list[Path]:
    """train.jsonl, heldout.jsonl (one example per line, in document order) and report.json in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for part in SPLITS:
        path = out / f"{part}.jsonl"
        path.write_text("".join(json.dumps(asdict(e), ensure_ascii=False) + "\n" for e in examples[part]))
        paths.append(path)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return [*paths, out / "report.json"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="folder with contracts/ and opinions/")
    parser.add_argument("--out", type=Path, required=True, help="folder of train.jsonl, heldout.jsonl, report.json")
    parser.add_argument("--heldout-fraction", type=float, default=0.2, help="share of documents held out")
    parser.add_argument("--seed", type=int, default=0, help="seed of the document split")
    args = parser.parse_args(argv)
    if not 0 < args.heldout_fraction < 1:
        parser.error(f"--heldout-fraction must be in (0, 1); got {args.heldout_fraction}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.getLogger("eyecite").setLevel(logging.ERROR)  # it warns of every overlap it resolves
    examples, report = build(args.data, args.heldout_fraction, args.seed)
    for path in write(examples, report, args.out):
        print(f"wrote {path}")
    for part in SPLITS:
        kinds = ", ".join(f"{kind} {n}" for kind, n in report["examples"][part].items())
        print(f"{part:8} {len(report['documents'][part])} documents, {len(examples[part])} examples: {kinds}")
    print("skipped  " + "; ".join(f"{n} {reason}" for reason, n in report["skipped"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
