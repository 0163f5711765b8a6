"""Citation-completion items: every case citation eyecite finds in a document becomes a `CitationItem`, a prompt that
ends right before the citation (reaching back far enough to hold the case name) with the gold citation it asks for.

Short forms (short cites, supra, Id.) are resolved to their full citation by eyecite's resolver and kept as their
own form. `build_citation_items` draws a seeded sample spread over forms and documents.
"""

from __future__ import annotations

import bisect
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from eyecite.models import CitationBase, FullCaseCitation
from transformers import PreTrainedTokenizerBase

from legalpt.eval.citations.checks import check_documents, check_int, check_tokenizer, fields_of
from legalpt.eval.citations.parsing import FORM_OF, FORMS, GoldCitation, find_citations, gold_citation, resolutions

CONTINUATION_CHARS = 100  # true text kept after the end of a citation (its pin cite, court and year included)


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
        values = fields_of(cls, record, "record")
        gold = values["gold"]
        if not isinstance(gold, Mapping):
            raise ValueError(f"record['gold']: expected an object, got {type(gold).__name__}")
        values["gold"] = GoldCitation(**fields_of(GoldCitation, gold, "record['gold']"))
        if values["form"] not in FORMS:
            raise ValueError(f"record['form']: expected one of {FORMS}, got {values['form']!r}")
        return cls(**values)


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
    documents = check_documents(documents)
    check_tokenizer(tokenizer)
    check_int("prompt_tokens", prompt_tokens, 1)
    check_int("max_items", max_items, 0)
    check_int("seed", seed, None)
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
        citations = find_citations(doc["text"])
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
    refers_to = resolutions(citations)
    found = []
    for citation in citations:
        form = FORM_OF.get(type(citation))
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
            gold=gold_citation(full),
            position=begin / len(text),
            prompt_tokens=len(tokenizer(prompt, add_special_tokens=False, verbose=False)["input_ids"]),
        )
        items.append(item)
    return items
