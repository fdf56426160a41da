"""The vectorised clock integral of ``Pr_wor(S ⊄ G_j)`` (``alpha_star._wor_miss_clocks``: elementary symmetric
sums of every prefix as nested cumulative sums) against the plain token-by-token Poisson-binomial recursion on
the same quadrature grid, on random and confident rows (tails down to 1e-310), k = 2..6, to 1e-12."""
import numpy as np
import pytest

from univer_theory import ConfidentModel
from univer_theory.alpha_star import _suffix_mass, _wor_miss_clocks, alpha_star, ratio_argsort
from univer_theory.models import CONFIDENT_TARGETS
from univer_theory.plans.clocks import LOG_T_NODES, LOG_T_RANGE, log_time_grid, log_time_upper, rate_times


def sequential_miss(q_sorted: np.ndarray, k: int) -> np.ndarray:
    """Reference: ``Pr[N_{G_j}(t) = m]``, m < k, updated one token at a time (probabilities only), then
    ``∫ r e^{−rt} Pr[N_{G_j}(t) < k] dt`` on the grid of ``plans.clocks`` (one row ``[V]`` → ``[V + 1]``)."""
    V = q_sorted.size
    r = _suffix_mass(q_sorted)
    s, w = log_time_grid(LOG_T_NODES, log_time_upper(r[r > 0].min(initial=1.0)))
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
