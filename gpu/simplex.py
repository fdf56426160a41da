"""A batched dense simplex for many small node LPs at once (the slot rule's and rule 1's: :mod:`gpu.slot_rule`,
:mod:`gpu.condot`).  A second algorithm beside the exact core's HiGHS (:mod:`solvers.highs_lp`) on purpose:
HiGHS solves one LP at a time on the host; a level's LPs are solved here together, on their device.

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

import torch

#: Reduced costs and tableau entries within this of 0 count as 0 (ratio ties: relative to the LP's max b).
TOL = 1e-12
#: Consecutive degenerate pivots after which an LP switches from Dantzig's to Bland's rule.
STALL = 50


def lex_simplex(A: torch.Tensor, b: torch.Tensor, costs: torch.Tensor, basis: torch.Tensor,
                max_pivots: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
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
    """
    B, m, n = A.shape
    L = costs.shape[1]
    if b.shape != (B, m) or costs.shape != (B, L, n) or basis.shape != (B, m):
        raise ValueError(f"lex_simplex: shapes disagree: A {tuple(A.shape)}, b {tuple(b.shape)}, "
                         f"costs {tuple(costs.shape)}, basis {tuple(basis.shape)}")
    if (b < 0).any():
        raise ValueError("lex_simplex: b must be ≥ 0 (the starting basis must be feasible)")
    table = torch.cat([A, b[..., None]], -1)                                      # [B, m, n + 1]
    reduced = torch.cat([costs, costs.new_zeros(B, L, 1)], -1)
    reduced = reduced - costs.gather(2, basis[:, None, :].expand(B, L, m)) @ table   # c − c_B·B⁻¹[A | b]
    basis = basis.clone()
    scale = b.amax(1, keepdim=True).clamp(min=torch.finfo(b.dtype).tiny)
    optimal = torch.ones(B, dtype=torch.bool, device=A.device)
    stalled = torch.zeros(B, dtype=torch.long, device=A.device)
    batch = torch.arange(B, device=A.device)
    cap = max_pivots if max_pivots is not None else 20 * (m + n)
    for step in range(cap + 1):
        enter, active = _price(reduced[:, :, :n], stalled >= STALL)
        active &= optimal
        if not active.any() or step == cap:
            break
        column = table[batch, :, enter]                                           # [B, m]
        ok = column > TOL
        ratio = torch.where(ok, table[:, :, n].clamp(min=0) / torch.where(ok, column, 1), torch.inf)
        least = ratio.min(1, keepdim=True).values
        tied = ok & (ratio <= least + TOL * scale)
        leave = torch.where(stalled >= STALL, torch.where(tied, basis, n).argmin(1),    # Bland: lowest basic column
                            tied.to(torch.uint8).argmax(1))                             # else the first tied row
        optimal &= ~(active & ~ok.any(1))                                         # unbounded
        active &= ok.any(1)
        stalled = torch.where(least.squeeze(1) > TOL * scale.squeeze(1), 0, stalled + 1)
        row = table[batch, leave] / torch.where(active, table[batch, leave, enter], 1)[:, None]   # [B, n + 1]
        column = torch.where(active[:, None], column, 0)
        column[batch, leave] = 0
        # only the rows with an entry in the pivot column change (a few on a network matrix): update those
        touched = int((column != 0).sum(1).max())
        if touched:
            at = (column != 0).to(torch.uint8).topk(touched, 1).indices                 # [B, touched], padded
            grab = at[:, :, None].expand(-1, -1, n + 1)
            table.scatter_(1, grab, table.gather(1, grab) - column.gather(1, at)[:, :, None] * row[:, None, :])
        table[batch, leave] = torch.where(active[:, None], row, table[batch, leave])
        reduced -= torch.where(active[:, None], reduced[batch, :, enter], 0)[:, :, None] * row[:, None, :]
        basis[batch, leave] = torch.where(active, enter, basis[batch, leave])
    return _basic_solution(table, basis, n), optimal & ~active


def _price(reduced: torch.Tensor, bland: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Entering column ``[B]`` and whether there is one ``[B]``: lexicographically positive reduced costs; the
    largest at the lowest deciding level (Dantzig), or the lowest index where ``bland``."""
    B, L, n = reduced.shape
    score = torch.full((B, n), -torch.inf, dtype=reduced.dtype, device=reduced.device)
    open_ = torch.ones(B, n, dtype=torch.bool, device=reduced.device)
    found = torch.zeros(B, dtype=torch.bool, device=reduced.device)
    improving = torch.zeros_like(open_)
    for level in range(L):
        d = reduced[:, level]
        here = open_ & (d > TOL)
        improving |= here
        score = torch.where(~found[:, None] & here, d, score)                     # the lowest level with any
        found |= here.any(1)
        open_ &= d.abs() <= TOL
    dantzig = score.argmax(1)
    return torch.where(bland, improving.to(torch.uint8).argmax(1), dantzig), improving.any(1)


def _basic_solution(table: torch.Tensor, basis: torch.Tensor, n: int) -> torch.Tensor:
    """``x [B, n]``: ``x_B = B⁻¹b`` (round-off below 0 clipped), 0 off the basis."""
    x = table.new_zeros(table.shape[0], n)
    return x.scatter(1, basis, table[:, :, n].clamp(min=0))
