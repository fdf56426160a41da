"""Rule 1 by the lexicographic simplex (solvers/condot_simplex.py: a level's nodes at once, gpu/condot.py, and the
exact core's :func:`univer_theory.plans.lp_plan.lp_plan`, one node) against HiGHS' tie-broken vertex
(:func:`solvers.condot.condot_plan`, repaired as rule 1): the same plan — w(S) on every ordering of the realised
tuple and the marginal a, to 1e-13 — which needs the LP's tie-break (the two solvers would otherwise stop at
different optimal vertices), and UniVer on small-vocabulary wor trees; the same with the shape rule's position
weights, iid and wor."""
import itertools

import numpy as np
import pytest
import torch

from gpu import expected_accepted_length
from gpu.condot import condot_weights
from solvers.condot_simplex import condot_table, lehmer_rank, tuple_rank
from solvers.condot import condot_lp, condot_plan
from univer_theory import VERIFIERS, DirichletModel, TreeShape, sample_tree
from univer_theory.plans.lp_plan import lp_plan, plan_weights, tabulated_plan
from univer_theory.processes import tuple_law

from .helpers import padded_rows


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_tuple_rank_is_the_exact_cores_order(k):
    """Lehmer rank (wor) and base-s digits (iid) enumerate the tuples in ``tuple_law``'s order."""
    for s in range(k, 9):
        for process, tuples in (("wor", itertools.permutations(range(s), k)),
                                ("iid", itertools.product(range(s), repeat=k))):
            tuples = torch.tensor(list(tuples))
            assert tuple_rank(tuples, torch.tensor(s), process).tolist() == list(range(len(tuples)))
    assert lehmer_rank(torch.tensor([[2, 0]]), torch.tensor(3)).tolist() == [4]     # (2, 0) is 5th of 3·2


def highs_plan(p, q, rho, k, process, omega=None):
    """The oracle: HiGHS' tie-broken vertex (recomputed from its optimal basis), as rule 1's weights, repaired."""
    law = tuple_law(q, k, process)
    res = condot_plan(p, q, rho, k, process, support=law, position_weights=omega)
    assert res.success, res.message
    probs = np.array([float(pr) for _, pr in law])
    return tabulated_plan("highs", plan_weights(np.asarray(res.plan), probs), res.tuples, probs, p, rho)


def supports(k, process):
    """Draft support sizes k…8 (wor) within the shape rule's 512 tuples (iid: s^k ≤ 512)."""
    if process == "wor":
        return range(k, 9) if k < 4 else (4, 5, 6, 7)
    return [s for s in range(k, 9) if s ** k <= 512]


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("process", ["wor", "iid"])
@pytest.mark.parametrize("k", [2, 3, 4])
def test_batched_plan_is_the_exact_cores_plan(k, process, weighted):
    """Rule 1 (``weighted`` False) and the shape rule (integer position weights ω, ties among them included) on
    rows with supports up to 8 inside V = 10 (one with a token holding 99.9% of q), every ρ regime: the realised
    tuple and all its orderings (the slot rule's call) as HiGHS' vertex and as ``lp_plan`` (1e-13); the plan attains
    α*(ρ)."""
    rng = np.random.default_rng(30 + k + 10 * weighted + 100 * (process == "iid"))
    rows, plans, oracles, omegas = [], [], [], []
    for i, s in enumerate(supports(k, process)):
        p, q = rng.dirichlet(np.full(10, 0.5)), np.zeros(10)
        q[rng.choice(10, s, replace=False)] = rng.dirichlet(np.full(s, 0.7))
        if i == 1:
            q[q > 0] = np.where(q[q > 0] == q.max(), 0.999, 0.001 / (s - 1))
        rho = (1.0, 0.6, 0.25)[i % 3]
        S = tuple(int(y) for y in rng.choice(10, k, replace=process == "iid", p=q))
        omega = tuple(int(x) for x in rng.integers(1, 8, size=k)) if i % 2 else (1,) + (6,) * (k - 1)
        plan = lp_plan(p, q, rho, k, process, omega if weighted else None)
        assert plan.construction == ("shape_lp" if weighted else "lp")
        assert plan.alpha == pytest.approx(condot_lp(p, q, rho, k, process).value, abs=1e-9)     # α*(ρ)
        rows.append((rho * p, q, [tuple(S[j] for j in perm) for perm in itertools.permutations(range(k))]))
        plans.append(plan)
        oracles.append(highs_plan(p, q, rho, k, process, omega if weighted else None))
        omegas.append(omega)
    w, a, solved = condot_weights(torch.tensor(np.array([r[0] for r in rows])),
                                  torch.tensor(np.array([r[1] for r in rows])),
                                  torch.tensor([r[2] for r in rows]), process,
                                  torch.tensor(omegas, dtype=torch.float64) if weighted else None)
    assert solved.all()
    for (_, _, tuples), plan, oracle, w_row, a_row in zip(rows, plans, oracles, w.numpy(), a.numpy()):
        for want in (oracle, plan):
            np.testing.assert_allclose(w_row, [want.select(S) for S in tuples], rtol=0, atol=1e-13)
            np.testing.assert_allclose(a_row, want.marginal, rtol=0, atol=1e-13)


def test_position_weights_move_mass_to_the_heavy_position():
    """The ω level acts: with ω = (1, 9) the plan puts at least as much mass at position 2 as rule 1's, strictly
    more on this node, and still attains α*(ρ); non-integer or mis-sized ω is a ValueError."""
    p, q = np.array([0.3, 0.3, 0.2, 0.2]), np.array([0.4, 0.3, 0.2, 0.1])
    law = tuple_law(q, 2, "wor")
    mass = lambda plan: sum(float(pr) * plan.select(S)[1] for S, pr in law)          # noqa: E731
    plain, heavy = lp_plan(p, q, 1.0, 2, "wor"), lp_plan(p, q, 1.0, 2, "wor", (1, 9))
    assert mass(heavy) > mass(plain) + 1e-3 and heavy.alpha == pytest.approx(plain.alpha, abs=1e-12)
    for bad in ((1.5, 2), (1, 2, 3)):
        with pytest.raises(ValueError, match="position_weights"):
            lp_plan(p, q, 1.0, 2, "wor", bad)


@pytest.mark.parametrize("V,shapes", [(5, ["2,2", "3,1", "4"]), (8, ["3,2", "4,1"])])
def test_small_vocabulary_wor_trees_match_the_exact_core(V, shapes):
    """Draft supports ≤ 8: rule 1 wins some node (trace); E[τ | T] as the exact core (1e-12)."""
    model = DirichletModel(V, seed=5, similarity=0.5, concentration=0.7)
    rng = np.random.default_rng(2)
    trees = [sample_tree(model, TreeShape.parse(s), "wor", rng) for s in shapes for _ in range(4)]
    exact = VERIFIERS["univer"]
    trace = [n for t in trees for n in exact.trace(t, *model.node_probs(t), "wor")]
    assert any(n["construction"] == "lp" for n in trace)
    ref = np.array([exact.expected_accepted_length(t, *model.node_probs(t), "wor") for t in trees])
    batch, p, q = padded_rows(trees, model)
    got = expected_accepted_length(batch, p, q, "wor", "univer")
    np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=1e-12)


def test_an_unfinished_simplex_falls_back_to_the_plan_without_its_lp(monkeypatch):
    """Where ``condot_weights`` reports a row not solved (pivot cap), the batched shape rule and wor rule 1 keep the
    plan they would give without that LP — never the unsolved answer, never an empty plan; the exact core's
    ``lp_plan`` returns None (its callers fall back on None only)."""
    import gpu.univer_rule as univer_rule
    import gpu.wor_plans as wor_plans
    import solvers.condot_simplex as condot_simplex
    from univer_theory.plans import shape_lp

    def unsolved(*args, **kwargs):                   # junk weights, flagged as not solved
        w, a, solved = condot_weights(*args, **kwargs)
        return w * 0 + 0.5, a * 0 + 1.0, solved & False

    def never_better(*args, **kwargs):               # solved, α = 0: rule 1 is never taken
        w, a, solved = condot_weights(*args, **kwargs)
        return w, a * 0, solved | True

    model = DirichletModel(4, seed=3, similarity=0.5, concentration=0.6)
    rng = np.random.default_rng(7)
    for process, shapes in (("iid", ["((..),.)", "(((..),.),.)"]), ("wor", ["((..),.)", "2,2", "3,1"])):
        trees = [sample_tree(model, TreeShape.parse(s), process, rng) for s in shapes for _ in range(3)]
        batch, p, q = padded_rows(trees, model)
        with monkeypatch.context() as m:
            m.setattr(univer_rule, "condot_weights", unsolved)
            m.setattr(wor_plans, "condot_weights", unsolved)
            forced = expected_accepted_length(batch, p, q, process, "univer")
        with monkeypatch.context() as m:
            m.setattr(shape_lp, "within_limits", lambda *a, **k: False)
            m.setattr(wor_plans, "condot_weights", never_better)
            without = expected_accepted_length(batch, p, q, process, "univer")
        assert (forced - without).abs().max() <= 1e-12, process
        assert (forced - expected_accepted_length(batch, p, q, process, "univer")).abs().max() > 1e-3, process

    real = condot_simplex.condot_table

    def unfinished(*args, **kwargs):
        sup, tup, w, a, solved = real(*args, **kwargs)
        return sup, tup, w * 0 + 0.5, a * 0, solved & False

    monkeypatch.setattr(condot_simplex, "condot_table", unfinished)
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    assert lp_plan(p, q, 1.0, 2, "iid") is None and lp_plan(p, q, 1.0, 2, "wor") is None
    assert lp_plan(p, q, 1.0, 2, "wor", (3, 1)) is None


def test_condot_table_refuses_a_process_or_k_it_does_not_solve():
    """Its tuples are the support's ordered k-tuples (iid or wor); a greedy or topk node, or a k that is not an integer
    ≥ 1, is a ValueError rather than another process's plan."""
    c, q = np.array([[0.1, 0.2, 0.3]]), np.array([[0.5, 0.3, 0.2]])
    with pytest.raises(ValueError, match="unknown process 'greedy'"):
        condot_table(c, q, 2, "greedy")
    for k in (0, 2.0, True):
        with pytest.raises(ValueError, match="k must be an integer ≥ 1"):
            condot_table(c, q, k, "iid")
