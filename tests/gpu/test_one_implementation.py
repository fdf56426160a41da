"""numpy and torch run the same node-rule functions (:mod:`univer_theory.nx`): on seeded rows with ties, zeros
and peaky tails, the numpy call (batched, and row by row as the exact core's batch of one) and the torch call
on the same rows agree — orders exactly, floats to 1e-12.  The functions' correctness against their oracles is
tests/theory/test_one_implementation.py (and the LP / enumeration tests)."""
import numpy as np
import pytest
import torch

from tests.theory.test_one_implementation import rows
from univer_theory.alpha_star import alpha_star_and_cut, alpha_star_rows
from univer_theory.orders import ratio_argsort, top_tokens
from gpu.univer_rule import _greedy_fill
from univer_theory.plans.choose import (fill_weights, greedy_fill_plan, greedy_fill_rows, single_child_rows,
                                          single_child_weights)
from univer_theory.plans.clocks import log_time_grid, rate_times
from univer_theory.verifiers import kseq_acceptance_mass, kseq_rho_star

TOL = 1e-12


def batch(seed):
    p, q = (np.stack(x) for x in zip(*rows(seed)))
    return p, q, torch.from_numpy(p), torch.from_numpy(q)


def close(a, b):
    np.testing.assert_allclose(b.numpy() if torch.is_tensor(b) else b, a, rtol=0, atol=TOL)


@pytest.mark.parametrize("seed", range(3))
def test_orders_agree(seed):
    p, q, tp, tq = batch(seed)
    for descending in (False, True):
        want = ratio_argsort(p, q, descending)
        assert np.array_equal(ratio_argsort(tp, tq, descending).numpy(), want)
        assert np.array_equal(np.stack([ratio_argsort(a, b, descending) for a, b in zip(p, q)]), want)
    for m in (1, 3):
        assert np.array_equal(top_tokens(tq, m).numpy(), top_tokens(q, m))


@pytest.mark.parametrize("seed", range(3))
def test_kseq_agrees(seed):
    p, q, tp, tq = batch(seed)
    k = np.arange(p.shape[0]) % 4 + 1
    rho = kseq_rho_star(p, q, k)
    close(rho, kseq_rho_star(tp, tq, torch.from_numpy(k), max_k=4))
    close(rho, [kseq_rho_star(a, b, int(n)) for a, b, n in zip(p, q, k)])
    mass = kseq_acceptance_mass(p, q, k, rho)
    close(mass, kseq_acceptance_mass(tp, tq, torch.from_numpy(k), torch.from_numpy(rho)))
    close(mass, [kseq_acceptance_mass(a, b, int(n), r) for a, b, n, r in zip(p, q, k, rho)])


def test_kseq_rho_star_agrees_where_one_ulp_of_a_sum_moves_it():
    """A row with p ≈ q on its drafted tokens and ~3.7e-15 of p off them (k = 4): ρ* is set by a mass ~20 ulps
    wide, so one ulp of the rows' sums moves it by ~4e-6 — numpy's pairwise sum took Σq = 1, torch's 1 + 2^-52, and
    the batched K-SEQ (torch rows) was 7.5e-6 off the exact core in E[τ | T].  The rows are normalised by their
    sequential sums (the same floats in numpy and torch on the CPU): ρ* bit for bit."""
    q = np.array([6.222082395670817e-08, 0.0, 0.0, 0.0, 2.503481340568748e-06, 0.6564403861416448,
                  0.33981050290572046, 2.0881149243166466e-05, 0.003725638321056683, 1.908765721097236e-08,
                  6.692513240692212e-09])
    p = np.array([6.222082395670793e-08, 2.6975547539749576e-17, 3.297191731429929e-15, 3.646994219136081e-16,
                  2.503481340568738e-06, 0.6564403861416422, 0.3398105029057191, 2.0881149243166384e-05,
                  0.0037256383210566685, 1.9087657210972288e-08, 6.692513240692186e-09])
    assert float(kseq_rho_star(torch.from_numpy(p), torch.from_numpy(q), 4)) == kseq_rho_star(p, q, 4)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("process", ["iid", "topk"])
def test_single_child_and_fills_agree(seed, process):
    p, q, tp, tq = batch(seed)
    rho = np.linspace(0.1, 1.0, p.shape[0])
    c, tc = rho[:, None] * p, torch.from_numpy(rho)[:, None] * tp
    q1, a = single_child_rows(c, q, process)
    tq1, ta = single_child_rows(tc, tq, process)
    close(q1, tq1)
    close(a, ta)
    y = ratio_argsort(c, q)[:, :2]
    close(single_child_weights(c, q1, y), single_child_weights(tc, tq1, torch.from_numpy(y)))
    top = top_tokens(q, 3)
    mask = np.arange(3)[None, :] < np.arange(p.shape[0])[:, None] % 3 + 1
    cy = np.take_along_axis(c, top, -1)
    close(fill_weights(cy, mask), fill_weights(torch.from_numpy(cy), torch.from_numpy(mask)))
    fixed = np.zeros(q.shape, dtype=bool)
    np.put_along_axis(fixed, top_tokens(q, 2), True, -1)
    for x, t in zip(greedy_fill_rows(c, q, fixed), greedy_fill_rows(tc, tq, torch.from_numpy(fixed))):
        close(x, t)


def test_rate_times_agree():
    _, q, _, tq = batch(0)
    s, _ = log_time_grid()
    got = rate_times(tq[..., None], torch.tensor(s))
    want = rate_times(q[..., None], s)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-15, atol=0)


def _zipf_rows(rng, R, V):
    """``p ∝ rank^{-1.1}`` over a random permutation, ``q = norm(p·e^{0.8 z})``, one row with a 1e-300 tail."""
    p = np.stack([np.arange(1, V + 1) ** -1.1 for _ in range(R)])
    p = np.stack([rng.permutation(x) for x in p])
    q = p * np.exp(0.8 * rng.standard_normal(p.shape))
    q[0, rng.permutation(V)[:V // 2]] = 1e-300
    return p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)


@pytest.mark.parametrize("process", ["iid", "wor", "greedy", "topk"])
@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_alpha_star_rows_agree(process, k):
    """α*(ρ) and its cut: torch on the whole batch against the exact core's numpy call row by row (a batch of
    one), on the seeded rows (V = 7: ties, zeros, 1e-300 tails) and on Zipf rows at V = 300 (a shared clock grid
    for the batch): values to 1e-13, cuts equal."""
    rng = np.random.default_rng(k)
    for p, q in [np.stack(x) for x in zip(*rows(k))], _zipf_rows(rng, 4, 300):
        keep = np.count_nonzero(q, axis=1) >= (1 if process == "iid" else k)
        p, q = p[keep], q[keep]
        rho = rng.choice([1.0, 0.6, 1e-3, 0.0], size=p.shape[0])
        value, cut = alpha_star_rows(torch.from_numpy(p), torch.from_numpy(q), k, process, torch.from_numpy(rho))
        for i in range(p.shape[0]):
            want, want_cut = alpha_star_and_cut(p[i], q[i], k, process, rho[i])
            assert abs(float(value[i]) - want) <= 1e-13, (i, float(value[i]), want)
            assert np.array_equal(cut[i].numpy(), want_cut), i


def test_alpha_star_rows_rejects_bad_arguments():
    p = torch.full((2, 4), 0.25, dtype=torch.float64)
    with pytest.raises(ValueError, match="alpha_star_rows: unknown process 'beam'"):
        alpha_star_rows(p, p, 2, "beam", 1.0)
    with pytest.raises(ValueError, match="alpha_star_rows: k must be an integer ≥ 1, got 0"):
        alpha_star_rows(p, p, 0, "wor", 1.0)
    with pytest.raises(ValueError, match="k = 20 children over V = 128000 tokens"):
        q = torch.full((1, 128_000), 1 / 128_000, dtype=torch.float64)
        alpha_star_rows(q, q, 20, "wor", 1.0)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("k", [2, 3])
def test_greedy_fill_is_the_exact_cores_table_on_every_tuple(seed, k):
    """The batched greedy rule (:func:`gpu.univer_rule._greedy_fill`, the realised tuple only) and the exact core's
    table (:func:`univer_theory.plans.choose.greedy_fill_plan`, every tuple) are one formula: on numpy rows the same
    w(S) and the same marginal, bit for bit (before, the core capped and re-summed its table, the batched layer
    scaled ``a``); on torch rows to 1e-12."""
    for p, q in rows(seed):
        if np.count_nonzero(q) <= k:
            continue
        rho = 0.7
        plan = greedy_fill_plan(p, q, rho, k)
        fixed = [int(t) for t in top_tokens(q, k - 1)]
        kids = np.array([fixed + [int(x)] for x in np.flatnonzero(q > 0) if x not in fixed])
        R = kids.shape[0]
        c, qs, mask = np.tile(rho * p, (R, 1)), np.tile(q, (R, 1)), np.ones((R, k), dtype=bool)
        w, a = _greedy_fill(c, qs, kids, mask)
        for S, got in zip(kids.tolist(), w):
            assert np.array_equal(plan.select(tuple(S)), got), (S, plan.select(tuple(S)), got)
        assert all(np.array_equal(plan.marginal, x) for x in a)
        tw, ta = _greedy_fill(*(torch.from_numpy(x) for x in (c, qs, kids, mask)))
        close(w, tw)
        close(a, ta)


def test_greedy_fill_marginal_is_below_rho_p_exactly():
    """The repair of :func:`~univer_theory.plans.choose.greedy_fill_weights` (weights and marginal of a token with
    a > ρp scaled by ρp/a): without it 1 155 of 3 000 seeded nodes had a > ρp by round-off (1.4e-17), which the
    equality test of the two layers cannot see.  Both layers: a ≤ ρp in floats, on every node."""
    rng = np.random.default_rng(7)
    for _ in range(600):
        V, k = int(rng.integers(3, 7)), int(rng.integers(2, 4))
        p, q, rho = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V)), float(rng.uniform(0.05, 1.0))
        plan = greedy_fill_plan(p, q, rho, k)
        assert (plan.marginal <= rho * p).all()
        kids = np.array([[int(t) for t in top_tokens(q, k - 1)] + [int(top_tokens(q, k)[-1])]])
        _, a = _greedy_fill(torch.from_numpy(rho * p)[None], torch.from_numpy(q)[None], torch.from_numpy(kids),
                            torch.ones(1, k, dtype=torch.bool))
        assert (a[0].numpy() <= rho * p).all()
