"""The vectorised clock integral of ``Pr_wor(S ⊄ G_j)`` (``alpha_star._wor_miss_clocks``: elementary symmetric
sums of every prefix as nested cumulative sums) against the plain token-by-token Poisson-binomial recursion on
the same quadrature grid, on random and confident rows (tails down to 1e-310), k = 2..6, to 1e-12."""
import numpy as np
import pytest

from univer_theory import ConfidentModel
from univer_theory.alpha_star import _suffix_mass, _wor_miss_clocks, alpha_star, ratio_argsort
from univer_theory.models import CONFIDENT_TARGETS
from univer_theory.plans.clocks import (LOG_T_NODES, LOG_T_RANGE, _legendre_rule, clock_nodes, log_time_grid,
                                        log_time_upper, rate_times, sequential_thinning_avail)
from univer_theory.plans.pts import pts_plan
from univer_theory.processes import tuple_law
from univer_theory.tolerance import worst_of


def sequential_miss(q_sorted: np.ndarray, k: int) -> np.ndarray:
    """Reference: ``Pr[N_{G_j}(t) = m]``, m < k, updated one token at a time (probabilities only), then
    ``∫ r e^{−rt} Pr[N_{G_j}(t) < k] dt`` on the grid of ``plans.clocks`` (one row ``[V]`` → ``[V + 1]``)."""
    V = q_sorted.size
    r = _suffix_mass(q_sorted)
    s, w = log_time_grid(clock_nodes(k), log_time_upper(r[r > 0].min(initial=1.0)))
    state = np.zeros((k, s.size))
    state[0] = 1.0
    miss = [1.0]
    for j in range(V):
        qt = rate_times(np.array([q_sorted[j]]), s)
        arrived = -np.expm1(-qt) * state[:-1]
        state *= np.exp(-qt)
        state[1:] += arrived
        rt = rate_times(np.array([r[j + 1]]), s)
        miss.append(float(w @ (state.sum(axis=0) * rt * np.exp(-rt))))
    miss = np.array(miss) - np.expm1(-r * np.exp(LOG_T_RANGE[0]))
    drafted = np.concatenate([[0], np.cumsum(q_sorted > 0)])
    return np.clip(np.where(drafted < k, 1.0, np.where(r == 0, 0.0, miss)), 0.0, 1.0)


def rows(V: int):
    """Dirichlet rows (one with exact zeros) and confident rows of every target family and tail."""
    rng = np.random.default_rng(V)
    for conc in (0.3, 1.0, 5.0):
        yield "dirichlet", rng.dirichlet(np.full(V, conc)), rng.dirichlet(np.full(V, conc))
    q = rng.dirichlet(np.ones(V))
    q[rng.choice(V, V // 3, replace=False)] = 0.0
    yield "zeros", rng.dirichlet(np.ones(V)), q / q.sum()
    for seed, tail in enumerate((1e-8, 1e-14, 1e-100, 1e-300, 1e-310)):
        model = ConfidentModel(V, seed=seed, tail=tail, target=CONFIDENT_TARGETS[seed % len(CONFIDENT_TARGETS)])
        yield f"confident {tail:g}", model.target(()), model.draft(())


@pytest.mark.parametrize("V", [7, 23, 150])
@pytest.mark.parametrize("k", [2, 3, 4, 5, 6])
def test_vectorised_clocks_match_the_sequential_recursion(V, k):
    for name, p, q in rows(V):
        q_sorted = np.take_along_axis(q, ratio_argsort(p, q), axis=-1)
        if np.count_nonzero(q_sorted) < k:
            continue
        got = _wor_miss_clocks(q_sorted[None], k)[0]
        assert np.all(np.isfinite(got)), name
        np.testing.assert_allclose(got, sequential_miss(q_sorted, k), rtol=0, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("k", [9, 12])
def test_vectorised_clocks_match_the_sequential_recursion_past_four_draws(k):
    """α*(ρ)'s clock grid grows with k as PTS's does (:func:`clock_nodes`): on 400 nodes the miss integrals of these
    V = 150 rows were up to ~1e-11 off the recursion on its grid at k = 12 (α* 6.6e-12 off on V = 300 rows)."""
    for name, p, q in rows(150):
        q_sorted = np.take_along_axis(q, ratio_argsort(p, q), axis=-1)
        got = _wor_miss_clocks(q_sorted[None], k)[0]
        np.testing.assert_allclose(got, sequential_miss(q_sorted, k), rtol=0, atol=1e-13, err_msg=name)


def test_vectorised_clocks_batch_rows_independently():
    """A batch of rows gives each row's own values (one shared grid, ranges set by the smallest mass)."""
    batch = [np.take_along_axis(q, ratio_argsort(p, q), axis=-1) for _, p, q in rows(40)]
    together = _wor_miss_clocks(np.stack(batch), 3)
    for i, q_sorted in enumerate(batch):
        np.testing.assert_allclose(together[i], sequential_miss(q_sorted, 3), rtol=0, atol=1e-12)


def test_clock_range_is_checked():
    """Beyond the float64 range of the symmetric sums (k large on a large vocabulary) a ValueError says so."""
    q = np.full(128_000, 1 / 128_000)
    with pytest.raises(ValueError, match="k = 20 children over V = 128000 tokens"):
        alpha_star(q, q, 20, "wor")


@pytest.mark.parametrize("k", [2, 3, 4, 5, 7])
def test_symmetric_below_compiled_is_the_nested_cumulative_sums(k):
    """α*(ρ)'s ``Σ_{n<k} e_n`` of every prefix (``alpha_star._symmetric_below``; numpy: one compiled pass per n)
    against the nested cumulative sums written with numpy's own ``cumsum``, bit for bit — odds from 1e-300 to
    1e300, a fifth of them 0, an infinite first odds in some rows, and odds of like magnitudes (where a sum
    reassociated, ``e_1 + (1 + e_2)``, changes bits); rows shorter than k, ``[R, V]`` and ``[B, nodes, V]``."""
    import importlib
    alpha_star = importlib.import_module("univer_theory.alpha_star")

    def nested(odds):
        V = odds.shape[-1]
        e_n = np.cumsum(odds, -1)
        total = e_n + 1.0
        for _ in range(2, k):
            e_n = np.cumsum(odds[..., V - e_n.shape[-1] + 1:] * e_n[..., :-1], -1)
            total[..., V - e_n.shape[-1]:] += e_n
        return total

    rng = np.random.default_rng(53 + k)
    with np.errstate(all="ignore"):
        for shape in ((1, 1), (2, 2), (3, k), (4, 50), (2, 3, 400)):
            spread = 10.0 ** rng.uniform(-300, 300, shape) * (rng.random(shape) < 0.8)
            spread[..., 0] = np.where(rng.random(shape[:-1]) < 0.3, np.inf, spread[..., 0])
            for odds in (spread, rng.uniform(0.0, 2.0, shape)):    # like magnitudes: every rounding shows
                got, want = alpha_star._symmetric_below(odds, k), nested(odds)
                assert got.shape == want.shape and got.tobytes() == want.tobytes()


def test_rate_times_is_the_product_rounded_once():
    """``rate_times`` = ``min((q·T₁)·T₂, RATE_TIME_CAP)`` on numpy (one compiled pass): against ``q·e^s`` in 50-digit
    arithmetic (mpmath) within 1.5 ulp below ``TIME_SPLIT`` (T₁ = e^s within 1 ulp, one product) and 3 above it
    (two factors, two products; the grid of a 1e-310 rate reaches s = 750), 0 at q = 0, finite and positive for
    subnormal rates, exactly the cap beyond it — rows ``[R, m, 1]``, ``[m, 1]``, one rate ``[1]``, into a given
    ``out``, the same floats each way — and rejects rates that are not ``[..., 1]``, nodes that are not ``[t]`` and
    an ``out`` it cannot write in place."""
    import mpmath
    from univer_theory.plans.clocks import RATE_TIME_CAP, TIME_SPLIT

    s = log_time_grid(LOG_T_NODES, log_time_upper(1e-310))[0]
    assert s.max() > TIME_SPLIT
    mpmath.mp.dps = 50
    rng = np.random.default_rng(64)
    worst = {False: 0.0, True: 0.0}
    capped = 0
    for name, _, q in rows(300):
        q = q.copy()
        q[:2] = 5e-324, 0.0
        got = rate_times(q[:, None], s)
        for r in (q[None, :, None], q[:1]):                 # all rows as [1, m, 1], the first as [1]
            out = np.full(r.shape[:-1] + s.shape, np.nan)
            assert rate_times(r, s, out=out) is out, name
            assert np.array_equal(out.reshape(-1, s.size), got[:r.size]), name
        assert (got[1] == 0).all() and (got[0] > 0).any() and np.isfinite(got).all(), name
        capped += int((got == RATE_TIME_CAP).sum())
        for i, n in zip(rng.integers(0, q.size, 300), rng.integers(0, s.size, 300)):
            exact = mpmath.mpf(float(q[i])) * mpmath.exp(mpmath.mpf(float(s[n])))
            if q[i] == 0 or exact >= RATE_TIME_CAP or exact < np.finfo(np.float64).tiny:
                continue
            want = float(exact)
            worst[bool(s[n] > TIME_SPLIT)] = worst_of(worst[bool(s[n] > TIME_SPLIT)],
                                                     abs(got[i, n] - want) / np.spacing(want))
    assert capped and worst[False] <= 1.5 and worst[True] <= 3.0, worst
    with pytest.raises(ValueError, match=r"rates \[\.\.\., 1\]"):
        rate_times(np.full((3, 2), 0.5), s)
    with pytest.raises(ValueError, match=r"nodes \[t\]"):
        rate_times(np.full((3, 1), 0.5), s[None, :])
    with pytest.raises(ValueError, match="out must be a C-contiguous"):
        rate_times(np.full((3, 1), 0.5), s, out=np.empty((s.size, 3)).T)
    for out in (np.empty((1, s.size)), np.empty((4, s.size)), np.empty((3, s.size), np.float32)):
        with pytest.raises(ValueError, match="out must be a C-contiguous float64"):   # written past its end before
            rate_times(np.full((3, 1), 0.5), s, out=out)


def test_clock_factors_are_the_c_librarys_within_three_ulp():
    """PTS's clock factors (``clocks._clock_factors``: ``e^{−qT}``, ``1 − e^{−qT}``, ``qT·e^{−qT}`` in one compiled
    pass, ``univer_theory.vexp``) against numpy's ``exp`` / ``expm1`` of the same ``qT`` (``rate_times``): within 2,
    2 and 3 ulp (both sides' errors; where e^{−qT} is subnormal, within two of its steps, times qT for the third),
    exactly 1, 0, 0 at q = 0; rows of every family, with subnormal rates, on a grid to s = 750."""
    from univer_theory.plans.clocks import _clock_factors, node_times

    s = log_time_grid(LOG_T_NODES, log_time_upper(1e-310))[0]
    tiny = np.finfo(np.float64).tiny
    for name, _, q in rows(150):
        q = q.copy()
        q[:2] = 5e-324, 0.0
        qt = rate_times(q[:, None], s)
        e, ring, qe = (x.copy() for x in _clock_factors(q[None], node_times(s)))
        want = np.exp(-qt), -np.expm1(-qt), qt * np.exp(-qt)
        for got, ref, bound, slack in zip((e[0], ring[0], qe[0]), want, (2.0, 2.0, 3.0), (1.0, 1.0, qt)):
            normal = (np.abs(ref) >= tiny) & (want[0] >= tiny)      # qT·e from a subnormal e: e's step times qT
            assert (np.abs(got - ref)[normal] / np.spacing(ref[normal])).max() <= bound, name
            assert (np.abs(got - ref) <= 2 * 5e-324 * slack)[~normal].all(), name
        assert (e[0, 1] == 1).all() and (ring[0, 1] == 0).all() and (qe[0, 1] == 0).all()


@pytest.mark.parametrize("n", [LOG_T_NODES, 800])
def test_the_legendre_rule_integrates_every_even_power_it_should(n):
    """``Σ_i w_i x_i^{2j} = 2/(2j + 1)`` for ``2j < 2n``: numpy's weights are off by up to ~5e-10 relative next to
    ±1 (this sum 2.2e-11 off at n = 400, 5.2e-12 at 800), which moved clock integrals whose mass sits at a
    panel's end by ~1e-12; the rule's weights, formed in long double, within round-off of the powers (where long
    double is float64 the rule is numpy's)."""
    x, w = _legendre_rule(n)
    err = worst_of(*(abs(float(w @ x ** (2 * j)) * (2 * j + 1) / 2 - 1) for j in range(n)))
    if np.finfo(np.longdouble).eps < np.finfo(np.float64).eps:
        assert err <= 1e-13
    else:
        assert np.array_equal(w, np.polynomial.legendre.leggauss(n)[1])


@pytest.mark.parametrize("k", [5, 6, 12, 16])
def test_the_clock_grid_resolves_the_kth_arrival(k):
    """PTS's availabilities at θ = 0 are ``Pr(y ∈ S)``, which sum to k: on 400 nodes the sum was 2.1e-13 (k = 5),
    1.4e-12 (6), 1.6e-9 (12) and 5e-8 (16) off relatively on these V = 300 rows — the k-th arrival's density
    narrows with k; :func:`clock_nodes` grows the grid with √k."""
    rng = np.random.default_rng(0)
    for a in (0.3, 1.0, 3.0):
        q = rng.dirichlet(np.full(300, a))
        avail, _ = sequential_thinning_avail(q, np.argsort(-q), np.zeros(300), k)
        assert abs(avail.sum() - k) / k <= 1e-14


def test_pts_stays_within_its_caps_on_a_confident_row():
    """A sure token (q ≈ 1) and seven tails at rate e^{−30} — a clock integral whose mass sits at the end of the
    first panel — k = 6, ρ = 1, p of the sure token just above its reported availability: with numpy's weights
    the availability was 1.2e-12 short, θ = 1 there, and the realised marginal passed ρp by 1.2e-12 (2.9e-27
    now; the enumeration's own sum is ~1e-13)."""
    from paper_checks.lossless import wide_node_model           # the full lossless grid's k = 6 node

    model, V, k = wide_node_model(), 8, 6
    p, q = model.target(()), model.draft(())
    plan = pts_plan(p, q, 1.0, k, "wor")
    a = np.zeros(V + 1)
    for S, prob in tuple_law(q, k, "wor"):
        np.add.at(a, list(S), prob * plan.select(S))
    assert np.max(a - p) <= 5e-13 and np.max(np.abs(a - plan.marginal)) <= 5e-13     # the sum over 20 160 tuples
