"""Rule 8 (this toolkit's addition, docs/deviations.md item 35): a wor node seen through its first draw.

Without replacement, the first child is the top draft token ``t = argmax q`` (lowest id on ties) with probability
``π = q_t/q(V)``, and given ``S_1 = t`` the other k − 1 children are k − 1 draws without replacement from
``q' = q/q(V∖t)`` on ``V∖t`` — a (k − 1)-child wor node.  With ``c = ρp`` the plan is

* on a tuple with ``S_1 = t``: a (k − 1)-child plan ``w'`` on ``(S_2, …, S_k)`` against
  ``c' = c·min(1/π, 1/c(V∖t))`` on ``V∖t`` (so ``π·a' ≤ c`` and ``Σ c' ≤ 1``: a scaling ``ρ' = Σ c'`` and target
  ``p' = c'/ρ'``), then child 1 (= t) takes what that leaves, ``w_1 = (1 − Σ_j w'_j)·τ``,
  ``τ = min(c_t, π(1 − α'))/(π(1 − α'))``;
* on every other tuple: nothing (``w = 0``).

Its exact marginal is ``a(y) = π·a'(y)`` (y ≠ t), ``a(t) = min(c_t, π(1 − α'))``, so
``α = π·α' + min(c_t, π(1 − α'))``.  Every plan's tuples with ``S_1 = t`` can do no better than
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


def first_draw_rows(c, q):
    """The first-draw split of rows ``c = ρp``, ``q`` ``[..., V]`` (module docstring):
    ``(t [..., 1], π [...], c' [..., V], q' [..., V], ρ' [...], p' [..., V])``.  Masses are summed over the tail,
    never taken as ``1 − q_t``; ``p' = q'`` where ``c(V∖t) = 0`` (then ``ρ' = 0``)."""
    nx = get_backend(c, q)
    t = top_tokens(q, 1)
    q_tail, c_tail = nx.put(q, t, 0.0), nx.put(c, t, 0.0)
    qt = nx.take(q, t)[..., 0]
    pi = qt / (qt + nx.sum(q_tail))
    q_in = q_tail / nx.sum(q_tail, keepdims=True)
    ct = nx.sum(c_tail)
    c_in = c_tail / nx.maximum(pi, ct)[..., None]
    rho_in = nx.clip(nx.sum(c_in), 0.0, 1.0)
    p_in = nx.where(rho_in[..., None] > 0, c_in / nx.where(rho_in > 0, rho_in, 1.0)[..., None], q_in)
    return t, pi, c_in, q_in, rho_in, p_in


def first_draw_gate(c, q, alpha, tol):
    """``[...]`` bool: where rule 8 can beat a plan of acceptance ``α`` by more than ``tol`` — its α is at most π,
    the first draw's probability of t (:func:`first_draw_rows`)."""
    return first_draw_rows(c, q)[1] > alpha + tol


def first_draw_marginal(c, t, pi, a_in):
    """``(a [..., V], τ [...])`` from the inner plan's marginal ``a' [..., V]`` (0 at t):
    ``a = min(π a', c)`` off t (the min only absorbs round-off) and ``a(t) = min(c_t, π(1 − α'))``."""
    nx = get_backend(c, a_in)
    room = pi * nx.clip(1.0 - nx.sum(a_in), 0.0)
    top = nx.minimum(nx.take(c, t)[..., 0], room)
    tau = nx.where(room > 0, top / nx.where(room > 0, room, 1.0), 0.0)
    return nx.put(nx.minimum(pi[..., None] * a_in, c), t, top[..., None]), tau


def first_draw_weights(first, w_in, tau):
    """``w [..., k]`` on tuples whose first child is t where ``first [...]`` holds (0 elsewhere):
    ``((1 − Σ w')·τ, w')`` from the inner weights ``w' [..., k − 1]``; ``τ`` broadcasts against ``first``."""
    nx = get_backend(w_in)
    w = nx.concat([((1.0 - nx.sum(w_in)) * tau)[..., None], w_in])
    return nx.where(first[..., None], w, 0.0)
