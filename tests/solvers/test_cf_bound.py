"""The conditional-framework optimum CF (theory.md §6.4) and the value-aware oracle ``univer-va``."""
import importlib

import numpy as np
import pytest

from solvers.cf_bound import cf_bound, concave_majorant, sandwich
from solvers.global_lp import global_tree_lp
from solvers.value_aware import value_aware_verifier
from univer_theory import (VERIFIERS, ConfidentModel, DirichletModel, DraftTree, LOSSLESS_TOL, Model, TableModel,
                           TreeShape, context_free, evaluate)
from univer_theory.alpha_star import alpha_star
from univer_theory.plans.tv_plan import tv_plan
from univer_theory.tolerance import worst_of
from univer_theory.validation import Unsupported


def model(V, seed, similarity=0.3):
    return DirichletModel(V, seed=seed, similarity=similarity, concentration=0.8)


def test_sandwich_recovers_the_breakpoints_of_a_concave_pl_function():
    # f(ρ) = min(ρ, 0.3 + 0.2ρ, 0.45): kinks where ρ = 0.3 + 0.2ρ (ρ = 0.375) and 0.3 + 0.2ρ = 0.45 (ρ = 0.75)
    pieces = np.array([[1.0, 0.0], [0.2, 0.3], [0.0, 0.45]])

    def evaluate_f(rho):
        vals = pieces[:, 0] * rho + pieces[:, 1]
        i = int(np.argmin(vals))
        return float(vals[i]), float(pieces[i, 0])

    f = sandwich(evaluate_f)
    for kink in (0.375, 0.75):
        assert np.min(np.abs(f.rho - kink)) <= 1e-12
    assert f.rho.size <= 6 and f.gap <= 1e-11
    grid = np.linspace(0, 1, 101)
    np.testing.assert_allclose(f(grid), np.min(pieces[:, :1] * grid + pieces[:, 1:], axis=0), atol=1e-12)


def test_concave_majorant_drops_points_under_their_neighbours_chord():
    """A point a hair below concavity (value error over breakpoints ~1e-11 apart) is dropped; the slopes of what is
    kept strictly decrease, every input point lies on or under the result, and a concave input is kept as it is."""
    rho = np.array([0.0, 0.2, 0.2 + 1e-11, 0.5, 1.0])
    value = np.array([0.0, 0.4, 0.4 + 2e-11 + 1e-16, 0.7, 0.9])       # the short chord's slope tilts up
    xs, ys = concave_majorant(rho, value)
    assert xs.tolist() == [0.0, 0.2 + 1e-11, 0.5, 1.0]
    slopes = np.diff(ys) / np.diff(xs)
    assert np.all(np.diff(slopes) < 0)
    assert np.all(value <= np.interp(rho, xs, ys) + 1e-15)
    grid, concave = np.array([0.0, 0.2, 0.3, 0.5, 1.0]), np.array([0.0, 0.4, 0.5, 0.6, 0.7])
    assert concave_majorant(grid, concave)[0].tolist() == grid.tolist()


def test_cf_stays_above_univer_where_breakpoints_crowd():
    """A fresh-seed instance (greedy, context-free sparse rows, ``(((.)),((.),(.)),.)``) where the breakpoint search
    left two of a child's breakpoints ~5e-10 apart near ρ ≈ 3.6e-8 and their chord's slope rose by 4.6e-3: the node
    LP reads Ḡ as the minimum of its chord lines, which that chord cut far from it, and CF came out 3.2e-4 *below*
    UniVer (an algorithm of its framework).  Built on the least concave majorant of its points, CF ≥ UniVer."""
    p = np.array([0.0011381698651695708, 0.7694212545904864, 0.2294405755443441])
    q = np.array([0.6399473692241079, 6.418889844646599e-09, 0.36005262435700225])
    m, shape = TableModel(3, {(): p}, {(): q}), TreeShape.parse("(((.)),((.),(.)),.)")
    univer = evaluate(m, shape, "greedy", VERIFIERS["univer"]).expected_accepted
    res = cf_bound(m, shape, "greedy")
    assert res.success, res.message
    assert univer <= res.value + res.tolerance + 1e-12, (univer, res.value, res.tolerance)


@pytest.mark.parametrize("target", ["dirichlet", "zero_top"])
def test_cf_stays_above_univer_on_confident_rows(target):
    """``ConfidentModel(4, tail=1e-8)`` (the paper checks' confident family), ``3,1`` iid: the useful tuples have
    probabilities ~1e-8, where HiGHS' answer to a node LP (absolute tolerances 1e-10, presolve) came out up to
    2.5e-8 low, so CF fell below UniVer, RRS, K-SEQ and TV (by a third of E[τ] = 3e-8 on the zero-top rows).  The
    node value is now also bounded through the LP's duals (weak duality over the columns' implied bounds), an upper
    bound whatever HiGHS did: CF ≥ every method, and within the global LP's slack of it."""
    m, shape = ConfidentModel(4, seed=0, tail=1e-8, target=target), TreeShape.parse("3,1")
    res, glob = cf_bound(m, shape, "iid"), global_tree_lp(m, shape, "iid")
    assert res.success, res.message
    for name in ("univer", "rrs", "kseq", "tv"):
        value = evaluate(m, shape, "iid", VERIFIERS[name]).expected_accepted
        assert value <= res.value + res.tolerance + 1e-12, (name, value, res.value)
    assert res.value <= glob.value + 1e-8


@pytest.mark.parametrize("shape", ["1,1", "1,1,1"])
@pytest.mark.parametrize("process", ["iid", "wor"])
def test_chain_cf_equals_block_verification(shape, process):
    m = model(4, 3)
    res = cf_bound(m, shape, process)
    bv = evaluate(m, TreeShape.parse(shape), process, VERIFIERS["bv"]).expected_accepted
    assert res.success, res.message
    assert res.value == pytest.approx(float(bv), abs=1e-9)


def test_cf_margin_stays_small_where_highs_overfills_an_improbable_tuple():
    """A peaky V = 5 chain (concentration 0.1, wor): HiGHS' point overfills a row of a tuple of Q_k ~ 1e-12 by
    round-off, and shrinking every π by that row's factor gave a margin of 0.68 — `univer bound` then printed SPS's
    and RRSw's 7.7% gap to CF as 0.00%; each π is shrunk by the rows it enters now.  CF = BV on a chain."""
    m = DirichletModel(5, seed=254, similarity=0.5, concentration=0.1)
    res = cf_bound(m, "1,1,1,1", "wor")
    bv = evaluate(m, TreeShape.parse("1,1,1,1"), "wor", VERIFIERS["bv"]).expected_accepted
    assert res.success and res.margin <= 1e-6, (res.margin, res.message)
    assert -res.tolerance - 1e-12 <= res.value - float(bv) <= res.margin + 1e-12


@pytest.mark.parametrize("process,k", [("iid", 2), ("iid", 3), ("wor", 2), ("wor", 3)])
def test_depth_one_cf_equals_alpha_star(process, k):
    m = model(5, 4, similarity=0.1)
    assert cf_bound(m, str(k), process).value == pytest.approx(
        float(alpha_star(m.target(()), m.draft(()), k, process)), abs=1e-9)


@pytest.mark.parametrize("shape,process", [("2,2", "iid"), ("2,2", "wor"), ("3,1", "iid"), ("((..),.)", "iid"),
                                           ("((..),.)", "wor")])
def test_tv_le_cf_le_global_and_value_aware_attains_cf(shape, process):
    m, sh = model(3 if process == "iid" else 4, 2), TreeShape.parse(shape)
    cf = cf_bound(m, sh, process)
    glob = global_tree_lp(m, sh, process)
    tv = float(evaluate(m, sh, process, VERIFIERS["tv"]).expected_accepted)
    assert cf.success and glob.success
    assert tv <= cf.value + 1e-9 and cf.value <= glob.value + 1e-9
    va = evaluate(m, sh, process, value_aware_verifier(m, sh, process, cf))
    assert float(va.distance) <= LOSSLESS_TOL
    # the realisation of the CF-optimal node plans attains CF (up to LP tolerance), never more
    assert float(va.expected_accepted) <= cf.value + 1e-9
    assert float(va.expected_accepted) >= cf.value - 1e-8


def test_cf_of_a_star_is_alpha_star_within_its_tolerance_and_margin():
    """Depth 1: CF = α*(1) exactly (module docstring).  ``value`` is HiGHS' objective or its certificate, whichever is
    larger, so it may sit above α* — by 1.1e-9 on a V = 6 five-child star, above the E[τ] ≤ 1 of any verifier —
    but never by more than ``margin``, nor below by more than ``tolerance``; the worst instance is reported."""
    worst = (0.0, None)
    for V, k, process, seed in [(6, 5, "iid", 1), (6, 5, "wor", 1), (6, 4, "iid", 1), (3, 2, "wor", 1),
                                *((V, k, pr, s) for V in (3, 5) for k in (2, 3) for pr in ("iid", "wor")
                                  for s in range(3) if pr == "iid" or k < V)]:
        m = DirichletModel(V, seed=seed, similarity=0.4)
        cf = cf_bound(m, str(k), process)
        exact = float(alpha_star(np.asarray(m.target(()), float), np.asarray(m.draft(()), float), k, process, 1.0))
        over = cf.value - exact
        assert -cf.tolerance - 1e-13 <= over <= cf.margin + 1e-13, (V, k, process, seed, over, cf.margin)
        assert cf.margin < 1e-8 and f"{cf.margin:.1e} above" in cf.message     # HiGHS-sized, not the value itself
        worst = worst_of(worst, (over, (V, k, process, seed)))
    assert worst[0] > 1e-10, worst              # the grid holds a star whose certificate overshoots


@pytest.mark.parametrize("V,seed,target,shape,process", [(3, 1049, "dirichlet", "3,1", "iid"),
                                                          (6, 1051, "dirichlet", "2,1", "iid"),
                                                          (6, 1075, "zero_top", "((..),.)", "iid")])
def test_cf_less_its_margin_is_below_the_global_bound_on_confident_rows(V, seed, target, shape, process):
    """Below the root: HiGHS' node points break a row by up to 1.1e-9 on confident rows (probabilities ~1e-8), its
    objective then above the node's optimum, so CF came out up to 1.1e-9 above the certified global bound (the
    exact CF is below it) with a margin of 5e-12.  The margin now measures each node value against a feasible
    point and carries the children's margins up: CF − margin stays below the global bound, by a fresh-seed grid's
    worst instances, whose CF sits above the bound by more than the root's own excess."""
    m = ConfidentModel(V, seed=seed, tail=1e-8, target=target, concentration=1.0)
    cf, glob = cf_bound(m, shape, process), global_tree_lp(m, shape, process)
    assert cf.value > glob.value + 1e-11                  # the instance: CF's value above the bound
    assert cf.value - cf.margin <= glob.value + 1e-12, (cf.value, cf.margin, glob.value)
    assert cf.margin < 1e-8


def test_cf_margin_carries_every_level_up(monkeypatch):
    """A node's margin is its own slack (its value over a feasible point's) plus ``k`` times its children's largest
    margin: a slack δ injected at the grandchildren of shape ``3,1,2`` (its only nodes of two children) reaches the
    root as 3·1·δ, beside a HiGHS-sized rest.  Propagating only each node's own slack (the grandchildren's δ lost
    one level up), or measuring against no feasible point (a margin of the whole value), fails here."""
    cf_module = importlib.import_module("solvers.cf_bound")
    m, delta = DirichletModel(3, seed=0, similarity=0.4), 1e-4
    assert cf_bound(m, "3,1,2", "iid").margin < 1e-8
    real = cf_module.NodeProblem.feasible_value
    monkeypatch.setattr(cf_module.NodeProblem, "feasible_value",
                        lambda node, rho, x: real(node, rho, x) - (delta if node.k == 2 else 0.0))
    margin = cf_bound(m, "3,1,2", "iid").margin
    assert 3 * delta <= margin <= 3 * delta + 1e-8, margin


@pytest.mark.parametrize("V,shape,process", [(3, "((..),.)", "iid"), (4, "(((..),.),.)", "wor"), (3, "2,2", "iid")])
def test_alpha_star_root_bound_sits_between_univer_and_cf(V, shape, process):
    """Restricting the root to the α*(1)-face can only lower CF, and UniVer (α* at every node) stays below it."""
    m, sh = model(V, 1), TreeShape.parse(shape)
    cf = cf_bound(m, sh, process)
    univer = float(evaluate(m, sh, process, VERIFIERS["univer"]).expected_accepted)
    assert univer <= cf.alpha_root_value + cf.tolerance + 1e-9 and cf.alpha_root_value <= cf.value + 1e-9


def test_alpha_star_root_bound_never_above_cf():
    """The α*-face LP is the free root LP with one more row, so its value cannot pass CF's certified one: HiGHS'
    face point, feasible only to its tolerance, scored 2.5e-11 above it on this V = 2 root (more than CF's
    tolerance + margin, 4.5e-12: the optimality check read "the α*-root bound > CF")."""
    m = context_free(np.array([0.0009643340126964795, 0.9990356659873035]), np.array([0.5, 0.5]))
    cf = cf_bound(m, "(..(.)(..))", "iid")
    assert cf.alpha_root_value <= cf.value


@pytest.mark.parametrize("V,process", [(4, "iid"), (5, "iid"), (5, "wor")])
def test_alpha_star_root_bound_proves_tv_out_of_reach(V, process):
    """Peaky (((..),.),.) instances: the best verifier with an α*-optimal root stays below TV, because TV's
    root plan gives up node acceptance (α < α*(1)) for more mass on the deep first child.  Per instance
    "UniVer ≥ TV" is therefore impossible there for *any* α*-optimal verifier; UniVer gets within 0.5% of
    the bound."""
    m, sh = DirichletModel(V, seed=0, similarity=0.5, concentration=0.2), TreeShape.parse("(((..),.),.)")
    bound = cf_bound(m, sh, process).alpha_root_value
    tv = evaluate(m, sh, process, VERIFIERS["tv"])
    univer = float(evaluate(m, sh, process, VERIFIERS["univer"]).expected_accepted)
    assert bound < float(tv.expected_accepted) - 1e-3
    assert bound - 5e-3 * bound <= univer <= bound + 1e-9
    p, q = m.target(()), m.draft(())
    assert float(tv_plan(p, q, 1.0, 2, process).alpha) < float(alpha_star(p, q, 2, process)) - 1e-3


def test_value_aware_plans_subnormal_tuples():
    """An iid root whose drafted tuples have subnormal probabilities (q = 5e-324 on a token): ``w = π/Q_k``
    overflowed on the solver's round-off in π and the cap made inf/inf a NaN — the value-aware verifier (and
    ``paper_checks.studies.bounds``, which runs it) raised "scale nan outside [0, 1]"; ``min(1, π/Q_k)`` is formed
    below 1 (``lp_plan.plan_weights``), and it is lossless."""
    p = np.array([0.9999999999999857, 2.199999999999974e-16, 1.3904046524568757e-14, 2.199999999999974e-16])
    q = np.array([0.0, 0.0, 5e-324, 1.0])
    model = TableModel(4, {(): p}, {(): q})
    r = evaluate(model, "3", "iid", value_aware_verifier(model, "3", "iid"))
    assert r.lossless and float(r.distance) <= LOSSLESS_TOL


def test_value_aware_is_bound_to_its_shape():
    m = model(3, 0)
    va = value_aware_verifier(m, "2,2", "iid")
    assert va.supports(TreeShape.parse("2,2"), "iid") and not va.supports(TreeShape.parse("2,1"), "iid")
    tree = DraftTree.from_shape(TreeShape.parse("2,1"), [0, 1, 2, 0])
    p, q = m.node_probs(tree)
    with pytest.raises(Unsupported, match="built for shape"):
        va.law(tree, p, q, "iid")


class NotNormalised(Model):
    vocab_size = 2

    def target(self, prefix):
        return np.array([0.5, 0.5])

    def draft(self, prefix):
        return np.array([0.7, 0.7])


def test_bad_input_raises_value_error():
    with pytest.raises(ValueError, match="no drafted node"):
        cf_bound(model(3, 0), "()", "iid")
    with pytest.raises(ValueError, match=r"cf_bound: draft row at prefix \(\) sums to 1\.4"):
        cf_bound(NotNormalised(), "2", "iid")
    with pytest.raises(ValueError, match="unknown process"):
        value_aware_verifier(model(3, 0), "2", "beam")


def test_tree_solvers_refuse_a_model_that_is_not_one_and_a_bad_tolerance():
    """A ``(p, q)`` tuple or None was an AttributeError from deep inside (a float vocab_size an IndexError in the
    global LP); ``tol = NaN`` returned success, ``tol = −1`` ran to the evaluation cap, a string was numpy's error."""
    for model, match in (((np.ones(2) / 2, np.ones(2) / 2), "model must be a univer_theory Model .*, got tuple"),
                         (None, "got NoneType")):
        for solver in (cf_bound, global_tree_lp, value_aware_verifier):
            with pytest.raises(ValueError, match=match):
                solver(model, "2", "wor")
    for tol in (float("nan"), -1.0, 0.0, "1e-9", True):
        with pytest.raises(ValueError, match="tol must be a finite number > 0"):
            cf_bound(DirichletModel(3, seed=0), "2", "wor", tol=tol)


def test_value_aware_refuses_a_cf_of_another_setting():
    """A CF of another model gave E[τ] 1.80174 below the true CF 1.80311, one of process iid used for wor 1.99691
    below 1.99983, without a word: the value functions fit another instance."""
    model, other = DirichletModel(3, seed=0), DirichletModel(3, seed=1)
    cf = cf_bound(model, "2", "wor")
    assert value_aware_verifier(model, "2", "wor", cf) is not None
    assert value_aware_verifier(DirichletModel(3, seed=0), "2", "wor", cf) is not None   # an equal model is fine
    for args, match in (((other, "2", "wor"), "another model"), ((model, "2", "iid"), "process 'wor', not 'iid'"),
                        ((model, "1,1", "wor"), "shape")):
        with pytest.raises(ValueError, match=match):
            value_aware_verifier(*args, cf)
    # the same root rows, other rows below: the check compared the root rows only (E[τ] 1.67317 against 1.70875)
    root_p, root_q = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    flat = TableModel(3, {"": root_p}, {"": root_q})
    deep = TableModel(3, {"": root_p, "0": [0.05, 0.05, 0.9], "1": [0.9, 0.05, 0.05], "2": [0.1, 0.8, 0.1]},
                      {"": root_q, "0": [0.8, 0.1, 0.1], "1": [0.1, 0.1, 0.8], "2": [0.3, 0.3, 0.4]})
    with pytest.raises(ValueError, match=r"another model \(its rows at prefix \(0,\) differ\)"):
        value_aware_verifier(deep, "2,2", "wor", cf_bound(flat, "2,2", "wor"))
    targets = {"": root_p, "0": [0.05, 0.05, 0.9], "1": [0.9, 0.05, 0.05], "2": [0.1, 0.8, 0.1]}
    drafts = {"": root_q, "0": [0.8, 0.1, 0.1], "1": [0.1, 0.1, 0.8], "2": [0.3, 0.3, 0.4]}
    other_drafts = TableModel(3, targets, {**drafts, "0": [0.1, 0.8, 0.1]})       # the drafts alone differ
    with pytest.raises(ValueError, match="another model"):
        value_aware_verifier(other_drafts, "2,1", "wor", cf_bound(TableModel(3, targets, drafts), "2,1", "wor"))


def test_value_aware_serves_only_its_own_model_rows_and_process():
    """univer-va cached its plans by (prefix, ρ, subtrees) alone: one call with another model's rows on a tree of its
    shape, or one evaluation under another process (both accepted), and its own evaluation afterwards was lossy
    (distance 0.34 and 0.08).  Other rows are now a ValueError, another process unsupported, and the oracle's own
    evaluation is unchanged by the attempts."""
    m, other, shape = DirichletModel(4, seed=0, similarity=0.5), DirichletModel(4, seed=7, similarity=0.5), "2,1"
    va = value_aware_verifier(m, shape, "wor")
    fresh = evaluate(m, TreeShape.parse(shape), "wor", va)
    tree = DraftTree((-1, 0, 0, 1, 2), (-1, 0, 1, 2, 3))
    with pytest.raises(ValueError, match="not those of the model"):
        va.expected_accepted_length(tree, *other.node_probs(tree), "wor")
    with pytest.raises(Unsupported):
        evaluate(m, TreeShape.parse(shape), "iid", va)
    with pytest.raises(Unsupported, match="built for shape"):    # evaluate reads unsupported(), not supports()
        evaluate(m, TreeShape.parse("2"), "wor", va)
    again = evaluate(m, TreeShape.parse(shape), "wor", va)
    assert float(again.distance) <= LOSSLESS_TOL
    assert again.expected_accepted == fresh.expected_accepted
    p, q = m.node_probs(tree)                      # the model's rows renormalised by the caller: round-off only
    assert va.expected_accepted_length(tree, p / p.sum(1, keepdims=True), q, "wor") == pytest.approx(
        va.expected_accepted_length(tree, p, q, "wor"), abs=1e-12)
    p_other, q_other = other.node_probs(tree)
    nudged = p.copy()
    nudged[0, :2] += (1e-6, -1e-6)
    for rows in ((p, q_other), (p_other, q), (nudged, q)):   # after a cached call: either row, or a nudge, refused
        with pytest.raises(ValueError, match="not those of the model"):
            va.expected_accepted_length(tree, *rows, "wor")


def test_cf_refuses_a_node_lp_above_its_tuple_limit(monkeypatch):
    """CF's own guard, the API's (``univer bound`` checks its root row first, tests/test_cli_errors.py): V = 50,
    k = 3 i.i.d. is 50³ = 125 000 draft tuples > MAX_CF_NODE_TUPLES = 3e4, refused before any tuple is listed
    (solved, such a node LP takes tens of minutes)."""
    cf = importlib.import_module("solvers.cf_bound")   # the module (the package exports the function by its name)

    def listed(*args):
        raise AssertionError("a node LP's tuples were listed before its size was checked")
    monkeypatch.setattr(cf, "tuple_law", listed)
    with pytest.raises(ValueError, match=r"125000 draft tuples \(k = 3, iid\) exceeds MAX_CF_NODE_TUPLES = 3e\+04"):
        cf_bound(DirichletModel(50, seed=0), "3", "iid")
