"""Rule 4 of theory.md §6.3: priority with sequential thinning (PTS), wor, any k and V.

Priority ``≺`` is ``p/q`` descending (ties by token id).  For the realised S, walk its tokens in priority
order and accept token y with probability ``θ_y``, otherwise move on:

.. math::  w_j(S) = θ_{y_j} \\prod_{z ∈ S,\\, z ≺ y_j} (1 − θ_z),
           \\qquad θ_y = \\min\\big(1, ρp(y)/\\mathrm{avail}(y)\\big),

with ``avail(y) = E[1(y∈S) Π_{z∈S, z≺y}(1−θ_z)]`` under the wor law (exponential-clock integral of §6.5,
:func:`~univer_theory.plans.clocks.sequential_thinning_avail`).  The token marginal is
``a(y) = θ_y·avail(y) ≤ ρp(y)``: exact up to the quadrature error (~1e-14).  Always feasible, near-optimal
(α/α*_wor ≈ 0.997 on average, theory.md §6.3).
"""
from __future__ import annotations

import numpy as np

from .base import NodePlan
from .clocks import LOG_T_NODES, sequential_thinning_avail
from .node_inputs import check_node_inputs


def priority_order(target_probs: np.ndarray, draft_probs: np.ndarray) -> list[int]:
    """Drafted tokens (q > 0) by ``p/q`` descending, ties by token id."""
    drafted = np.flatnonzero(draft_probs > 0)
    ratio = target_probs[drafted] / draft_probs[drafted]
    return [int(x) for x in drafted[np.lexsort((drafted, -ratio))]]


def pts_plan(target_probs, draft_probs, rho, k, process, nodes: int = LOG_T_NODES) -> NodePlan | None:
    """PTS node plan for ``wor`` children (None for any other process).

    Parameters
    ----------
    target_probs, draft_probs : p, q [V].
    rho : scaling ρ ∈ [0, 1].
    k : number of children (≤ |supp q|).
    process : draft process; only ``"wor"`` is handled.
    nodes : Gauss–Legendre nodes in log T.

    Returns
    -------
    NodePlan with ``info = {"theta": θ [V], "avail": avail [V], "order": priority}``.
    """
    p, q, rho = check_node_inputs("pts_plan", target_probs, draft_probs, rho, k, process)
    if process != "wor":
        return None
    order = priority_order(p, q)
    c = rho * p
    avail, theta = sequential_thinning_avail(q, order, c, k, nodes)
    rank = np.full(p.size, p.size)
    rank[order] = np.arange(len(order))

    def select(S) -> np.ndarray:
        w = np.zeros(len(S))
        left = 1.0
        for j in sorted(range(len(S)), key=lambda j: rank[S[j]]):
            w[j] = left * theta[S[j]]
            left *= 1.0 - theta[S[j]]
        return w

    return NodePlan("pts", rho, p, theta * avail, select,
                    {"theta": theta, "avail": avail, "order": order})
