"""Goodness-of-fit helpers for sampler tests: the G-test against an exact law, and its power.

Cells whose expected count is below ``min_expected`` are pooled into one cell; an outcome outside the law's
support fails the test outright (p = 0), since the G statistic would otherwise ignore it.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
from scipy import stats


def _pool(expected: np.ndarray, *others: np.ndarray, min_expected: float):
    """Pool the cells with ``expected < min_expected`` into one (applied alike to ``others``)."""
    big = expected >= min_expected
    if big.all():
        return (expected, *others)
    return tuple(np.append(x[big], x[~big].sum()) for x in (expected, *others))


def g_test_counts(observed, probs, min_expected: float = 5.0) -> float:
    """p-value of the G-test of cell counts ``observed`` against cell probabilities ``probs``."""
    observed, probs = np.asarray(observed, dtype=float), np.asarray(probs, dtype=float)
    if np.any(observed[probs == 0] > 0):
        return 0.0
    n = observed.sum()
    expected, observed = _pool(probs * n, observed, min_expected=min_expected)
    if expected.size < 2:
        raise ValueError("g_test: fewer than two cells; use more samples")
    mask = observed > 0
    g = 2.0 * np.sum(observed[mask] * np.log(observed[mask] / expected[mask]))
    return float(stats.chi2.sf(g, df=expected.size - 1))


def g_test(samples, law: dict, min_expected: float = 5.0) -> float:
    """p-value of the G-test of ``samples`` (hashable outcomes) against the exact ``law``."""
    counts = Counter(samples)
    if any(key not in law or float(law[key]) == 0 for key in counts):
        return 0.0
    keys = sorted(law, key=lambda k: -float(law[k]))
    return g_test_counts([counts.get(k, 0) for k in keys], [float(law[k]) for k in keys], min_expected)


def g_test_power(true_law: dict, alt_law: dict, n: int, alpha: float, min_expected: float = 5.0) -> float:
    """Power of :func:`g_test` at level ``alpha`` with ``n`` samples drawn from ``alt_law``.

    Mass of ``alt_law`` outside the support of ``true_law`` rejects once one sample lands there; otherwise the
    statistic is approximately noncentral χ² with ``λ = n·Σ (a − t)²/t`` (Pearson form, accurate for small
    deviations), on the same pooled cells as the test.
    """
    keys = sorted((k for k in true_law if float(true_law[k]) > 0), key=lambda k: -float(true_law[k]))
    t = np.array([float(true_law[k]) for k in keys])
    a = np.array([float(alt_law.get(k, 0.0)) for k in keys])
    outside = sum(float(v) for k, v in alt_law.items() if float(true_law.get(k, 0)) == 0)
    _, t, a = _pool(t * n, t, a, min_expected=min_expected)
    df = t.size - 1
    lam = n * float(np.sum((a - t) ** 2 / t))
    return 1.0 - (1.0 - outside) ** n * float(stats.ncx2.cdf(stats.chi2.isf(alpha, df), df, lam))


def detectable_distance(probs, n: int, alpha: float, power: float = 0.99, min_expected: float = 5.0) -> float:
    """Smallest χ²-distance ``Σ (a − t)²/t`` that the G-test with ``n`` samples detects w.p. ``power``."""
    (expected,) = _pool(np.asarray(probs, dtype=float) * n, min_expected=min_expected)
    df = expected.size - 1
    crit = stats.chi2.isf(alpha, df)
    lam = 1.0
    while stats.ncx2.sf(crit, df, lam) < power:
        lam *= 1.05
    return lam / n
