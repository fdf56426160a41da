"""SpecHub and Global Resolution: exact losslessness, acceptance against their LPs / α*, and their limits."""
from fractions import Fraction

import numpy as np
import pytest
from scipy.optimize import linprog
from scipy.sparse import vstack

from solvers.condot import condot_constraints, condot_lp
from univer_theory import (LOSSLESS_TOL, VERIFIERS, DirichletModel, DraftTree, TreeShape, alpha_star,
                           distance_to_target, evaluate, mass_balance_violation, output_law, sample_children,
                           tuple_law)
from univer_theory.multidraft import FlatPlanRule, gr_plan, spechub_plan
from univer_theory.plans.base import NodePlan
from univer_theory.processes import HUB, hub_token
from univer_theory.validation import Unsupported
from univer_theory.verifiers import Verifier

from ..stats import LEVEL, assert_accepts, assert_power, assert_rejects, g_test

HUB_SHAPES = ["2", "2,2", "((..),(..))", "2,2,2"]


def _rows(V, seed, conc=0.8):
    m = DirichletModel(V, seed=seed, similarity=0.5, concentration=conc)
    return m.target(()), m.draft(())


def _hub_lp_value(p, q):
    """The flat OT LP (theory.md §4.1) on SpecHub's pair law, built here from the constraint blocks."""
    law = tuple_law(q, 2, "hub")
    tuples, probs = [S for S, _ in law], np.array([float(x) for _, x in law])
    by_tuple, by_token = condot_constraints(tuples, p.size)
    res = linprog(-np.ones(2 * len(tuples)), A_ub=vstack([by_tuple, by_token]).tocsr(),
                  b_ub=np.concatenate([probs, p]), method="highs")
    assert res.status == 0
    return -res.fun


def test_hub_tuple_law_pairs_contain_the_hub():
    q = np.array([Fraction(1, 5), Fraction(1, 2), Fraction(3, 10)])
    law = dict(tuple_law(q, 2, "hub"))
    assert sum(law.values()) == 1 and hub_token(q) == 1
    assert law == {(0, 1): Fraction(1, 5), (2, 1): Fraction(3, 10),
                   (1, 0): Fraction(1, 2) * Fraction(1, 5) / Fraction(1, 2),
                   (1, 2): Fraction(1, 2) * Fraction(3, 10) / Fraction(1, 2)}
    with pytest.raises(ValueError, match="exactly 2 children"):
        tuple_law(q, 3, "hub")


def test_hub_sampler_matches_tuple_law():
    """G-test of 6000 draws of ``sample_children(·, 2, 'hub')`` against ``tuple_law`` (level ``tests.stats.LEVEL``;
    power ≥ POWER against the iid and wor pair laws)."""
    q = np.array([0.15, 0.4, 0.25, 0.2])
    law = dict(tuple_law(q, 2, "hub"))
    assert_power(law, {proc: dict(tuple_law(q, 2, proc)) for proc in ("iid", "wor")}, 6000)
    rng = np.random.default_rng(5)
    samples = [sample_children(q, 2, "hub", rng) for _ in range(6000)]
    assert_accepts(g_test(samples, law), f"hub tuples (level {LEVEL:.2g})")


@pytest.mark.parametrize("V,shape", [(V, s) for V in (3, 4, 5) for s in HUB_SHAPES if s != "2,2,2" or V == 3])
def test_spechub_is_lossless(V, shape):
    for seed in range(3):
        r = evaluate(DirichletModel(V, seed=seed, similarity=0.4, concentration=0.8), TreeShape.parse(shape), "hub",
                     VERIFIERS["spechub"])
        assert r.distance <= LOSSLESS_TOL, (V, shape, seed, r.distance)


@pytest.mark.parametrize("shape", ["2", "2,2"])
def test_spechub_is_exactly_lossless_in_fraction_mode(shape):
    model = DirichletModel(4, seed=2, similarity=0.4, exact=True)
    law = output_law(model, TreeShape.parse(shape), "hub", VERIFIERS["spechub"])
    assert sum(law.values()) == 1
    assert distance_to_target(model, law, TreeShape.parse(shape).max_depth + 1) == 0
    assert mass_balance_violation(model, law) == 0


@pytest.mark.parametrize("V,seed,conc", [(V, s, c) for V in (3, 4, 6, 9) for s in range(4) for c in (0.2, 1.0)])
def test_spechub_acceptance_equals_its_lp(V, seed, conc):
    """α of SpecHub's plan == the flat OT LP on its pair law
    == ``min(1, p(a) + Σ_{i≠a} min(p(i), q(i)/(1 − q(a))))`` (every pair contains the hub a); depth 1: E[τ] = α."""
    p, q = _rows(V, seed, conc)
    plan = spechub_plan(p, q, 2)
    a = hub_token(q)
    closed = min(1.0, p[a] + sum(min(p[i], q[i] / (1 - q[a])) for i in range(V) if i != a))
    assert abs(plan.alpha - _hub_lp_value(p, q)) < 1e-9
    assert abs(plan.alpha - closed) < 1e-12
    assert np.all(plan.marginal <= p + 1e-15)
    model = DirichletModel(V, seed=seed, similarity=0.5, concentration=conc)
    depth1 = evaluate(model, TreeShape.parse("2"), "hub", VERIFIERS["spechub"]).expected_accepted
    assert abs(depth1 - plan.alpha) < 1e-12


def test_spechub_plan_is_exact_for_fractions():
    p = np.array([Fraction(1, 2), Fraction(1, 3), Fraction(1, 6)])
    q = np.array([Fraction(1, 6), Fraction(1, 2), Fraction(1, 3)])
    plan = spechub_plan(p, q, 2)
    # hub a = 1, Q({0, 1}) = 1/6 + (1/2)(1/6)/(1/2) = 1/3, Q({2, 1}) = 2/3: α = min(1, 1/3 + 1/3 + 1/6) = 5/6
    assert plan.alpha == Fraction(5, 6)
    for S, pr in tuple_law(q, 2, "hub"):
        assert sum(plan.select(S)) <= 1


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("V,seed", [(3, 0), (4, 1), (5, 2), (8, 3)])
def test_gr_attains_alpha_star(k, V, seed):
    """GR's node acceptance is α* of the i.i.d. flat OT (closed form and LP), and at depth 1 E[τ] = α*."""
    p, q = _rows(V, seed)
    star = alpha_star(p, q, k, "iid")
    assert abs(gr_plan(p, q, k).alpha - star) < 1e-12
    assert abs(condot_lp(p, q, 1.0, k, "iid").value - star) < 1e-9
    model = DirichletModel(V, seed=seed, similarity=0.5, concentration=0.8)
    shape = TreeShape.uniform([k])
    assert abs(evaluate(model, shape, "iid", VERIFIERS["gr"]).expected_accepted - star) < 1e-12
    assert star >= evaluate(model, shape, "iid", VERIFIERS["rrs"]).expected_accepted - 1e-12


@pytest.mark.parametrize("shape", ["2,2", "3,1", "((..),.)", "(((..),.),.)"])
def test_gr_is_lossless_on_trees(shape):
    for seed in range(3):
        model = DirichletModel(4, seed=seed, similarity=0.4, concentration=0.8)
        assert evaluate(model, TreeShape.parse(shape), "iid", VERIFIERS["gr"]).distance <= LOSSLESS_TOL


def test_gr_per_node_optimum_is_not_tree_optimal():
    """α* at every node does not order trees: on ((..),.) GR's layout plan puts no extra mass on the deep first
    position, and RRS (which tries it first) accepts more tokens (found on this seed; GR ≥ RRS holds at depth 1,
    :func:`test_gr_attains_alpha_star`)."""
    model = DirichletModel(4, seed=2, similarity=0.4, concentration=0.8)
    shape = TreeShape.parse("((..),.)")
    gr = evaluate(model, shape, "iid", VERIFIERS["gr"]).expected_accepted
    rrs = evaluate(model, shape, "iid", VERIFIERS["rrs"]).expected_accepted
    assert gr < rrs - 0.05


def test_unsupported_combinations_raise_not_implemented():
    model = DirichletModel(4, seed=0)
    with pytest.raises(Unsupported, match="spechub"):
        evaluate(model, TreeShape.parse("3"), "hub", VERIFIERS["spechub"])
    with pytest.raises(Unsupported, match="spechub"):
        evaluate(model, TreeShape.parse("2,2"), "iid", VERIFIERS["spechub"])
    with pytest.raises(Unsupported, match="gr"):
        evaluate(model, TreeShape.parse("2,2"), "wor", VERIFIERS["gr"])
    with pytest.raises(Unsupported, match="gr has no exact rational form"):
        evaluate(DirichletModel(3, seed=0, exact=True), TreeShape.parse("2"), "iid", VERIFIERS["gr"])
    with pytest.raises(Unsupported, match="float64"):
        gr_plan(np.array([Fraction(1, 2)] * 2, dtype=object), np.array([Fraction(1, 2)] * 2, dtype=object), 2)
    assert not VERIFIERS["spechub"].supports(TreeShape.parse("2,1"), "hub")


def test_hub_tree_without_the_hub_is_a_value_error():
    model = DirichletModel(3, seed=0)
    a = hub_token(model.draft(()))
    others = [x for x in range(3) if x != a]
    tree = DraftTree(parent=(-1, 0, 0), token=(-1, *others), vocab_size=3)
    p, q = model.node_probs(tree)
    with pytest.raises(ValueError, match="hub"):
        VERIFIERS["spechub"].law(tree, p, q, "hub")


def _swapped_spechub_plan(target_probs, draft_probs, k):
    """A lossy SpecHub: each pair's weights handed to the other position (the marginal it reports, and so the
    residual, are the true plan's)."""
    plan = spechub_plan(target_probs, draft_probs, k)
    return NodePlan("spechub-swapped", plan.rho, plan.target, plan.marginal, lambda S: plan.select(S)[::-1])


SWAPPED_SPECHUB = Verifier("spechub-swapped", FlatPlanRule("spechub-swapped", _swapped_spechub_plan, (HUB,)),
                           (HUB,), "SpecHub with each pair's weights swapped", widths=(2,), lossless=False)


def _hub_tree():
    """A hub tree of two levels on which the G-test tells SpecHub from NSS and from the swapped variant."""
    model = DirichletModel(3, seed=21, similarity=0.3)
    a = hub_token(model.draft(()))
    b = next(x for x in range(3) if x != a)
    top = hub_token(model.draft((b,)))
    c = next(x for x in range(3) if x != top)
    tree = DraftTree(parent=(-1, 0, 0, 1, 1), token=(-1, b, a, top, c), vocab_size=3)
    return (tree, *model.node_probs(tree))


def _spechub_samples(verifier, tree, p, q, seed):
    rng = np.random.default_rng(seed)
    return [tuple(tree.token[u] for u in nodes) + (y,)
            for nodes, y in (verifier.sample(tree, p, q, "hub", rng) for _ in range(6000))]


def test_spechub_sampler_matches_its_law():
    """G-test (level ``tests.stats.LEVEL``) of 6000 SpecHub verifications of one hub tree against its exact law;
    power ≥ POWER against NSS's law on the same tree (another verifier: the test tells them apart; RRS's and RRSw's
    laws coincide with SpecHub's on this tree) and against a lossy SpecHub (the swapped variant)."""
    tree, p, q = _hub_tree()
    law = VERIFIERS["spechub"].law(tree, p, q, "hub")
    assert_power(law, {"nss": VERIFIERS["nss"].law(tree, p, q, "iid"),
                       "spechub-swapped": SWAPPED_SPECHUB.law(tree, p, q, "hub")}, 6000)
    assert_accepts(g_test(_spechub_samples(VERIFIERS["spechub"], tree, p, q, 7), law), "spechub sampler")


def test_g_test_rejects_a_lossy_spechub_sampler():
    """The swapped variant is lossy (its output law is off the target's, exactly) and its samples are rejected
    against SpecHub's law."""
    result = evaluate(DirichletModel(3, seed=21, similarity=0.3), TreeShape.parse("2,2"), "hub", SWAPPED_SPECHUB)
    assert result.distance > 1e-3
    tree, p, q = _hub_tree()
    law = VERIFIERS["spechub"].law(tree, p, q, "hub")
    assert_rejects(g_test(_spechub_samples(SWAPPED_SPECHUB, tree, p, q, 8), law), "spechub-swapped")


def test_gr_single_child_is_the_unique_plan_at_any_draft_mass():
    """A chain whose drafted tokens have q = 1e-17 (a float32 row's tail at a low temperature, cast to float64):
    GR planned k = 1 with the i.i.d. layout, whose interval arithmetic gives such a token μ = 0 (below an ulp of
    its position), so it rejected tokens with p/q = 5·10¹⁶ and reported E[τ | T] = 0.  The k = 1 plan is unique,
    w = min(1, p/q) = 1: E[τ | T] = 2, as RRS and the batched GR."""
    tree = DraftTree((-1, 0, 1), (-1, 0, 1))
    for tail in (1e-15, 1e-17, 1e-30):
        p, q = np.array([0.5, 0.3, 0.2, 0.0]), np.array([tail, tail, 1 - 2 * tail, 0.0])
        P, Q = np.stack([p] * 3), np.stack([q] * 3)
        for name in ("gr", "rrs"):
            assert float(VERIFIERS[name].expected_accepted_length(tree, P, Q, "iid")) == 2.0, (name, tail)


def test_flat_plan_cache_is_bounded_as_univers(monkeypatch):
    """GR's (and SpecHub's) rule kept 4 096 plans whatever V (~170 bytes a token each: ~11 GB at V = 16 384); it keeps
    as many as UniVer's, :func:`univer_theory.univer.plan_cache_size` (checked under a cap of 20, on 30 new rows)."""
    from univer_theory import univer
    monkeypatch.setattr(univer, "PLAN_CACHE_ENTRIES", 20)
    assert univer.plan_cache_size(49152) == 16
    rule = FlatPlanRule("gr", gr_plan, ("iid",))
    rng = np.random.default_rng(0)
    for _ in range(30):
        rule.plan(rng.dirichlet(np.ones(4)), rng.dirichlet(np.ones(4)), 2, "iid")
    assert len(rule._plans) == 20
    monkeypatch.setattr(univer, "PLAN_CACHE_ENTRIES", 4096)
    monkeypatch.setattr(univer, "PLAN_CACHE_TOKENS", 20 * 4)     # V = 4: 20 plans through the rows' size
    rule = FlatPlanRule("gr", gr_plan, ("iid",))
    for _ in range(30):
        rule.plan(rng.dirichlet(np.ones(4)), rng.dirichlet(np.ones(4)), 2, "iid")
    assert len(rule._plans) == 20
