"""Rule 4 of theory.md §6.3: priority with sequential thinning (PTS), wor, any k and V.

Priority ``≺`` is ``p/q`` descending (ties by token id).  For the realised S, walk its tokens in priority
order and accept token y with probability ``θ_y``, otherwise move on:

.. math::  w_j(S) = θ_{y_j} \\prod_{z ∈ S,\\, z ≺ y_j} (1 − θ_z),
           \\qquad θ_y = \\min\\big(1, ρp(y)/\\mathrm{avail}(y)\\big),

with ``avail(y) = E[1(y∈S) Π_{z∈S, z≺y}(1−θ_z)]`` under the wor law (exponential-clock integral of §6.5,
:func:`~univer_theory.plans.clocks.sequential_thinning_avail`).  The token marginal is
``a(y) = θ_y·avail(y) ≤ ρp(y)``: exact up to the quadrature error (~1e-14).  Always feasible, near-optimal
(α/α*_wor ≈ 0.997 on average, theory.md §6.3).

**k = 2 in closed form.**  A wor pair meets token y with one partner z, ``Pr(S = {y, z} as a set) =
q_y q_z (1/R_y + 1/R_z)`` (``R_x = Σ_{w≠x} q_w``, the wor law's ``1 − q_x``), so

.. math::  \\mathrm{avail}(y) = q_y\\Big[\\frac{1}{R_y}\\sum_{z≠y} g_z q_z + \\sum_{z≠y} \\frac{g_z q_z}{R_z}\\Big],
           \\qquad g_z = 1 − θ_z \\ (z ≺ y),\\quad g_z = 1 \\ (\\text{otherwise}):

two running sums over the higher-priority tokens plus two suffix sums, all of non-negative terms — O(m) for
m drafted tokens, exact (no quadrature), instead of the clock integral's O(m·k·nodes)
(:func:`pair_thinning_avail`; at V = 49 152 about 100× faster).  The closed form divides by ``R_x``; when one
token holds all but a subnormal mass, ``q_x/R_x`` overflows: :func:`pair_thinning_avail` then declines and the
row takes the clock integral instead (it forms no such ratio).
"""
from __future__ import annotations

import numpy as np

from ..orders import ratio_argsort
from .base import NodePlan
from .clocks import LOG_T_NODES, sequential_thinning_avail
from .node_inputs import check_node_inputs


def priority_order(target_probs: np.ndarray, draft_probs: np.ndarray) -> list[int]:
    """Drafted tokens (q > 0) by ``p/q`` descending, ties by token id (:func:`~univer_theory.orders.ratio_argsort`)."""
    order = ratio_argsort(target_probs, draft_probs, descending=True)
    return [int(x) for x in order[:np.count_nonzero(draft_probs > 0)]]


def pair_thinning_avail(draft_probs: np.ndarray, order, c: np.ndarray):
    """PTS availabilities and acceptance probabilities for k = 2 wor children, in closed form (module
    docstring); same contract as :func:`~univer_theory.plans.clocks.sequential_thinning_avail` with k = 2, or
    None where the closed form is not finite (``Σ_x q_x/R_x`` overflows: a subnormal rest mass).

    The walk over the priority order is a scalar recursion (θ_y needs the running sums of the tokens before
    y), run on Python floats.
    """
    order = np.asarray(order, dtype=np.int64)
    q = np.asarray(draft_probs, dtype=np.float64)
    qs = q[order]
    zero = np.zeros(1)
    # R_x = Σ_{w≠x} q_w by leave-one-out prefix + suffix sums (undrafted tokens add exactly 0)
    rest = np.concatenate((zero, np.cumsum(qs)[:-1])) + np.concatenate((np.cumsum(qs[::-1])[::-1][1:], zero))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        odds = qs / rest
        if not np.isfinite(odds.sum()):
            return None
    # suffix sums over the lower-priority tokens (g = 1): Σ_{z≻y} q_z and Σ_{z≻y} q_z/R_z
    t1 = np.concatenate((np.cumsum(qs[::-1])[::-1][1:], zero))
    t2 = np.concatenate((np.cumsum(odds[::-1])[::-1][1:], zero))
    avail = np.zeros(q.size)
    theta = np.zeros(q.size)
    cs = np.asarray(c, dtype=np.float64)[order]
    av_out, th_out = [], []
    p1 = p2 = 0.0                           # Σ_{z≺y} (1−θ_z) q_z and Σ_{z≺y} (1−θ_z) q_z/R_z
    for qy, ry, s1, s2, cy in zip(qs.tolist(), rest.tolist(), t1.tolist(), t2.tolist(), cs.tolist()):
        av = qy * ((p1 + s1) / ry + p2 + s2)
        th = 0.0 if cy <= 0 else (1.0 if cy >= av else cy / av)
        av_out.append(av)
        th_out.append(th)
        g = 1.0 - th
        p1 += g * qy
        p2 += g * qy / ry
    avail[order], theta[order] = av_out, th_out
    return avail, theta


def pts_plan(target_probs, draft_probs, rho, k, process, nodes: int = LOG_T_NODES) -> NodePlan | None:
    """PTS node plan for ``wor`` children (None for any other process).

    Parameters
    ----------
    target_probs, draft_probs : p, q [V].
    rho : scaling ρ ∈ [0, 1].
    k : number of children (≤ |supp q|).
    process : draft process; only ``"wor"`` is handled.
    nodes : Gauss–Legendre nodes in log T (k ≥ 3; k = 2 is closed form).

    Returns
    -------
    NodePlan with ``info = {"theta": θ [V], "avail": avail [V], "order": priority}``.
    """
    p, q, rho = check_node_inputs("pts_plan", target_probs, draft_probs, rho, k, process)
    if process != "wor":
        return None
    order = priority_order(p, q)
    c = rho * p
    pair = pair_thinning_avail(q, order, c) if k == 2 else None
    avail, theta = pair if pair is not None else sequential_thinning_avail(q, order, c, k, nodes)
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
