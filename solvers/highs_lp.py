"""A thin, deterministic HiGHS call for the ground-truth LPs (global tree LP, CF node LPs) and the exact core's
LP plans.

``maximise c·x  s.t.  row_lower ≤ A x ≤ row_upper,  col_lower ≤ x ≤ col_upper`` through HiGHS' own bindings
(no scipy re-packing: the CF bound solves thousands of tiny LPs, the global LP one LP with ~10⁶ columns):
``highspy`` from the ``solvers`` extra, else the identical bindings bundled in scipy ≥ 1.15, so the exact
core needs no extra.
Row duals are returned as *supergradients of the optimal value*: ``V(b') ≤ V(b) + row_dual·(b' − b)`` for a
change of the binding bounds, which is what the CF breakpoint search needs.
"""
from __future__ import annotations

import numbers
import os
import sys
import threading
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import scipy.sparse as sp

from univer_theory.tolerance import exceeds
from univer_theory.validation import check_choice


@lru_cache(maxsize=1)
def bindings():
    """``(module, Highs class)`` of HiGHS' Python bindings, imported on first use (``import solvers`` stays light):
    ``highspy`` (the ``solvers`` extra), else the same bindings bundled in scipy ≥ 1.15."""
    try:
        import highspy
        return highspy, highspy.Highs
    except ImportError:
        pass
    try:
        from scipy.optimize._highspy import _core
    except ImportError as err:
        raise ImportError("solvers.highs_lp needs HiGHS: pip install 'univer[solvers]' (highspy), or scipy ≥ 1.15, "
                          "which bundles it") from err
    return _core, _core._Highs


#: HiGHS' algorithm choices exposed to callers.
LP_METHODS = ("simplex", "ipm", "choose")
#: Re-solves tried in turn when a run does not end Optimal (``retry``): interior point with crossover, then
#: simplex without presolve (presolve's reductions are where tiny coefficients, e.g. Q(S) ~ 1e-10, go wrong).
RETRIES = (("ipm", "choose"), ("simplex", "off"))


@dataclass(frozen=True)
class LPSolution:
    """Raw HiGHS answer (not yet rechecked: callers recheck feasibility in their own terms)."""

    x: np.ndarray          # column values [n_cols]
    row_dual: np.ndarray   # ∂(optimal value)/∂(binding row bound) [n_rows]
    objective: float
    status: int            # 0 optimal, 1 anything else
    success: bool
    message: str           # HiGHS model status in words


def solve_lp(c, A, row_lower, row_upper, col_lower, col_upper, *, method: str = "choose",
             tolerance: float = 1e-10, threads: int = 1, vertex: bool = False, retry: bool = True,
             presolve: str = "choose", vertex_tol: float | None = None) -> LPSolution:
    """Maximise ``c·x`` over ``{x : row_lower ≤ A x ≤ row_upper, col_lower ≤ x ≤ col_upper}`` with HiGHS.

    ``±inf`` bounds mean "no bound".  ``tolerance`` is HiGHS' primal and dual feasibility tolerance
    (1e-10 is its floor).  ``method``: one of :data:`LP_METHODS`.  ``vertex`` (simplex only): ``x`` is the
    basic solution of HiGHS' optimal basis recomputed by one dense solve — nonbasic columns and rows at the
    bound HiGHS left them on, the basic columns from the square system that leaves — so it carries round-off
    only, not HiGHS' feasibility tolerance; a basis whose exact solution breaks a bound by more than
    ``vertex_tol`` (default :data:`VERTEX_TOL`; HiGHS calls a basis optimal that is feasible within its tolerance)
    is reported unsuccessful.
    ``presolve``: HiGHS' option (``"choose"`` or ``"off"``).  ``retry``: when the run does not end Optimal, re-solve
    with each of :data:`RETRIES` in turn (simplex ones only with ``vertex``); ``message`` then lists every attempt.
    ValueError for ``c`` or ``A`` with NaN / inf entries, ``c`` not of one entry per column, bounds that are NaN or
    neither scalars nor one per row / column.
    """
    if vertex and method != "simplex":
        raise ValueError("solve_lp: vertex=True needs method='simplex' (a basis)")
    check_choice(method, LP_METHODS, "solve_lp", "method")
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real) or not 1e-10 <= tolerance <= 1:
        # HiGHS refuses a value below its floor 1e-10 (or NaN passes) and keeps its default 1e-7 without a word
        raise ValueError(f"solve_lp: tolerance must be a number in [1e-10, 1] (1e-10 is HiGHS' floor), "
                         f"got {tolerance!r}")
    highspy, _ = bindings()
    A = sp.csc_matrix(A)
    n_rows, n_cols = A.shape
    cost = np.asarray(c, dtype=np.float64)
    if cost.shape != (n_cols,) or not np.all(np.isfinite(cost)) or not np.all(np.isfinite(A.data)):
        raise ValueError(f"solve_lp: c must hold one finite cost per column of A ({n_cols}) and A finite entries, "
                         f"got c of shape {cost.shape}")
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n_cols, n_rows
    lp.col_cost_ = cost
    lp.col_lower_ = _finite_or_inf(col_lower, n_cols, "col_lower")
    lp.col_upper_ = _finite_or_inf(col_upper, n_cols, "col_upper")
    lp.row_lower_ = _finite_or_inf(row_lower, n_rows, "row_lower")
    lp.row_upper_ = _finite_or_inf(row_upper, n_rows, "row_upper")
    lp.sense_ = highspy.ObjSense.kMaximize
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = A.indptr.astype(np.int32)
    lp.a_matrix_.index_ = A.indices.astype(np.int32)
    lp.a_matrix_.value_ = A.data.astype(np.float64)
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = n_cols, n_rows
    silence_banner()
    check_choice(presolve, ("choose", "off"), "solve_lp", "presolve")
    attempts = [(method, presolve)]
    if retry:
        attempts += [a for a in RETRIES if a != (method, presolve) and (not vertex or a[0] == "simplex")]
    tried = []
    for solver, pre in attempts:
        h = _run(lp, solver, pre, tolerance, threads, A.nnz >= INTERRUPTIBLE_NONZEROS)
        model_status = h.getModelStatus()
        tried.append(f"{solver} (presolve {pre}): {h.modelStatusToString(model_status)}")
        if model_status == highspy.HighsModelStatus.kOptimal:
            break
    sol = h.getSolution()
    ok = model_status == highspy.HighsModelStatus.kOptimal
    x = np.array(sol.col_value)
    message = h.modelStatusToString(model_status)
    if vertex and ok:
        x = _basic_solution(A, h.getBasis(), lp)
        off = _bound_excess(A @ x, lp.row_lower_, lp.row_upper_) + _bound_excess(x, lp.col_lower_, lp.col_upper_)
        limit = VERTEX_TOL if vertex_tol is None else vertex_tol
        if exceeds(off, limit):     # HiGHS' basis is primal feasible only within its tolerance, not its vertex
            ok, message = False, f"{message}, but its basis' exact solution breaks a bound by {off:.2e}"
    if len(tried) > 1:
        message += " after re-solving: " + "; ".join(tried)
    return LPSolution(x, np.array(sol.row_dual), float(h.getInfo().objective_function_value),
                      0 if ok else 1, ok, message)


def _run(lp, solver: str, presolve: str, tolerance: float, threads: int, interruptible: bool = False):
    """One HiGHS run of ``lp`` (in a worker thread when ``interruptible``); returns the solved ``Highs`` object."""
    highspy, Highs = bindings()
    h = Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("random_seed", 0)
    h.setOptionValue("threads", int(threads))
    h.setOptionValue("solver", solver)
    h.setOptionValue("presolve", presolve)
    h.setOptionValue("primal_feasibility_tolerance", float(tolerance))
    h.setOptionValue("dual_feasibility_tolerance", float(tolerance))
    h.passModel(lp)
    run = (lambda: interruptible_run(h)) if interruptible else h.run
    if run() == highspy.HighsStatus.kError and h.getModelStatus() == highspy.HighsModelStatus.kNotset:
        # HiGHS' thread scheduler is process-wide: if another user (cvxpy's HIGHS backend, say) started it
        # with a different thread count, run() refuses to start; reset it and run once more
        Highs.resetGlobalScheduler(True)
        run()
    return h


#: LPs with at least this many matrix entries run in a worker thread (:func:`interruptible_run`): the global
#: tree LP of V = 6 ``3,2`` wor ran > 10 minutes, and Ctrl-C did nothing while HiGHS held the main thread.
INTERRUPTIBLE_NONZEROS = 10 ** 5


def interruptible_run(h):
    """``h.run()`` in a worker thread while the main thread waits, so Ctrl-C reaches Python during a long solve:
    the solve is cancelled and the KeyboardInterrupt raised.  highspy's ``cancelSolve`` only sets a flag that its
    interrupt callbacks read, and those are subscribed by ``HandleUserInterrupt = True`` (set here; no measurable
    cost: the V = 5 ``3,2`` wor global LP in 6.2–7.0 s either way) — without it the worker solved on to the end
    (where the bindings lack both, the solve is left to end with the process)."""
    if hasattr(type(h), "HandleUserInterrupt"):
        h.HandleUserInterrupt = True
    done, out = threading.Event(), []

    def work():
        try:
            out.append(h.run())
        except BaseException as err:            # handed to the caller's thread
            out.append(err)
        finally:
            done.set()

    threading.Thread(target=work, daemon=True).start()
    try:
        while not done.wait(0.1):
            pass
    except KeyboardInterrupt:
        if hasattr(h, "cancelSolve"):
            h.cancelSolve()
            done.wait(1.0)
        raise
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def _basic_solution(A: sp.csc_matrix, basis, lp) -> np.ndarray:
    """``x`` of a HiGHS basis (:func:`solve_lp`'s ``vertex``): ``x_N`` at its bounds, then
    ``A[nonbasic rows, basic] x_B = bound − A[nonbasic rows, nonbasic] x_N``."""
    highspy, _ = bindings()
    status = highspy.HighsBasisStatus
    col, row = list(basis.col_status), list(basis.row_status)
    at_upper = lambda s: s == status.kUpper                          # noqa: E731  (kLower, kZero: lower bound)
    x = np.where([at_upper(s) for s in col], lp.col_upper_, lp.col_lower_)
    basic = np.array([s == status.kBasic for s in col])
    tight = np.array([s != status.kBasic for s in row])
    x[basic] = 0.0
    x[np.abs(x) >= highspy.kHighsInf] = 0.0                           # free nonbasic columns sit at 0
    bound = np.where([at_upper(s) for s in row], lp.row_upper_, lp.row_lower_)[tight]
    A = A.tocsr()
    system = A[tight][:, basic].toarray()
    if basic.any():
        x[basic] = np.linalg.solve(system, bound - A[tight] @ x)
    return x


#: Largest bound excess of a ``vertex=True`` answer (round-off of one dense solve: 1.9e-12 seen on a peaky row,
#: ``tests/solvers/test_alpha_star_grid.py``): beyond it the basis HiGHS called optimal is infeasible (within HiGHS'
#: own 1e-10, e.g. a CondOT row of Q_k = 8.9e-11 taken whole) and is refused.
VERTEX_TOL = 1e-11


def _bound_excess(values, lower, upper) -> float:
    """How far ``values`` lie outside ``[lower, upper]`` (HiGHS' ±kHighsInf: no bound), at most; 0 inside; NaN where
    a value is NaN."""
    return float(np.max(np.maximum(lower - values, values - upper), initial=0.0))


def nonnegative_multipliers(duals) -> np.ndarray:
    """HiGHS' row duals as the multipliers ``y ≥ 0`` of a weak-duality bound (NaN, ±inf and negatives → 0): any
    such ``y`` gives a valid bound, HiGHS' own duals a tight one."""
    y = np.nan_to_num(np.asarray(duals, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    return np.maximum(y, 0.0)


def _finite_or_inf(values, n: int, name: str) -> np.ndarray:
    """Bounds ``values`` (a scalar or n of them, ±inf for none) as HiGHS reads them; ValueError otherwise."""
    inf = bindings()[0].kHighsInf
    raw = np.asarray(values, dtype=np.float64)
    if raw.ndim > 1 or raw.size not in (1, n) or np.isnan(raw).any():
        raise ValueError(f"solve_lp: {name} must be a number or {n} of them (±inf for no bound, no NaN), got "
                         f"shape {raw.shape}")
    arr = np.broadcast_to(raw, (n,)).copy()
    arr[arr == np.inf] = inf
    arr[arr == -np.inf] = -inf
    return arr


_BANNER_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def silence_banner() -> None:
    """Create the process's first ``Highs`` object with stdout closed: HiGHS prints its version banner on the
    first construction, before any option can be set, and it would corrupt ``--json`` output.  Threads whose
    first solves start together each run this (``lru_cache`` does not serialise them); the lock keeps one
    thread from saving the descriptor another has pointed at ``/dev/null``, which would close stdout for good."""
    with _BANNER_LOCK:
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                bindings()[1]()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
