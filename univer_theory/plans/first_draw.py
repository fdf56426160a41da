"""Rule 8 (this toolkit's addition, docs/deviations.md item 35): a wor node seen through its first draw.

Without replacement, the first child is the top draft token ``t = argmax q`` (lowest id on ties) with probability
``π = q_t/q(V)``, and given ``S_1 = t`` the other k − 1 children are k − 1 draws without replacement from
``q' = q/q(V∖t)`` on ``V∖t`` — a (k − 1)-child wor node.  With ``c = ρp`` the plan is

* on a tuple with ``S_1 = t``: a (k − 1)-child plan ``w'`` on ``(S_2, …, S_k)`` against
  ``c' = c·min(1/π, 1/c(V∖t))`` on ``V∖t`` (so ``π·a' ≤ c`` and ``Σ c' ≤ 1``: a scaling ``ρ' = Σ c'`` and target
  ``p' = c'/ρ'``), then child 1 (= t) takes what that leaves, ``w_1 = (1 − Σ_j w'_j)·τ``,
  ``τ = min(c_t, π(1 − α'))/(π(1 − α'))``;
* on a tuple with ``S_1 = x ≠ t`` (probability ``1 − π``): what those leave of ``c`` — child 1 up to x's room, then
  child 2 if it is t, up to t's room (:func:`first_draw_marginal`; on a confident row this recovers most of the
  ``d = 1 − π`` that rule 8 would otherwise leave, when α*(ρ) needs t).

Its tuples that start with t have the exact marginal ``π·a'(y)`` (y ≠ t) and ``min(c_t, π(1 − α'))`` at t, so
they give ``π·α' + min(c_t, π(1 − α'))``; the other tuples only add.  Every plan's tuples with ``S_1 = t`` can do no better than
``π·min(1, c_t/π + α*_{k−1}(c/π))`` and the others add at most ``1 − π``, while ``α*_{k−1}(c') ≥
α*_{k−1}(c/π)/max(1, c(V∖t)/π)``: with an α*-optimal inner plan, ``α ≥ α*(ρ) − 2(1 − π)/π``.  So on a confident
row (``1 − π = d`` ≤ 1e-12) the node is as good as the (k − 1)-child node on its tail, whose rows are ordinary —
where PTS and the iid coupling lose several percent on a near-flat tail under a low-ratio top token (item 25).

The float formulas, numpy or torch (:mod:`univer_theory.nx`), rows ``[..., V]``; the plan that composes them
with the inner choice is :func:`univer_theory.plans.choose.first_draw_plan` (core) and
``gpu.wor_plans.wor_weights`` (batched).
"""
from __future__ import annotations

from ..nx import get_backend
from ..orders import top_tokens
from .wor_pair import leave_one_out, safe_div


#: Relative room ``(c − a)/c`` below which the room left by the tuples that start with t is taken as round-off.
ROOM_TOL = 2.0 ** -40


def first_draw_probability(q):
    """``(t [..., 1], π [...])``: the top draft token of rows ``q [..., V]`` (lowest id on ties) and the
    probability ``π = q_t/q(V)`` that it is drawn first."""
    nx = get_backend(q)
    t = top_tokens(q, 1)
    return t, nx.take(q, t)[..., 0] / nx.sum(q)


def first_draw_rows(c, q):
    """The first-draw split of rows ``c = ρp``, ``q`` ``[..., V]`` (module docstring):
    ``(t [..., 1], π [...], q' [..., V], ρ' [...], p' [..., V])``, the inner node's target ``c' = ρ'p'``.  Masses
    are summed over the tail, never taken as ``1 − q_t``; ``p' = q'`` where ``c(V∖t) = 0`` (then ``ρ' = 0``)."""
    nx = get_backend(c, q)
    t, pi = first_draw_probability(q)
    q_tail, c_tail = nx.put(q, t, 0.0), nx.put(c, t, 0.0)
    q_in = q_tail / nx.sum(q_tail, keepdims=True)
    c_in = c_tail / nx.maximum(pi, nx.sum(c_tail))[..., None]
    rho_in = nx.clip(nx.sum(c_in), 0.0, 1.0)
    p_in = nx.where(rho_in[..., None] > 0, c_in / nx.where(rho_in > 0, rho_in, 1.0)[..., None], q_in)
    return t, pi, q_in, rho_in, p_in


def first_draw_gate(q, alpha, tol):
    """``[...]`` bool: where rule 8 is worth building against a plan of acceptance ``α`` — where its tuples that start
    with t, which give at most π (:func:`first_draw_probability`), could beat ``α`` by more than ``tol``."""
    return first_draw_probability(q)[1] > alpha + tol


def first_draw_marginal(c, q, t, pi, a_in):
    """``(a [..., V], τ [...], u [..., V], v [...])`` from the inner plan's marginal ``a' [..., V]`` (0 at t).

    Tuples starting with t: ``a = min(π a', c)`` off t (the min only absorbs round-off), ``a(t) = min(c_t,
    π(1 − α'))``.  Then the room ``r = c − a`` left by them is offered to the other tuples (``S_1 = x ≠ t``,
    probability ``π_x = q_x/q(V)``): child 1 is taken w.p. ``u_x = min(1, r_x/π_x)``, else child 2 if it is t
    (probability ``q_t/q(V∖x)``, summed without cancellation) w.p. ``v = min(1, r_t/M)``,
    ``M = Σ_{x≠t} π_x (1 − u_x) q_t/q(V∖x)``; they add ``min(π_x, r_x)`` at x and ``min(r_t, M)`` at t."""
    nx = get_backend(c, a_in)
    room = pi * nx.clip(1.0 - nx.sum(a_in), 0.0)
    top = nx.minimum(nx.take(c, t)[..., 0], room)
    tau = safe_div(top, room, room > 0)
    a = nx.put(nx.minimum(pi[..., None] * a_in, c), t, top[..., None])
    r = nx.where(c - a > ROOM_TOL * c, c - a, 0.0)
    pix = nx.put(q, t, 0.0) / nx.sum(q, keepdims=True)
    on = pix > 0
    u = nx.where(on & (r >= pix), 1.0, safe_div(r, pix, on & (r < pix)))     # min(1, r/π): no r/π past 1
    M = nx.sum(pix * (1.0 - u) * safe_div(nx.take(q, t), leave_one_out(q), on))   # Pr(S_2 = t | S_1 = x)
    rt = nx.take(r, t)[..., 0]
    v = nx.minimum(safe_div(rt, M, M > 0), 1.0)
    extra = nx.put(nx.minimum(pix, r), t, nx.minimum(rt, M)[..., None])
    return a + extra, tau, u, v


def first_draw_weights(first, w_in, tau, u1, second, v):
    """``w [..., k]`` of rule 8 on tuples: where ``first [...]`` holds (``S_1 = t``) ``((1 − Σ w')·τ, w')`` from the
    inner weights ``w' [..., k − 1]``; elsewhere ``(u_{S_1}, (1 − u_{S_1})·v·[S_2 = t], 0, …)`` with ``u1 = u_{S_1}``
    and ``second = [S_2 = t]`` (:func:`first_draw_marginal`); ``τ``, ``v`` broadcast against ``first``."""
    nx = get_backend(w_in)
    main = nx.concat([(nx.maximum(1.0 - nx.sum(w_in), 0.0) * tau)[..., None], w_in])
    rest = nx.concat([u1[..., None], nx.where(second, (1.0 - u1) * v, 0.0)[..., None], 0.0 * w_in[..., 1:]])
    return nx.where(first[..., None], main, rest)
