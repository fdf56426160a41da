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
(:func:`pair_availability`, the one spelling).  On the host θ comes from the walk itself, compiled
(:func:`pair_thinning_walk`: one O(m) pass a row, the prefix sums carried as scalars); on an accelerator from the
walk's fixed point (:func:`pair_avail`, :func:`thinning_fixed_point`: 9–16 passes of cumulative sums at
V = 49 152, each parallel) — the same floats, bit for bit on the CPU (``tests/theory/test_thinning_walk.py``; an
accelerator's cumulative sums are parallel scans, whose rounding may differ in the last bits).  The closed
form divides by ``R_x``; when one token holds all but a subnormal mass, ``q_x/R_x`` overflows:
:func:`pair_thinning_avail` then declines and the row takes the clock integral instead (it forms no such ratio).

One implementation (:mod:`univer_theory.nx`): :func:`pair_sums`, :func:`pair_avail` and
:func:`thinning_fixed_point` take rows ``[R, m]`` in priority order, numpy or torch (``gpu.wor_plans.pts_weights``
on every row of a level; there the fixed point also runs on the k ≥ 3 clock integral); the walk reads the same
sums and formula.  The exact core runs the walk on a batch of one row (:func:`pair_thinning_avail`).  The checks
stay apart: the tuple-law enumeration and the clock integral (``tests/theory/test_wor_plans.py``).
"""
from __future__ import annotations

import numba
import numpy as np

from ..nx import array_module, get_backend
from ..orders import ratio_argsort
from .base import NodePlan
from .clocks import acceptance, acceptance_caps, sequential_thinning_avail, walk_acceptance
from .node_inputs import check_node_inputs
from .wor_pair import exclusive_cumsum, leave_one_out, quiet


def priority_order(target_probs: np.ndarray, draft_probs: np.ndarray) -> list[int]:
    """Drafted tokens (q > 0) by ``p/q`` descending, ties by token id (:func:`~univer_theory.orders.ratio_argsort`)."""
    order = ratio_argsort(target_probs, draft_probs, descending=True)
    return [int(x) for x in order[:np.count_nonzero(draft_probs > 0)]]


def pair_availability(q, rest, before, before_odds, after, after_odds):
    """The closed form (module docstring) at one token y: ``q_y[(Σ_{z≺y} g_z q_z + Σ_{z≻y} q_z)/R_y +
    Σ_{z≺y} g_z q_z/R_z + Σ_{z≻y} q_z/R_z]`` from its four sums — plain arithmetic, so the one spelling serves
    arrays (numpy or torch, :func:`pair_avail`) and, compiled, the walk's scalars (:func:`_pair_walk`)."""
    return q * ((before + after) / rest + before_odds + after_odds)


_pair_availability = numba.njit(inline="always")(pair_availability)


def pair_sums(qs, on):
    """k = 2: the parts of the closed form that do not depend on θ, on rows in priority order ``qs [R, m]``
    (``on``: drafted): ``(R_x, Σ_{z≻x} q_z, Σ_{z≻x} q_z/R_z, finite [R])`` — ``R_x = Σ_{w≠x} q_w`` (1 off the
    support) and the suffix sums over the lower-priority tokens (g = 1 there), and the rows where the form is
    finite (``Σ_x q_x/R_x < ∞``; the others need the clock integral).  Numpy arrays or torch tensors."""
    nx = get_backend(qs)
    rest = nx.where(on, leave_one_out(qs), 1.0)
    with quiet(qs):
        odds = qs / rest
        finite = array_module(qs).isfinite(odds.sum(-1))
    return rest, exclusive_cumsum(qs, reverse=True), exclusive_cumsum(odds, reverse=True), finite


def pair_avail(qs, on):
    """k = 2: the map ``g ↦ avail`` in closed form (module docstring) on rows already in priority order
    ``qs [R, m]`` (``on``: drafted; undrafted positions, q = 0, add exact zeros), and the rows where that form is
    finite (:func:`pair_sums`) — numpy arrays or torch tensors."""
    rest, after, after_odds, finite = pair_sums(qs, on)

    def avail_of(g):
        return pair_availability(qs, rest, exclusive_cumsum(g * qs), exclusive_cumsum(g * qs / rest), after,
                                 after_odds)
    return avail_of, finite


@numba.njit(cache=True)
def _pair_walk(qs, rest, after, after_odds, c_num, c_den, rows):  # pragma: no cover - compiled
    """The k = 2 walk on rows ``rows`` of ``qs [R, m]`` (priority order; :func:`pair_sums`' parts, the caps'
    forms of :func:`~univer_theory.plans.clocks.acceptance_caps`): ``(θ, avail) [R, m]``, zero on other rows.
    The prefix sums are accumulated one position at a time, in the order and with the operations of
    :func:`pair_avail`'s exclusive cumulative sums, so each availability is the fixed point's float."""
    R, m = qs.shape
    theta, avail = np.zeros((R, m)), np.zeros((R, m))
    for r in rows:
        before, before_odds = 0.0, 0.0
        for i in range(m):
            av = _pair_availability(qs[r, i], rest[r, i], before, before_odds, after[r, i], after_odds[r, i])
            th = walk_acceptance(av, c_num[r, i], c_den[r, i])
            theta[r, i], avail[r, i] = th, av
            gq = (1.0 - th) * qs[r, i]
            before += gq
            before_odds += gq / rest[r, i]
    return theta, avail


def pair_thinning_walk(qs, on, cs):
    """k = 2: PTS's ``(θ, avail, finite)`` on numpy rows in priority order ``qs, cs [R, m]`` (``on``: drafted) by
    the sequential walk, compiled (one pass of O(m) per row; :func:`thinning_fixed_point` takes 9–16 passes of
    cumulative sums, the path for an accelerator) — the same floats; θ = avail = 0 on the rows that are not
    ``finite`` (:func:`pair_sums`) and off the support."""
    rest, after, after_odds, finite = pair_sums(qs, on)
    c_num, c_den = acceptance_caps(np.where(on, cs, 0.0))
    theta, avail = _pair_walk(qs, rest, after, after_odds, c_num, c_den, np.flatnonzero(finite))
    return theta, avail, finite


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
    :func:`pair_thinning_walk` on a batch of one row (the drafted tokens in ``order``).
    """
    order = np.asarray(order, dtype=np.int64)
    q = np.asarray(draft_probs, dtype=np.float64)
    qs = q[order][None]
    theta_s, avail_s, finite = pair_thinning_walk(qs, qs > 0, np.asarray(c, dtype=np.float64)[order][None])
    if not finite[0]:
        return None
    avail, theta = np.zeros(q.size), np.zeros(q.size)
    avail[order], theta[order] = avail_s[0], theta_s[0]
    return avail, theta


def pts_plan(target_probs, draft_probs, rho, k, process, nodes: int | None = None) -> NodePlan | None:
    """PTS node plan for ``wor`` children (None for any other process).

    Parameters
    ----------
    target_probs, draft_probs : p, q [V].
    rho : scaling ρ ∈ [0, 1].
    k : number of children (≤ |supp q|).
    process : draft process; only ``"wor"`` is handled.
    nodes : Gauss–Legendre nodes per panel in log T (k ≥ 3; k = 2 is closed form; default
        :func:`~univer_theory.plans.clocks.clock_nodes` of k).

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
