"""Derived known values and reductions between verifiers (theory.md §3, §5)."""
from fractions import Fraction as F
from itertools import product

import numpy as np
import pytest

from univer_theory import VERIFIERS, DirichletModel, DraftTree, TreeShape, context_free, evaluate, tuple_law
from univer_theory.verifiers import kseq_acceptance_mass, kseq_rho_star, normalise, positive_part, tv_prefix_update


def exact(*xs):
    return np.array([F(x) for x in xs], dtype=object)


def test_block_verification_toy_example():
    """p = (1/3, 2/3), q = (2/3, 1/3), γ = 2, context-free.

    Token level: E[τ] = Σ_i Pr(first i accepted) with per-step acceptance β = Σ min(p, q) = 2/3:
    β + β² = 10/9.  BV: E[τ] = E[w_1] + E[w_2] with w_1 = min(1, p(x)/q(x)) and w_2 = min(1, w_1·p(x')/q(x'))."""
    p, q = exact("1/3", "2/3"), exact("2/3", "1/3")
    beta = sum(min(a, b) for a, b in zip(p, q))
    token_level = beta + beta ** 2
    w1 = [min(1, p[x] / q[x]) for x in range(2)]
    bv = sum(q[x] * w1[x] for x in range(2)) + sum(q[x] * q[y] * min(1, w1[x] * p[y] / q[y])
                                                   for x in range(2) for y in range(2))
    assert (token_level, bv) == (F(10, 9), F(11, 9))
    model, shape = context_free(p, q), TreeShape.parse("1,1")
    assert evaluate(model, shape, "iid", VERIFIERS["sps"]).expected_accepted == token_level
    assert evaluate(model, shape, "iid", VERIFIERS["bv"]).expected_accepted == bv
    assert evaluate(model, shape, "iid", VERIFIERS["tv"]).expected_accepted == bv


@pytest.mark.parametrize("seed", range(3))
def test_tv_equals_bv_on_chains_joint_law(seed):
    """Per chain (every x^γ), TV's and BV's (path, Y) laws coincide exactly."""
    model = DirichletModel(3, seed=seed, exact=True)
    for tokens in product(range(3), repeat=3):
        tree = DraftTree.chain(tokens, vocab_size=3)
        p, q = model.node_probs(tree)
        assert VERIFIERS["tv"].law(tree, p, q, "iid") == VERIFIERS["bv"].law(tree, p, q, "iid")


def test_bv_through_probability_is_w():
    """``Pr(τ ≥ i | x^i) = w_i`` in expectation over the draft continuation: E[τ] = Σ_i E[w_i]."""
    model, shape = DirichletModel(3, seed=5, exact=True), TreeShape.parse("1,1,1")
    expected_w = 0
    for tokens in product(range(3), repeat=3):
        tree = DraftTree.chain(tokens, vocab_size=3)
        p, q = model.node_probs(tree)
        pr, w = 1, 1
        for i, x in enumerate(tokens):
            pr *= q[i, x]
        for i, x in enumerate(tokens):
            w = min(1, w * p[i, x] / q[i, x])
            expected_w += pr * w
    assert evaluate(model, shape, "iid", VERIFIERS["bv"]).expected_accepted == expected_w


@pytest.mark.parametrize("process,baseline", [("iid", "rrs"), ("wor", "rrsw")])
def test_tv_at_depth_one_is_rrs(process, baseline):
    """On depth-1 trees TV's per-tree law equals RRS (iid) / RRSw (wor), for every tuple."""
    model = DirichletModel(4, seed=2, exact=True)
    shape = TreeShape.parse("3")
    for S, _ in tuple_law(model.draft(()), 3, process):
        tree = DraftTree.from_shape(shape, S, 4)
        p, q = model.node_probs(tree)
        assert VERIFIERS["tv"].law(tree, p, q, process) == VERIFIERS[baseline].law(tree, p, q, process)


def test_rrs_node_acceptance_is_one_minus_product_of_tv():
    """RRS at a node with k i.i.d. children: Pr(accept) = 1 − Π_j TV(P_j, Q), P_{j+1} = norm([P_j − Q]_+)."""
    model = DirichletModel(4, seed=7, exact=True)
    k = 3
    p, q = model.target(()), model.draft(())
    P, prod = p, 1
    for _ in range(k):
        prod *= sum(abs(a - b) for a, b in zip(P, q)) / 2
        P = normalise(positive_part(P - q))
    r = evaluate(model, TreeShape.parse(str(k)), "iid", VERIFIERS["rrs"])
    assert r.expected_accepted == 1 - prod


@pytest.mark.parametrize("k", [2, 3])
def test_kseq_acceptance_formula(k):
    """K-SEQ acceptance ``Σ_x min(p, ρ*q) = 1 − (1 − β(ρ*))^k`` and the exact depth-1 E[τ] equals it."""
    model = DirichletModel(5, seed=11, similarity=0.2)
    p, q = model.target(()), model.draft(())
    rho = kseq_rho_star(p, q, k)
    beta = np.minimum(q, p / rho).sum()
    assert 1 <= rho <= k
    assert abs(np.minimum(p, rho * q).sum() - (1 - (1 - beta) ** k)) < 1e-12
    assert abs(kseq_acceptance_mass(p, q, k, rho).sum() - np.minimum(p, rho * q).sum()) < 1e-12
    r = evaluate(model, TreeShape.parse(str(k)), "iid", VERIFIERS["kseq"])
    assert abs(r.expected_accepted - np.minimum(p, rho * q).sum()) < 1e-12


def test_temperature_zero_gains_nothing():
    """With one-hot targets every lossless verifier accepts exactly the argmax path: BV == token level."""
    from univer_theory import TemperedModel
    model = TemperedModel(DirichletModel(3, seed=4), 0.0, draft_temperature=1.0)
    shape = TreeShape.parse("1,1,1")
    sps = evaluate(model, shape, "iid", VERIFIERS["sps"]).expected_accepted
    bv = evaluate(model, shape, "iid", VERIFIERS["bv"]).expected_accepted
    assert abs(sps - bv) < 1e-15


def test_tempered_model_drafts_at_one_by_default_at_temperature_zero():
    """``TemperedModel``'s default draft temperature is :func:`resolve_draft_temperature`'s, the CLI's and the LLM
    pipeline's: the target's T, except 1 at T = 0 (before, a one-hot draft there, which drafts one child only)."""
    from univer_theory import TemperedModel
    base = DirichletModel(3, seed=4)
    for T, draft_T in ((0.0, 1.0), (0.5, 0.5), (2.0, 2.0)):
        model = TemperedModel(base, T)
        assert model.draft_temperature == draft_T
    cold = TemperedModel(base, 0.0)
    assert np.array_equal(cold.draft(()), base.draft(())) and sorted(cold.target(())) == [0.0, 0.0, 1.0]
    half = TemperedModel(base, 1.0, draft_temperature=np.float32(0.5))       # a numpy number is a real number
    assert half.draft_temperature == 0.5 and np.array_equal(half.draft(()), TemperedModel(base, 1.0, 0.5).draft(()))
    with pytest.raises(ValueError, match="TemperedModel: draft_temperature must be one real number, got str '0.5'"):
        TemperedModel(base, 1.0, draft_temperature="0.5")


def test_small_temperatures_sharpen_towards_the_argmax():
    """``norm(row^{1/T})`` at T = 1e-3 on (0.45, 0.4, 0.15): every ``row^{1000}`` underflows to 0 (0.45^1000 ≈
    1e-347; the row was 0/0, NaN); over its maximum it is ``(1, (8/9)^1000, (1/3)^1000) / Σ`` = ``(1, 7.2e-52, 0)``
    — derived, the last entry below float64's range."""
    from univer_theory.models import apply_temperature
    got = apply_temperature(np.array([0.45, 0.4, 0.15]), 1e-3)
    assert got[0] == 1.0 and got[2] == 0.0
    assert got[1] == pytest.approx((0.4 / 0.45) ** 1000, rel=1e-12)
    assert apply_temperature(np.array([0.2, 0.3, 0.5]), 0.5) == pytest.approx(np.array([4, 9, 25]) / 38, rel=1e-15)


def test_ordering_rrs_le_tv_on_grid():
    """RRS ≤ TV (iid) and RRSw ≤ TV (wor) on every seed — TV is RRS(w) plus the pass-down of ρ; the gaps are
    0.007–0.032 here, the worst one named on failure."""
    for process, base in (("iid", "rrs"), ("wor", "rrsw")):
        gaps = []
        for seed in range(4):
            model, shape = DirichletModel(4, seed=seed), TreeShape.parse("2,2")
            gaps.append(evaluate(model, shape, process, VERIFIERS["tv"]).expected_accepted
                        - evaluate(model, shape, process, VERIFIERS[base]).expected_accepted)
        assert all(g > 0 for g in gaps), (process, gaps)          # a NaN gap fails (min(gaps) dropped it)


def test_tv_prefix_update_where_the_residual_is_tiny():
    """``r ← R/(R + (1 − r))`` (§3.7): at r = 1 it is 1 whatever R > 0, also R = 3e-17, where ``R + 1 − r``
    evaluated left to right rounds R away (0/0 for R = 1e-20)."""
    for R in (3e-17, 1e-20, 0.25):
        assert tv_prefix_update(R, 1.0) == 1.0 and tv_prefix_update(np.float64(R), np.float64(1.0)) == 1.0
    assert tv_prefix_update(F(1, 4), F(1, 2)) == F(1, 3)
