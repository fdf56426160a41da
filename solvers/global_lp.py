"""The global tree LP (theory.md §4.3): the best E[τ] of ANY lossless verifier of drafted trees.

Enumerate every tree ``T`` of (model, shape, process) with its probability ``Q(T)``.  Variables
``A_T(u) ∈ [0, 1]`` for the non-root nodes (``A_T(root) = 1``) with, per tree,

.. math::  \\sum_{v \\in \\mathrm{children}(u)} A_T(v) \\le A_T(u),

aggregated ``a(s) = Σ_T Q(T) Σ_{u ∈ T spelling s} A_T(u)`` with ``a(s·y) ≤ p(y|s)·a(s)`` for every drafted
``s·y`` (``a(()) = 1``), and objective ``max Σ_{s ≠ ()} a(s) = E[τ]``.  Nodes are indexed by *position*:
i.i.d. duplicate children are distinct nodes with their own subtrees.  The value equals α* at depth 1 and
Block Verification on chains; it may exceed every verifier that sees only the realised tree.

**Structure (used for exact reductions).**  With ``f_u = A_T(u) − Σ_{children v} A_T(v) ≥ 0`` (the mass
stopping at u) the tree constraints say ``f ≥ 0, Σ_u f_u = 1``: the tree's polytope is a simplex whose
vertices are the root→u paths.  So tree T contributes ``Q(T)·C_T`` to the vector ``a`` with
``C_T = conv{χ(w) : w ∈ W_T ∪ {()}}``, ``W_T`` the set of strings its nodes spell and ``χ(w)`` the indicator
of the non-empty prefixes of w.  Consequences:

* trees with the same string set ``W_T`` merge into one of weight ``Σ Q`` (``Q·C + Q'·C = (Q+Q')·C``);
  ``reduce=True`` does this (i.i.d. duplicates and sibling orderings collapse);
* the LP is then built literally on one representative per class: one column per node, sparse rows,
  plus one column ``a(s)`` per drafted string tied to the nodes by an equality row.  HiGHS silently drops
  matrix entries below its ``small_matrix_value`` (1e-9), so a class with ``Q(T) <`` :data:`COEF_FLOOR` gets
  the columns ``A_T(u)·Q(T)/COEF_FLOOR`` (tree rows ``≤ Q(T)/COEF_FLOOR`` at the root) and the entry
  ``COEF_FLOOR`` in ``a(s) − Σ …``: as entries ``Q(T)``, every tree with ``Q(T) < 1e-9`` fell out of the LP
  (5.8e-8 of E[τ] on a V = 3 greedy instance with q(y) = 6.4e-9, 3.7e-7 on deviations item 23's instance).

**Certified value.**  For any ``μ ≥ 0`` on the edge rows, with ``w(s) = 1 − μ(s) + Σ_y p(y|s)·μ(s·y)``,

.. math::  E[τ] \\le \\sum_{y} μ(y)·p(y) + \\sum_T Q(T)·\\max(0, \\max_{u ∈ T} \\sum_{v ∈ root→u} w(s(v)))

(Lagrangian of the edge rows; the max is over the vertices of the tree's simplex).  ``value`` is this bound at
HiGHS' edge-row duals, recomputed from the true data with a round-off margin: an upper bound on every lossless
verifier whatever HiGHS' tolerances did, and ``tolerance = value − primal_value`` bounds its excess over the
LP optimum (``primal_value``: the rechecked feasible point's ``Σ a(s)``).

Note that nodes spelling the same string give *identical* vertices: the position-indexed LP equals a trie
LP in which such nodes are one node whose constraint sums over its distinct children.  The pitfall of §4.3
is sharing one variable between duplicates while keeping the per-position constraints
(``Σ_{positions} A ≤ A(parent)`` counts the shared variable once per copy) and counting it once in ``a``:
``merge_duplicates=True`` reproduces it, for demonstration only.

The trees are produced as token arrays (``enumerate_tree_arrays``), in exactly the order and with the
probabilities of :func:`univer_theory.processes.enumerate_trees`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from univer_theory.models import Model, check_model_type, checked_rows
from univer_theory.processes import PROCESSES, tuple_law
from univer_theory.tolerance import exceeds
from univer_theory.tree import TreeShape, as_shape
from univer_theory.validation import check_choice

from .highs_lp import LP_METHODS, nonnegative_multipliers, solve_lp

#: Feasibility tolerance of the recheck of a returned solution (HiGHS runs at 1e-10).
RECHECK_TOL = 1e-9
#: Largest drop of E[τ] accepted from repairing HiGHS' point into a feasible one (:func:`_repair`), and largest
#: gap accepted between the certified bound and that feasible point.
REPAIR_TOL = 1e-5
#: Smallest coefficient Q(T)/scale put in the matrix: HiGHS drops entries below its small_matrix_value (1e-9).
COEF_FLOOR = 1e-8


def model_rows(model: Model, prefix: tuple, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``(p(·|s), q(·|s))`` as validated float64 rows of length ``model.vocab_size``."""
    p, q = checked_rows(model, prefix, where)
    return np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)


@dataclass(frozen=True)
class TreeArrays:
    """All trees of one shape as arrays.

    ``tokens [n_trees, N]`` (column 0 is the root, −1), ``probs [n_trees]`` = Q(T), ``codes [n_trees, N]`` the
    prefix ``s(u)`` of every node as an integer (``code(s·y) = code(s)·(V+1) + y + 1``, ``code(()) = 0``);
    ``process`` and ``drafts`` (prefix code → the draft row Q(T) was built from) record the setting, so that a
    caller's trees can be checked against another (:func:`check_trees_setting`).
    """

    shape: TreeShape
    vocab_size: int
    tokens: np.ndarray
    probs: np.ndarray
    codes: np.ndarray
    process: str = ""
    drafts: dict = field(default_factory=dict)

    @property
    def num_trees(self) -> int:
        return self.probs.size

    def prefix(self, code: int) -> tuple[int, ...]:
        """Decode a prefix code back to its token tuple."""
        out = []
        while code:
            code, r = divmod(int(code), self.vocab_size + 1)
            out.append(r - 1)
        return tuple(reversed(out))


#: Most trees :func:`enumerate_tree_arrays` builds (each a row of N tokens and N prefix codes; the LP has a
#: variable per tree and node).  The largest benchmarked case, V = 5 ``3,2`` wor, is 4.8·10⁵ trees (17 s); V = 6
#: ``3,2`` wor (3.2·10⁶) ran past 10 minutes, and further on the arrays alone outgrow a workstation's memory (V = 8
#: ``3,3`` wor: 1.3·10¹⁰ trees, 95 GiB of arrays at its last node), so it is refused as the count passes this.
MAX_TREES = 10 ** 6


def enumerate_tree_arrays(model: Model, shape, process: str) -> TreeArrays:
    """Every tree of ``shape`` with ``Q(T) > 0`` (float64), vectorised.

    Internal nodes are filled in node order; each partial tree is replaced by its block of child tuples,
    so the row order is that of :func:`univer_theory.processes.enumerate_trees`.  ``tuple_law`` is called
    once per distinct prefix, not per tree.  A ValueError as soon as the partial trees number more than
    :data:`MAX_TREES`.
    """
    where = "enumerate_tree_arrays"
    check_model_type(model, where)
    shape = as_shape(shape, where)
    check_choice(process, PROCESSES, where, "process")
    V, N = model.vocab_size, shape.num_nodes
    if (V + 1) ** (shape.max_depth + 1) >= 2 ** 62:
        raise ValueError(f"{where}: vocab {V} and depth {shape.max_depth} overflow the int64 prefix codes")
    tokens = np.full((1, N), -1, dtype=np.int64)
    codes = np.zeros((1, N), dtype=np.int64)
    probs = np.ones(1)
    arrays = TreeArrays(shape, V, tokens, probs, codes, process)
    for u in range(N):
        kids = list(shape.children[u])
        if not kids:
            continue
        uniq, inv = np.unique(codes[:, u], return_inverse=True)
        for c in uniq:
            arrays.drafts[int(c)] = model_rows(model, arrays.prefix(c), where)[1]
        laws = [tuple_law(arrays.drafts[int(c)], len(kids), process) for c in uniq]
        width = max(len(law) for law in laws)
        tup = np.zeros((uniq.size, width, len(kids)), dtype=np.int64)
        pr = np.zeros((uniq.size, width))
        for g, law in enumerate(laws):
            tup[g, :len(law)] = [S for S, _ in law]
            pr[g, :len(law)] = [float(x) for _, x in law]
        counts = np.array([len(law) for law in laws])[inv]
        if counts.sum() > MAX_TREES:
            raise ValueError(f"{where}: shape {shape} over vocab {V} ({process}) has more than {int(counts.sum()):.3g} "
                             f"trees (at node {u} of {N}), above MAX_TREES = {MAX_TREES:.0e}: the global tree LP is "
                             f"for small vocabularies and trees")
        rep = np.repeat(np.arange(probs.size), counts)
        within = np.arange(rep.size) - np.repeat(np.cumsum(counts) - counts, counts)
        g = inv[rep]
        tokens, codes, probs = tokens[rep], codes[rep], probs[rep] * pr[g, within]
        tokens[:, kids] = tup[g, within]
        codes[:, kids] = codes[:, [u]] * (V + 1) + tokens[:, kids] + 1
    return TreeArrays(shape, V, tokens, probs, codes, process, arrays.drafts)


def check_trees_setting(trees: TreeArrays, model: Model, shape: TreeShape, process: str, where: str) -> None:
    """ValueError unless ``trees`` were enumerated for this shape, process, vocabulary and the model's draft rows
    (at every prefix they read: Q(T) depends on nothing else)."""
    checks = ((trees.shape == shape, f"shape {trees.shape}, not {shape}"),
              (trees.process == process, f"process {trees.process!r}, not {process!r}"),
              (trees.vocab_size == model.vocab_size, f"vocab {trees.vocab_size}, not {model.vocab_size}"))
    for ok, what in checks:
        if not ok:
            raise ValueError(f"{where}: trees were enumerated for {what}")
    if not trees.drafts and any(shape.children):
        raise ValueError(f"{where}: trees carry no record of the draft rows they were enumerated from (build them "
                         f"with enumerate_tree_arrays)")
    for code, q in trees.drafts.items():
        if not np.array_equal(model_rows(model, trees.prefix(code), where)[1], q):
            raise ValueError(f"{where}: trees were enumerated from another model's draft row at prefix "
                             f"{trees.prefix(code)}")


def trie_classes(trees: TreeArrays) -> tuple[np.ndarray, np.ndarray]:
    """``(representative row per class, class weight Σ Q(T))`` for trees with the same string set ``W_T``."""
    n = trees.num_trees
    strings = np.sort(trees.codes[:, 1:], axis=1)
    strings[:, 1:][strings[:, 1:] == strings[:, :-1]] = -1  # drop repeated strings, keep a fixed width
    strings = np.ascontiguousarray(np.sort(strings, axis=1))
    keys = strings.view(np.dtype((np.void, strings.dtype.itemsize * strings.shape[1]))).ravel()
    _, first, cls = np.unique(keys, return_index=True, return_inverse=True)
    return first, np.bincount(cls.reshape(n), weights=trees.probs)


@dataclass(frozen=True)
class _PrefixTable:
    """Distinct non-root strings: ``pid [n, N−1]`` of every node, parent index (−1: the root), ``p(y|s)``."""

    codes: np.ndarray
    pid: np.ndarray
    parent: np.ndarray
    p_edge: np.ndarray

    @property
    def size(self) -> int:
        return self.codes.size


def _prefix_table(model: Model, trees: TreeArrays, codes: np.ndarray, where: str) -> _PrefixTable:
    node_codes = codes[:, 1:]
    prefixes, pid = np.unique(node_codes, return_inverse=True)
    base = model.vocab_size + 1
    parent_code, last = prefixes // base, prefixes % base - 1
    parent = np.where(parent_code == 0, -1, np.searchsorted(prefixes, parent_code))
    rows = {c: model_rows(model, trees.prefix(c), where)[0] for c in np.unique(parent_code)}
    p_edge = np.array([rows[c][y] for c, y in zip(parent_code, last)])
    return _PrefixTable(prefixes, pid.reshape(node_codes.shape), parent, p_edge)


def _edge_rows(table: _PrefixTable, col0: int) -> tuple[tuple, np.ndarray]:
    """Rows ``a(s·y) − p(y|s)·a(s) ≤ rhs`` on columns ``col0 + prefix index`` (rhs = p(y) at the root)."""
    P = table.size
    inner = table.parent >= 0
    i = np.concatenate([np.arange(P), np.flatnonzero(inner)])
    j = np.concatenate([np.arange(P), table.parent[inner]]) + col0
    v = np.concatenate([np.ones(P), -table.p_edge[inner]])
    return (i, j, v), np.where(inner, 0.0, table.p_edge)


@dataclass(frozen=True)
class GlobalLPResult:
    """Optimum of the global tree LP.

    ``value``: a certified upper bound on the LP optimum, hence on E[τ] of every lossless verifier (the dual
    bound of the module docstring at HiGHS' duals, recomputed exactly up to a round-off margin; with
    ``merge_duplicates`` the pitfall's primal value instead); ``primal_value``: ``Σ_s a(s)`` of the rechecked
    feasible point (≤ the LP optimum); ``tolerance``: ``value − primal_value`` (the LP optimum lies between);
    ``trees``: enumerated trees; ``classes``: trees left after merging equal string sets (the LP's blocks);
    ``variables`` / ``constraints``: LP size; ``seconds``: enumeration + build + solve (``solve_seconds``:
    HiGHS alone); ``acceptance``: ``a(s)`` per drafted string; ``lp_objective``: HiGHS' own objective (its point
    may break unscaled rows by ~1e-7; ``primal_value`` is that of the repaired feasible point, at most
    :data:`REPAIR_TOL` lower, see :func:`_repair`); ``status`` 0 optimal and rechecked,
    1 HiGHS not optimal, 4 recheck failed, ``tolerance`` > :data:`REPAIR_TOL`, or no finite certificate (``value``
    is then ``primal_value``, no bound).
    """

    value: float
    trees: int
    classes: int
    variables: int
    constraints: int
    seconds: float
    solve_seconds: float
    acceptance: dict
    status: int
    success: bool
    message: str
    lp_objective: float = float("nan")
    primal_value: float = float("nan")
    tolerance: float = float("nan")


def global_tree_lp(model: Model, shape, process: str, *, reduce: bool = True, merge_duplicates: bool = False,
                   method: str = "simplex", trees: TreeArrays | None = None) -> GlobalLPResult:
    """Solve the global tree LP of theory.md §4.3 with HiGHS.

    Parameters
    ----------
    model, shape, process : the drafting setting (``shape`` a :class:`TreeShape` or its text form).
    reduce : merge trees with the same string set first (exact, see the module docstring).
    merge_duplicates : reproduce the *known pitfall* (see the module docstring); never a bound.
    method : HiGHS algorithm, one of :data:`solvers.highs_lp.LP_METHODS` (dual simplex was the fastest
        measured, see ``benchmarks/bench_global_lp.py``).
    trees : pre-enumerated trees of this setting (benchmarks reuse them; :func:`check_trees_setting`); default
        enumerates.
    """
    where = "global_tree_lp"
    start = time.perf_counter()
    check_model_type(model, where)
    check_choice(method, LP_METHODS, where, "method")
    shape = as_shape(shape, where)
    if trees is None:
        trees = enumerate_tree_arrays(model, shape, process)
    else:
        check_trees_setting(trees, model, shape, process, where)
    if reduce and not merge_duplicates:
        rows, weights = trie_classes(trees)
        codes = trees.codes[rows]
    else:
        codes, weights = trees.codes, trees.probs
    table = _prefix_table(model, trees, codes, where)
    n, m, P = codes.shape[0], shape.num_nodes - 1, table.size
    t0 = time.perf_counter()
    a, status, message, objective, bound = _solve(shape, table, weights, merge_duplicates, method)
    solve_seconds = time.perf_counter() - t0
    viol = float(np.max(a - _edge_bound(table, a), initial=0.0))
    if status == 0 and exceeds(viol, RECHECK_TOL):
        status, message = 4, f"the solution violates a(s·y) ≤ p(y|s)·a(s) by {viol:.2e} > {RECHECK_TOL:g}"
    elif status == 0:
        message += f"; recheck max violation {viol:.1e}"
    primal = float(a.sum())
    value = float(max(bound, primal)) if np.isfinite(bound) else primal  # bound ≥ optimum ≥ primal up to round-off
    if status == 0 and not merge_duplicates and not np.isfinite(bound):   # (min(inf, nan) kept inf: NaN or overflow)
        status, message = 4, "no certified bound: the certificate at HiGHS' duals is not finite"
    elif status == 0 and exceeds(value - primal, REPAIR_TOL):
        status, message = 4, f"the certified bound exceeds the feasible point by {value - primal:.2e} > {REPAIR_TOL:g}"
    elif status == 0 and not merge_duplicates:
        message += f"; certified bound {value - primal:.1e} above the feasible point"
    n_tree_rows = n * sum(1 for u in range(shape.num_nodes) if shape.children[u])
    return GlobalLPResult(value, trees.num_trees, n, n * m + P, n_tree_rows + 2 * P,
                          time.perf_counter() - start, solve_seconds,
                          {trees.prefix(c): float(v) for c, v in zip(table.codes, a)}, status, status == 0, message,
                          objective, primal, value - primal)


def _solve(shape: TreeShape, table: _PrefixTable, weights: np.ndarray, merge_duplicates: bool, method: str):
    """The literal LP: columns ``scale_t·x[t, u]`` (one per non-root node, ``scale_t = min(1, Q_t/COEF_FLOOR)``)
    then ``a(s)``; returns ``a`` recomputed from ``x``, and the certified bound at HiGHS' edge-row duals
    (:func:`_certified_bound`), the lowest over the attempts."""
    pid = table.pid
    n, m = pid.shape
    P, N = table.size, m + 1
    own = np.arange(n)[:, None] * m + np.arange(m)[None, :]
    if merge_duplicates:  # the pitfall: node u uses the column of the first node of its tree with the same string
        var_of_node = np.arange(n)[:, None] * m + np.argmax(pid[:, :, None] == pid[:, None, :], axis=2)
    else:
        var_of_node = own
    keep = var_of_node == own  # each column counted once in a(s)
    n_x = n * m
    col_of = np.concatenate([np.full((n, 1), -1), var_of_node], axis=1)
    ri, rj, rv, upper = [], [], [], []
    row = 0
    for u in range(N):  # (1) Σ_children x − x_u ≤ 0   (root: Σ_children x ≤ 1)
        kids = shape.children[u]
        if not kids:
            continue
        rows_u = row + np.arange(n)
        for c in kids:
            ri.append(rows_u), rj.append(col_of[:, c]), rv.append(np.ones(n))
        if u:
            ri.append(rows_u), rj.append(col_of[:, u]), rv.append(-np.ones(n))
        upper.append(np.full(n, 1.0 if u == 0 else 0.0))  # for x; the LP's rows have scale·upper
        row += n
    n_tree_rows = row
    tq = np.broadcast_to(weights[:, None], (n, m))
    # column of node u of class t: scale·x, so that its entry Q(T)/scale in a(s)'s row is ≥ COEF_FLOOR
    scale = np.ones_like(weights) if COEF_FLOOR <= 0 else np.minimum(1.0, weights / COEF_FLOOR)
    coef = np.divide(weights, scale, out=np.full_like(weights, COEF_FLOOR), where=scale > 0)
    ri += [row + pid[keep], row + np.arange(P)]  # (2) a(s) − Σ y = 0
    rj += [var_of_node[keep], n_x + np.arange(P)]
    rv += [-np.broadcast_to(coef[:, None], (n, m))[keep], np.ones(P)]
    row += P
    (ei, ej, ev), rhs = _edge_rows(table, n_x)  # (3) a(s·y) − p(y|s)·a(s) ≤ rhs
    ri.append(row + ei), rj.append(ej), rv.append(ev)
    A = sp.csc_matrix((np.concatenate(rv), (np.concatenate(ri), np.concatenate(rj))), shape=(row + P, n_x + P))
    row_lower = np.concatenate([np.full(n_tree_rows, -np.inf), np.zeros(P), np.full(P, -np.inf)])
    row_q, row_s = np.tile(weights, n_tree_rows // max(n, 1)), np.tile(scale, n_tree_rows // max(n, 1))
    s_col = np.repeat(scale, m)
    tree_upper = np.concatenate(upper)
    row_upper = np.concatenate([tree_upper * row_s, np.zeros(P), rhs])

    def tree_violation(x):  # largest excess of a tree row at x, in E[τ] units (times Q(T))
        return float(np.max(row_q * (A[:n_tree_rows, :n_x] @ x - tree_upper), initial=0.0))

    def violation(x):  # largest excess of a tree row or an edge row at x
        a = np.bincount(pid[keep], weights=(tq * x[var_of_node])[keep], minlength=P)
        return max(tree_violation(x), float(np.max(a - _edge_bound(table, a), initial=0.0)))

    bound, best, tried = np.inf, None, 0
    for presolve in ("choose", "off"):  # HiGHS' presolve is where the unscaled rows drift (docs/deviations.md 23)
        sol = solve_lp(np.concatenate([np.zeros(n_x), np.ones(P)]), A, row_lower, row_upper, 0.0,
                       np.concatenate([s_col, np.full(P, np.inf)]), method=method, presolve=presolve)
        x = np.clip(np.divide(sol.x[:n_x], s_col, out=np.zeros(n_x), where=s_col > 0), 0.0, 1.0)
        tried += 1
        usable = sol.status == 0 or (sol.row_dual.size == A.shape[0] and np.isfinite(sol.x).all()
                                     and np.isfinite(sol.row_dual).all())
        if merge_duplicates or not usable:  # (a point and duals HiGHS left short of its tolerances are repaired and
            break                           # certified as an optimal one's: global_tree_lp keeps them if they agree)
        # always repaired: x = column/scale carries HiGHS' absolute error divided by scale, large on improbable
        # trees; the repair makes every row hold to round-off and costs E[τ] only in proportion to the excess
        off = violation(x) > RECHECK_TOL
        x, lost = _repair(shape, table, weights, x.reshape(n, m))
        x = x.ravel()
        bound = min(bound, _certified_bound(shape, table, weights, sol.row_dual[n_tree_rows + P:]))  # each valid
        primal = float(weights @ x.reshape(n, m).sum(axis=1))
        if best is None or primal > best[0]:
            best = (primal, x, lost, off, sol)
        if bound - best[0] <= RECHECK_TOL:  # certified bound and feasible point agree: optimal to RECHECK_TOL
            break
    if best is not None:  # the best feasible point of the attempts (a later failed attempt does not count)
        _, x, lost, off, sol = best
    status, message = sol.status, sol.message + ("" if tried == 1 else " (re-solved without presolve)")
    if best is not None:
        if status != 0:
            status, message = 0, f"HiGHS ended '{message}'; its repaired point and certified duals are used"
        if exceeds(lost, REPAIR_TOL):
            status, message = 4, (f"repairing HiGHS' point lost {lost:.1e} > {REPAIR_TOL:g} of its objective "
                                  f"{sol.objective:.12f}")
        elif off:
            message += (f"; HiGHS' point was off the unscaled LP and was repaired to a feasible one "
                        f"(HiGHS objective {sol.objective:.12f}, repaired value lower by {lost:.1e})")
    tree_viol = tree_violation(x)
    a = np.bincount(pid[keep], weights=(tq * x[var_of_node])[keep], minlength=P)  # recomputed from x
    if status == 0 and exceeds(tree_viol, RECHECK_TOL):
        status, message = 4, f"the solution violates a tree constraint by {tree_viol:.2e} > {RECHECK_TOL:g}"
    bound = bound if best is not None else np.nan
    return a, status, message, sol.objective, bound


def _certified_bound(shape: TreeShape, table: _PrefixTable, weights: np.ndarray, mu: np.ndarray) -> float:
    """The module docstring's Lagrangian bound at edge-row multipliers ``mu`` (clipped to ``≥ 0``): valid for
    any ``mu``, tight at optimal duals.  It is recomputed from the float64 data, with sums taken by ``math.fsum``
    and a margin for the rounding of ``w`` and of the path sums, so it is not below the exact value."""
    mu = nonnegative_multipliers(mu)
    inner = table.parent >= 0
    fan = np.bincount(table.parent[inner], weights=table.p_edge[inner] * mu[inner], minlength=table.size)
    w = 1.0 - mu + fan
    w_abs = 1.0 + mu + fan
    n, m = table.pid.shape
    path, path_abs = np.zeros((n, m + 1)), np.zeros((n, m + 1))
    best, best_abs = np.zeros(n), np.zeros(n)
    for u in range(1, m + 1):
        path[:, u] = path[:, shape.parent[u]] + w[table.pid[:, u - 1]]
        path_abs[:, u] = path_abs[:, shape.parent[u]] + w_abs[table.pid[:, u - 1]]
        best, best_abs = np.maximum(best, path[:, u]), np.maximum(best_abs, path_abs[:, u])
    root = mu[~inner] * table.p_edge[~inner]
    terms = np.concatenate([root, weights * best])
    scale = math.fsum(root) + math.fsum(weights * best_abs)
    fan_out = int(np.max(np.bincount(table.parent[inner]), initial=0))
    return math.fsum(terms) + 2 * np.finfo(np.float64).eps * (m + fan_out + 4) * scale


def _edge_bound(table: _PrefixTable, a: np.ndarray) -> np.ndarray:
    """``p(y|s)·a(s)`` for every drafted string ``s·y`` (``a(()) = 1``): the edge rows' right-hand side."""
    return table.p_edge * np.where(table.parent >= 0, a[table.parent], 1.0)


def _repair(shape: TreeShape, table: _PrefixTable, weights: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, float]:
    """A feasible point near HiGHS' ``x [classes, N−1]`` (HiGHS meets its tolerance on the *scaled* LP, so the
    unscaled rows can be off by ~1e-7 when ``Q(T)`` spans many decades); returns ``(x', value(x) − value(x'))``.

    1. Tree rows, top-down: where ``Σ_children x > x_u`` (1 at the root) the children are scaled by
       ``x_u / Σ``; later rows see the scaled parents, so every tree row holds after one pass.
    2. Edge rows: with ``a`` recomputed from step 1, every string gets ``f(s·y) = min(1, p(y|s)·a(s)/a(s·y))``
       and every node spelling ``w`` is scaled by ``F(w) = Π f`` over the non-empty prefixes of ``w``.  A node
       and its child scale by ``F(w)`` and ``F(w)·f(w·y) ≤ F(w)``, so tree rows stay valid; ``a(w)`` scales by
       ``F(w)`` (every node spelling ``w·y`` lies under one spelling ``w``), so the edge row becomes
       ``f(s·y)·a(s·y) ≤ p(y|s)·a(s)``, true by the choice of f.  Feasible points only lower the objective.
    """
    x = x.copy()
    before = float(weights @ x.sum(axis=1))
    for u, kids in enumerate(shape.children):
        if not kids:
            continue
        cap = np.ones(x.shape[0]) if u == 0 else x[:, u - 1]
        total = x[:, [c - 1 for c in kids]].sum(axis=1)
        scale = np.where(total > cap, cap / np.where(total > 0, total, 1.0), 1.0)
        x[:, [c - 1 for c in kids]] *= scale[:, None]
    a = np.bincount(table.pid.ravel(), weights=(weights[:, None] * x).ravel(), minlength=table.size)
    allowed = _edge_bound(table, a)
    f = np.divide(allowed, a, out=np.ones_like(a), where=a > allowed)
    F = np.ones(table.size)
    for i in range(table.size):  # parents precede children: codes are sorted and code(s·y) > code(s)
        F[i] = f[i] * (F[table.parent[i]] if table.parent[i] >= 0 else 1.0)
    x *= F[table.pid]
    return x, before - float(weights @ x.sum(axis=1))

