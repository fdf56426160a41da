"""Goodness-of-fit helpers for sampler tests: the G-test against an exact law, its power, and the suite's
false-alarm budget.

Cells whose expected count is below ``min_expected`` (:data:`MIN_EXPECTED`) are pooled into one cell, and G is
divided by Williams' correction (:func:`williams`); an outcome outside the law's support fails the test outright
(p = 0), since the G statistic would otherwise ignore it.

Budget (Bonferroni): the suite's *accepting* G-tests (a lossless sampler must pass) share one family-wise
false-alarm budget :data:`FAMILY_FALSE_ALARM`; each runs at ``LEVEL = FAMILY_FALSE_ALARM / Σ ACCEPTING``, so
the probability that any of them fails on a correct sampler is at most the budget.  Every accepting test is
registered in :data:`ACCEPTING` with its number of parametrised cases (one accepting G-test per case);
``tests/test_mc_budget.py`` checks the registry against the cases pytest collects and the calls in the source,
and :func:`assert_accepts` refuses an unregistered caller or a second accepting G-test in one case, so the level
cannot drift silently.  Each accepting test also asserts its power (:func:`assert_power`): ≥ :data:`POWER` at
``LEVEL`` against the exact law of each of its lossy alternatives on its instance.
"""
from __future__ import annotations

import os
from collections import Counter

import numpy as np
from scipy import stats

from paper_checks.base import law_distance

#: Family-wise false-alarm budget of all accepting goodness-of-fit tests together (Standards: ≤ 1e-3).
FAMILY_FALSE_ALARM = 1e-3
#: Accepting G-tests: ``"<file under tests/>::<test function>"`` → its number of parametrised cases, each of
#: which runs exactly one accepting G-test.
ACCEPTING = {
    "theory/test_samplers.py::test_sampler_matches_exact_law": 12,
    "theory/test_samplers.py::test_chain_sampler_matches_exact_law": 2,
    "theory/test_structures.py::test_sampler_matches_tuple_law": 3,
    "theory/test_layout.py::test_monte_carlo_selection_rule": 1,
    "gpu/test_distribution.py::test_sampler_follows_exact_per_tree_law": 11,
    "gpu/test_cuda.py::test_sampler_follows_exact_per_tree_law": 4,
    "gpu/test_distribution.py::test_same_test_rejects_bug_zoo": 3,
    "gpu/test_distribution.py::test_sample_children_follows_tuple_law": 5,
    "gpu/test_distribution.py::test_draft_tree_follows_tree_law": 2,
    "gpu/test_lossless_large.py::test_first_token_marginal_is_target": 6,
    "gpu/test_confident_rows.py::test_verify_emits_the_target_law_on_the_audit_row": 1,
    "gpu/test_support.py::test_sampler_on_the_drafted_support_follows_exact_law": 3,
    "gpu/test_support.py::test_same_test_rejects_undrafted_tokens_from_all_of_p": 2,
    "gpu/test_walk.py::test_same_test_rejects_a_lossy_rule_walked": 1,
    "gpu/test_walk.py::test_walk_on_the_drafted_support_reads_each_trees_own_row": 1,
    "gpu/test_traverse.py::test_univer_keeps_its_law_traversed": 2,
    "gpu/test_traverse.py::test_same_test_rejects_a_lossy_rule_traversed": 2,
    "theory/test_multidraft.py::test_hub_sampler_matches_tuple_law": 1,
    "theory/test_multidraft.py::test_spechub_sampler_matches_its_law": 1,
}
#: Level of each accepting (and rejecting) G-test.
LEVEL = FAMILY_FALSE_ALARM / sum(ACCEPTING.values())
#: Cells whose expected count is below this are pooled into one.  With Williams' correction (:func:`williams`)
#: the G-test's size at ``LEVEL`` is its level (0.91–1.02× on the V = 1000 rows of ``gpu/test_lossless_large``,
#: 2·10⁶ null draws each); at 5, uncorrected, it was 1.7–3× ``LEVEL`` there, so the budget did not hold.
MIN_EXPECTED = 20.0
#: Power every accepting test must have against its lossy alternatives, at ``LEVEL`` and its sample size.
POWER = 0.99

_CALLED: set[str] = set()


def registry_key(node: str) -> str:
    """Key in :data:`ACCEPTING` of a pytest node id (``tests/<file>::<function>[<case>]``)."""
    return node.removeprefix("tests/").split("[", 1)[0]


def _current_case() -> tuple[str, str]:
    """``(registry key, node id)`` of the running test, from pytest's ``PYTEST_CURRENT_TEST``."""
    node = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    return registry_key(node), node


def assert_accepts(pval: float, what: str) -> None:
    """The accepting side: a lossless sampler's G-test p-value must be ≥ :data:`LEVEL` (registered tests only,
    one accepting G-test per parametrised case)."""
    key, node = _current_case()
    assert key in ACCEPTING, f"accepting G-test in unregistered test {node!r}: add it to tests.stats.ACCEPTING"
    assert node not in _CALLED, f"{node}: a second accepting G-test in one case; register it"
    _CALLED.add(node)
    assert pval >= LEVEL, f"{what}: G-test p = {pval:.3g} < level {LEVEL:.3g}"


def assert_rejects(pval: float, what: str) -> None:
    """The power side: a lossy sampler's G-test p-value must be < :data:`LEVEL`."""
    assert pval < LEVEL, f"{what}: lossy sampler not detected, G-test p = {pval:.3g} ≥ level {LEVEL:.3g}"


def accepting_calls(node: str) -> int:
    """Number of accepting G-tests the case ``node`` ran (0 or 1)."""
    return int(node in _CALLED)


def _pool(expected: np.ndarray, *others: np.ndarray, min_expected: float):
    """Pool the cells (the last axis) with ``expected [cells] < min_expected`` into one (applied alike to
    ``others [..., cells]``)."""
    big = expected >= min_expected
    if big.all():
        return (expected, *others)
    return tuple(np.append(x[..., big], x[..., ~big].sum(-1, keepdims=True), axis=-1) for x in (expected, *others))


def williams(probs: np.ndarray, n: float) -> float:
    """Williams' correction ``q = 1 + (Σ 1/π_i − 1)/(6n·df)`` of the G statistic on (pooled) cell probabilities
    ``probs`` (:data:`MIN_EXPECTED`: its measured size)."""
    probs = probs[probs * n >= 1.0]     # a cell expected below once (empty, or a pooled subnormal tail) rejects
                                        # only when hit, about as often as its mass: 1/π would overflow q
    return 1.0 + (float(np.sum(1.0 / probs)) - 1.0) / (6.0 * n * max(probs.size - 1, 1))


def g_test_pvalues(observed, probs, min_expected: float = MIN_EXPECTED) -> np.ndarray:
    """p-values of the G-test of each row of cell counts ``observed [S, cells]`` (rows of one total n) against
    cell probabilities ``probs [cells]``: 0 where a row counts a cell of probability 0."""
    observed, probs = np.atleast_2d(np.asarray(observed, dtype=float)), np.asarray(probs, dtype=float)
    n = observed[0].sum()
    if np.any(observed.sum(-1) != n):
        raise ValueError("g_test: rows of counts must have one total")
    outside = np.any(observed[:, probs == 0] > 0, axis=-1)
    expected, observed = _pool(probs * n, observed, min_expected=min_expected)
    if expected.size < 2:
        raise ValueError("g_test: fewer than two cells; use more samples")
    hit = observed > 0                  # cells counted 0 add 0; one of expected 0 counted is outside (p = 0)
    ratio = np.where(hit, observed, 1.0) / np.where(hit & (expected > 0), expected, 1.0)
    g = 2.0 * np.sum(np.where(hit, observed * np.log(ratio), 0.0), axis=-1)
    return np.where(outside, 0.0, stats.chi2.sf(g / williams(expected / n, n), df=expected.size - 1))


def g_test_counts(observed, probs, min_expected: float = MIN_EXPECTED) -> float:
    """p-value of the G-test of cell counts ``observed [cells]`` against cell probabilities ``probs``."""
    return float(g_test_pvalues(observed, probs, min_expected)[0])


def g_test(samples, law: dict, min_expected: float = MIN_EXPECTED) -> float:
    """p-value of the G-test of ``samples`` (hashable outcomes) against the exact ``law``."""
    counts = Counter(samples)
    if any(key not in law or float(law[key]) == 0 for key in counts):
        return 0.0
    keys = sorted(law, key=lambda k: -float(law[k]))
    return g_test_counts([counts.get(k, 0) for k in keys], [float(law[k]) for k in keys], min_expected)


def g_test_power(true_law: dict, alt_law: dict, n: int, alpha: float,
                 min_expected: float = MIN_EXPECTED) -> float:
    """Power of :func:`g_test` at level ``alpha`` with ``n`` samples drawn from ``alt_law``.

    Mass of ``alt_law`` outside the support of ``true_law`` rejects once one sample lands there; otherwise the
    statistic is approximately noncentral χ² with ``λ = n·Σ (a − t)²/t`` (Pearson form, accurate for small
    deviations), on the same pooled cells as the test, against its critical value (Williams-corrected).
    """
    keys = sorted((k for k in true_law if float(true_law[k]) > 0), key=lambda k: -float(true_law[k]))
    t = np.array([float(true_law[k]) for k in keys])
    a = np.array([float(alt_law.get(k, 0.0)) for k in keys])
    outside = sum(float(v) for k, v in alt_law.items() if float(true_law.get(k, 0)) == 0)
    _, t, a = _pool(t * n, t, a, min_expected=min_expected)
    df = t.size - 1
    lam = n * float(np.sum((a - t) ** 2 / t))
    crit = williams(t, n) * stats.chi2.isf(alpha, df)
    return 1.0 - (1.0 - outside) ** n * float(stats.ncx2.cdf(crit, df, lam))


def assert_power(law: dict, alternatives: dict, n: int, may_coincide=(),
                 min_expected: float = MIN_EXPECTED) -> dict:
    """Power of the accepting G-test of ``law`` with ``n`` samples at :data:`LEVEL` against each alternative law
    (``{name: law}``): every power must be ≥ :data:`POWER`.  An alternative equal to ``law`` (max-abs ≤ 1e-9)
    fails the check unless named in ``may_coincide`` (a variant that cannot differ on this instance); at least
    one must differ.  Returns ``{name: power}`` of the differing alternatives."""
    same = sorted(name for name, alt in alternatives.items() if law_distance(law, alt) <= 1e-9)
    assert set(same) <= set(may_coincide), f"alternatives {same} equal the tested law here: the test has no power"
    powers = {name: g_test_power(law, alt, n, LEVEL, min_expected) for name, alt in alternatives.items()
              if name not in same}
    assert powers, f"no alternative differs from the tested law (of {sorted(alternatives)}): the test has no power"
    weak = {k: round(v, 4) for k, v in powers.items() if not v >= POWER}             # a NaN power is weak
    assert not weak, f"underpowered at n = {n}, level {LEVEL:.2g}: {weak} < {POWER}"
    return powers


def assert_fits(counts, law, alternatives, what):
    """``counts`` (``{cell: count}``) pass the G-test against ``law``, which has power against ``alternatives``."""
    assert_power(law, alternatives, sum(counts.values()))
    outside = {k: c for k, c in counts.items() if float(law.get(k, 0)) == 0}
    assert not outside, f"{what}: samples in zero-probability cells {outside}"
    assert_accepts(g_test(counts, law), what)
