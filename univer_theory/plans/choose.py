"""Which node plan UniVer uses at a node (theory.md §6.3): the constructions by name and the automatic choice.

* ``k = 1``: the unique plan ``w = min(1, ρp(y)/Q_1(y))`` (``single``; UniVer == BV on chains);
* ``iid``: rule 2, the private-position layout (α*-optimal, any V);
* ``wor``: k = 2 → rule 3 (``wor_pair``) when feasible, which it is only when its exact α is within
  ``OPTIMALITY_TOL`` of α*(ρ) (checked on the result, so nothing can beat it by more); otherwise the larger
  exact α of rule 4 (``pts``) and rule 5 (``iid_coupling``); on a small draft support (≤ :data:`SMALL_SUPPORT`
  tokens) rule 1 (``lp``, α*-optimal) replaces them when it is better by more than :data:`ALPHA_TIE`; on a larger
  support within the Luce budget (:func:`~univer_theory.plans.luce.luce_budget`) rule 7 (``luce``) replaces
  them when it is better by more than ``OPTIMALITY_TOL`` — it is built only when they are below α*(ρ) by more
  than that, which gives the same choice as building it always (its α never exceeds α*);
* ``topk``: the fixed top-k list filled in drafting order (``fill``, closed form, α*-optimal, exact in Fraction
  mode); ``greedy``: the closed-form ``greedy_fill`` (α*-optimal);
* rule 6 (``tv``) as the last resort.
"""
from __future__ import annotations

import numpy as np

from ..alpha_star import alpha_star
from ..processes import tuple_law
from .base import NodePlan
from .iid_coupling import iid_coupling_plan
from .layout import layout_plan
from .lp_plan import lp_plan, tabulated_plan
from .luce import luce_budget, luce_plan
from .node_inputs import check_node_inputs
from .pts import pts_plan
from .tv_plan import tv_plan
from .wor_pair import OPTIMALITY_TOL, wor_pair_plan

#: Every construction by its public name, with the draft processes it handles.
CONSTRUCTIONS = {
    "fill": (lambda p, q, rho, k, process: topk_fill_plan(p, q, rho, k), ("topk",)),
    "greedy_fill": (lambda p, q, rho, k, process: greedy_fill_plan(p, q, rho, k), ("greedy",)),
    "layout": (layout_plan, ("iid",)),
    "lp": (lp_plan, ("iid", "wor", "topk", "greedy")),
    "tv": (tv_plan, ("iid", "wor")),
    "wor_pair": (wor_pair_plan, ("wor",)),
    "pts": (pts_plan, ("wor",)),
    "iid_coupling": (iid_coupling_plan, ("wor",)),
    "luce": (luce_plan, ("wor",)),
}

#: Draft supports up to this size may use the exact LP (rule 1) under ``wor``.
SMALL_SUPPORT = 8
#: α differences below this count as ties (the earlier, closed-form construction wins).
ALPHA_TIE = 1e-12


def single_child_plan(target_probs, draft_probs, rho, process) -> NodePlan:
    """k = 1: ``w(y) = min(1, ρp(y)/Q_1(y))``, ``a = min(ρp, Q_1)`` (exact for Fraction rows).

    ``Q_1 = q`` for iid / wor / greedy; the point mass on the top draft token for topk.
    """
    p, q = np.asarray(target_probs), np.asarray(draft_probs)
    if process == "topk":
        ((top,), _), = tuple_law(q, 1, "topk")
        q = q * 0
        q[top] = 1
    c = rho * p
    a = np.minimum(c, q)

    def select(S):
        (y,) = S
        return np.array([min(1, c[y] / q[y])], dtype=p.dtype)

    return NodePlan("single", rho, p, a, select)


def topk_fill_plan(target_probs, draft_probs, rho, k: int) -> NodePlan:
    """``topk``: the tuple is the fixed list D of the k most likely draft tokens (``Q_k(D) = 1``); fill it in
    drafting order, ``w_j = min(ρp(y_j), 1 − Σ_{l<j} w_l)``, so ``a(y_j) = w_j ≤ ρp(y_j)`` and
    ``α = min(1, ρp(D)) = α*(ρ)``.  Any other tuple has probability 0 and gets ``w = 0``.  Exact for Fraction rows.
    """
    p = np.asarray(target_probs)
    (top, _), = tuple_law(np.asarray(draft_probs), k, "topk")
    c = rho * p
    w, used = [], 0 * c[0]
    for y in top:
        w.append(max(0 * used, min(c[y], 1 - used)))
        used = used + w[-1]
    w = np.array(w, dtype=p.dtype)
    a = 0 * c
    a[list(top)] = w

    def select(S):
        return w.copy() if tuple(int(y) for y in S) == tuple(top) else 0 * w

    return NodePlan("fill", rho, p, a, select)


def greedy_fill_plan(target_probs, draft_probs, rho, k: int) -> NodePlan:
    """``greedy``, k ≥ 2: tuples ``S_z = (t_1..t_{k−1}, z)`` — the fixed top-(k−1) list T, then z drawn from q off T
    with ``r(z) = q(z)/q(V∖T)``.  With ``c = ρp``: the last child takes what its own token allows,
    ``w_k(z) = m_z/r(z)``, ``m_z = min(r(z), c(z))``; the fixed children share every tuple's remaining capacity
    ``1 − w_k(z)`` in proportion to ``c(t_i)``, scaled by ``φ = min(1, c(T)/L)``, ``L = Σ_z (r(z) − m_z)``.  Then
    ``α = Σ_z m_z + min(c(T), L) = α*(ρ)`` (moving mass from a z to the fixed list is one-for-one, so no plan
    does better).  Float rows; repaired as rule 1 so that ``a ≤ ρp`` holds exactly.
    """
    p = np.asarray(target_probs, dtype=np.float64)
    law = tuple_law(np.asarray(draft_probs, dtype=np.float64), k, "greedy")
    tuples = [S for S, _ in law]
    r = np.array([float(x) for _, x in law])
    fixed = list(tuples[0][:-1])
    c = float(rho) * p
    z = np.array([S[-1] for S in tuples])
    m = np.minimum(r, c[z])
    last = np.where(r > 0, m / np.where(r > 0, r, 1), 0.0)
    spare, share = float(np.sum(r - m)), float(c[fixed].sum())
    phi = min(1.0, share / spare) if spare > 0 else 0.0
    split = c[fixed] / share if share > 0 else np.zeros(len(fixed))
    w = np.concatenate([phi * (1 - last)[:, None] * split[None, :], last[:, None]], axis=1)
    return tabulated_plan("greedy_fill", w, tuples, r, p, rho)


def choose_plan(target_probs, draft_probs, rho, k: int, process: str) -> NodePlan:
    """The automatic choice of the module docstring; ``plan.construction`` records the rule used."""
    if k == 1:
        return single_child_plan(target_probs, draft_probs, rho, process)
    if process == "iid":
        plan = layout_plan(target_probs, draft_probs, rho, k, process)
    elif process == "wor":
        plan = wor_pair_plan(target_probs, draft_probs, rho, k, process) if k == 2 else None
        if plan is None:
            plan = _best([pts_plan(target_probs, draft_probs, rho, k, process),
                          iid_coupling_plan(target_probs, draft_probs, rho, k, process)])
            support = np.count_nonzero(np.asarray(draft_probs, dtype=np.float64))
            if support <= SMALL_SUPPORT:
                plan = _best([plan, lp_plan(target_probs, draft_probs, rho, k, process)])
            elif luce_budget(support, k) and (float(plan.alpha) < float(
                    alpha_star(target_probs, draft_probs, k, process, rho)) - OPTIMALITY_TOL):
                plan = _best([plan, luce_plan(target_probs, draft_probs, rho, k, process)], OPTIMALITY_TOL)
    elif process == "topk":
        plan = topk_fill_plan(target_probs, draft_probs, rho, k)
    else:
        plan = greedy_fill_plan(target_probs, draft_probs, rho, k)
    if plan is None:
        plan = tv_plan(target_probs, draft_probs, rho, k, process)
    if plan is None:
        raise NotImplementedError(f"choose_plan: no UniVer construction for process {process!r} at k = {k}")
    return plan


def build_plan(construction: str, target_probs, draft_probs, rho, k: int, process: str) -> NodePlan:
    """A forced construction (``"auto"`` = :func:`choose_plan`); k = 1 always uses :func:`single_child_plan`.

    Raises NotImplementedError when the construction does not handle ``process`` or returns no plan here
    (e.g. ``wor_pair`` infeasible on this node), ValueError on bad node inputs (:func:`check_node_inputs`).
    """
    check_node_inputs("build_plan", target_probs, draft_probs, rho, k, process)
    if construction == "auto":
        return choose_plan(target_probs, draft_probs, rho, k, process)
    if k == 1:
        return single_child_plan(target_probs, draft_probs, rho, process)
    fn, processes = CONSTRUCTIONS[construction]
    plan = fn(target_probs, draft_probs, rho, k, process) if process in processes else None
    if plan is None:
        raise NotImplementedError(f"build_plan: construction {construction!r} gives no plan for process "
                                  f"{process!r}, k = {k} on this node")
    return plan


def _best(plans, tie: float = ALPHA_TIE):
    """The plan with the largest α; on ties (within ``tie``) the earlier one."""
    best = None
    for plan in plans:
        if plan is not None and (best is None or float(plan.alpha) > float(best.alpha) + tie):
            best = plan
    return best
