"""Flat multi-draft OT / CondOT(ρ) (theory.md §4.1–§4.2): the LP, its cvxpy twin, the brute-force min-cut
and the closed forms of ``univer_theory.alpha_star`` must agree; ``Pr_wor(S ⊆ G)`` by clocks must match the
enumerated tuple law."""
import re
from itertools import combinations

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from solvers import (PLAN_TOL, condot_lp, condot_mincut, condot_value, flat_ot_cvxpy, flat_ot_lp, solve_flat)
from solvers.condot import plan_result
from univer_theory import PROCESSES, tuple_law
from univer_theory.alpha_star import (alpha_star, alpha_star_and_cut, optimal_cut,
                                      prob_subset_wor, prob_subset_wor_k2, prob_subset_wor_prefixes,
                                      ratio_order)
from univer_theory.tolerance import worst_of

TOL = 1e-9
#: Entries of the hypothesis weight vectors: exact zeros, near-zeros and O(1) weights.
WEIGHT = st.sampled_from([0.0, 1e-12, 1e-7]) | st.integers(1, 12).map(float)


def _normalised(weights):
    w = np.array(weights, dtype=np.float64)
    return w / w.sum()


@st.composite
def nodes(draw, max_vocab=6, processes=PROCESSES, max_k=3):
    """(p, q, k, process, ρ): p with zeros and near-zeros; q with at least k positive entries."""
    V = draw(st.integers(2, max_vocab))
    process = draw(st.sampled_from(processes))
    k = draw(st.integers(1, max_k if process == "iid" else min(max_k, V)))
    p_w, q_w = draw(st.lists(WEIGHT, min_size=V, max_size=V)), draw(st.lists(WEIGHT, min_size=V, max_size=V))
    assume(sum(p_w) > 0 and np.count_nonzero(q_w) >= k)
    rho = draw(st.sampled_from([0.0, 1.0]) | st.floats(0.0, 1.0))
    return _normalised(p_w), _normalised(q_w), k, process, rho


def _cut_cost(p, q, k, process, rho, cut):
    """``ρ p(A) + Pr(S ⊄ A)`` summed from the tuple law (the definition)."""
    miss = sum(pr for S, pr in tuple_law(q, k, process) if not all(cut[y] for y in S))
    return rho * p[cut].sum() + miss


@given(nodes())
@example(node=(np.array([0.0, 0.0, 0.0, 1.0]), np.array([0.0, 0.0, 0.0, 1.0]), 1, "iid", 2.225073858507203e-309))
def test_lp_cvxpy_mincut_and_closed_form_agree(node):
    """The example: a subnormal ρ, where the bounds Q_k(S)/ρ of the LPs' unit overflowed (``solvers.condot.lp_bounds``
    caps them at k)."""
    p, q, k, process, rho = node
    results = {m: solve_flat(p, q, k, process, rho, method=m) for m in ("lp", "cvxpy", "mincut", "fast")}
    for name, res in results.items():
        assert res.success, (name, res.message)
    values = {name: res.value for name, res in results.items()}
    assert np.ptp(list(values.values())) <= TOL, values                  # (NaN wherever it comes)
    # both cuts are minimisers of the cut objective
    for name in ("mincut", "fast"):
        assert abs(_cut_cost(p, q, k, process, rho, results[name].cut) - values["mincut"]) <= 1e-12, name



def test_cvxpy_is_exact_relative_to_rho():
    """``flat_ot_cvxpy`` solves and rechecks in the unit ρ, as the HiGHS LPs do (``solvers.condot.lp_unit``): with
    its bounds absolute, 4 of these nodes failed the recheck at ρ = 1e-9 and one was 2.1e-9·ρ off α*(ρ) (4.7e-11·ρ
    in the unit ρ).  Dirichlet, dyadic, sparse and peaky rows, V = 4 and 7; the worst instance is reported."""
    from ..theory.test_one_implementation import node_grid

    worst, rho = (0.0, None), 1e-9
    for where, p, q, process, k in node_grid((1, 2), (("iid", 1), ("wor", 1), ("iid", 2), ("wor", 2)), 60):
        res = solve_flat(p, q, k, process, rho, method="cvxpy")
        assert res.success, f"{where}: {res.message}"
        worst = worst_of(worst, (abs(res.value - alpha_star(p, q, k, process, rho)) / rho, where))
    assert worst[0] <= 1e-9, f"worst |value − α*|/ρ = {worst[0]:.3g} at {worst[1]}"

@given(nodes(max_vocab=5))
def test_lp_plan_is_a_feasible_node_plan(node):
    """The returned plan satisfies CondOT(ρ) and its marginal is the plan's own."""
    p, q, k, process, rho = node
    res = condot_lp(p, q, rho, k, process)
    law = dict(tuple_law(q, k, process))
    assert res.plan.shape == (len(law), k) and res.plan.min() >= 0
    assert np.all(res.plan.sum(axis=1) <= np.array([law[S] for S in res.tuples]) + PLAN_TOL)
    marginal = np.zeros(p.size)
    for S, row in zip(res.tuples, res.plan):
        for y, mass in zip(S, row):
            marginal[y] += mass
    np.testing.assert_allclose(res.marginal, marginal, atol=1e-15)
    assert np.all(res.marginal <= rho * p + PLAN_TOL)
    assert res.value == pytest.approx(res.marginal.sum(), abs=1e-15)


def test_flat_ot_is_condot_at_rho_one():
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
    for process in PROCESSES:
        assert flat_ot_lp(p, q, 2, process).value == condot_lp(p, q, 1.0, 2, process).value
        assert condot_value(p, q, 1.0, 2, process) == pytest.approx(alpha_star(p, q, 2, process), abs=TOL)


def test_lp_accepts_a_precomputed_support():
    rng = np.random.default_rng(4)
    p, q = rng.dirichlet(np.ones(4)), rng.dirichlet(np.ones(4))
    law = tuple_law(q, 3, "wor")
    assert condot_lp(p, q, 0.6, 3, "wor", support=law).value == condot_lp(p, q, 0.6, 3, "wor").value


def test_recheck_rejects_an_infeasible_plan():
    """A plan that overshoots ρ·p is reported as a failed recheck, with the rule and tolerance."""
    p = np.array([0.5, 0.5])
    tuples, probs = ((0,), (1,)), np.array([0.5, 0.5])
    bad = plan_result(np.array([0.5, 0.5]), tuples, probs, p, 0.5, solver_ok=True, status="optimal",
                      message="solver ok", solver="test", seconds=0.0, claimed_value=1.0)
    assert not bad.success and bad.status == "recheck_failed" and "ρ·p(y)" in bad.message
    good = plan_result(np.array([0.25, 0.25]), tuples, probs, p, 0.5, solver_ok=True, status="optimal",
                       message="solver ok", solver="test", seconds=0.0, claimed_value=0.5)
    assert good.success and good.message == "solver ok"
    claimed = plan_result(np.array([0.25, 0.25]), tuples, probs, p, 0.5, solver_ok=True, status="optimal",
                          message="solver ok", solver="test", seconds=0.0, claimed_value=0.4)
    assert not claimed.success and "claims" in claimed.message


@given(nodes(processes=("iid",)))
@example(node=(_normalised([0, 0, 1e-12, 0, 0, 1e-7]), _normalised([0, 4, 12, 1e-12, 1e-12, 1e-12]), 3, "iid", 0.0))
def test_iid_closed_form_is_the_theory_prefix_formula(node):
    """ρ = 1: ``α* = 1 + min(0, min_j [P_j − Q_j^k])`` over ratio-order prefixes (§4.1), summed here.  The two
    sum in other orders and cancel near 1 − P_j ≈ 0: each is within ~(V + k)·ε of the exact value (1.2e-15 apart
    at α* = 1e-5, V = 6, k = 3 — a fixed 1e-15 was a flake), so the tolerance is twice that."""
    p, q, k, _, _ = node
    order = ratio_order(p, q)
    best = min(0.0, min(p[order[:j]].sum() - q[order[:j]].sum() ** k for j in range(p.size + 1)))
    tol = 2 * (p.size + k) * np.finfo(np.float64).eps
    assert alpha_star(p, q, k, "iid") == pytest.approx(1 + best, abs=tol)


def test_batched_closed_form_matches_rows():
    rng = np.random.default_rng(5)
    p, q = rng.dirichlet(np.ones(7), size=(3, 4)), rng.dirichlet(np.ones(7), size=(3, 4))
    rho = rng.random((3, 4))
    for process in PROCESSES:
        values, cuts = alpha_star_and_cut(p, q, 3, process, rho)
        assert values.shape == (3, 4) and cuts.shape == (3, 4, 7)
        for i in np.ndindex(3, 4):
            value, cut = alpha_star_and_cut(p[i], q[i], 3, process, rho[i])
            assert values[i] == pytest.approx(value, abs=1e-15) and np.array_equal(cuts[i], cut)


def test_ratio_order_puts_zero_draft_tokens_last_and_breaks_ties_by_id():
    p = np.array([0.1, 0.2, 0.3, 0.2, 0.2])
    q = np.array([0.2, 0.0, 0.6, 0.2, 0.0])
    # ratios 0.5, inf, 0.5, 1.0, inf
    assert ratio_order(p, q).tolist() == [0, 2, 3, 1, 4]


@st.composite
def wor_rows(draw, max_vocab=6):
    V = draw(st.integers(2, max_vocab))
    k = draw(st.integers(1, min(3, V)))
    q_w = draw(st.lists(WEIGHT, min_size=V, max_size=V))
    assume(np.count_nonzero(q_w) >= k)
    return _normalised(q_w), k, np.array(draw(st.permutations(range(V))))


@given(wor_rows())
def test_wor_clocks_match_the_tuple_law(row):
    """``Pr_wor(S ⊆ G_j)`` for every prefix, clocks vs Σ of ``tuple_law`` (k ≤ 3), to 1e-12."""
    q, k, order = row
    law = tuple_law(q, k, "wor")
    exact = [sum(pr for S, pr in law if set(S) <= set(order[:j].tolist())) for j in range(q.size + 1)]
    np.testing.assert_allclose(prob_subset_wor_prefixes(q, order, k), exact, rtol=0, atol=1e-12)


@given(wor_rows())
def test_wor_k2_closed_form_matches_clocks(row):
    q, _, order = row
    assume(np.count_nonzero(q) >= 2)
    clocks = prob_subset_wor_prefixes(q, order, 2)
    for j in range(q.size + 1):
        G = np.zeros(q.size, dtype=bool)
        G[order[:j]] = True
        assert prob_subset_wor_k2(q, G) == pytest.approx(clocks[j], abs=1e-12)
        assert prob_subset_wor(q, G, 2) == pytest.approx(clocks[j], abs=1e-12)


def test_wor_k3_clocks_on_a_larger_vocabulary():
    """V = 8, k = 3: every 3-subset G of a fixed row, clocks vs the tuple law (336 tuples)."""
    q = np.random.default_rng(6).dirichlet(np.full(8, 0.5))
    law = tuple_law(q, 3, "wor")
    for G in combinations(range(8), 4):
        mask = np.isin(np.arange(8), G)
        exact = sum(pr for S, pr in law if set(S) <= set(G))
        assert prob_subset_wor(q, mask, 3) == pytest.approx(exact, abs=1e-12)


BAD = [
    ("unnormalised target", dict(p=[0.5, 0.4, 0.1 + 0.2]), "target_probs sums"),
    ("negative draft", dict(q=[1.2, -0.2, 0.0]), "negative entry"),
    ("NaN target", dict(p=[np.nan, 0.5, 0.5]), "NaN"),
    ("mismatched vocabularies", dict(q=[0.5, 0.5]), "differ"),
    ("k above support", dict(k=3, process="wor"), "only 2 tokens"),
    ("k zero", dict(k=0), "k must be an integer ≥ 1, got 0"),
    ("k a bool", dict(k=True), "k must be an integer ≥ 1, got True"),
    ("rho above one", dict(rho=1.5), "rho must lie in [0, 1]"),
    ("unknown process", dict(process="beam"), "unknown process"),
]


@pytest.mark.parametrize("case, change, match", BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("method", ["lp", "cvxpy", "mincut", "fast"])
def test_bad_input_raises_value_error(case, change, match, method):
    """Each method's error names the function the caller reaches (``fast`` named ``alpha_star`` before)."""
    args = dict(p=[0.2, 0.3, 0.5], q=[0.6, 0.4, 0.0], k=2, process="iid", rho=1.0) | change
    where = {"lp": "condot_lp", "cvxpy": "flat_ot_cvxpy", "mincut": "condot_mincut", "fast": "solve_flat"}[method]
    with pytest.raises(ValueError, match=f"^{where}: .*{re.escape(match)}"):
        solve_flat(np.array(args["p"]), np.array(args["q"]), args["k"], args["process"], args["rho"], method=method)


def test_unknown_method_and_oversized_mincut_raise():
    p = q = np.full(13, 1 / 13)
    with pytest.raises(ValueError, match="unknown method 'simplex'"):
        solve_flat(p, q, 2, "iid", method="simplex")
    with pytest.raises(ValueError, match="exceeds 12"):
        condot_mincut(p, q, 2, "iid")
    # OSQP and SCS (cvxpy's own) at their default tolerances returned plans up to 1.7e-5 below α* as optimal
    for solver in ("NOPE", "OSQP", "SCS"):
        with pytest.raises(ValueError, match="not one with tolerances set for this LP, or not installed"):
            flat_ot_cvxpy(p[:3] * 13 / 3, q[:3] * 13 / 3, 2, "iid", solver=solver)
    with pytest.raises(ValueError, match="G_mask"):
        prob_subset_wor(q, np.ones(12, dtype=bool), 2)
    with pytest.raises(ValueError, match="permutation"):
        prob_subset_wor_prefixes(q, np.zeros(13, dtype=int), 2)
    with pytest.raises(ValueError, match="does not broadcast"):
        optimal_cut(np.tile(p, (2, 1)), np.tile(q, (2, 1)), 2, "iid", rho=np.ones(3))


def test_highs_lp_runs_after_cvxpy_started_highs():
    """cvxpy's HIGHS backend starts HiGHS' process-wide thread scheduler with its own thread count; our direct
    HiGHS calls (slot rule, CF, global LP) must still solve afterwards (they once returned 'Not Set')."""
    from solvers import solve_lp
    flat_ot_cvxpy(np.array([0.2, 0.3, 0.5]), np.array([0.4, 0.4, 0.2]), 2, "iid")
    sol = solve_lp(np.array([1.0, 1.0]), np.array([[1.0, 1.0]]), [-np.inf], [1.0], [0.0, 0.0], [1.0, 1.0])
    assert sol.success and abs(sol.objective - 1.0) < 1e-12


@pytest.mark.parametrize("rho,cut", [(1.0, [0, 0, 0]), (0.5, [1, 1, 0])])
def test_mincut_breaks_ties_to_the_smallest_bitmask(rho, cut):
    """p = q on two tokens, k = 2 wor: several cuts are minimal; the min-cut oracle returns the smallest bitmask
    among them, which is the closed form's cut too."""
    p = q = np.array([0.5, 0.5, 0.0])
    res = condot_mincut(p, q, 2, "wor", rho)
    assert res.cut.astype(int).tolist() == cut
    assert np.asarray(alpha_star_and_cut(p, q, 2, "wor", rho)[1]).astype(int).tolist() == cut


def test_a_given_tuple_law_must_be_one():
    """``support=`` was barely checked: a law summing to 2 (or listed twice) gave value 1.0 with success above
    α* = 0.9857, float tokens were truncated (bools read as 1 and 0), a wor tuple (0, 0) accepted, an empty list an
    IndexError, Q = inf a cvxpy success — each a ValueError naming the rule now; the law itself still gives the
    LP's value."""
    p, q = np.array([.5, .3, .2]), np.array([.2, .3, .5])
    law = tuple_law(q, 2, "wor")
    assert condot_lp(p, q, 1.0, 2, "wor", support=law).value == pytest.approx(alpha_star(p, q, 2, "wor"), abs=1e-9)
    for support, match in (([], "non-empty list"), ([(S, 2 * x) for S, x in law], "sum to 1"),
                           (law + law, "sum to 1"), ([((0.5, 1.7), 1.0)], "integer tokens"),
                           ([((True, False), .5), ((0, 2), .5)], "integer tokens"),      # bools were 1, 0
                           ([((0, 0), 1.0)], "repeated token"), ([((0, 1), float("inf"))], "finite"),
                           ([(0, 1)], "pairs"), (np.array([[0, 1]]), "pairs"),
                           ([((0, 1), .5), ((0, 1), .5)], "a tuple twice")):
        with pytest.raises(ValueError, match=match):
            condot_lp(p, q, 1.0, 2, "wor", support=support)
        with pytest.raises(ValueError, match=match):
            flat_ot_cvxpy(p, q, 2, "wor", support=support)


def test_rho_must_be_a_real_number_and_rows_rectangular():
    """``rho = "0.5"`` was read as 0.5; ``0.5 + 0j``, ``"abc"`` and ragged rows were numpy's errors naming neither
    the function nor the argument.  Fractions (the exact mode's ρ) stay accepted."""
    from fractions import Fraction
    p, q = np.array([.5, .3, .2]), np.array([.2, .3, .5])
    assert alpha_star(p, q, 2, "wor", Fraction(1, 2)) == alpha_star(p, q, 2, "wor", 0.5)
    for rho in ("0.5", 0.5 + 0j, "abc", True):
        for call in (lambda: alpha_star(p, q, 2, "wor", rho), lambda: condot_lp(p, q, rho, 2, "wor"),
                     lambda: condot_mincut(p, q, 2, "wor", rho)):
            with pytest.raises(ValueError, match="rho must be a real number"):
                call()
    with pytest.raises(ValueError, match="target_probs must be rows of one length"):
        alpha_star([[.5, .5], [1.0]], [[.5, .5], [1.0]], 1, "iid")


def test_cvxpy_succeeds_only_on_an_optimal_status_and_a_claim_its_plan_keeps(monkeypatch):
    """``flat_ot_cvxpy`` counts only cvxpy's ``optimal`` as success (not ``optimal_inaccurate``), and rechecks the
    claimed objective against its plan's sum."""
    import cvxpy as cp
    p, q = np.array([.5, .3, .2]), np.array([.2, .3, .5])
    assert flat_ot_cvxpy(p, q, 2, "iid", 0.7).success
    solve = cp.Problem.solve
    for status, shift in ((cp.OPTIMAL_INACCURATE, 0.0), (None, 1e-3)):
        def patched(self, *args, **kwargs):
            out = solve(self, *args, **kwargs)
            if status is not None:
                self._status = status
            self._value += shift
            return out
        monkeypatch.setattr(cp.Problem, "solve", patched)
        res = flat_ot_cvxpy(p, q, 2, "iid", 0.7)
        assert not res.success and (status is not None or "claims" in res.message), res.message


def test_mincut_takes_its_largest_vocabulary_and_refuses_the_next():
    from solvers.mincut import MAX_MINCUT_VOCAB
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(MAX_MINCUT_VOCAB)), rng.dirichlet(np.ones(MAX_MINCUT_VOCAB))
    assert abs(condot_mincut(p, q, 2, "wor", 0.8).value - condot_value(p, q, 0.8, 2, "wor")) < 1e-8
    p, q = rng.dirichlet(np.ones(MAX_MINCUT_VOCAB + 1)), rng.dirichlet(np.ones(MAX_MINCUT_VOCAB + 1))
    with pytest.raises(ValueError, match="exceeds"):
        condot_mincut(p, q, 2, "wor", 0.8)


def test_mincut_refuses_a_tuple_law_the_lp_refuses_and_sums_it_per_token_set():
    """V ≤ 12 does not bound the tuples: k = 5 i.i.d. over 12 tokens (2.5e5 tuples) built an int64 table of 2^12 ×
    248 832 entries (8 GB) and k = 22 over 2 tokens enumerated 4.2e6 tuples — refused as condot_lp refuses them; at
    the limit's side (k = 4, 20 736 tuples) the table is one column per token set and the value the LP's."""
    from solvers.condot import MAX_NODE_LP_TUPLES
    for V, k in [(12, 5), (2, 22)]:
        with pytest.raises(ValueError, match="MAX_NODE_LP_TUPLES"):
            condot_mincut(np.full(V, 1 / V), np.full(V, 1 / V), k, "iid")
    rng = np.random.default_rng(1)
    p, q = rng.dirichlet(np.ones(12)), rng.dirichlet(np.ones(12))
    assert 12 ** 4 <= MAX_NODE_LP_TUPLES
    assert abs(condot_mincut(p, q, 4, "iid", 0.8).value - alpha_star(p, q, 4, "iid", 0.8)) <= 1e-12


def test_plan_recheck_flags_a_negative_entry_beyond_its_tolerance():
    from solvers.condot import check_plan
    tuples, probs, p = ((0, 1), (1, 0)), np.array([.5, .5]), np.array([.5, .5])
    problems = check_plan(np.array([[.25 + 1e-6, -1e-6], [.25, 0.]]), tuples, probs, p, 1.0)[2]
    assert any("negative" in s for s in problems), problems
    assert check_plan(np.array([[.25, -0.1 * PLAN_TOL], [.25, 0.]]), tuples, probs, p, 1.0)[2] == []


def test_plan_recheck_fails_a_nan_plan_and_refuses_a_nan_tolerance():
    """A NaN passed every rule of the recheck (``nan < −tol``, ``nan > tol`` are False): an all-NaN plan had no
    violation, one NaN hid a plan's two real ones, and ``plan_result`` called a NaN solver point optimal."""
    from solvers.condot import check_plan, plan_result
    tuples, probs, p = ((0, 1), (1, 0)), np.array([.5, .5]), np.array([.5, .5])
    assert check_plan(np.full((2, 2), np.nan), tuples, probs, p, 1.0)[2] == ["4 plan entries NaN or infinite"]
    problems = check_plan(np.array([[5.0, np.nan], [.25, 0.]]), tuples, probs, p, 1.0)[2]
    assert problems[0] == "1 plan entries NaN or infinite" and len(problems) == 3, problems
    for tol in (float("nan"), -1e-9, float("inf")):
        with pytest.raises(ValueError, match="check_plan: tol must be a finite number ≥ 0"):
            check_plan(np.zeros((2, 2)), tuples, probs, p, 1.0, tol)
    r = plan_result(np.full(4, np.nan), tuples, probs, p, 1.0, solver_ok=True, status="optimal", message="m",
                    solver="s", seconds=0.0, claimed_value=0.5)
    assert not r.success and r.status == "recheck_failed", r.message
    r = plan_result(np.array([.25, 0., .25, 0.]), tuples, probs, p, 1.0, solver_ok=True, status="optimal",
                    message="m", solver="s", seconds=0.0, claimed_value=np.nan)
    assert not r.success and "the solver claims nan" in r.message


def test_the_cvxpy_path_prints_nothing_on_stdout():
    """highspy prints its version banner on its first ``Highs`` object; through cvxpy it reached stdout (a user's
    ``--json`` pipe).  A fresh interpreter whose first LP is cvxpy's prints only its own line."""
    import subprocess
    import sys
    code = ("from solvers import solve_flat\nimport numpy as np\n"
            "r = solve_flat(np.array([.5, .3, .2]), np.array([.2, .3, .5]), 2, 'wor', method='cvxpy')\n"
            "print(r.solver)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("cvxpy-") and out.count("\n") == 1, out
