"""Citation accuracy, judged by eyecite: which items are asked, what a continuation scores, and the summaries.

This module owns the citation tasks of `legalpt-eval`, without any model (generations come in as text):

- citation completion: every case citation eyecite finds in a document becomes a `CitationItem`, a prompt that ends
  right before the citation (and reaches back far enough to hold the case name) with the gold citation. Short forms
  (short cites, supra, Id.) are resolved to their full citation by eyecite's resolver and scored as their own form;
- `CitationIndex`: the full citations of a reference corpus, which tells a fabricated citation (no such citation
  anywhere) from a misattributed one (a real citation of another case);
- `score_citation` / `summarize_citations`: the metrics of one continuation, and their micro-averages with bootstrap
  intervals over documents, per document and broken down by reporter, position in the document and prompt length;
- citation set: a continued opinion's citations against those of its real continuation (precision, recall, F1).

Citation identity is eyecite's: (volume, reporter as reporters-db normalizes it, page). Case names are compared by
`same_case_name`, fuzzily, since eyecite and authors shorten names.
"""

from __future__ import annotations

import bisect
import difflib
import math
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from eyecite import get_citations, resolve_citations
from eyecite.models import CitationBase, FullCaseCitation, IdCitation, ShortCaseCitation, SupraCitation
from transformers import PreTrainedTokenizerBase

from legalpt.eval.stats import bootstrap_ci

FORMS = ("full", "short", "supra", "id")  # citation forms, as `CitationItem.form` names them
SHORT_FORMS = ("short", "supra", "id")  # scored together as "short_forms"
CITATION_METRICS = (
    "well_formed",
    "exact",
    "reporter",
    "volume",
    "page",
    "year",
    "case_name",
    "fabricated",
    "misattributed",
)
CONTINUATION_CHARS = 100  # true text kept after the end of a citation (its pin cite, court and year included)
TOP_REPORTERS = 15  # reporters listed in the accuracy-by-reporter breakdown
_FORM_OF = {FullCaseCitation: "full", ShortCaseCitation: "short", SupraCitation: "supra", IdCitation: "id"}
# Words that authors and eyecite drop from a party's name, or write in many ways.
_NAME_FILLER = frozenset(
    {"a", "an", "and", "the", "of", "et", "al", "inc", "corp", "corporation", "co", "company", "llc", "lp", "ltd"}
)
_PARTY_SPLIT = re.compile(r"\s+vs?\.\s+")
_NAME_RATIO = 0.8  # difflib ratio above which two party names are the same party

Key = tuple[str | None, str, str]  # (volume, normalized reporter, page)


# ----------------------------------------------------------------------------------------------------------------
# Parsing


def _find_citations(text: str) -> list[CitationBase]:
    """eyecite's citations of `text`, with the year of a full citation repaired where eyecite reads it elsewhere.

    eyecite 2.7's court pattern runs on past a year-only parenthetical to the next "(Court Year)" within reach: in
    "A v. B, 1 U.S. 1 (1990). Later text. C v. D, 2 F.3d 2 (2d Cir. 1995)" both get 1995 (freelawproject/eyecite
    #347). A full citation whose post-citation text reaches past a closing parenthesis into another citation is
    parsed again on its own, up to that citation, and takes its year, edition and extent from there.
    """
    if not text.strip():
        return []  # eyecite refuses empty text
    citations = get_citations(text)
    starts = sorted(c.span()[0] for c in citations)
    for citation in citations:
        if isinstance(citation, FullCaseCitation):
            end, reach = citation.span()[1], citation.full_span()[1]
            cut = next((s for s in starts if end < s < reach and ")" in text[end:s]), None)
            if cut is not None:
                _reparse(citation, text, cut)
    return citations


def _reparse(citation: FullCaseCitation, text: str, cut: int) -> None:
    start = citation.full_span()[0]
    alone = get_citations(text[start:cut])
    own = next((c for c in alone if start + c.span()[0] == citation.span()[0]), None)
    if isinstance(own, FullCaseCitation):
        citation.year, citation.metadata.year = own.year, own.metadata.year
        citation.edition_guess = own.edition_guess  # an edition guessed from the wrong year may be wrong too
        citation.full_span_end = start + own.full_span()[1]


# ----------------------------------------------------------------------------------------------------------------
# Items


@dataclass(frozen=True)
class GoldCitation:
    """The full citation an item asks for: for a short form, the one eyecite resolves it to."""

    volume: str | None  # as written ("347"); a few reporters have none
    reporter: str  # normalized through reporters-db ("F.2d", "U.S.")
    page: str  # first page ("483")
    year: int | None  # decision year eyecite read from the citation's parenthetical
    case_name: str | None  # "Brown v. Board of Education"; None when eyecite found no name
    plaintiff: str | None
    defendant: str | None

    @property
    def key(self) -> Key:
        return (self.volume, self.reporter, self.page)


@dataclass(frozen=True)
class CitationItem:
    """One citation-completion prompt and the citation that follows it in the document."""

    id: str  # "<doc_id>:<character offset of the citation>"
    doc_id: str
    form: str  # full | short | supra | id
    # The text before the citation: `prompt_tokens` tokens, reaching back to the case name if needed, without the
    # whitespace just before the citation: byte-level BPE writes " 347" as one token, so a prompt ending in a space
    # would ask for a continuation the model never saw in training.
    prompt: str
    continuation: str  # the true text after the prompt: that whitespace, the whole citation, ~100 more characters
    gold: GoldCitation
    position: float  # citation start / document length
    prompt_tokens: int  # tokens of `prompt` by the tokenizer that built the item

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> CitationItem:
        values = _fields_of(cls, record, "record")
        gold = values["gold"]
        if not isinstance(gold, Mapping):
            raise ValueError(f"record['gold']: expected an object, got {type(gold).__name__}")
        values["gold"] = GoldCitation(**_fields_of(GoldCitation, gold, "record['gold']"))
        if values["form"] not in FORMS:
            raise ValueError(f"record['form']: expected one of {FORMS}, got {values['form']!r}")
        return cls(**values)


@dataclass(frozen=True)
class SetItem:
    """One citation-set prompt: an opinion's text up to a cut, and the real text that follows it."""

    id: str  # "<doc_id>:<character offset of the cut>"
    doc_id: str
    prompt: str
    reference: str  # the real continuation, about as many tokens as the model generates

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> SetItem:
        return cls(**_fields_of(cls, record, "record"))


def _fields_of(cls: type, record: Mapping[str, Any], name: str) -> dict[str, Any]:
    expected = {f.name for f in fields(cls)}
    if not isinstance(record, Mapping) or set(record) != expected:
        got = sorted(record) if isinstance(record, Mapping) else type(record).__name__
        raise ValueError(f"{name}: expected the fields {sorted(expected)} of {cls.__name__}, got {got}")
    return dict(record)


def build_citation_items(
    documents: Iterable[Mapping[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    prompt_tokens: int,
    max_items: int = 0,
    seed: int = 0,
) -> tuple[list[CitationItem], dict[str, Any]]:
    """The citation-completion items of `documents` (records with `id` and `text`), and what was found on the way.

    Every case citation eyecite finds is a candidate, in any kind of document. With `max_items` > 0 that many are
    drawn: each form gets a share proportional to its count (at least one), and within a form the draw goes round
    the documents in turn, so long documents do not crowd out short ones; `seed` fixes the draw. The stats count
    documents, documents without case citations, citations found, items and undrawn citations per form, short forms
    eyecite could not resolve, skips by reason, and the other citations (statutes, journals) eyecite found.
    """
    documents = _check_documents(documents)
    _check_tokenizer(tokenizer)
    _check_int("prompt_tokens", prompt_tokens, 1)
    _check_int("max_items", max_items, 0)
    _check_int("seed", seed, None)
    stats: dict[str, Any] = {
        "documents": len(documents),
        "documents_without_citations": 0,
        "found": Counter(),
        "unresolved": Counter(),
        "skipped": Counter(),
        "other_citations": Counter(),
    }
    candidates = []  # (document index, form, citation, full citation it refers to)
    spans = []  # per document: the sorted full spans of all its citations, which no prompt may cut
    for index, doc in enumerate(documents):
        seen = stats["found"].total()
        citations = _find_citations(doc["text"])
        candidates += [(index, *candidate) for candidate in _case_citations(doc["text"], citations, stats)]
        stats["documents_without_citations"] += stats["found"].total() == seen
        spans.append(sorted(c.full_span() for c in citations))
    chosen = _sample(candidates, max_items, seed) if max_items else candidates
    stats["items"] = Counter(form for _, form, _, _ in chosen)
    stats["not_sampled"] = Counter(form for _, form, _, _ in candidates) - stats["items"]
    by_document = defaultdict(list)
    for index, form, citation, full in sorted(chosen, key=lambda c: (c[0], c[2].span()[0])):
        by_document[index].append((form, citation, full))  # in text order (eyecite lists bracketed parallels first)
    items = [
        item
        for index in sorted(by_document)
        for item in _document_items(documents[index], by_document[index], spans[index], tokenizer, prompt_tokens)
    ]
    for name in ("found", "items", "not_sampled", "unresolved", "skipped", "other_citations"):
        stats[name] = dict(sorted((k, v) for k, v in stats[name].items() if v))
    return items, stats


def _case_citations(
    text: str, citations: list[CitationBase], stats: dict[str, Any]
) -> list[tuple[str, CitationBase, FullCaseCitation]]:
    """(form, citation, the full citation it refers to) for each case citation of `text`, counting the others."""
    refers_to = _resolutions(citations)
    found = []
    for citation in citations:
        form = _FORM_OF.get(type(citation))
        if form is None:
            stats["other_citations"][type(citation).__name__] += 1
            continue
        stats["found"][form] += 1
        full = citation if form == "full" else refers_to.get(id(citation))
        if not text[: citation.span()[0]].strip():
            stats["skipped"][f"{form} citation with no text before it"] += 1
        elif form != "full" and full is None:
            stats["unresolved"][form] += 1
        elif not isinstance(full, FullCaseCitation):
            stats["skipped"][f"{form} form refers to a {type(full).__name__}"] += 1
        elif full.groups.get("page") is None:
            stats["skipped"][f"{form} citation without a page number"] += 1
        else:
            found.append((form, citation, full))
    return found


def _resolutions(citations: list[CitationBase]) -> dict[int, CitationBase]:
    """id(citation) -> the full citation eyecite's resolver groups it with."""
    return {id(c): resource.citation for resource, group in resolve_citations(citations).items() for c in group}


def _sample(candidates: list[tuple], max_items: int, seed: int) -> list[tuple]:
    """`max_items` candidates: shares per form proportional to their counts (at least one each), and within a form
    one document after another in a seeded order."""
    if len(candidates) <= max_items:
        return candidates
    rng = random.Random(f"legalpt-citations/{seed}")
    by_form = defaultdict(lambda: defaultdict(list))  # form -> document -> candidates
    for candidate in candidates:
        by_form[candidate[1]][candidate[0]].append(candidate)
    counts = {form: sum(len(c) for c in docs.values()) for form, docs in sorted(by_form.items())}
    quotas = _shares(counts, max_items)
    chosen = []
    for form, docs in sorted(by_form.items()):
        queues = [rng.sample(docs[index], len(docs[index])) for index in sorted(docs)]
        rng.shuffle(queues)
        picked = []
        while len(picked) < quotas[form]:
            for queue in queues:
                if queue and len(picked) < quotas[form]:
                    picked.append(queue.pop())
        chosen += picked
    return chosen


def _shares(counts: dict[str, int], total: int) -> dict[str, int]:
    """`total` split in proportion to `counts` (largest remainders), with at least one for each when it fits."""
    whole = sum(counts.values())
    exact = {k: total * n / whole for k, n in counts.items()}
    shares = {k: int(x) for k, x in exact.items()}
    for k in sorted(exact, key=lambda k: shares[k] - exact[k])[: total - sum(shares.values())]:
        shares[k] += 1
    for k in counts:
        if shares[k] == 0 and total >= len(counts):
            shares[max(shares, key=shares.get)] -= 1
            shares[k] = 1
    return shares


def _document_items(
    doc: Mapping[str, Any],
    chosen: list[tuple[str, CitationBase, FullCaseCitation]],
    spans: list[tuple[int, int]],
    tokenizer: PreTrainedTokenizerBase,
    prompt_tokens: int,
) -> list[CitationItem]:
    text, doc_id = doc["text"], str(doc["id"])
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]
    starts, ends = [s for s, _ in offsets], [e for _, e in offsets]
    items = []
    for form, citation, full in chosen:
        begin, end = citation.span()
        before = bisect.bisect_right(ends, begin)  # tokens that end before the citation starts
        # Reach back to the case name (or a short form's antecedent) when the token window stops inside it, and to
        # the start of any citation the window would cut: its tail would read as another citation.
        start = min(starts[max(0, before - prompt_tokens)] if before else 0, citation.full_span()[0])
        for span_start, span_end in reversed(spans):
            if span_start < start < span_end:
                start = span_start
        cut = start + len(text[start:begin].rstrip())  # the prompt stops before the whitespace (see CitationItem)
        prompt = text[start:cut]
        stop = max(end, citation.full_span()[1], citation.span_with_pincite()[1]) + CONTINUATION_CHARS
        item = CitationItem(
            id=f"{doc_id}:{begin}",
            doc_id=doc_id,
            form=form,
            prompt=prompt,
            continuation=text[cut:stop],
            gold=_gold(full),
            position=begin / len(text),
            prompt_tokens=len(tokenizer(prompt, add_special_tokens=False, verbose=False)["input_ids"]),
        )
        items.append(item)
    return items


def _gold(full: FullCaseCitation) -> GoldCitation:
    plaintiff, defendant = full.metadata.plaintiff, full.metadata.defendant
    return GoldCitation(
        volume=full.groups.get("volume"),
        reporter=full.corrected_reporter(),
        page=full.groups["page"],
        year=full.year,
        case_name=_case_name(plaintiff, defendant),
        plaintiff=plaintiff,
        defendant=defendant,
    )


def _case_name(plaintiff: str | None, defendant: str | None) -> str | None:
    """The case name "Plaintiff v. Defendant" (or the party eyecite found); None when only filler is left ("Inc.")."""
    name = " v. ".join(p for p in (plaintiff, defendant) if p)
    return name if _parties(name) else None


def _gold_text(gold: GoldCitation) -> str:
    """The gold citation written out, so that eyecite can resolve a generated short form against it."""
    year = f" ({gold.year})" if gold.year else ""
    name = f"{gold.case_name}, " if gold.case_name else ""
    return f"{name}{' '.join(p for p in gold.key if p)}{year}."


# ----------------------------------------------------------------------------------------------------------------
# Reference index and case names


class CitationIndex:
    """Every full case citation of a reference corpus: (volume, normalized reporter, page) -> case names cited with it.

    A key whose citations never came with a name maps to an empty set: the citation exists, its case is unknown.
    """

    def __init__(self, names: Mapping[Key, Iterable[str]] | None = None) -> None:
        self._names: dict[Key, set[str]] = {key: set(value) for key, value in (names or {}).items()}

    @classmethod
    def from_documents(cls, documents: Iterable[Mapping[str, Any]]) -> CitationIndex:
        index = cls()
        for doc in _check_documents(documents):
            for citation in _find_citations(doc["text"]):
                if isinstance(citation, FullCaseCitation) and citation.groups.get("page") is not None:
                    gold = _gold(citation)
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


# ----------------------------------------------------------------------------------------------------------------
# Scoring one continuation


@dataclass(frozen=True)
class _Cited:
    """What a generated citation refers to: its own fields, or those of the full citation a short form resolves to."""

    volume: str | None = None
    reporter: str | None = None
    page: str | None = None
    year: int | None = None
    name: str | None = None  # a case name the generation itself writes (not one from the prompt)

    @property
    def key(self) -> Key | None:
        return (self.volume, self.reporter, self.page) if self.reporter and self.page else None


def score_citation(item: CitationItem, generation: str, index: CitationIndex) -> dict[str, float]:
    """The metrics of `generation`, the text a model wrote after `item.prompt`: 1.0 / 0.0, NaN where not applicable.

    The generation is parsed by eyecite after its prompt, and the first citation that starts inside it counts.
    - well_formed: it is a full case citation with a page (eyecite only knows reporters of reporters-db); for a
      short-form item an Id., supra or short cite is well-formed too. Everything below is 0 when it is not.
    - exact, reporter, volume, page: (volume, normalized reporter, page) of the citation, or of the full citation a
      short form resolves to, equal gold's; eyecite resolves a generated short form against the citations of the
      prompt and the gold full citation (a short form names its case, it does not cite it).
    - year: the cited decision year equals gold's (NaN when gold has none).
    - case_name: `same_case_name` of gold's name and the name the generation writes for its citation, or when it
      writes none, any name the index holds for the cited key (NaN when gold has no name).
    - fabricated: the cited key is in no citation of the index.
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
    if gold.case_name is not None:
        known = index.names(cited.key) if cited.key else set()
        names = {cited.name} if cited.name else known
        scores["case_name"] = float(any(same_case_name(name, gold.case_name) for name in names))
        scores["misattributed"] = float(bool(known) and not any(same_case_name(n, gold.case_name) for n in known))
    return scores


def _generated_citation(item: CitationItem, generation: str) -> _Cited | None:
    """What the first citation of `generation` refers to; None when there is none or it is not well-formed."""
    offset = len(item.prompt)
    citations = _find_citations(item.prompt + generation)
    # eyecite lists a bracketed parallel citation before the one it follows: the first is the leftmost.
    first = min((c for c in citations if c.span()[0] >= offset), key=lambda c: c.span()[0], default=None)
    form = _FORM_OF.get(type(first))
    if form is None or (form != "full" and item.form == "full"):
        return None
    name = _written_name(first, offset)
    if form == "full":
        return _cited(first, name) if first.groups.get("page") is not None else None
    anchors = _find_citations(_gold_text(item.gold))
    full = _resolutions(anchors + citations).get(id(first))
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
    name = _case_name(getattr(metadata, "plaintiff", None), getattr(metadata, "defendant", None))
    return name or _case_name(getattr(metadata, "antecedent_guess", None), None)


# ----------------------------------------------------------------------------------------------------------------
# Summaries


def summarize_citations(
    items: Sequence[CitationItem], scores: Sequence[Mapping[str, float]], samples: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """Citation-completion results for "full" items and for "short_forms" (short, supra, Id.) apart.

    Each part has its item and document counts, the micro-average of every metric over items with a bootstrap
    interval that resamples documents, per-document averages, and exact-match accuracy (with interval) by gold
    reporter (the 15 most cited), by position in the document (tenths) and by prompt length (powers of two).
    """
    items, scores = _check_scored(items, scores, CitationItem, CITATION_METRICS)
    _check_int("samples", samples, 0)
    groups = {"full": ("full",), "short_forms": SHORT_FORMS}
    summary = {}
    for group, forms in groups.items():
        picked = [(item, score) for item, score in zip(items, scores, strict=True) if item.form in forms]
        summary[group] = _summarize_group(picked, samples, seed)
    return summary


def _summarize_group(picked: list[tuple[CitationItem, Mapping[str, float]]], samples: int, seed: int) -> dict[str, Any]:
    docs = [item.doc_id for item, _ in picked]
    per_document = defaultdict(list)
    for item, score in picked:
        per_document[item.doc_id].append(score)
    exact = [score["exact"] for _, score in picked]
    reporters = [item.gold.reporter for item, _ in picked]
    tenths = [f"{min(int(item.position * 10), 9) / 10:.1f}" for item, _ in picked]
    lengths = [_length_bucket(item.prompt_tokens) for item, _ in picked]
    top = [reporter for reporter, _ in Counter(reporters).most_common(TOP_REPORTERS)]
    return {
        "items": len(picked),
        "documents": len(per_document),
        "by_form": dict(Counter(item.form for item, _ in picked)),
        "metrics": {m: _interval([score[m] for _, score in picked], docs, samples, seed) for m in CITATION_METRICS},
        "per_document": {
            doc: {"items": len(rows), **{m: _nanmean([row[m] for row in rows]) for m in CITATION_METRICS}}
            for doc, rows in per_document.items()
        },
        "by_reporter": _breakdown(exact, docs, reporters, top, samples, seed),
        "by_position": _breakdown(exact, docs, tenths, [f"{i / 10:.1f}" for i in range(10)], samples, seed),
        "by_prompt_tokens": _breakdown(exact, docs, lengths, sorted(set(lengths), key=_bucket_start), samples, seed),
    }


def _breakdown(
    values: list[float], docs: list[str], labels: list[str], order: list[str], samples: int, seed: int
) -> list[dict[str, Any]]:
    """Mean of `values` (with its interval) for each label in `order`, as rows {"bucket", "items", "mean", ...}."""
    rows = []
    for label in order:
        picked = [(v, d) for v, d, other in zip(values, docs, labels, strict=True) if other == label]
        interval = _interval([v for v, _ in picked], [d for _, d in picked], samples, seed)
        rows.append({"bucket": label, "items": len(picked), **interval})
    return rows


def _length_bucket(tokens: int) -> str:
    """Prompt lengths in powers of two: "0", "1-1", "2-3", "4-7", ..., "256-511"."""
    if tokens <= 0:
        return "0"
    low = 1 << (tokens.bit_length() - 1)
    return f"{low}-{2 * low - 1}"


def _bucket_start(label: str) -> int:
    return int(label.split("-")[0])


def _interval(values: list[float], docs: list[str], samples: int, seed: int) -> dict[str, float]:
    """Micro-average of `values` (NaNs left out) and its bootstrap interval over documents."""
    mean, low, high = bootstrap_ci(values, groups=docs, samples=samples, seed=seed)
    return {"mean": mean, "low": low, "high": high, "n": sum(not math.isnan(v) for v in values)}


def _nanmean(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


def _check_scored(
    items: Sequence[Any], scores: Sequence[Mapping[str, Any]], item_type: type, metrics: Sequence[str]
) -> tuple[list[Any], list[Mapping[str, Any]]]:
    items, scores = list(items), list(scores)
    if len(items) != len(scores):
        raise ValueError(f"scores: expected one per item ({len(items)}), got {len(scores)}")
    for i, (item, score) in enumerate(zip(items, scores, strict=True)):
        if not isinstance(item, item_type):
            raise TypeError(f"items[{i}]: expected a {item_type.__name__}, got {type(item).__name__}")
        if not isinstance(score, Mapping) or any(m not in score for m in metrics):
            raise ValueError(f"scores[{i}]: expected a mapping with the keys {list(metrics)}")
    return items, scores


# ----------------------------------------------------------------------------------------------------------------
# Citation set: the citations of a continued opinion against those of its real continuation


def set_items(
    documents: Iterable[Mapping[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    n_documents: int,
    prompt_tokens: int,
    new_tokens: int,
    seed: int = 0,
) -> list[SetItem]:
    """Up to `n_documents` prompts, one per document, drawn with `seed` among documents with a full case citation.

    In each, a full citation is drawn and the text is cut at a token boundary up to `new_tokens` / 2 tokens before
    it, so that the real continuation (`new_tokens` tokens) cites at least one case; the prompt is the
    `prompt_tokens` tokens before the cut. Documents are parsed in the drawn order until enough qualify.
    """
    documents = _check_documents(documents)
    _check_tokenizer(tokenizer)
    _check_int("n_documents", n_documents, 0)
    _check_int("prompt_tokens", prompt_tokens, 1)
    _check_int("new_tokens", new_tokens, 1)
    _check_int("seed", seed, None)
    order = list(range(len(documents)))
    random.Random(f"legalpt-citation-set/{seed}").shuffle(order)
    items = []
    for index in order:
        if len(items) == n_documents:
            break
        doc = documents[index]
        text, doc_id = doc["text"], str(doc["id"])
        begins = [c.span()[0] for c in _find_citations(text) if _is_keyed(c)]
        if not begins:
            continue
        rng = random.Random(f"legalpt-citation-set/{seed}/{doc_id}")
        offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        starts = [s for s, _ in offsets["offset_mapping"]]
        ends = [e for _, e in offsets["offset_mapping"]]
        cut = max(1, bisect.bisect_right(ends, rng.choice(begins)) - rng.randint(0, new_tokens // 2))  # in tokens
        stop = min(cut + new_tokens, len(ends))
        items.append(
            SetItem(
                id=f"{doc_id}:{starts[cut]}",
                doc_id=doc_id,
                prompt=text[starts[max(0, cut - prompt_tokens)] : starts[cut]],
                reference=text[starts[cut] : ends[stop - 1]],
            )
        )
    return items


def score_citation_set(generation: str, reference: str) -> dict[str, int]:
    """tp, predicted and relevant counts of the full case citations (keys) of `generation` against `reference`.

    Short forms add nothing: within one text they resolve to a full citation that is already counted.
    """
    for name, text in (("generation", generation), ("reference", reference)):
        if not isinstance(text, str):
            raise TypeError(f"{name}: expected a str, got {type(text).__name__}")
    predicted, relevant = _keys(generation), _keys(reference)
    return {"tp": len(predicted & relevant), "predicted": len(predicted), "relevant": len(relevant)}


def summarize_citation_set(
    items: Sequence[SetItem], scores: Sequence[Mapping[str, int]], samples: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """Micro precision, recall and F1 over all documents, each with a bootstrap interval that resamples documents.

    Each is a mean over citations, which is what `bootstrap_ci` resamples: precision over predicted citations (1 when
    also in the reference), recall over reference citations, and F1 = 2 tp / (predicted + relevant) over both.
    """
    items, scores = _check_scored(items, scores, SetItem, ("tp", "predicted", "relevant"))
    _check_int("samples", samples, 0)
    hits = {"precision": [], "recall": [], "f1": []}
    docs = {"precision": [], "recall": [], "f1": []}
    for item, score in zip(items, scores, strict=True):
        tp, predicted, relevant = score["tp"], score["predicted"], score["relevant"]
        outcomes = {
            "precision": [1.0] * tp + [0.0] * (predicted - tp),
            "recall": [1.0] * tp + [0.0] * (relevant - tp),
            "f1": [1.0] * (2 * tp) + [0.0] * (predicted + relevant - 2 * tp),
        }
        for name, values in outcomes.items():
            hits[name] += values
            docs[name] += [item.doc_id] * len(values)
    totals = {key: sum(score[key] for score in scores) for key in ("tp", "predicted", "relevant")}
    return {
        "documents": len({item.doc_id for item in items}),
        **totals,
        **{name: _interval(hits[name], docs[name], samples, seed) for name in hits},
        "per_document": {item.doc_id: dict(score) for item, score in zip(items, scores, strict=True)},
    }


def _keys(text: str) -> set[Key]:
    return {_gold(c).key for c in _find_citations(text) if _is_keyed(c)}


def _is_keyed(citation: CitationBase) -> bool:
    return isinstance(citation, FullCaseCitation) and citation.groups.get("page") is not None


# ----------------------------------------------------------------------------------------------------------------
# Argument checks


def _check_documents(documents: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    if isinstance(documents, (str, Mapping)) or not isinstance(documents, Iterable):
        raise TypeError(f"documents: expected records with 'id' and 'text', got {type(documents).__name__}")
    documents = list(documents)
    for i, doc in enumerate(documents):
        if not isinstance(doc, Mapping) or not isinstance(doc.get("text"), str) or doc.get("id") is None:
            raise ValueError(f"documents[{i}]: expected a record with an 'id' and a str 'text'")
    return documents


def _check_tokenizer(tokenizer: PreTrainedTokenizerBase) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError(
            f"tokenizer: expected a fast (tokenizers-backed) tokenizer, which reports character offsets, "
            f"got {type(tokenizer).__name__}"
        )


def _check_int(name: str, value: int, minimum: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
