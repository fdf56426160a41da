"""Flat multi-draft OT (theory.md §4.1) and its ρ-scaled form CondOT(ρ) (§4.2): one façade over four methods.

=========  ==========================================================================  ===============
method     what it computes                                                            size
=========  ==========================================================================  ===============
``lp``     the node LP over ordered tuples and positions, HiGHS (:func:`condot_lp`)     V ≲ 15 (k = 3)
``cvxpy``  the same LP written in cvxpy (:func:`flat_ot_cvxpy`; cross-check)            V ≲ 10
``mincut`` ``min_A [ρ p(A) + Pr(S ⊄ A)]`` over all 2^V cuts (:func:`condot_mincut`)      V ≤ 12
``fast``   the closed forms of ``univer_theory.alpha_star`` (prefix cuts, clocks)       any V, batched
=========  ==========================================================================  ===============
"""
from __future__ import annotations

import time

import numpy as np

from univer_theory.alpha_star import alpha_star as alpha_star_fast
from univer_theory.alpha_star import alpha_star_and_cut, check_node_inputs
from univer_theory.validation import check_choice

from .condot import condot_constraints, condot_lp, lp_bounds, lp_unit, plan_result, tuple_support
from .highs_lp import silence_banner
from .mincut import condot_mincut
from .result import OTResult

METHODS = ("lp", "cvxpy", "mincut", "fast")

#: The solvers :func:`flat_ot_cvxpy` runs (the first one installed with cvxpy by default), with the tolerances
#: that keep their answers inside our recheck's :data:`~solvers.condot.PLAN_TOL` = 1e-9 on most rows (their
#: defaults, ~1e-7, fail it on near-zero targets; CLARABEL still returns "optimal_inaccurate", i.e. success False,
#: on a few rows with tiny probabilities).  No other solver is accepted: the recheck tests feasibility, not
#: optimality, and at their default tolerances OSQP and SCS returned feasible plans up to 1.7e-5 below α* as
#: "optimal" (43 and 64 of 447 rows).
CVXPY_SOLVERS = {
    "HIGHS": {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10, "output_flag": False},
    "CLARABEL": {"tol_feas": 1e-11, "tol_gap_abs": 1e-11, "tol_gap_rel": 1e-11},
}


def _cvxpy():
    """cvxpy, imported on the first :func:`flat_ot_cvxpy` (the other methods need neither it nor the extra)."""
    try:
        import cvxpy
    except ImportError as err:
        raise ImportError(f"flat_ot_cvxpy needs cvxpy: pip install 'univer[solvers]' ({err})") from err
    return cvxpy


def flat_ot_cvxpy(target_probs, draft_probs, k: int, process: str, rho=1.0, *, support=None,
                  solver: str | None = None) -> OTResult:
    """The CondOT(ρ) LP of :func:`condot_lp` stated in cvxpy (independent modelling path, same recheck).

    ``solver``: one of :data:`CVXPY_SOLVERS` that cvxpy has installed (default the first).
    """
    where = "flat_ot_cvxpy"
    p, q, k, rho_arr = check_node_inputs(where, target_probs, draft_probs, k, process, rho)
    if p.ndim != 1:
        raise ValueError(f"{where}: target_probs must be one row [V], got shape {p.shape}")
    cp = _cvxpy()
    installed = cp.installed_solvers()
    if solver is None:
        solver = next((s for s in CVXPY_SOLVERS if s in installed), None)
    usable = [s for s in CVXPY_SOLVERS if s in installed]
    if solver not in usable:
        raise ValueError(f"{where}: cvxpy solver {solver!r} is not one with tolerances set for this LP, or not "
                         f"installed; choose one of {usable}")
    rho = float(rho_arr)
    tuples, probs = tuple_support(where, q, k, process, support)
    if solver == "HIGHS":
        silence_banner()                         # highspy's version banner, printed once, would corrupt --json
    start = time.perf_counter()
    by_tuple, by_token = condot_constraints(tuples, p.size)
    unit = lp_unit(rho)
    x = cp.Variable(len(tuples) * k, nonneg=True)
    bounds = lp_bounds(probs, rho * p, k, rho)
    problem = cp.Problem(cp.Maximize(cp.sum(x)),
                         [by_tuple @ x <= bounds[:len(tuples)], by_token @ x <= bounds[len(tuples):]])
    problem.solve(solver=solver, **CVXPY_SOLVERS.get(solver, {}))
    seconds = time.perf_counter() - start
    ok = problem.status == cp.OPTIMAL
    values = x.value * unit if x.value is not None else np.zeros(len(tuples) * k)
    return plan_result(values, tuples, probs, p, rho, solver_ok=ok, status=problem.status,
                       message=f"cvxpy {solver}: {problem.status}", solver=f"cvxpy-{solver}", seconds=seconds,
                       claimed_value=problem.value * unit if ok else np.nan)


def _fast(target_probs, draft_probs, k: int, process: str, rho) -> OTResult:
    start = time.perf_counter()
    value, cut = alpha_star_and_cut(target_probs, draft_probs, k, process, rho, where="solve_flat")
    return OTResult(value, None, None, None, cut, "optimal", True, "closed form", "closed-form",
                    time.perf_counter() - start)


def solve_flat(target_probs, draft_probs, k: int, process: str, rho=1.0, method: str = "lp") -> OTResult:
    """CondOT(ρ) (flat multi-draft OT at ρ = 1) of one node by ``method`` ∈ :data:`METHODS`.

    .. math::  α^*(ρ) = \\max_{π ∈ CondOT(ρ)} \\sum π = \\min_A [ρ\\,p(A) + \\Pr(S ⊄ A)]

    ``lp``/``cvxpy`` return a plan (``plan``, ``marginal``, ``tuples``); ``mincut``/``fast`` a cut A*.
    """
    check_choice(method, METHODS, "solve_flat", "method")
    if method == "lp":
        return condot_lp(target_probs, draft_probs, rho, k, process)
    if method == "cvxpy":
        return flat_ot_cvxpy(target_probs, draft_probs, k, process, rho)
    if method == "mincut":
        return condot_mincut(target_probs, draft_probs, k, process, rho)
    return _fast(target_probs, draft_probs, k, process, rho)


