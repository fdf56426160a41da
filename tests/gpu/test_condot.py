"""Rule 1 batched (gpu/condot.py) against the exact core's :func:`univer_theory.plans.lp_plan.lp_plan`: the
same plan — w(S) on every ordering of the realised tuple and the marginal a, to 1e-13 — which needs the LP's
tie-break (HiGHS and the batched simplex would otherwise stop at different optimal vertices), and UniVer on
small-vocabulary wor trees with no node planned through the exact core."""
import itertools

import numpy as np
import pytest
import torch

import gpu.univer_rule as univer_rule
from gpu import expected_accepted_length
from gpu.condot import condot_weights, lehmer_rank
from solvers.condot import condot_lp
from univer_theory import VERIFIERS, DirichletModel, TreeShape, sample_tree
from univer_theory.plans.lp_plan import lp_plan

from .helpers import padded_rows


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_lehmer_rank_is_the_lexicographic_position(k):
    for s in range(k, 9):
        perms = torch.tensor(list(itertools.permutations(range(s), k)))
        assert lehmer_rank(perms, torch.tensor(s)).tolist() == list(range(len(perms)))


@pytest.mark.parametrize("k", [2, 3, 4])
def test_batched_rule_one_is_the_exact_cores_plan(k):
    """Rows with supports k…8 inside V = 10 (one with a token holding 99.9% of q), every ρ regime; the realised
    tuple and all its orderings (the slot rule's call)."""
    rng = np.random.default_rng(30 + k)
    rows, plans = [], []
    for i, s in enumerate(range(k, 9) if k < 4 else (4, 5, 6, 7)):
        p, q = rng.dirichlet(np.full(10, 0.5)), np.zeros(10)
        q[rng.choice(10, s, replace=False)] = rng.dirichlet(np.full(s, 0.7))
        if i == 1:
            q[q > 0] = np.where(q[q > 0] == q.max(), 0.999, 0.001 / (s - 1))
        rho = (1.0, 0.6, 0.25)[i % 3]
        S = tuple(int(y) for y in rng.choice(10, k, replace=False, p=q))
        plan = lp_plan(p, q, rho, k, "wor")
        assert plan.alpha == pytest.approx(condot_lp(p, q, rho, k, "wor").value, abs=1e-9)       # α*(ρ)
        rows.append((rho * p, q, [tuple(S[j] for j in perm) for perm in itertools.permutations(range(k))]))
        plans.append(plan)
    w, a, solved = condot_weights(torch.tensor(np.array([r[0] for r in rows])),
                                  torch.tensor(np.array([r[1] for r in rows])),
                                  torch.tensor([r[2] for r in rows]))
    assert solved.all()
    for (_, _, tuples), plan, w_row, a_row in zip(rows, plans, w.numpy(), a.numpy()):
        np.testing.assert_allclose(w_row, [plan.select(S) for S in tuples], rtol=0, atol=1e-13)
        np.testing.assert_allclose(a_row, plan.marginal, rtol=0, atol=1e-13)


@pytest.mark.parametrize("V,shapes", [(5, ["2,2", "3,1", "4"]), (8, ["3,2", "4,1"])])
def test_small_vocabulary_wor_trees_are_planned_in_torch(V, shapes, monkeypatch):
    """Draft supports ≤ 8: rule 1 wins some node (trace) and no node goes through the exact core's per-node
    planner (disabled); E[τ | T] as the exact core (1e-12)."""
    def no_loop(*_):
        raise AssertionError("a node was planned through the exact core")
    monkeypatch.setattr(univer_rule, "_plan_nodes", no_loop)
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
