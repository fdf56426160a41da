"""Goodness-of-fit helpers for sampler tests (G-test against an exact law)."""
from __future__ import annotations

from collections import Counter

import numpy as np
from scipy import stats


def g_test(samples, law: dict, min_expected: float = 5.0) -> float:
    """p-value of the G-test of ``samples`` (hashable outcomes) against the exact ``law``.

    Cells whose expected count is below ``min_expected`` are pooled into one cell; an outcome outside the
    law's support makes the test fail outright (p = 0), since the G statistic would otherwise ignore it.
    """
    counts = Counter(samples)
    n = sum(counts.values())
    if any(key not in law or float(law[key]) == 0 for key in counts):
        return 0.0
    keys = sorted(law, key=lambda k: -float(law[k]))
    expected = np.array([float(law[k]) * n for k in keys])
    observed = np.array([counts.get(k, 0) for k in keys], dtype=float)
    big = expected >= min_expected
    if (~big).any():
        expected = np.append(expected[big], expected[~big].sum())
        observed = np.append(observed[big], observed[~big].sum())
    if expected.size < 2:
        raise ValueError("g_test: fewer than two cells; use more samples")
    mask = observed > 0
    g = 2.0 * np.sum(observed[mask] * np.log(observed[mask] / expected[mask]))
    return float(stats.chi2.sf(g, df=expected.size - 1))
