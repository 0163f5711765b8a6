"""The citation-set task: continue an opinion from a cut and compare the cases the continuation cites with those of
the real continuation (micro precision, recall and F1 over full case citations).
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from legalpt.eval.citations.checks import check_documents, check_int, check_scored, check_tokenizer, fields_of
from legalpt.eval.citations.parsing import Key, find_citations, gold_citation, is_keyed
from legalpt.eval.citations.summary import mean_interval


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
        return cls(**fields_of(cls, record, "record"))


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
    documents = check_documents(documents)
    check_tokenizer(tokenizer)
    check_int("n_documents", n_documents, 0)
    check_int("prompt_tokens", prompt_tokens, 1)
    check_int("new_tokens", new_tokens, 1)
    check_int("seed", seed, None)
    order = list(range(len(documents)))
    random.Random(f"legalpt-citation-set/{seed}").shuffle(order)
    items = []
    for index in order:
        if len(items) == n_documents:
            break
        doc = documents[index]
        text, doc_id = doc["text"], str(doc["id"])
        begins = [c.span()[0] for c in find_citations(text) if is_keyed(c)]
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
    items, scores = check_scored(items, scores, SetItem, ("tp", "predicted", "relevant"))
    check_int("samples", samples, 0)
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
        **{name: mean_interval(hits[name], docs[name], samples, seed) for name in hits},
        "per_document": {item.doc_id: dict(score) for item, score in zip(items, scores, strict=True)},
    }


def _keys(text: str) -> set[Key]:
    return {gold_citation(c).key for c in find_citations(text) if is_keyed(c)}
