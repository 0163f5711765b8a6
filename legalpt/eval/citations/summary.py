"""Citation-completion summaries: micro-averages of every metric with bootstrap intervals over documents, per
document, counts of malformed and fabricated generations (by reason), and exact match broken down by reporter,
position in the document and prompt length.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from legalpt.eval.citations.checks import check_int, check_scored
from legalpt.eval.citations.items import CitationItem
from legalpt.eval.citations.scoring import CITATION_METRICS, NOT_IN_CORPUS, UNKNOWN_REPORTER, fabrication_reason
from legalpt.eval.stats import bootstrap_ci

SHORT_FORMS = ("short", "supra", "id")  # scored together as "short_forms"
TOP_REPORTERS = 15  # reporters listed in the accuracy-by-reporter breakdown


def summarize_citations(
    items: Sequence[CitationItem], scores: Sequence[Mapping[str, float]], samples: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """Citation-completion results for "full" items and for "short_forms" (short, supra, Id.) apart.

    Each part has its item and document counts, the micro-average of every metric over items with a bootstrap
    interval that resamples documents, per-document averages, how many generations were malformed and how many
    fabricated for each reason (`outcomes`), and exact-match accuracy (with interval) by gold reporter (the 15 most
    cited), by position in the document (tenths) and by prompt length (powers of two).
    """
    items, scores = check_scored(items, scores, CitationItem, CITATION_METRICS)
    check_int("samples", samples, 0)
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
        "outcomes": _outcomes([score for _, score in picked]),
        "metrics": {m: mean_interval([score[m] for _, score in picked], docs, samples, seed) for m in CITATION_METRICS},
        "per_document": {
            doc: {"items": len(rows), **{m: _nanmean([row[m] for row in rows]) for m in CITATION_METRICS}}
            for doc, rows in per_document.items()
        },
        "by_reporter": _breakdown(exact, docs, reporters, top, samples, seed),
        "by_position": _breakdown(exact, docs, tenths, [f"{i / 10:.1f}" for i in range(10)], samples, seed),
        "by_prompt_tokens": _breakdown(exact, docs, lengths, sorted(set(lengths), key=_bucket_start), samples, seed),
    }


def _outcomes(scores: list[Mapping[str, float]]) -> dict[str, int]:
    """Generations that are no citation (malformed), and fabricated citations by reason, apart."""
    reasons = Counter(fabrication_reason(score) for score in scores)
    return {
        "malformed": sum(score["well_formed"] != 1.0 for score in scores),
        "fabricated_unknown_reporter": reasons[UNKNOWN_REPORTER],
        "fabricated_not_in_corpus": reasons[NOT_IN_CORPUS],
    }


def _breakdown(
    values: list[float], docs: list[str], labels: list[str], order: list[str], samples: int, seed: int
) -> list[dict[str, Any]]:
    """Mean of `values` (with its interval) for each label in `order`, as rows {"bucket", "items", "mean", ...}."""
    rows = []
    for label in order:
        picked = [(v, d) for v, d, other in zip(values, docs, labels, strict=True) if other == label]
        interval = mean_interval([v for v, _ in picked], [d for _, d in picked], samples, seed)
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


def mean_interval(values: list[float], docs: list[str], samples: int, seed: int) -> dict[str, float]:
    """Micro-average of `values` (NaNs left out) and its bootstrap interval over documents."""
    mean, low, high = bootstrap_ci(values, groups=docs, samples=samples, seed=seed)
    return {"mean": mean, "low": low, "high": high, "n": sum(not math.isnan(v) for v in values)}


def _nanmean(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan
