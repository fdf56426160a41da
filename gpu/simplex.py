"""A batched dense simplex for many small node LPs at once (the slot rule's and rule 1's: :mod:`gpu.slot_rule`,
:mod:`gpu.condot`).  A second algorithm beside the exact core's HiGHS (:mod:`solvers.highs_lp`) on purpose:
HiGHS solves one LP at a time on the host; a level's LPs are solved here together, on their device — written
once against :mod:`univer_theory.nx`, run in torch on an accelerator and in numpy on the CPU (on views of the
CPU tensors' memory: a pivot is a few dozen small operations, each ~4× cheaper in numpy; the same floats).

.. math::

    \\operatorname{lexmax}_{x ≥ 0,\\ A x = b} \\ (c_1·x,\\ c_2·x,\\ …,\\ c_L·x)

— maximise ``c_1·x``, then ``c_2·x`` on its optimal face, and so on — for ``B`` LPs of the same size, in
lockstep on their device: a full tableau ``[B, m, n + 1]`` and L reduced-cost rows, one pivot per step for
every LP not yet optimal (python loops over pivots only, never over LPs).  It starts from a given basis that
is the identity in A (e.g. slack and artificial columns; ``b ≥ 0`` makes it feasible); a phase 1 is a first
level ``c_1 = −Σ artificials``.

A column may enter when its reduced cost is *lexicographically* positive (the first level where it is not 0
within :data:`TOL` says > 0), i.e. it improves ``Σ_l M^{L−l} c_l`` for M large.  Pricing is Dantzig's (the
largest reduced cost at the lowest level that has an improving column) until an LP has made
:data:`STALL` degenerate pivots in a row; from then on that LP uses Bland's rule (lowest improving column;
among rows tied in the ratio test, the lowest basic column), which cannot cycle.  The answer is a basic
solution ``x_B = B⁻¹b``.  A pivot rewrites only the tableau rows with an entry in the entering column (on
the node LPs' network matrices, the few rows of one path of the basis forest).  When the LP's optimum is
unique (the node LPs' are, by :mod:`solvers.tie_break`) it is the point any exact solver returns, whatever the
pivots.  On a totally unimodular A the tableau stays in {−1, 0, 1}, so the pivots themselves are exact.
"""
from __future__ import annotations

import numpy as np

from univer_theory.nx import array_module, get_backend

from .host import on_host

#: Reduced costs and tableau entries within this of 0 count as 0 (ratio ties: relative to the LP's max b).
TOL = 1e-12
#: Consecutive degenerate pivots after which an LP switches from Dantzig's to Bland's rule.
STALL = 50


def lex_simplex(A, b, costs, basis, max_pivots: int | None = None):
    """Solve B LPs (module docstring).

    Parameters
    ----------
    A : ``[B, m, n]``; b : ``[B, m]`` with b ≥ 0
    costs : ``[B, L, n]`` the objectives, most important first
    basis : ``[B, m]`` long — columns of A forming the identity (column ``basis[:, i]`` = unit vector i)
    max_pivots : cap on pivots (default ``20·(m + n)``); an LP still improving then reports ``False``

    Returns
    -------
    ``(x [B, n], optimal [B] bool)`` — ``optimal`` False for an LP unbounded or stopped by the cap.

    Torch tensors or numpy arrays (:mod:`univer_theory.nx`: one implementation).  CPU tensors are solved on
    numpy views of their memory (:func:`gpu.host.on_host`): a pivot is a few dozen operations on small tables,
    whose per-call cost is ~4× lower in numpy; accelerators keep their tensors.
    """
    B, m, n = A.shape
    L = costs.shape[1]
    if tuple(b.shape) != (B, m) or tuple(costs.shape) != (B, L, n) or tuple(basis.shape) != (B, m):
        raise ValueError(f"lex_simplex: shapes disagree: A {tuple(A.shape)}, b {tuple(b.shape)}, "
                         f"costs {tuple(costs.shape)}, basis {tuple(basis.shape)}")
    if (b < 0).any():
        raise ValueError("lex_simplex: b must be ≥ 0 (the starting basis must be feasible)")
    return on_host(_lex_simplex, A, b, costs, basis, max_pivots)


def _lex_simplex(A, b, costs, basis, max_pivots):
    """:func:`lex_simplex` on validated inputs of one backend."""
    nx, xp = get_backend(A), array_module(A)
    B, m, n = A.shape
    L = costs.shape[1]
    table = nx.concat([A, b[..., None]])                                          # [B, m, n + 1]
    reduced = nx.concat([costs, 0 * costs[..., :1]])
    reduced = reduced - nx.take(costs, xp.broadcast_to(basis[:, None, :], (B, L, m))) @ table   # c − c_B·B⁻¹[A | b]
    basis = basis + 0
    scale = nx.maximum(nx.amax(b, keepdims=True), np.finfo(np.float64).tiny)
    optimal = nx.zeros_like(b[:, 0]) == 0
    stalled = 0 * nx.arange(B, A)
    batch = nx.arange(B, A)
    cap = max_pivots if max_pivots is not None else 20 * (m + n)
    for step in range(cap + 1):
        enter, active = _price(reduced[:, :, :n], stalled >= STALL)
        active &= optimal
        if not active.any() or step == cap:
            break
        column = table[batch, :, enter]                                           # [B, m]
        ok = column > TOL
        ratio = nx.where(ok, nx.maximum(table[:, :, n], 0.0) / nx.where(ok, column, 1.0), nx.inf)
        least = nx.amin(ratio, keepdims=True)
        tied = ok & (ratio <= least + TOL * scale)
        leave = nx.where(stalled >= STALL, _first(-nx.where(tied, basis, n)),   # Bland: lowest basic column
                         _first(nx.asarray(tied, A)))                             # else the first tied row
        optimal &= ~(active & ~ok.any(1))                                         # unbounded
        active &= ok.any(1)
        stalled = nx.where(least[:, 0] > TOL * scale[:, 0], 0, stalled + 1)
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
    level = _first(nx.asarray(here.any(2), reduced))                              # the lowest level with any
    batch = nx.arange(B, reduced)
    score = nx.where(here[batch, level], reduced[batch, level], -nx.inf)
    return nx.where(bland, _first(nx.asarray(improving, reduced)), _first(score)), improving.any(1)


def _basic_solution(table, basis, n: int):
    """``x [B, n]``: ``x_B = B⁻¹b`` (round-off below 0 clipped), 0 off the basis."""
    nx = get_backend(table)
    return nx.put(0 * table[:, 0, :n], basis, nx.maximum(table[:, :, n], 0.0))
