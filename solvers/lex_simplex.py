"""A dense lexicographic simplex for many small node LPs at once: rule 1's and the shape rule's CondOT(ρ) plans
(:mod:`solvers.condot_simplex`) and the slot rule's class LPs (:mod:`solvers.slot_rule`), in both layers — the
exact core solves its node's LP as a batch of one, a level of :mod:`gpu` solves all its nodes' LPs together, on
their device — so both take the same plan from the same floats.  HiGHS (:mod:`solvers.highs_lp`) is the
independent oracle the tests check it against.

.. math::

    \\operatorname{lexmax}_{x ≥ 0,\\ A x = b} \\ (c_1·x,\\ c_2·x,\\ …,\\ c_L·x)

— maximise ``c_1·x``, then ``c_2·x`` on its optimal face, and so on — for ``B`` LPs of the same size: a full
tableau ``[m, n + 1]`` and L reduced-cost rows per LP, one pivot per step.  It starts from a given basis that
is the identity in A (e.g. slack and artificial columns; ``b ≥ 0`` makes it feasible); a phase 1 is a first
level ``c_1 = −Σ artificials``.

A column may enter when its reduced cost is *lexicographically* positive (the first level where it is not 0
within :data:`TOL` says > 0), i.e. it improves ``Σ_l M^{L−l} c_l`` for M large.  Pricing is Dantzig's (the
largest reduced cost at the lowest level that has an improving column; the lowest such column) until an LP has
made :data:`STALL` degenerate pivots (a step of exactly 0) in a row; from then on, until a step is positive, that LP
uses Bland's rule (lowest improving column; among rows tied in the ratio test, the lowest basic column), which
cannot cycle; otherwise the first tied row leaves.  (A step below the ties' tolerance counted as degenerate before:
on a confident row, whose tiny ρp and Q_k make most steps ~1e-14, rule 1's LP at k = 4 over 8 tokens then ran
168 979 pivots, 168 304 of them Bland's, in 5 s; it takes 4 034 in 0.2 s now.)  The answer is a basic solution
``x_B = B⁻¹b``.  A pivot rewrites only the tableau rows with an entry in the entering column (on the node LPs'
network matrices, the few rows of one path of the basis forest).  When the LP's optimum is unique (the node LPs'
are, by :mod:`solvers.tie_break`) it is the point any exact solver returns, whatever the pivots.  On a totally
unimodular A the tableau stays in {−1, 0, 1}, so the pivots themselves are exact.

Two runs of these same pivots, one per kind of device (the only algorithm written twice, because a pivot is a
few dozen tiny operations that cost their call overhead, not their arithmetic):

* the CPU (numpy arrays, CPU tensors): a compiled loop over the LPs and their pivots (:func:`_simplex_rows`,
  numba; ~1 µs a pivot where the lockstep version below costs ~100 µs in numpy);
* an accelerator: every LP of the level in lockstep in torch (:func:`_lex_simplex`, written against
  :mod:`univer_theory.nx`; python loops over pivots only, never over LPs), one host read per pivot (whether an
  LP is still improving).

Both take the same decisions on the same floats (``tests/solvers/test_lex_simplex.py`` runs them side by side).
"""
from __future__ import annotations

import numba
import numpy as np

from univer_theory.nx import array_module, get_backend
from univer_theory.validation import check_int

#: Reduced costs and tableau entries within this of 0 count as 0.  Ratio ties are exact: a row within a tolerance of
#: the least ratio would step past it and leave another row's basic variable below 0 (by up to the tolerance), a point
#: off ``A x = b`` that the clip to 0 hides (rule 1 then 1.1e-12 short of α*, slot plans refused by their recheck).
TOL = 1e-12
#: Consecutive degenerate pivots (a step of exactly 0) after which an LP switches from Dantzig's to Bland's rule;
#: a positive step switches it back.
STALL = 50


def lex_simplex(A, b, costs, basis, max_pivots: int | None = None, check_basis: bool = True):
    """Solve B LPs (module docstring).

    Parameters
    ----------
    A : ``[B, m, n]``; b : ``[B, m]`` with b ≥ 0
    costs : ``[B, L, n]`` the objectives, most important first
    basis : ``[B, m]`` long — columns of A forming the identity (column ``basis[:, i]`` = unit vector i; indices
        outside ``[0, n)`` or columns that are not that identity are a ValueError)
    max_pivots : cap on pivots (default ``20·(m + n)``); an LP still improving then reports ``False``
    check_basis : check that the basis columns are the identity (False for callers that build them as such: the
        node LPs' slack and artificial columns — the check is a ``[B, m, m]`` gather, ~15% of a batched solve)

    Returns
    -------
    ``(x [B, n], optimal [B] bool)`` — ``optimal`` False for an LP unbounded or stopped by the cap.

    Torch tensors or numpy arrays: on the CPU (numpy, or CPU tensors) the compiled loop (:func:`_simplex_host`), on
    an accelerator the lockstep torch run (:func:`_lex_simplex`) — module docstring.  The answer is of the inputs'
    kind.
    """
    B, m, n = A.shape
    L = costs.shape[1]
    if tuple(b.shape) != (B, m) or tuple(costs.shape) != (B, L, n) or tuple(basis.shape) != (B, m):
        raise ValueError(f"lex_simplex: shapes disagree: A {tuple(A.shape)}, b {tuple(b.shape)}, "
                         f"costs {tuple(costs.shape)}, basis {tuple(basis.shape)}")
    if max_pivots is not None:
        check_int(max_pivots, "lex_simplex", "max_pivots")
    xp = array_module(A)
    feasible = ((b >= 0) & (b < float("inf"))).all()           # NaN fails it too
    in_range = ((basis >= 0) & (basis < n)).all()              # the compiled loop reads A there unchecked
    finite = xp.isfinite(A).all() & xp.isfinite(costs).all()  # a NaN reduced cost never prices in: a wrong "optimum"
    identity = in_range                     # unchecked: stands as the range check (which an A of no columns fails)
    if check_basis and n:       # column basis[:, i] of A is unit vector i, or the tableau starts on a basis it is not
        cols = xp.broadcast_to(get_backend(A).clip(basis, 0, n - 1)[:, None, :], (B, m, m))
        eye = np.eye(m) if xp is np else xp.eye(m, dtype=A.dtype, device=A.device)
        identity = (get_backend(A).take(A, cols) == eye).all()
    feasible, in_range, finite, identity = xp.stack([feasible, in_range, finite, identity]).tolist()  # one host read
    if not feasible:
        raise ValueError("lex_simplex: b must be finite and ≥ 0 (the starting basis must be feasible)")
    if not finite:
        raise ValueError("lex_simplex: A and costs must be finite (a NaN cost stopped the pivoting at the start, "
                         "reported optimal)")
    if not in_range:
        raise ValueError(f"lex_simplex: basis must hold column indices in [0, {n})")
    if not identity:
        raise ValueError("lex_simplex: the basis columns of A must be the identity (column basis[:, i] = unit "
                         "vector i); the pivots read x_B = b from it")
    cap = max_pivots if max_pivots is not None else 20 * (m + n)
    if get_backend(A).name == "numpy" or A.device.type == "cpu":
        return _simplex_host(A, b, costs, basis, cap)
    return _lex_simplex(A, b, costs, basis, cap)


def _lex_simplex(A, b, costs, basis, cap: int):
    """:func:`lex_simplex` on validated inputs of one backend, every LP in lockstep (at most ``cap`` pivots)."""
    nx, xp = get_backend(A), array_module(A)
    B, m, n = A.shape
    L = costs.shape[1]
    table = nx.concat([A, b[..., None]])                                          # [B, m, n + 1]
    reduced = nx.concat([costs, 0 * costs[..., :1]])
    reduced = reduced - nx.take(costs, xp.broadcast_to(basis[:, None, :], (B, L, m))) @ table   # c − c_B·B⁻¹[A | b]
    basis = basis + 0
    optimal = nx.zeros_like(b[:, 0]) == 0
    stalled = 0 * nx.arange(B, A)
    batch = nx.arange(B, A)
    for step in range(cap + 1):
        enter, active = _price(reduced[:, :, :n], stalled >= STALL)
        active &= optimal
        if not active.any() or step == cap:
            break
        column = table[batch, :, enter]                                           # [B, m]
        ok = column > TOL
        ratio = nx.where(ok, nx.maximum(table[:, :, n], 0.0) / nx.where(ok, column, 1.0), nx.inf)
        least = nx.amin(ratio, keepdims=True)
        tied = ok & (ratio <= least)
        leave = nx.where(stalled >= STALL, _first(-nx.where(tied, basis, n)),   # Bland: lowest basic column
                         _first(tied))                                            # else the first tied row
        optimal &= ~(active & ~ok.any(1))                                         # unbounded
        active &= ok.any(1)
        stalled = nx.where(least[:, 0] > 0, 0, stalled + 1)
        row = table[batch, leave] / nx.where(active, table[batch, leave, enter], 1.0)[:, None]   # [B, n + 1]
        column = nx.where(active[:, None], column, 0.0)
        column[batch, leave] = 0
        # only the rows with an entry in the pivot column change (a few on a network matrix): update those
        lp, at = nx.nonzero(column)
        table[lp, at] = table[lp, at] - column[lp, at][:, None] * row[lp]
        table[batch, leave] = nx.where(active[:, None], row, table[batch, leave])
        reduced -= nx.where(active[:, None], reduced[batch, :, enter], 0.0)[:, :, None] * row[:, None, :]
        basis[batch, leave] = nx.where(active, enter, basis[batch, leave])
    return _basic_solution(table, basis, n), optimal & ~active


def _first(x):
    """``[B]``: the index of the first largest entry of each row of ``x [B, n]``."""
    return get_backend(x).argmax(x)[:, 0]


def _price(reduced, bland):
    """Entering column ``[B]`` and whether there is one ``[B]``: lexicographically positive reduced costs; the
    largest at the lowest deciding level (Dantzig), or the lowest index where ``bland``.  A column is open at
    level l when its reduced costs at the levels before are 0 (within :data:`TOL`); it improves at the first level
    where it is open and positive."""
    nx, xp = get_backend(reduced), array_module(reduced)
    B, L, n = reduced.shape
    settled = abs(reduced) <= TOL
    opens = [settled[:, 0] | ~settled[:, 0]]
    for level in range(1, L):
        opens.append(opens[-1] & settled[:, level - 1])
    here = xp.stack(opens, 1) & (reduced > TOL)                                   # [B, L, n]
    improving = here.any(1)
    level = _first(here.any(2))                                                   # the lowest level with any
    batch = nx.arange(B, reduced)
    score = nx.where(here[batch, level], reduced[batch, level], -nx.inf)
    return nx.where(bland, _first(improving), _first(score)), improving.any(1)


def _basic_solution(table, basis, n: int):
    """``x [B, n]``: ``x_B = B⁻¹b`` (round-off below 0 clipped), 0 off the basis."""
    nx = get_backend(table)
    return nx.put(0 * table[:, 0, :n], basis, nx.maximum(table[:, :, n], 0.0))


def _simplex_host(A, b, costs, basis, cap: int):
    """:func:`lex_simplex` on numpy arrays or CPU tensors: :func:`_simplex_rows` on their memory (float64).  (The
    callers in :mod:`gpu` reach it from host calls that ``torch.compile`` leaves out, :func:`gpu.host.on_host`.)"""
    tensors = get_backend(A).name == "torch"
    A, b, costs, basis = (np.asarray(t.numpy() if tensors else t) for t in (A, b, costs, basis))
    x, optimal = _simplex_rows(*(np.ascontiguousarray(t, np.float64) for t in (A, b, costs)),
                               np.ascontiguousarray(basis, np.int64), cap)
    x = x.astype(A.dtype, copy=False)
    if not tensors:
        return x, optimal
    import torch
    return torch.from_numpy(x), torch.from_numpy(optimal)


@numba.njit(cache=True, nogil=True)
def _simplex_rows(A, b, costs, basis, cap):  # pragma: no cover - compiled
    """The pivots of :func:`_lex_simplex` (module docstring), one LP after the other: ``(x [B, n], optimal [B])``."""
    B, m, n = A.shape
    L = costs.shape[1]
    x = np.zeros((B, n))
    optimal = np.ones(B, np.bool_)
    table, reduced = np.empty((m, n + 1)), np.empty((L, n + 1))
    row = np.empty(n + 1)
    for t in range(B):
        table[:, :n] = A[t]
        table[:, n] = b[t]
        bas = basis[t].copy()
        for level in range(L):                                  # c − c_B·B⁻¹[A | b]
            reduced[level, :n] = costs[t, level]
            reduced[level, n] = 0.0
            for i in range(m):
                cost = costs[t, level, bas[i]]
                if cost != 0.0:
                    for j in range(n + 1):
                        reduced[level, j] -= cost * table[i, j]
        stalled = 0
        for step in range(cap + 1):
            bland = stalled >= STALL
            enter = _price_row(reduced, n, bland)
            if enter < 0:
                break
            if step == cap:
                optimal[t] = False
                break
            least = np.inf
            for i in range(m):
                if table[i, enter] > TOL:
                    least = min(least, max(table[i, n], 0.0) / table[i, enter])
            if least == np.inf:                                 # unbounded
                optimal[t] = False
                break
            leave = -1
            for i in range(m):
                if table[i, enter] > TOL and max(table[i, n], 0.0) / table[i, enter] <= least:
                    if leave < 0 or (bland and bas[i] < bas[leave]):
                        leave = i
                    if not bland:
                        break
            stalled = 0 if least > 0.0 else stalled + 1
            pivot = table[leave, enter]
            for j in range(n + 1):
                row[j] = table[leave, j] / pivot
            for i in range(m):
                factor = table[i, enter]
                if i != leave and factor != 0.0:
                    for j in range(n + 1):
                        table[i, j] -= factor * row[j]
            table[leave] = row
            for level in range(L):
                factor = reduced[level, enter]
                for j in range(n + 1):
                    reduced[level, j] -= factor * row[j]
            bas[leave] = enter
        for i in range(m):
            x[t, bas[i]] = max(table[i, n], 0.0)
    return x, optimal


@numba.njit(cache=True, nogil=True)
def _price_row(reduced, n, bland):  # pragma: no cover - compiled
    """:func:`_price` for one LP: the entering column, or −1 when no column is lexicographically positive."""
    L = reduced.shape[0]
    best, enter, deciding = -np.inf, -1, L
    for j in range(n):
        for level in range(L):
            r = reduced[level, j]
            if r > TOL:                                         # open at this level and improving
                if bland:
                    return j
                if level < deciding or (level == deciding and r > best):
                    deciding, best, enter = level, r, j
                break
            if abs(r) > TOL:                                    # negative here: closed below
                break
    return enter
