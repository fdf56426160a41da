"""Rule 7 (the Luce plan) in the batched layer: the one implementation of ``univer_theory.plans.luce`` gives the
same fit on torch as on numpy, and ``gpu.wor_plans.wor_weights`` takes it where the exact core's choice does — its
plan on every ordered tuple realises the marginal it returns, equal to ``choose_plan``'s, at α*(ρ)."""
import itertools

import numpy as np
import pytest
import torch

from gpu.luce import luce_rows, luce_rows_weights, row_classes
from gpu.wor_plans import wor_weights
from univer_theory import ConfidentModel
from univer_theory.alpha_star import alpha_star
from univer_theory.plans.choose import choose_plan
from univer_theory.plans.luce import luce_fit, luce_plan, token_classes
from univer_theory.plans.wor_pair import OPTIMALITY_TOL
from univer_theory.processes import tuple_law

from ..theory.test_luce import flat_tail_row, tied_rows


def test_torch_and_numpy_run_the_same_fit():
    """Rows of several support sizes padded to one (q = 0 there), as ``gpu.luce`` pads them: φ, τ and a agree
    with numpy's row-by-row fit on the unpadded support to 1e-12."""
    rng = np.random.default_rng(5)
    rows = []
    for m in (9, 11, 12, 12):
        p, q = flat_tail_row(m, 30.0, 0.5, rng)
        rows.append((0.8 * p, q))
    c = np.zeros((len(rows), 12))
    q = np.zeros((len(rows), 12))
    for i, (ci, qi) in enumerate(rows):
        c[i, :ci.size], q[i, :qi.size] = ci, qi
    phi_t, tau_t, a_t = luce_fit(torch.tensor(c), torch.tensor(q), 3)
    for i, (ci, qi) in enumerate(rows):
        phi, tau, a = luce_fit(ci[None], qi[None], 3)
        m = ci.size
        np.testing.assert_allclose(a_t[i, :m].numpy(), a[0], rtol=0, atol=1e-12)
        np.testing.assert_allclose(tau_t[i, :m].numpy(), tau[0], rtol=0, atol=1e-12)
        assert float(a_t[i, m:].abs().sum()) == 0.0
        free = phi[0] > -100                      # weights far below the reject option only scale e^{-hundreds}
        np.testing.assert_allclose(phi_t[i, :m].numpy()[free], phi[0][free], rtol=0, atol=1e-9)


def batched_choice_on_every_tuple(cases, V, k):
    """``wor_weights`` on rows ``cases = [(p, q, ρ)]`` over every ordered k-tuple: its plan realises the marginal it
    returns (enumeration, 1e-12), equal to ``choose_plan``'s (1e-10), at α ≥ α*(ρ) − OPTIMALITY_TOL.  Returns
    the constructions the core chose."""
    p = torch.tensor(np.stack([x[0] for x in cases]))
    q = torch.tensor(np.stack([x[1] for x in cases]))
    rho = torch.tensor([x[2] for x in cases], dtype=torch.float64)
    tuples = torch.tensor(list(itertools.permutations(range(V), k)))[None].expand(len(cases), -1, -1)
    w, a = wor_weights(rho[:, None] * p, q, rho, p, tuples)
    used = set()
    for i, (pi, qi, r) in enumerate(cases):
        law = dict(tuple_law(qi, k, "wor"))
        probs = np.array([float(law.get(tuple(S), 0.0)) for S in tuples[0].tolist()])
        realised = np.zeros(V)
        np.add.at(realised, tuples[0].numpy().ravel(), (probs[:, None] * w[i].numpy()).ravel())
        np.testing.assert_allclose(realised, a[i].numpy(), rtol=0, atol=1e-12, err_msg=str(i))
        plan = choose_plan(pi, qi, r, k, "wor")
        used.add(plan.construction)
        np.testing.assert_allclose(a[i].numpy(), plan.marginal, rtol=0, atol=1e-10, err_msg=plan.construction)
        assert float(a[i].sum()) >= float(alpha_star(pi, qi, k, "wor", r)) - OPTIMALITY_TOL, (i, plan.construction)
    return used


@pytest.mark.parametrize("k", [2, 3])
def test_the_batched_choice_takes_rule_7_as_the_core(k):
    """Flat-tail rows (V = 12, beyond the LP's support), ρ ∈ {1, 0.6}: realised marginal = returned marginal
    (1e-12), = choose_plan's (1e-10), α ≥ α*(ρ) − OPTIMALITY_TOL, and rule 7 is used on some rows."""
    rng = np.random.default_rng([11, k])
    cases = [(*flat_tail_row(12, a, d, rng), rho) for a in (100.0, 10.0) for d in (1e-10, 0.5) for rho in (1.0, 0.6)]
    assert "luce" in batched_choice_on_every_tuple(cases, 12, k)


def test_row_classes_are_the_cores_token_classes():
    """``gpu.luce.row_classes`` groups each row as ``token_classes`` does (same classes, same order, same sizes)."""
    rows = tied_rows(6, 11)
    V = max(p.size for p, *_ in rows)
    c = torch.zeros(len(rows), V, dtype=torch.float64)
    q = torch.zeros_like(c)
    for i, (p, qi, rho, _) in enumerate(rows):
        c[i, :p.size], q[i, :p.size] = torch.tensor(rho * p), torch.tensor(qi)
    q_cls, c_cls, size, slot = row_classes(c, q)
    for i in range(len(rows)):
        first, sizes, members = token_classes(q[i].numpy(), c[i].numpy())
        m = sizes.size
        assert size[i, :m].long().tolist() == sizes.tolist() and not size[i, m:].any()
        assert q_cls[i, :m].tolist() == q[i, first].tolist() and c_cls[i, :m].tolist() == c[i, first].tolist()
        assert slot[i][q[i] > 0].tolist() == members.tolist() and (slot[i][q[i] == 0] == -1).all()


def test_the_batched_choice_on_tied_rows():
    """Rows of 17–22 tokens in few classes of exchangeable tokens (beyond the token budget), k = 3 on every
    ordered tuple: realised marginal = returned marginal (1e-12), = ``choose_plan``'s (1e-10), α ≥ α*(ρ) −
    OPTIMALITY_TOL, and rule 7 used on some rows."""
    k, V = 3, 17
    cases = [row for row in tied_rows(40, 12) if row[0].size == V][:2]
    cases.append((*(lambda m: (m.target(()), m.draft(())))(ConfidentModel(V, tail=1e-16, target="ties")), 1.0))
    cases = [(p, q, rho) for p, q, rho, *_ in cases]
    assert "luce" in batched_choice_on_every_tuple(cases, V, k)


def test_rule_7_is_fitted_on_the_rows_the_core_fits(monkeypatch):
    """``wor_weights`` fits rule 7 only on the rows below α*(ρ) − OPTIMALITY_TOL, as ``choose_plan`` does: on flat
    tails (PTS / the coupling fall short) and p = q rows (they reach α*), the rows handed to the batched fit are
    exactly those on which the exact core builds its Luce plan, and the marginals are the core's."""
    import gpu.wor_plans
    import univer_theory.plans.choose

    fitted, built = [], []
    batched, single = gpu.wor_plans.luce_rows_weights, univer_theory.plans.choose.luce_plan
    monkeypatch.setattr(gpu.wor_plans, "luce_rows_weights",
                        lambda c, q, ch: fitted.append(c.shape[0]) or batched(c, q, ch))
    monkeypatch.setattr(univer_theory.plans.choose, "luce_plan", lambda *a: built.append(1) or single(*a))
    rng = np.random.default_rng(12)
    cases = [(*flat_tail_row(12, 100.0, d, rng), rho) for d in (1e-10, 0.5) for rho in (1.0, 0.6)]
    cases += [(q, q, 1.0) for q in rng.dirichlet(np.full(12, 2.0), size=3)]
    p = torch.tensor(np.stack([x[0] for x in cases]))
    q = torch.tensor(np.stack([x[1] for x in cases]))
    rho = torch.tensor([x[2] for x in cases], dtype=torch.float64)
    children = torch.tensor([[0, 1, 2]] * len(cases))
    _, a = wor_weights(rho[:, None] * p, q, rho, p, children)
    for i, (pi, qi, r) in enumerate(cases):
        np.testing.assert_allclose(a[i].numpy(), choose_plan(pi, qi, r, 3, "wor").marginal, rtol=0, atol=1e-10)
    assert 0 < sum(fitted) == len(built) < len(cases), (fitted, built)


def test_the_gate_counts_a_full_support_and_the_undrafted_zero():
    """16 distinct positive q (``LUCE_SUPPORT``) padded with zeros to V = 20: the budget gate counts the zero as a
    value too (17 distinct), admits the row, as the exact core's ``luce_plan`` does."""
    rng = np.random.default_rng(1)
    q = np.zeros(20)
    q[:16] = rng.dirichlet(np.ones(16))
    p = rng.dirichlet(np.ones(20))
    assert luce_plan(p, q, 1.0, 2, "wor") is not None
    assert luce_rows(torch.tensor(p)[None], torch.tensor(q)[None], 2).tolist() == [True]


def test_rows_with_one_draft_and_two_targets_are_fitted_apart():
    """Two rows with the same q and c = ρp for ρ = 1 and 0.4: identical rows are fitted once, and these are not
    identical — each row's marginal is its own fit's (de-duplicating by q alone gave row 2 row 1's plan, 0.51
    where ρp is 0.20: lossy), and a ≤ ρp."""
    rng = np.random.default_rng(0)
    q, p = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
    c, Q = torch.tensor(np.stack([p, 0.4 * p])), torch.tensor(np.stack([q, q]))
    children = torch.tensor([[0, 1], [0, 1]])
    w, a = luce_rows_weights(c, Q, children)
    for r in range(2):
        w_r, a_r = luce_rows_weights(c[r:r + 1], Q[r:r + 1], children[r:r + 1])
        assert torch.equal(w[r], w_r[0]) and torch.equal(a[r], a_r[0])
    assert (a <= c + 1e-15).all()
