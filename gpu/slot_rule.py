"""The slot rule of UniVer, batched (the twin of :mod:`solvers.slot_rule`; theory.md §6.3 layer ii).

Input: the node plan evaluated on every ordering of each row's realised tuple S (``w_all [R, k!, k]``,
ordering 0 = S itself), the draft rows and the position weights ``ω [R, k]`` (integers ``1 + |subtree|``).
Output: ``w(S) [R, k]`` after the slot rule, equal to what :func:`solvers.slot_rule.slot_rule_lp` gives.

* k = 2: the closed form (:func:`slot_pair`: the exact core's :func:`solvers.slot_rule.slot_pair` on the rows);
* k ≥ 3: the class LP of :func:`solvers.slot_rule.slot_rule_lp` — among the ω-optima the one that changes the
  plan least, then the tie-break of :mod:`solvers.tie_break` — in ``z = z_0 + u − v``, every row's LP solved
  at once by :func:`gpu.simplex.lex_simplex` with its four levels exactly (phase 1, ``ω·z``, ``−Σ(u + v)``,
  ``r·z``; the exact core folds them into one objective with ε, the same optimum by total unimodularity).
  The solver differs because HiGHS solves one LP at a time on the host, and a level needs all its small LPs
  solved together on the device.  The float formulas around it are the exact core's functions: the tie-break
  (:func:`solvers.slot_rule.ordering_code`, :func:`~solvers.slot_rule.tie_break`) and ``w = min(1, z/Q_k)`` capped
  at ``Σ_j w_j ≤ 1`` (:func:`univer_theory.plans.lp_plan.capped_rows`).
  Each LP has a capacity row per ordering, a mass row per token rank and a ``z ≥ 0`` row per variable;
  orderings that repeat an earlier one (i.i.d. repeated tokens) or have ``Q_k = 0`` get capacity 0 and no
  columns, so the LP is the exact core's class LP.  A row whose LP is not solved, or whose answer fails the exact
  core's recheck (:func:`solvers.slot_rule.slot_violations`: below zero, over a capacity or a class mass moved by
  more than ``SLOT_TOL·ΣQ``), keeps the plan's own weights, as the exact core does.
"""
from __future__ import annotations

import torch

from solvers.slot_rule import SLOT_TOL, ordering_code, slot_violations, tie_break
from solvers.slot_rule import slot_pair as core_slot_pair
from univer_theory.nx import array_module, get_backend
from univer_theory.plans.lp_plan import capped_rows, plan_weights
from univer_theory.processes import tuple_probs

from .host import on_host
from .simplex import lex_simplex


def slot_pair(w_s: torch.Tensor, w_r: torch.Tensor, children: torch.Tensor, q: torch.Tensor,
              omega: torch.Tensor, process: str) -> torch.Tensor:
    """The k = 2 slot rule in closed form: ``w(S) [R, 2]`` from the plan on the realised S and on its reversal,
    the orderings' probabilities and the position weights — :func:`solvers.slot_rule.slot_pair` (the exact
    core's function) on the level's rows; on the CPU on numpy views (:func:`gpu.host.on_host`)."""
    return on_host(_slot_pair, w_s, w_r, children, q, omega, process)


def _slot_pair(w_s, w_r, children, q, omega, process: str):
    """:func:`slot_pair` on one backend (:mod:`univer_theory.nx`)."""
    probs = tuple_probs(q, children[:, [[0, 1], [1, 0]]], process)        # S and its reversal [R, 2]
    return core_slot_pair(w_s, w_r, probs[:, 0], probs[:, 1], omega, children[:, 0] == children[:, 1])[0]


def slot_lp(w_all: torch.Tensor, children: torch.Tensor, q: torch.Tensor, omega: torch.Tensor, process: str,
            perms: list) -> torch.Tensor:
    """The slot rule for k ≥ 3 (module docstring): ``w(S) [R, k]`` from ``w_all [R, P, k]``, the plan on the
    orderings ``children[:, perms[p]]`` (``perms[0]`` the identity, P = k!).  On the CPU on numpy views
    (:func:`gpu.host.on_host`: the LP is built from ~60 small operations)."""
    return on_host(_slot_lp, w_all, children, q, omega, process, perms)


def _slot_lp(w_all, children, q, omega, process: str, perms: list):
    """:func:`slot_lp` on one backend (:mod:`univer_theory.nx`)."""
    nx, xp = get_backend(w_all), array_module(w_all)
    R, P, k = w_all.shape
    perm = nx.index(perms, w_all)
    # d_i: rank of S_i among S's distinct tokens; an ordering's code Σ d_i k^{k−1−i} names it within the class
    first = ~xp.tril(children[:, :, None] == children[:, None, :], -1).any(2)            # [R, k] first occurrences
    rank = ((children[:, None, :] < children[:, :, None]) & first[:, None, :]).sum(2)    # [R, k]
    ranks = rank[:, perm]                                                                  # [R, P, k]
    code = ordering_code(ranks)                                                            # [R, P]
    repeat = xp.tril(code[:, :, None] == code[:, None, :], -1).any(2)                      # an earlier ordering
    probs = tuple_probs(q, children[:, perm], process)
    keep = ~repeat & (probs > 0)                                                           # the class C(S)
    z0 = nx.where(keep[..., None], w_all * probs[..., None], 0.0).reshape(R, P * k)        # [R, P·k]
    # z = z0 + u − v; columns u, v (P·k each), capacity slacks (P), z ≥ 0 slacks (P·k), mass artificials (k)
    n_z = P * k
    cols, rows = nx.arange(n_z, w_all), nx.arange(R, w_all)[:, None]
    on = nx.asarray(xp.broadcast_to(keep[..., None], (R, P, k)).reshape(R, n_z), w_all)       # [R, P·k]
    A = nx.full((R, P + k + n_z, 3 * n_z + P + k), 0.0, w_all)
    for sign, at in ((1, cols), (-1, n_z + cols)):
        A[:, cols // k, at] = sign * on                                                    # Σ_j (u − v) ≤ spare
        A[rows, P + ranks.reshape(R, n_z), at] = sign * on                                 # Σ (u − v) = 0 per token
        A[:, P + k + cols, at] = -sign * on                                                # v − u ≤ z0
    slack = nx.concat([nx.arange(P, w_all), P + k + cols, P + nx.arange(k, w_all)])
    A[:, slack, 2 * n_z + nx.arange(P + k + n_z, w_all)] = 1.0
    spare = nx.maximum(nx.where(keep, probs, 0.0) - z0.reshape(R, P, k).sum(2), 0.0)
    b = nx.concat([spare, nx.full((R, k), 0.0, w_all), z0])
    tie = tie_break(code, k).reshape(R, n_z)                                               # r [R, P·k]
    om = xp.broadcast_to(omega[:, None, :], (R, P, k)).reshape(R, n_z)
    costs = nx.full((R, 4, A.shape[2]), 0.0, w_all)
    costs[:, 0, :n_z] = costs[:, 0, n_z:2 * n_z] = on - 1                                  # columns not in the class
    costs[:, 0, 2 * n_z + P + n_z:] = -1                                                   # phase 1
    for sign, at in ((1, slice(0, n_z)), (-1, slice(n_z, 2 * n_z))):
        costs[:, 1, at] = sign * om * on                                                   # ω·z
        costs[:, 2, at] = -on                                                              # −|z − z0|
        costs[:, 3, at] = sign * tie * on                                                  # the tie-break
    basis = nx.arange(P + k + n_z, w_all)
    basis[slack] = 2 * n_z + nx.arange(P + k + n_z, w_all)
    x, optimal = lex_simplex(A, b, costs, xp.broadcast_to(basis[None], (R, P + k + n_z)))
    z = (z0 + x[:, :n_z] - x[:, n_z:2 * n_z]).reshape(R, P, k)
    unit = nx.sum(nx.where(keep, probs, 0.0))                                             # ΣQ of the class
    unit = nx.where(unit > 0, unit, 1.0)[:, None]
    checks = slot_violations(z / unit[..., None], z0.reshape(R, P, k) / unit[..., None],
                             nx.where(keep, probs, 0.0) / unit, ranks)
    ok = optimal & (checks[0] <= SLOT_TOL) & (checks[1] <= SLOT_TOL) & (checks[2] <= SLOT_TOL)
    return nx.where(ok[:, None], capped_rows(plan_weights(nx.maximum(z[:, 0], 0.0), probs[:, 0])), w_all[:, 0])  # 0 = S
