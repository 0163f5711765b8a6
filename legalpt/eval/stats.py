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
) -> tuple[float, float, float]:
    """Mean of `values` and its percentile-bootstrap interval (low, high).

    With `groups` (e.g. the document of each citation) whole groups are resampled, since items of one document are not
    independent; the statistic stays the micro-average over items. NaN values (a metric that does not apply to an
    item) are left out. Empty input gives NaNs.
    """
    x = np.asarray(values, dtype=np.float64)
    keep = ~np.isnan(x)
    x = x[keep]
    if x.size == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(x.mean())
    if samples <= 0:
        return mean, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    if groups is None:
        draws = rng.integers(0, x.size, size=(samples, x.size))
        stats = x[draws].mean(axis=1)
    else:
        _, group_index = np.unique(np.asarray(groups, dtype=object)[keep].astype(str), return_inverse=True)
        n_groups = group_index.max() + 1
        sums = np.bincount(group_index, weights=x, minlength=n_groups)  # (G,)
        counts = np.bincount(group_index, minlength=n_groups)  # (G,)
        picks = rng.integers(0, n_groups, size=(samples, n_groups))  # (samples, G)
        stats = sums[picks].sum(axis=1) / np.maximum(counts[picks].sum(axis=1), 1)
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(stats, [alpha, 1.0 - alpha])
    return mean, float(low), float(high)
