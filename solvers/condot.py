"""The node LP CondOT(ρ) over ordered child tuples and positions (theory.md §4.2, §6.1; UniVer rule 1).

.. math::

    \\max \\sum_{S, j} π(S, j) \\quad\\text{s.t.}\\quad π ≥ 0,\\;
    \\sum_j π(S, j) ≤ Q_k(S),\\; \\sum_{(S, j):\\, S_j = y} π(S, j) ≤ ρ\\,p(y),

over every ordered tuple S with ``Q_k(S) > 0`` (``univer_theory.processes.tuple_law``) and position j.
A plan π is a node plan in the sense of §6.1 with ``w_j(S) = π(S, j)/Q_k(S)``.  Positions subsume the
set-based LP of §4.1 (parallel edges of the same max-flow), so ρ = 1 is the flat multi-draft OT.
Solved with HiGHS (deterministic); the answer is rechecked here (:func:`check_plan`).
"""
from __future__ import annotations

import time

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csr_array, vstack

from univer_theory.alpha_star import check_node_inputs
from univer_theory.plans.lp_plan import check_position_weights
from univer_theory.processes import tuple_count, tuple_law
from univer_theory.tolerance import exceeds
from univer_theory.validation import SIMPLEX_ATOL, count_text

from .highs_lp import VERTEX_TOL, solve_lp
from .result import OTResult
from .tie_break import prime_roots, tie_eps

#: Tolerance of our recheck of a solver's plan: nonnegativity, ``Σ_j π(S,j) ≤ Q_k(S)``, ``a(y) ≤ ρ p(y)``.
#: HiGHS runs with feasibility tolerances 1e-10 (:data:`HIGHS_OPTIONS`); its errors show up 1:1 in the plan.
PLAN_TOL = 1e-9
HIGHS_OPTIONS = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}


def lp_unit(rho: float) -> float:
    """The unit ``s = min(ρ, 1)`` (1 at ρ = 0) in which the node LPs are solved and rechecked (:func:`lp_bounds`):
    HiGHS' feasibility tolerances and :data:`PLAN_TOL` are then relative to ρ, which bounds the value α*(ρ) (read as
    absolute, they let HiGHS plans of 2–4× α* pass at ρ = 1e-9)."""
    return rho if 0 < rho < 1 else 1.0


def lp_bounds(tuple_probs: np.ndarray, capacities: np.ndarray, k: int, rho: float) -> np.ndarray:
    """The node LP's row bounds in the unit ``s`` = :func:`lp_unit`: ``min(Q_k(S), kρ)/s`` for the tuple rows, then
    the capacities ``ρp(y)/s``.  Every ``π(S, j) ≤ ρp(S_j) ≤ ρ``, so ``Σ_j π(S, j) ≤ kρ`` holds anyway: the feasible
    set, its vertices and the tie-broken optimum are those of the LP as stated (each vertex divided by s), and no
    bound exceeds k (``Q_k(S)/ρ`` overflowed at a subnormal ρ)."""
    return np.concatenate([np.minimum(tuple_probs, k * rho), capacities]) / lp_unit(rho)


#: Most draft tuples a node LP is built over (counted before they are enumerated): V = 16, k = 4 i.i.d. (65 536
#: tuples) took 4 s on Dirichlet rows and minutes on uniform ones; V = 32, k = 4 (10⁶) ran past 150 s at 3.5 GB.
#: Beyond, ``method="fast"`` gives α*(ρ).
MAX_NODE_LP_TUPLES = 10 ** 5


def node_lp_tuples(q: np.ndarray, k: int, process: str) -> int:
    """The draft tuples of the node LP over ``q``'s drafted tokens (:func:`tuple_support` refuses more than
    :data:`MAX_NODE_LP_TUPLES`), counted before any is built."""
    return tuple_count(int(np.count_nonzero(q)), k, process)


def tuple_support(where: str, q: np.ndarray, k: int, process: str, support) -> tuple[tuple, np.ndarray]:
    """``(tuples, Q_k(tuples))`` from a given ``[(S, Q_k(S))]`` list or, if ``support`` is None, ``tuple_law``
    (refused beyond :data:`MAX_NODE_LP_TUPLES`).  A given list must be a law: distinct tuples S of k integer
    tokens in ``[0, V)`` (distinct within S unless iid), ``Q_k(S)`` finite, ≥ 0 and summing to 1 (within
    :data:`~univer_theory.validation.SIMPLEX_ATOL`); ValueError naming the first rule broken."""
    if support is None:
        drafted = int(np.count_nonzero(q))
        count = node_lp_tuples(q, k, process)
        if count > MAX_NODE_LP_TUPLES:
            raise ValueError(f"{where}: {count_text(count)} draft tuples (k = {k}, {process}, {drafted} drafted "
                             f"tokens) exceed MAX_NODE_LP_TUPLES = {MAX_NODE_LP_TUPLES:.0e}; α*(ρ) alone comes "
                             f"from the closed form (solve_flat(..., method='fast'))")
        law = tuple_law(q, k, process)
    else:
        rule = (f"{where}: support must be a non-empty list of (S, Q_k(S)) pairs, S a tuple of k = {k} integer "
                f"tokens in [0, {q.size})")
        try:
            law = [(tuple(S), pr) for S, pr in support]
        except (TypeError, ValueError):
            raise ValueError(rule) from None
        if not law or any(len(S) != k or not all(isinstance(y, (int, np.integer)) and not isinstance(y, bool)
                                                 and 0 <= y < q.size for y in S) for S, _ in law):
            raise ValueError(rule)
    tuples = tuple(tuple(int(y) for y in S) for S, _ in law)
    try:
        probs = np.array([float(pr) for _, pr in law], dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: support's Q_k(S) must be numbers") from None
    if support is not None:
        if not np.all(np.isfinite(probs) & (probs >= 0)) or abs(probs.sum() - 1.0) > SIMPLEX_ATOL:
            raise ValueError(f"{where}: support's Q_k(S) must be finite, ≥ 0 and sum to 1 (a law), got sum "
                             f"{probs.sum():.12g}")
        if len(set(tuples)) != len(tuples):
            raise ValueError(f"{where}: support lists a tuple twice")
        if process != "iid" and any(len(set(S)) != k for S in tuples):
            raise ValueError(f"{where}: support has a tuple with a repeated token, impossible under {process!r}")
    return tuples, probs


def condot_constraints(tuples: tuple, vocab_size: int) -> tuple[csr_array, csr_array]:
    """Sparse constraint matrices over the variables ``π(S_i, j)`` (flattened ``i·k + j``):
    tuple rows ``[n_tuples, n_tuples·k]`` (``Σ_j π(S_i, j)``) and token rows ``[V, n_tuples·k]`` (``a(y)``)."""
    n, k = len(tuples), len(tuples[0])
    cols = np.arange(n * k)
    by_tuple = csr_array((np.ones(n * k), (cols // k, cols)), shape=(n, n * k))
    tokens = np.array(tuples, dtype=np.int64).reshape(-1)
    by_token = csr_array((np.ones(n * k), (tokens, cols)), shape=(vocab_size, n * k))
    return by_tuple, by_token


def check_plan(plan: np.ndarray, tuples: tuple, tuple_probs: np.ndarray, target_probs: np.ndarray, rho: float,
               tol: float = PLAN_TOL) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Recheck a solver's CondOT(ρ) plan ``[n_tuples, k]``.

    Returns ``(plan ≥ 0 with round-off below tol clipped, marginal a [V] of that plan, violations)``;
    ``violations`` lists every broken rule with its size (empty when the plan is feasible within ``tol``); entries
    NaN or infinite are one, and read as 0 for the others.
    """
    if not 0 <= tol < np.inf:
        raise ValueError(f"check_plan: tol must be a finite number ≥ 0, got {tol!r}")
    problems = []
    broken = ~np.isfinite(plan)
    if broken.any():                          # NaN passes every comparison below: reported, then read as 0
        problems.append(f"{int(np.count_nonzero(broken))} plan entries NaN or infinite")
        plan = np.where(broken, 0.0, plan)
    if plan.min(initial=0.0) < -tol:
        problems.append(f"plan has a negative entry {plan.min():.3g} (tolerance {tol:g})")
    plan = np.maximum(plan, 0.0)
    over_tuple = (plan.sum(axis=1) - tuple_probs).max(initial=0.0)
    if over_tuple > tol:
        problems.append(f"Σ_j π(S, j) exceeds Q_k(S) by {over_tuple:.3g} (tolerance {tol:g})")
    marginal = np.zeros(target_probs.size)
    np.add.at(marginal, np.array(tuples, dtype=np.int64).reshape(-1), plan.reshape(-1))
    over_target = (marginal - rho * target_probs).max(initial=0.0)
    if over_target > tol:
        problems.append(f"marginal a(y) exceeds ρ·p(y) by {over_target:.3g} (tolerance {tol:g})")
    return plan, marginal, problems


def plan_result(x: np.ndarray, tuples: tuple, tuple_probs: np.ndarray, p: np.ndarray, rho: float, *,
                solver_ok: bool, status: str, message: str, solver: str, seconds: float,
                claimed_value: float) -> OTResult:
    """Build the :class:`OTResult` of a plan solver after :func:`check_plan` (shared by HiGHS and cvxpy), with
    the tolerance :data:`PLAN_TOL` in the unit :func:`lp_unit` (ρ·PLAN_TOL for ρ < 1)."""
    k = len(tuples[0])
    tol = PLAN_TOL * lp_unit(rho)
    plan, marginal, problems = check_plan(np.asarray(x, dtype=np.float64).reshape(-1, k), tuples, tuple_probs,
                                          p, rho, tol)
    value = float(plan.sum())
    if solver_ok and exceeds(abs(value - claimed_value), tol):
        problems.append(f"plan sums to {value:.12g} but the solver claims {claimed_value:.12g} "
                        f"(tolerance {tol:g})")
    if solver_ok and problems:
        status = "recheck_failed"
    plan.setflags(write=False)
    marginal.setflags(write=False)
    return OTResult(value, plan, marginal, tuples, None, status, solver_ok and not problems,
                    "; ".join([message] + problems), solver, seconds)


def _node_lp_inputs(where: str, target_probs, draft_probs, rho, k: int, process: str, support):
    """Checked ``(p, q, k, ρ, tuples, Q_k(tuples))`` of one node's CondOT(ρ) LP (one row of each)."""
    p, q, k, rho_arr = check_node_inputs(where, target_probs, draft_probs, k, process, rho)
    if p.ndim != 1:
        raise ValueError(f"{where}: target_probs must be one row [V], got shape {p.shape}")
    tuples, probs = tuple_support(where, q, k, process, support)
    return p, q, k, float(rho_arr), tuples, probs


#: :func:`condot_plan` solves in the unit ``lp_unit(ρ)·f`` for each f in turn until HiGHS' basis is exactly feasible
#: (to ``VERTEX_TOL·lp_unit(ρ)``).  HiGHS reads a bound below its 1e-10 as 0: a tuple of Q_k(S) = 3e-14 at ρ = 1e-3
#: was taken whole against a capacity of 6e-270; a finer unit makes such bounds visible to it.  On 14 652 seeded
#: nodes (Dirichlet, peaky, sparse, tied rows; iid, wor, greedy; k ≤ 3; ρ ∈ {1e-9, 1e-3, 0.3, 1}) the unit ρ
#: failed on 73 and ρ/16 solved all 73.
PLAN_UNITS = (1.0, 1 / 16)


def _zero_plan(tuples: tuple, probs: np.ndarray, p: np.ndarray, start: float) -> OTResult:
    """CondOT(0): every capacity ρp(y) is 0, so π = 0 is the only plan (HiGHS left 1.5e-10 in a plan's sum and
    a basis broke a 0 by 9.7e-12)."""
    return plan_result(np.zeros(len(tuples) * len(tuples[0])), tuples, probs, p, 0.0, solver_ok=True,
                       status="optimal", message="ρ = 0: the zero plan", solver="highs",
                       seconds=time.perf_counter() - start, claimed_value=0.0)


def condot_lp(target_probs, draft_probs, rho, k: int, process: str, *, support=None) -> OTResult:
    """Solve the CondOT(ρ) node LP with HiGHS.

    Parameters
    ----------
    target_probs, draft_probs : array ``[V]``
        ``p`` and ``q`` of the node.
    rho : float in [0, 1]
        Scaling ρ of the node (ρ = 1: flat multi-draft OT, §4.1).
    k : int
        Number of children.
    process : ``"iid" | "wor" | "topk" | "greedy"``
    support : list of ``(S, Q_k(S))``, optional
        The draft-tuple law to use (default ``tuple_law(q, k, process)``), e.g. to reuse one enumeration.

    Returns
    -------
    OTResult with ``plan [n_tuples, k]``, ``marginal [V]`` (recomputed from the plan), ``tuples``; ``value``
    is the plan's sum (α*(ρ) up to HiGHS' tolerance, relative to ρ: :func:`lp_unit`).
    """
    p, q, k, rho, tuples, probs = _node_lp_inputs("condot_lp", target_probs, draft_probs, rho, k, process, support)
    start = time.perf_counter()
    if rho == 0:
        return _zero_plan(tuples, probs, p, start)
    by_tuple, by_token = condot_constraints(tuples, p.size)
    unit = lp_unit(rho)
    res = linprog(-np.ones(len(tuples) * k), A_ub=vstack([by_tuple, by_token]).tocsr(),
                  b_ub=lp_bounds(probs, rho * p, k, rho), bounds=(0, None), method="highs", options=HIGHS_OPTIONS)
    seconds = time.perf_counter() - start
    ok = res.status == 0
    x = res.x * unit if res.x is not None else np.zeros(len(tuples) * k)
    return plan_result(x, tuples, probs, p, rho, solver_ok=ok, status="optimal" if ok else f"highs:{res.status}",
                       message=res.message, solver="highs", seconds=seconds,
                       claimed_value=-res.fun * unit if ok else np.nan)


def condot_plan(target_probs, draft_probs, rho, k: int, process: str, *, support=None,
                position_weights=None) -> OTResult:
    """The CondOT(ρ) plan of UniVer's rule 1 and of its shape rule: the LP's *one* optimum under the
    tie-break of :mod:`solvers.tie_break`, taken as the exact basic solution of HiGHS' optimal basis
    (``solve_lp(vertex=True)``).

    Lexicographically: ``max Σ π`` (= α*(ρ)); then, with integer ``position_weights`` ω [k], ``max Σ ω_j π(S, j)``
    on that face; then ``max Σ r(S_t, j) π(S_t, j)``, ``r(S_t, j) = frac(√P_{t·k + j})`` for the t-th tuple of
    ``tuple_law``'s order (lexicographic in the draft support's ranks, the order
    :mod:`solvers.condot_simplex` rebuilds).
    HiGHS solves one LP with the cost ``M + ω'_j + ε r``, ``ω' = ω − min ω``, ``M = 1 + 2(m + 1)·max ω'``,
    ``ε = 1/(2(m + 1))``, m = tuples + support tokens: at any basis of this totally unimodular LP the reduced
    costs of the ones are integers moved by less than ``(m + 1)·max ω' + ½ < M`` by the lower levels, and
    those of ω' integers moved by less than ``ε(m + 1) = ½``, so its optimum is the lexicographic one (without
    ω: ``1 + ε r``).  Solved in the units :data:`PLAN_UNITS`.  Same contract as :func:`condot_lp`; ``value`` = the
    plan's ``Σ π = α*(ρ)``."""
    p, q, k, rho, tuples, probs = _node_lp_inputs("condot_plan", target_probs, draft_probs, rho, k, process, support)
    omega = check_position_weights("condot_plan", position_weights, k)
    omega = np.zeros(k) if omega is None else omega
    start = time.perf_counter()
    if rho == 0:
        return _zero_plan(tuples, probs, p, start)
    by_tuple, by_token = condot_constraints(tuples, p.size)
    tokens = np.unique(np.array(tuples, dtype=np.int64))     # the other token rows are empty (a given support may
                                                                # draft a token whose q is 0: its row is not)
    A = vstack([by_tuple, by_token[tokens]]).tocsc()
    n = len(tuples) * k
    omega = omega - omega.min()
    cost = (1 + 2 * (A.shape[0] + 1) * omega.max()) + np.tile(omega, len(tuples)) + tie_eps(A.shape[0]) * prime_roots(n)
    bounds, messages = lp_bounds(probs, rho * p[tokens], k, rho), []
    for finer in PLAN_UNITS:
        sol = solve_lp(cost, A, -np.inf, bounds / finer, 0.0, np.inf, method="simplex", vertex=True,
                       vertex_tol=VERTEX_TOL / finer)
        messages.append(f"unit ρ·{finer:g}: {sol.message}")
        if sol.success:
            break
    seconds = time.perf_counter() - start
    x = sol.x * finer * lp_unit(rho) if sol.success else np.zeros(n)
    return plan_result(x, tuples, probs, p, rho, solver_ok=sol.success,
                       status="optimal" if sol.success else "highs:failed", message="; ".join(messages),
                       solver="highs", seconds=seconds, claimed_value=float(np.sum(x)))


def flat_ot_lp(target_probs, draft_probs, k: int, process: str, *, support=None) -> OTResult:
    """Flat multi-draft OT (§4.1) = :func:`condot_lp` at ρ = 1."""
    return condot_lp(target_probs, draft_probs, 1.0, k, process, support=support)


def condot_value(target_probs, draft_probs, rho, k: int, process: str, *, support=None) -> float:
    """α*(ρ) by the LP; raises RuntimeError (with the solver's message) if the solve or our recheck failed."""
    res = condot_lp(target_probs, draft_probs, rho, k, process, support=support)
    if not res.success:
        raise RuntimeError(f"condot_value: LP failed: {res.message}")
    return res.value
