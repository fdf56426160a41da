"""Rule 8, the node seen through its first draw (univer_theory/plans/first_draw.py): its marginal is the one its
``select`` realises; its α obeys the derived bound ``α ≥ α*(ρ) − 2(1 − π)/π`` whenever its inner plan is α*-optimal;
and on confident rows with a near-flat tail — where PTS and the iid coupling miss α*(ρ) by 2–5% and the tail is
beyond rule 7's budget — the automatic choice takes it and reaches α*(ρ) to OPTIMALITY_TOL.

α*(ρ) is the brute-force min-cut over all 2^V subsets (tests/theory/test_wor_plans.py) on V ≤ 10, the closed form
(checked against it there) above.
"""
import numpy as np
import pytest

from univer_theory import VERIFIERS, ConfidentModel, TreeShape, evaluate
from univer_theory.alpha_star import alpha_star
from univer_theory.plans.choose import build_plan, choose_plan, first_draw_plan
from univer_theory.plans.first_draw import first_draw_rows
from univer_theory.plans.wor_pair import OPTIMALITY_TOL
from univer_theory.tolerance import worst_of

from .test_wor_plans import brute_alpha_star, check_exact

TAILS = (1e-4, 1e-8, 1e-12, 1e-16, 1e-300)


def near_flat(V, seed, tail, target="dirichlet"):
    """A confident row whose draft tail and target are near flat (Dirichlet(100)) — the rows of issue #15 that
    the earlier choice missed by up to 3.9% (PTS, V = 200)."""
    model = ConfidentModel(V, seed=seed, tail=tail, target=target, concentration=100.0)
    return model.target(()), model.draft(())


def random_row(V, rng):
    """Dirichlet rows with a top draft token of any weight (π from ~1/V to ~1), some undrafted tokens."""
    q = rng.dirichlet(np.full(V, float(rng.choice([0.1, 1.0, 10.0]))))
    q[0] += float(rng.choice([0.0, 1.0, 10.0, 1e4]))
    if rng.random() < 0.3:
        q[rng.choice(np.arange(1, V), size=int(rng.integers(1, V - 3)), replace=False)] = 0
    p = rng.dirichlet(np.full(V, float(rng.choice([0.3, 1.0, 100.0]))))
    return p, q / q.sum()


@pytest.mark.parametrize("V, k", [(6, 2), (7, 3), (9, 3), (8, 4)])
def test_marginal_is_exact_and_the_bound_holds(V, k):
    """Seeded rows (π anywhere in (0, 1], ρ ∈ {1, U(0, 1)}): enumerated marginal = ``plan.marginal`` to 1e-12,
    ``a ≤ ρp``; where the inner plan is α*-optimal (k = 2: the single-child rule; k ≥ 3: when the inner node's
    α reaches its α*), ``α ≥ α*(ρ) − 2(1 − π)/π`` (module docstring of first_draw.py).  Reports the bound's
    tightest slack."""
    rng = np.random.default_rng([2026, V, k])
    slack, checked = np.inf, 0
    for _ in range(6):
        p, q = random_row(V, rng)
        rho = 1.0 if rng.random() < 0.5 else float(rng.uniform(0.05, 1))
        plan = first_draw_plan(p, q, rho, k)
        check_exact(plan, p, q, rho, k)
        inner = plan.info["inner"]
        _, pi, q_in, rho_in, p_in = first_draw_rows(rho * p, q)
        if float(inner.alpha) >= float(alpha_star(p_in, q_in, k - 1, "wor", float(rho_in))) - 1e-12:
            s = float(plan.alpha) - (brute_alpha_star(p, q, k, rho) - 2 * (1 - pi) / pi)
            slack, checked = -worst_of(-slack, -s), checked + 1      # the least slack, a NaN wherever it comes
    assert checked > 0
    assert slack >= -1e-12, slack


@pytest.mark.parametrize("tail", TAILS)
@pytest.mark.parametrize("V, k", [(17, 3), (17, 4), (40, 3), (40, 5)])
def test_choice_reaches_alpha_star_on_near_flat_confident_rows(V, k, tail):
    """Two seeds, two target families, ρ ∈ {1, 0.6}: the automatic choice is within ``2d/(1 − d) + OPTIMALITY_TOL``
    of α*(ρ) (d = the tail's mass; within OPTIMALITY_TOL for d ≤ 1e-12, the audit's confident rows), it takes
    rule 8 on at least one row, and the worst gap is reported."""
    worst, used = (0.0, None), set()
    for seed in range(2):
        for target in ("dirichlet", "zero_top"):
            p, q = near_flat(V, seed, tail, target)
            for rho in (1.0, 0.6):
                plan = choose_plan(p, q, rho, k, "wor")
                used.add(plan.construction)
                gap = float(alpha_star(p, q, k, "wor", rho)) - float(plan.alpha)
                worst = worst_of(worst, (gap, (seed, target, rho, plan.construction)))
    d = 1 - near_flat(V, 0, tail)[1].max()
    assert worst[0] <= 2 * d / (1 - d) + OPTIMALITY_TOL, worst
    if tail <= 1e-12:
        assert worst[0] <= OPTIMALITY_TOL, worst
    assert "first_draw" in used, used


def test_first_draw_is_lossless_through_the_oracle():
    """Depth-1 UniVer on a near-flat confident row (V = 17, k = 3, d = 1e-14: 17 classes, beyond rule 7's budget;
    PTS's α is 2% short of α* there): the exact oracle's distance ≤ 1e-12 and E[τ] = α*(1) to OPTIMALITY_TOL,
    with rule 8 at the root."""
    p, q = near_flat(17, 0, 1e-14)
    assert float(build_plan("pts", p, q, 1.0, 3, "wor").alpha) < float(alpha_star(p, q, 3, "wor")) - 1e-3
    assert choose_plan(p, q, 1.0, 3, "wor").construction == "first_draw"
    model = ConfidentModel(17)                    # only for its interface: rows replaced below
    model.target, model.draft = (lambda s: p), (lambda s: q)
    result = evaluate(model, TreeShape.parse("3"), "wor", VERIFIERS["univer"])
    assert float(result.distance) <= 1e-12
    assert float(result.expected_accepted) == pytest.approx(float(alpha_star(p, q, 3, "wor")), abs=OPTIMALITY_TOL)


def test_bad_input():
    p, q = near_flat(6, 0, 1e-12)
    with pytest.raises(ValueError, match="k ≥ 2"):
        first_draw_plan(p, q, 1.0, 1)
    with pytest.raises(ValueError, match="rho"):
        first_draw_plan(p, q, 1.5, 2)


@pytest.mark.parametrize("V, k", [(17, 3), (40, 3), (40, 4)])
def test_a_confident_row_costs_no_more_than_its_tail_node(V, k):
    """On confident rows of every concentration (d ∈ {1e-12, 1e-16}), the choice's gap to α*(ρ) is at most
    ``π·g' + 2d/(1 − d) + OPTIMALITY_TOL``, g' the gap of the choice on the (k − 1)-child tail node (module
    docstring of first_draw.py: min(·) is 1-Lipschitz).  So where a confident row still misses α*(ρ), the miss is
    an ordinary node's (rule 3 infeasible, PTS), not the confident top token's; the worst such gap is reported."""
    worst = (0.0, None)
    for seed, conc in enumerate((0.3, 1.0, 100.0)):
        for tail in (1e-12, 1e-16):
            model = ConfidentModel(V, seed=seed, tail=tail, target="dirichlet", concentration=conc)
            p, q = model.target(()), model.draft(())
            for rho in (1.0, 0.6):
                gap = float(alpha_star(p, q, k, "wor", rho)) - float(choose_plan(p, q, rho, k, "wor").alpha)
                _, pi, q_in, rho_in, p_in = first_draw_rows(rho * p, q)
                inner = choose_plan(p_in, q_in, float(rho_in), k - 1, "wor")
                g_in = float(alpha_star(p_in, q_in, k - 1, "wor", float(rho_in))) - float(inner.alpha)
                d = 1 - float(pi)
                assert gap <= pi * g_in + 2 * d / (1 - d) + OPTIMALITY_TOL, (seed, conc, tail, rho, gap, g_in)
                worst = worst_of(worst, (gap, (seed, conc, tail, rho, inner.construction)))
    print("worst gap", worst)


def test_rule_8_on_a_confident_tree_whose_inner_weights_sum_past_one():
    """A confident wor tree (V = 20, tail 1e-14) whose root takes rule 8: the inner plan's weights summed to 1 plus
    an ulp, so the top token's weight (1 − Σw')·τ was −2.2e-16 and the slot rule's LP refused its start ("b must
    be ≥ 0"), in both layers; it is clamped at 0 now, and the batched E[τ | T] is the exact core's."""
    import torch

    from gpu import TreeBatch, expected_accepted_length
    from univer_theory import sample_tree
    model = ConfidentModel(20, seed=232041, tail=1e-14, concentration=100.0, top_target=1e-6)
    tree = sample_tree(model, TreeShape.parse("((..),.,(.),.)"), "wor", np.random.default_rng(0))
    P, Q = model.node_probs(tree)
    want = VERIFIERS["univer"].expected_accepted_length(tree, P, Q, "wor")
    got = expected_accepted_length(TreeBatch.from_trees([tree]), torch.tensor(P)[None], torch.tensor(Q)[None], "wor",
                                   "univer")
    assert abs(float(got[0]) - want) <= 1e-12
