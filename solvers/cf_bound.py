"""The conditional-framework optimum CF (theory.md §6.4): the best E[τ] of any verifier of §6.1.

A verifier of the conditional framework hands every node X a scaling ``ρ_X`` and, for the realised child
tuple ``S``, a plan ``w(S)`` whose token marginal is CondOT(ρ)-feasible; children are attempted in drafting
order, child j with scaling ``s_j = π(S,j)/R_j(S)`` where ``π(S,j) = Q_k(S)·w_j(S)`` and
``R_j(S) = Q_k(S) − Σ_{l<j} π(S,l)`` (``R_j/Q_k(S)`` = Pr(child j is attempted | S)).

**Value functions.**  ``G_X(ρ)`` = expected number of accepted tokens *in X's subtree, X included*, when
X is entered with scaling ρ (X is on the accepted path w.p. exactly ρ, by the §6.1 theorem):

.. math::
    G_{leaf}(ρ) = ρ, \\qquad
    G_X(ρ) = ρ + \\max_{π ∈ CondOT(ρ)} \\sum_S \\sum_j R_j(S)\\,Ḡ_{c_j}\\big(π(S,j)/R_j(S)\\big),

where ``Ḡ_c`` is the child's value at prefix ``s·y_j`` averaged over its random subtree (for an internal
child this average is already inside ``G_c``).  The term ``R_j·Ḡ_{c_j}(π/R_j)`` is child j's expected
accepted tokens: attempted w.p. ``R_j/Q_k``, then ``G_c(s_j)``.  The root is entered with ρ = 1 and its own
"token" is the context, so **CF = G_root(1) − 1 = E[τ]**.  Checks: depth 1 → ``Σ π = α*``; a chain
(k = 1) → the unique plan ``w = min(1, ρp/q)`` per node, i.e. Block Verification's ``Σ_i E[w_i]``.

**Computation.**  Each ``G_X`` is concave piecewise linear in ρ (a parametric LP whose feasible set scales
with ρ, with concave PL children).  A concave PL ``Ḡ`` given by breakpoints enters the node problem as
hypograph rows ``t ≤ m_i·π + b_i·R`` (the perspective of ``min_i(m_i x + b_i)``), so every node problem is
an LP.  Breakpoints are found by the tangent/chord *sandwich*: on an interval [a, b] with values and
supergradients (LP duals), the two tangents meet at x*; if the tangent value there exceeds the chord by
less than ``tol`` the chord is exact to ``tol`` on [a, b], otherwise x* is evaluated and both halves are
refined.  For an exactly PL function this stops at its true breakpoints, so the chord interpolant *is* G up
to LP tolerance.  CF needs the model at undrafted prefixes: it is a bound, not an algorithm.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from univer_theory.alpha_star import alpha_star
from univer_theory.models import Model, check_model_type
from univer_theory.processes import PROCESSES, tuple_law
from univer_theory.tree import as_shape, split_key
from univer_theory.validation import check_choice

from .condot import node_lp_tuples
from .global_lp import model_rows
from .highs_lp import nonnegative_multipliers, solve_lp

#: Sandwich stopping gap per value function (tangent envelope − chord, absolute).
SANDWICH_TOL = 1e-11
#: Safety cap on LP evaluations per value function.
MAX_EVALUATIONS = 400
#: The α*-face is imposed as ``Σ π ≥ α* − slack`` (HiGHS' feasibility tolerance is 1e-10 below it).
ALPHA_FLOOR_SLACK = 1e-10
#: Slacks tried in turn when HiGHS calls the face LP infeasible (tuple probabilities ~1e-10 make ``α*`` itself
#: reachable only within round-off).  A looser floor admits more plans, so the value stays an upper bound.
FACE_SLACKS = (ALPHA_FLOOR_SLACK, 1e-9, 1e-8)
#: Draft tuples of a node LP above which CF refuses (ValueError) instead of solving: HiGHS' time grows about
#: quadratically in them (k = 3 i.i.d. on the 2-core AMD host: V = 20, 8 000 tuples, 9 s; V = 30, 27 000, 105 s),
#: so this is about two minutes a node, and ``condot_lp``'s 10⁵ would be ~25 minutes.
MAX_CF_NODE_TUPLES = 3 * 10 ** 4


@dataclass(frozen=True)
class ValueFunction:
    """Concave PL ``G`` on [0, 1] by its breakpoints; ``pieces()`` = chords as ``(slopes, intercepts)``."""

    rho: np.ndarray      # breakpoints, increasing, from 0 to 1
    value: np.ndarray    # G at the breakpoints
    gap: float           # final sandwich gap (≤ tol unless the evaluation cap was hit)

    def __call__(self, rho):
        return np.interp(rho, self.rho, self.value)

    def pieces(self) -> tuple[np.ndarray, np.ndarray]:
        slopes = np.diff(self.value) / np.diff(self.rho)
        return slopes, self.value[:-1] - slopes * self.rho[:-1]


LEAF = ValueFunction(np.array([0.0, 1.0]), np.array([0.0, 1.0]), 0.0)


class NodeProblem:
    """The CF node LP at one node for every ρ: fixed (p, q, process, children's ``Ḡ``), RHS ``ρ·p``.

    Columns: ``π(S, j)`` then ``t(S, j)``, tuple-major.  Rows: cumulative ``Σ_{l≤j} π(S,l) ≤ Q_k(S)``;
    marginals ``Σ_{S_j = y} π(S,j) ≤ ρ p(y)``; hypographs ``t − m_i π(S,j) + b_i Σ_{l<j} π(S,l) ≤ b_i Q_k(S)``;
    last, the acceptance floor ``−Σ π ≤ −α*(ρ) + slack`` (inactive unless :meth:`solve` is asked for the α*-face).
    Maximise ``Σ t``.
    """

    def __init__(self, target_probs: np.ndarray, draft_probs: np.ndarray, k: int, process: str, child_value):
        count = node_lp_tuples(np.asarray(draft_probs), k, process)
        if count > MAX_CF_NODE_TUPLES:
            raise ValueError(f"cf_bound: a node LP over {count} draft tuples (k = {k}, {process}) exceeds "
                             f"MAX_CF_NODE_TUPLES = {MAX_CF_NODE_TUPLES:.0e}: CF is for small vocabularies and trees")
        law = tuple_law(draft_probs, k, process)
        self.target = np.asarray(target_probs, dtype=np.float64)
        self.draft = np.asarray(draft_probs, dtype=np.float64)
        self.k, self.process = k, process
        self.tuples = [S for S, _ in law]
        self.probs = np.array([float(x) for _, x in law])
        nS = len(self.tuples)
        n_pi = nS * k
        ri, rj, rv, ub = [], [], [], []
        # cumulative
        for s in range(nS):
            for j in range(k):
                r = s * k + j
                ri += [r] * (j + 1)
                rj += [s * k + l for l in range(j + 1)]
                rv += [1.0] * (j + 1)
        ub.append(np.repeat(self.probs, k))
        row = n_pi
        # marginals
        self.tokens = np.unique([y for S in self.tuples for y in S])
        tok_row = {int(y): row + i for i, y in enumerate(self.tokens)}
        for s, S in enumerate(self.tuples):
            for j, y in enumerate(S):
                ri.append(tok_row[y]), rj.append(s * k + j), rv.append(1.0)
        self.marginal_rows = np.arange(row, row + self.tokens.size)
        ub.append(np.zeros(self.tokens.size))  # placeholder, set per ρ
        row += self.tokens.size
        # hypographs
        self.first_hypograph = row
        hypograph_t = []                         # per hypograph row, the (S, j) of its t column
        top = np.zeros(n_pi)                     # max Ḡ of the child at (S, j): t(S, j) ≤ Q_k(S)·top
        for s, S in enumerate(self.tuples):
            for j, y in enumerate(S):
                g = child_value(j, y)
                top[s * k + j] = float(np.max(g.value))
                m, b = g.pieces()
                rows = row + np.arange(m.size)
                t_col = n_pi + s * k + j
                ri += list(rows); rj += [t_col] * m.size; rv += [1.0] * m.size
                ri += list(rows); rj += [s * k + j] * m.size; rv += list(-m)
                for l in range(j):
                    ri += list(rows); rj += [s * k + l] * m.size; rv += list(b)
                ub.append(b * self.probs[s])
                hypograph_t += [s * k + j] * m.size
                row += m.size
        self.hypograph_t = np.array(hypograph_t, dtype=np.int64)
        # acceptance floor
        ri += [row] * n_pi; rj += list(range(n_pi)); rv += [-1.0] * n_pi
        ub.append(np.zeros(1))
        row += 1
        self.A = sp.csc_matrix((rv, (ri, rj)), shape=(row, 2 * n_pi))
        self.upper = np.concatenate(ub)
        self.cost = np.concatenate([np.zeros(n_pi), np.ones(n_pi)])
        self.n_pi = n_pi
        # implied column bounds of the certified value (:meth:`certified`): 0 ≤ π(S, j) ≤ Q_k(S) and
        # 0 ≤ t(S, j) ≤ Q_k(S)·max Ḡ (a concave Ḡ ≥ 0 through its perspective, ``R·Ḡ(π/R)`` at most ``Q_k(S)·max Ḡ``)
        self.column_upper = np.concatenate([np.repeat(self.probs, k), np.repeat(self.probs, k) * np.maximum(top, 0.0)])
        self.abs_A = abs(self.A)                 # for the round-off margin of :meth:`certified`, formed once

    def certified(self, upper: np.ndarray, row_dual: np.ndarray) -> float:
        """An upper bound on the node LP's optimum from any row multipliers ``y ≥ 0`` (HiGHS' duals, clipped):
        weak duality over the columns' implied bounds, ``u·y + Σ_c max(0, c_c − (Aᵀy)_c)·ub_c`` — valid whatever
        HiGHS' tolerances, presolve or dropped small entries did to its own answer (on confident rows, whose useful
        tuples have probabilities ~1e-8, its objective came out up to 2.5e-8 low and CF below UniVer).  Summed with
        ``math.fsum`` plus a round-off margin."""
        y = nonnegative_multipliers(row_dual)
        used = y > 0
        reduced = self.cost - self.A.T @ y
        terms = np.concatenate([upper[used] * y[used], np.maximum(reduced, 0.0) * self.column_upper])
        size = math.fsum(np.abs(terms)) + math.fsum(self.abs_A.T @ y * self.column_upper)
        return math.fsum(terms) + 4 * np.finfo(np.float64).eps * (self.A.shape[0] + 2) * size

    def row_upper(self, rho: float) -> np.ndarray:
        """The rows' right-hand sides at ``ρ``: the marginals ``ρ·p(y)``, the others as built."""
        upper = self.upper.copy()
        upper[self.marginal_rows] = rho * self.target[self.tokens]
        return upper

    def feasible_value(self, rho: float, x: np.ndarray) -> float:
        """A lower bound on the node LP's optimum at ``ρ`` (off the α*-face) from HiGHS' point ``x``, which may break
        a row by up to HiGHS' feasibility tolerance (1.1e-9 seen, its objective then above the optimum): ``π`` clipped
        to ≥ 0 and each column scaled down by the smallest ``upper/load`` of the cumulative and marginal rows it
        enters (their entries are 1, so every such row then holds; one factor for every column, the smallest over all
        rows, gave up the whole plan to a tuple of Q_k ~ 1e-12 overfilled by round-off: margins of 0.68), then each
        ``t(S, j)`` the largest its hypograph rows allow — a feasible point, whose ``Σ t`` is summed with
        ``math.fsum``."""
        upper = self.row_upper(rho)
        pi = np.clip(x[:self.n_pi], 0.0, None)
        h = self.first_hypograph
        rows = self.A[:h, :self.n_pi].tocoo()
        load = rows @ pi
        over = load > upper[:h]
        if over.any():
            factor = np.where(over, upper[:h] / np.where(over, load, 1.0), 1.0) * (1.0 - 4 * np.finfo(np.float64).eps)
            shrink = np.ones(self.n_pi)
            np.minimum.at(shrink, rows.col, factor[rows.row])
            pi = pi * shrink
        room = upper[h:-1] - self.A[h:-1, :self.n_pi] @ pi
        t = np.full(self.n_pi, np.inf)
        np.minimum.at(t, self.hypograph_t, room)
        return math.fsum(t)

    def solve(self, rho: float, on_face: bool = False):
        """``(G(ρ), supergradient dG/dρ, π [n_S, k], LPSolution)``; with ``on_face`` only α*(ρ)-optimal plans
        compete (``Σ π ≥ α*(ρ) − slack``, the first slack of :data:`FACE_SLACKS` HiGHS solves; the supergradient then
        ignores the floor's ρ-dependence).  Raises RuntimeError when HiGHS solves none (after its re-solves)."""
        upper = self.row_upper(rho)
        face = float(alpha_star(self.target, self.draft, self.k, self.process, rho)) if on_face else None
        for slack in FACE_SLACKS if on_face else (None,):
            if on_face:
                upper[-1] = min(0.0, slack - face)
            sol = solve_lp(self.cost, self.A, -np.inf, upper,
                           np.concatenate([np.zeros(self.n_pi), np.full(self.n_pi, -np.inf)]), np.inf, method="simplex")
            if sol.success:
                break
        if not sol.success:
            what = f"the α*-face LP (floor relaxed down to α* − {FACE_SLACKS[-1]:g})" if on_face else "the node LP"
            raise RuntimeError(f"cf_bound: {what} at ρ={rho}: HiGHS returned {sol.message}")
        slope = 1.0 + float(sol.row_dual[self.marginal_rows] @ self.target[self.tokens])
        pi = np.clip(sol.x[:self.n_pi], 0.0, None).reshape(len(self.tuples), self.k)
        return rho + max(sol.objective, self.certified(upper, sol.row_dual)), slope, pi, sol


def sandwich(evaluate, tol: float = SANDWICH_TOL, max_evaluations: int = MAX_EVALUATIONS) -> ValueFunction:
    """Breakpoints of a concave PL function on [0, 1] from ``evaluate(ρ) -> (value, supergradient)``."""
    pts = {0.0: evaluate(0.0), 1.0: evaluate(1.0)}
    stack, worst = [(0.0, 1.0)], 0.0
    while stack:
        a, b = stack.pop()
        (fa, ga), (fb, gb) = pts[a], pts[b]
        chord = (fb - fa) / (b - a)
        if ga - gb <= 1e-14:
            continue  # tangents parallel: G is linear on [a, b]
        x = (fb - fa + ga * a - gb * b) / (ga - gb)
        x = min(max(x, a), b)
        gap = fa + ga * (x - a) - (fa + chord * (x - a))
        if gap <= tol or x - a < 1e-13 or b - x < 1e-13:
            worst = max(worst, gap)
            continue
        if len(pts) >= max_evaluations:
            worst = max(worst, gap)
            continue
        pts[x] = evaluate(x)
        stack += [(a, x), (x, b)]
    xs = np.array(sorted(pts))
    xs, values = concave_majorant(xs, np.array([pts[x][0] for x in xs]))
    return ValueFunction(xs, values, worst)


def concave_majorant(rho: np.ndarray, value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The breakpoints of the least concave majorant of ``(rho, value)`` (rho increasing; both ends kept).

    The node LPs enter ``Ḡ`` as the *minimum of its chord lines*, which equals the interpolant only when the chord
    slopes decrease.  LP error and round-off (~1e-16 in G) over breakpoints ~1e-11 apart tilt a chord by ~1e-6;
    its line, extended over [0, 1], then cuts Ḡ by up to that much and CF drops below UniVer.  Points under the
    chord of their neighbours are dropped, with slopes computed exactly as :meth:`ValueFunction.pieces` does, so
    they strictly decrease; the majorant is ≤ G + the points' own error, so CF stays within its tolerance."""
    keep: list[int] = []
    for i in range(rho.size):
        while len(keep) >= 2:
            a, b = keep[-2], keep[-1]
            if (value[b] - value[a]) / (rho[b] - rho[a]) <= (value[i] - value[b]) / (rho[i] - rho[b]):
                keep.pop()
            else:
                break
        keep.append(i)
    return rho[keep], value[keep]


@dataclass(frozen=True)
class CFResult:
    """Conditional-framework optimum.

    ``value`` = G_root(1) − 1 (E[τ]); ``alpha_root_value``: the same with the root's plan restricted to the
    α*(1)-optimal face (every other node free) — the best E[τ] of any §6.1 verifier whose root attains α*, hence
    an upper bound on every verifier that attains α*(ρ) at every node (UniVer): below another method's E[τ] it
    *proves* that no such verifier reaches that method on this instance; ``functions``: {(subtree key, prefix):
    ValueFunction} of every internal non-root node; ``breakpoints`` total / ``max_breakpoints`` per function (the
    ρ-grid sizes); ``lp_solves``; ``tolerance``: bound on how far ``value`` may sit below the exact CF, propagated as
    ``δ_X = gap_X + k·max_c δ_c`` (every node value is HiGHS' objective or its weak-duality certificate, whichever is
    larger, so only the chords between breakpoints fall short); ``margin``: bound on how far ``value`` may sit
    *above* the exact CF — each node value's excess over a feasible point's (:meth:`NodeProblem.feasible_value`:
    HiGHS' point made feasible), ``μ_X = max_ρ (G_X(ρ) − feasible) + k·max_c μ_c`` (e.g. 1e-9 on a V = 6 star whose
    exact CF is α* ≤ 1, CF's ≥ 1 by that much; up to 2e-8 on confident rows, whose HiGHS points break a row by
    1e-9); ``status`` 0 ok, 1 a sandwich hit its evaluation cap;
    ``setting``: (shape, process, {prefix: the model's rows (p, q)} of every node problem) it was computed for
    (:func:`check_cf_setting`).
    """

    value: float
    alpha_root_value: float
    functions: dict = field(repr=False)
    breakpoints: int
    max_breakpoints: int
    lp_solves: int
    tolerance: float
    margin: float
    seconds: float
    status: int
    success: bool
    message: str
    setting: tuple = field(default=(), repr=False, compare=False)


def check_cf_setting(cf: CFResult, model: Model, shape, process: str, where: str) -> None:
    """ValueError unless ``cf`` was computed for this shape and process and a model with these rows at every prefix
    it read (a CF of another model or process gives value functions that fit nothing here, without an error
    downstream)."""
    shape_cf, process_cf, rows = cf.setting
    differ = [why for wrong, why in ((shape_cf != shape, f"shape {shape_cf}, not {shape}"),
                                     (process_cf != process, f"process {process_cf!r}, not {process!r}")) if wrong]
    if not differ:
        other = next((s for s, (p, q) in rows.items() if not all(
            np.array_equal(a, b) for a, b in zip(model_rows(model, s, where), (p, q)))), None)
        if other is not None:
            differ.append(f"another model (its rows at prefix {other} differ)")
    if differ:
        raise ValueError(f"{where}: cf was computed for {'; '.join(differ)}")


def cf_bound(model: Model, shape, process: str, tol: float = SANDWICH_TOL) -> CFResult:
    """CF of (model, shape, process): value functions bottom-up, then the root LP at ρ = 1 — once free (``value``)
    and once restricted to the α*(1)-optimal face (``alpha_root_value``, see :class:`CFResult`)."""
    where = "cf_bound"
    start = time.perf_counter()
    check_model_type(model, where)
    shape = as_shape(shape, where)
    check_choice(process, PROCESSES, where, "process")
    if isinstance(tol, bool) or not isinstance(tol, (int, float, np.floating)) or not 0 < tol < np.inf:
        raise ValueError(f"{where}: tol must be a finite number > 0, got {tol!r}")
    functions: dict = {}
    deltas: dict = {}                                # (key, prefix) → δ_X: how far G_X may sit below the exact one
    margins: dict = {}                               # (key, prefix) → μ_X: how far above
    counter = [0]

    def below(bounds: dict, key: str, prefix: tuple, node: NodeProblem) -> float:
        """``k · max_c`` of the children's bounds: each child term ``R_j·Ḡ_c(π/R_j)`` moves by at most ``R_j`` times
        the child's, and ``Σ_S Σ_j R_j(S) ≤ k``."""
        kids = split_key(key)
        return len(kids) * max((bounds.get((kids[j], prefix + (int(y),)), 0.0) for j in range(len(kids))
                                for y in node.tokens), default=0.0)

    rows: dict = {}                                  # prefix → the model's (p, q) as read, for the setting

    def problem(key: str, prefix: tuple) -> NodeProblem:
        p, q = rows[prefix] = model_rows(model, prefix, where)
        keys = split_key(key)
        return NodeProblem(p, q, len(keys), process, lambda j, y: value_function(keys[j], prefix + (y,)))

    def value_function(key: str, prefix: tuple) -> ValueFunction:
        if key == ".":
            return LEAF
        if (key, prefix) not in functions:
            node = problem(key, prefix)

            slack = [0.0]                           # the node values' largest excess over a feasible point's

            def evaluate(rho):
                counter[0] += 1
                g, slope, _, sol = node.solve(rho)
                slack[0] = max(slack[0], g - rho - node.feasible_value(rho, sol.x))
                return g, slope

            functions[key, prefix] = sandwich(evaluate, tol)
            deltas[key, prefix] = functions[key, prefix].gap + below(deltas, key, prefix, node)
            margins[key, prefix] = slack[0] + below(margins, key, prefix, node)
        return functions[key, prefix]

    root_key = shape.subtree_keys[0]
    root = problem(root_key, ())
    g_root, _, _, sol = root.solve(1.0)
    g_face, _, _, _ = root.solve(1.0, on_face=True)
    g_face = min(g_face, g_root)     # the face is the free LP and one more row, g_root a certified bound of it
    counter[0] += 2
    tolerance = below(deltas, root_key, (), root)
    margin = g_root - 1.0 - root.feasible_value(1.0, sol.x) + below(margins, root_key, (), root)
    sizes = [f.rho.size for f in functions.values()] or [0]
    capped = any(f.gap > tol for f in functions.values())
    where_cf = f"value within {tolerance:.1e} below and {margin:.1e} above the exact CF"
    message = (f"breakpoint search hit the cap of {MAX_EVALUATIONS} evaluations; {where_cf}" if capped
               else f"converged; {where_cf}")
    return CFResult(g_root - 1.0, g_face - 1.0, functions, int(sum(sizes)), int(max(sizes)), counter[0], tolerance,
                    margin, time.perf_counter() - start, int(capped), not capped, message,
                    (shape, process, rows))
