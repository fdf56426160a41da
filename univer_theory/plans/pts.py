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

two prefix sums over the higher-priority tokens plus two suffix sums, all of non-negative terms — O(m) per
pass for m drafted tokens, exact (no quadrature), instead of the clock integral's O(m·k·nodes)
(:func:`pair_avail`).  θ is found as the walk's fixed point (:func:`thinning_fixed_point`: the same floats as
the sequential walk, in 9–16 passes at V = 49 152).  The closed form divides by ``R_x``; when one token holds
all but a subnormal mass, ``q_x/R_x`` overflows: :func:`pair_thinning_avail` then declines and the row takes
the clock integral instead (it forms no such ratio).

One implementation (:mod:`univer_theory.nx`): :func:`pair_avail` and :func:`thinning_fixed_point` take rows
``[R, m]`` in priority order — numpy for the exact core (:func:`pair_thinning_avail`, a batch of one row), torch
for ``gpu.wor_plans.pts_weights`` (every row of a level; there the fixed point also runs on the k ≥ 3 clock
integral).  The checks stay apart: the tuple-law enumeration and the clock integral
(``tests/theory/test_wor_plans.py``).
"""
from __future__ import annotations

import numpy as np

from ..nx import array_module, get_backend
from ..orders import ratio_argsort
from .base import NodePlan
from .clocks import LOG_T_NODES, acceptance, acceptance_caps, sequential_thinning_avail
from .node_inputs import check_node_inputs
from .wor_pair import exclusive_cumsum, leave_one_out, quiet


def priority_order(target_probs: np.ndarray, draft_probs: np.ndarray) -> list[int]:
    """Drafted tokens (q > 0) by ``p/q`` descending, ties by token id (:func:`~univer_theory.orders.ratio_argsort`)."""
    order = ratio_argsort(target_probs, draft_probs, descending=True)
    return [int(x) for x in order[:np.count_nonzero(draft_probs > 0)]]


def pair_avail(qs, on):
    """k = 2: the map ``g ↦ avail`` in closed form (module docstring) on rows already in priority order
    ``qs [R, m]`` (``on``: drafted; undrafted positions, q = 0, add exact zeros), and the rows where that form is
    finite (``Σ_x q_x/R_x < ∞``; the others need the clock integral) — numpy arrays or torch tensors."""
    nx = get_backend(qs)
    rest = nx.where(on, leave_one_out(qs), 1.0)                        # R_x = Σ_{w≠x} q_w
    with quiet(qs):
        odds = qs / rest
        finite = array_module(qs).isfinite(odds.sum(-1))
    t1, t2 = exclusive_cumsum(qs, reverse=True), exclusive_cumsum(odds, reverse=True)   # g = 1 after y

    def avail_of(g):
        return qs * ((exclusive_cumsum(g * qs) + t1) / rest + exclusive_cumsum(g * qs / rest) + t2)
    return avail_of, finite


def thinning_fixed_point(avail_of, on, cs):
    """PTS's θ and availabilities ``[R, m]`` on rows in priority order (caps ``cs = ρp``) from a map
    ``g ↦ avail`` (:func:`pair_avail`, or ``gpu.wor_plans``' clock integral for k ≥ 3), as the fixed point
    ``θ = Φ(θ)``, ``Φ(θ)_y = min(1, c_y/avail_y(1 − θ))`` (0 where c_y = 0 or y is undrafted; θ from avail by
    :func:`~univer_theory.plans.clocks.acceptance`, the walk's own spelling).

    θ_y reads only the tokens before y, so ``Φ`` is triangular, and monotone (larger θ before y → less
    availability at y → larger θ_y): iterating it from ``θ ≡ 1`` decreases to the walk's θ, entry i is final
    after i + 1 passes at the latest, and — the float ``Φ`` being triangular too — the first pass that changes
    nothing returns exactly the sequential walk's floats (measured: 9–16 passes at V = 49 152 instead of a
    49 152-step walk).  One host read per pass."""
    nx = get_backend(cs)
    live, caps = on & (cs > 0), acceptance_caps(cs)
    theta = nx.where(on, 1.0 + 0 * cs, 0.0)
    for _ in range(cs.shape[-1] + 1):
        avail = avail_of(1 - theta)
        new = nx.where(live, acceptance(avail, *caps), 0.0)
        if bool((new == theta).all()):
            break
        theta = new
    return theta, nx.where(on, avail, 0.0)


def pair_thinning_avail(draft_probs: np.ndarray, order, c: np.ndarray):
    """PTS availabilities and acceptance probabilities for k = 2 wor children, in closed form (module
    docstring); same contract as :func:`~univer_theory.plans.clocks.sequential_thinning_avail` with k = 2, or
    None where the closed form is not finite (``Σ_x q_x/R_x`` overflows: a subnormal rest mass).
    :func:`pair_avail` and :func:`thinning_fixed_point` on a batch of one row (the drafted tokens in ``order``).
    """
    order = np.asarray(order, dtype=np.int64)
    q = np.asarray(draft_probs, dtype=np.float64)
    qs = q[order][None]
    on = qs > 0
    avail_of, finite = pair_avail(qs, on)
    if not finite[0]:
        return None
    theta_s, avail_s = thinning_fixed_point(avail_of, on, np.asarray(c, dtype=np.float64)[order][None])
    avail, theta = np.zeros(q.size), np.zeros(q.size)
    avail[order], theta[order] = avail_s[0], theta_s[0]
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
