"""Confidence intervals: percentile bootstrap over documents (or items), shared by every eval task."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def bootstrap_ci(
    values: Sequence[float],
    groups: Sequence[str] | None = None,
    samples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    weights: Sequence[float] | None = None,
) -> tuple[float, float, float]:
    """sum(values) / sum(weights) — the mean when `weights` is None — and its percentile-bootstrap interval.

    With `groups` (e.g. the document of each citation) whole groups are resampled, since items of one document are not
    independent; the statistic stays the micro-average over items. With `weights` it is a ratio of sums, e.g. bits over
    bytes, where long documents weigh more. NaN values (a metric that does not apply to an item) are left out. Empty
    input gives NaNs.
    """
    x = np.asarray(values, dtype=np.float64)
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=np.float64)
    keep = ~np.isnan(x)
    x, w = x[keep], w[keep]
    if x.size == 0:
        return float("nan"), float("nan"), float("nan")
    estimate = float(x.sum() / w.sum())
    if samples <= 0:
        return estimate, float("nan"), float("nan")
    if groups is None:
        group_index = np.arange(x.size)  # every item its own group
    else:
        _, group_index = np.unique(np.asarray(groups, dtype=object)[keep].astype(str), return_inverse=True)
    n_groups = group_index.max() + 1
    value_sums = np.bincount(group_index, weights=x, minlength=n_groups)  # (G,)
    weight_sums = np.bincount(group_index, weights=w, minlength=n_groups)  # (G,)
    picks = np.random.default_rng(seed).integers(0, n_groups, size=(samples, n_groups))  # (samples, G)
    stats = value_sums[picks].sum(axis=1) / np.maximum(weight_sums[picks].sum(axis=1), np.finfo(float).tiny)
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(stats, [alpha, 1.0 - alpha])
    return estimate, float(low), float(high)
