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
  (:func:`solvers.slot_rule.ordering_code`, :func:`~solvers.slot_rule.tie_break`) and ``w = z/Q_k`` capped
  at ``Σ_j w_j ≤ 1`` (:func:`univer_theory.plans.lp_plan.capped_rows`).
  Each LP has a capacity row per ordering, a mass row per token rank and a ``z ≥ 0`` row per variable;
  orderings that repeat an earlier one (i.i.d. repeated tokens) or have ``Q_k = 0`` get capacity 0 and no
  columns, so the LP is the exact core's class LP.  A row whose LP is not solved keeps the plan's own weights,
  as the exact core does when its LP fails.
"""
from __future__ import annotations

import torch

from solvers.slot_rule import ordering_code, tie_break
from solvers.slot_rule import slot_pair as core_slot_pair
from univer_theory.plans.lp_plan import capped_rows
from univer_theory.processes import tuple_probs

from .simplex import lex_simplex


def slot_pair(w_s: torch.Tensor, w_r: torch.Tensor, children: torch.Tensor, q: torch.Tensor,
              omega: torch.Tensor, process: str) -> torch.Tensor:
    """The k = 2 slot rule in closed form: ``w(S) [R, 2]`` from the plan on the realised S and on its reversal,
    the orderings' probabilities and the position weights — :func:`solvers.slot_rule.slot_pair` (the exact
    core's function) on the level's rows."""
    Q_s, Q_r = tuple_probs(q, torch.stack([children, children.flip(1)], 1), process).unbind(1)
    return core_slot_pair(w_s, w_r, Q_s, Q_r, omega, children[:, 0] == children[:, 1])[0]


def slot_lp(w_all: torch.Tensor, children: torch.Tensor, q: torch.Tensor, omega: torch.Tensor, process: str,
            perms: list) -> torch.Tensor:
    """The slot rule for k ≥ 3 (module docstring): ``w(S) [R, k]`` from ``w_all [R, P, k]``, the plan on the
    orderings ``children[:, perms[p]]`` (``perms[0]`` the identity, P = k!)."""
    R, P, k = w_all.shape
    dev, dt = w_all.device, w_all.dtype
    perm = torch.tensor(perms, device=dev)
    # d_i: rank of S_i among S's distinct tokens; an ordering's code Σ d_i k^{k−1−i} names it within the class
    first = ~torch.tril(children[:, :, None] == children[:, None, :], -1).any(2)          # [R, k] first occurrences
    rank = ((children[:, None, :] < children[:, :, None]) & first[:, None, :]).sum(2)    # [R, k]
    ranks = rank[:, perm]                                                                  # [R, P, k]
    code = ordering_code(ranks)                                                            # [R, P]
    repeat = torch.tril(code[:, :, None] == code[:, None, :], -1).any(2)                   # an earlier ordering
    probs = tuple_probs(q, children[:, perm], process)
    keep = ~repeat & (probs > 0)                                                           # the class C(S)
    z0 = torch.where(keep[..., None], w_all * probs[..., None], 0).flatten(1)                  # [R, P·k]
    # z = z0 + u − v; columns u, v (P·k each), capacity slacks (P), z ≥ 0 slacks (P·k), mass artificials (k)
    n_z = P * k
    cols = torch.arange(n_z, device=dev)
    on = keep.repeat_interleave(k, 1).to(dt)                                               # [R, P·k]
    A = torch.zeros(R, P + k + n_z, 3 * n_z + P + k, dtype=dt, device=dev)
    for sign, at in ((1, cols), (-1, n_z + cols)):
        A[:, cols // k, at] = sign * on                                                    # Σ_j (u − v) ≤ spare
        A[torch.arange(R, device=dev)[:, None], P + ranks.flatten(1), at] = sign * on     # Σ (u − v) = 0 per token
        A[:, P + k + cols, at] = -sign * on                                                # v − u ≤ z0
    slack = torch.cat([torch.arange(P), P + k + torch.arange(n_z), P + torch.arange(k)]).to(dev)
    A[:, slack, 2 * n_z + torch.arange(P + k + n_z, device=dev)] = 1
    spare = (torch.where(keep, probs, 0) - z0.view(R, P, k).sum(2)).clamp(min=0)
    b = torch.cat([spare, torch.zeros(R, k, dtype=dt, device=dev), z0], 1)
    tie = tie_break(code, k).flatten(1)                                                    # r [R, P·k]
    costs = torch.zeros(R, 4, A.shape[2], dtype=dt, device=dev)
    costs[:, 0, :2 * n_z] = (on - 1).repeat(1, 2)                                          # columns not in the class
    costs[:, 0, 2 * n_z + P + n_z:] = -1                                                   # phase 1
    for sign, at in ((1, slice(0, n_z)), (-1, slice(n_z, 2 * n_z))):
        costs[:, 1, at] = sign * omega.repeat(1, P) * on                                   # ω·z
        costs[:, 2, at] = -on                                                              # −|z − z0|
        costs[:, 3, at] = sign * tie * on                                                  # the tie-break
    basis = torch.empty(P + k + n_z, dtype=torch.long, device=dev)
    basis[slack] = 2 * n_z + torch.arange(P + k + n_z, device=dev)
    x, optimal = lex_simplex(A, b, costs, basis.expand(R, -1))
    z = z0[:, :k] + x[:, :k] - x[:, n_z:n_z + k]                                           # ordering 0 = S
    return torch.where(optimal[:, None], capped_rows(z.clamp(min=0) / probs[:, :1]), w_all[:, 0])
