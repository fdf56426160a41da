"""Rule 1: the exact CondOT(ρ) LP on the draft support as a node plan (theory.md §4.2, §6.3 item 1).

Any process.  The LP (``solvers.condot.condot_plan``, HiGHS) gives ``π(S, j)`` over every ordered tuple with
``Q_k(S) > 0``; the plan is ``w_j(S) = π(S, j)/Q_k(S)``.  The LP's optimum is usually a face; the plan is its
one point under the tie-break of ``solvers.tie_break`` (every exact solver finds it: the batched twin,
``gpu.condot``, does), recomputed from HiGHS' optimal basis, so it carries round-off, not HiGHS' tolerance.
Round-off would still leak 1:1 into the output law, so the plan actually used is repaired to be *exactly*
feasible in floats and its marginal is recomputed from it:

1. clip negative entries to 0;
2. scale each row so ``Σ_j w_j(S) ≤ 1``;
3. scale every entry carrying token y by ``min(1, ρp(y)/a(y))`` so ``a(y) ≤ ρp(y)``;
4. ``marginal = a`` recomputed from the repaired plan (the residual ``norm(ρp − a)`` is built from it).

Practical for support m ≲ 15 at k = 3 (m^k tuples); the solver layer is imported on first use.
"""
from __future__ import annotations

import numpy as np

from ..nx import get_backend
from ..processes import tuple_law
from .base import NodePlan
from .node_inputs import check_node_inputs


def capped_rows(w):
    """``w / max(1, Σ_j w_j)`` for the weights ``w [..., k]`` on each tuple (step 2 of the module docstring; the slot
    rule's ``z/Q_k`` too, :mod:`solvers.slot_rule`, :mod:`gpu.slot_rule`) — numpy arrays or torch tensors."""
    nx = get_backend(w)
    return w / nx.maximum(nx.sum(w, keepdims=True), 1.0)


def plan_weights(pi, tuple_probs):
    """``w_j(S) = min(1, π(S, j)/Q_k(S))`` from an LP's joint masses ``π [..., n, k]`` and the tuples'
    probabilities ``[..., n]`` (0 where ``Q_k(S) = 0``: a tuple whose float probability underflows carries no
    mass); the ratio is formed only below 1 — on a subnormal ``Q_k(S)`` the solver's round-off in π made ``π/Q_k``
    overflow, and ``inf/inf`` a NaN after the cap.  numpy arrays or torch tensors."""
    nx = get_backend(pi, tuple_probs)
    probs = tuple_probs[..., None]
    below = (probs > 0) & (pi < probs)
    return nx.where(below, pi / nx.where(below, probs, 1.0), nx.where(probs > 0, 1.0, 0.0))


def repaired_plan(weights, tuples, tuple_probs, c):
    """Steps 1–4 of the module docstring on ``weights [..., n, k]`` (``w_j(S)`` of the n tuples ``tuples
    [..., n, k]``, indices into the last axis of the caps ``c = ρp [..., V]``, with probabilities ``tuple_probs
    [..., n]``): ``(w, a [..., V])`` — numpy arrays (the exact core, one node) or torch tensors
    (:mod:`gpu.condot`, a batch of nodes, on support ranks)."""
    nx = get_backend(weights, c)
    w = capped_rows(nx.maximum(weights, 0.0))
    at = tuples.reshape(tuples.shape[:-2] + (-1,))

    def marginal(w):
        return nx.scatter_add(nx.zeros_like(c), at, (w * tuple_probs[..., None]).reshape(at.shape))

    a = marginal(w)
    over = a > c
    w = w * nx.take(nx.where(over, c / nx.where(over, a, 1.0), 1.0), at).reshape(w.shape)
    return w, marginal(w)


def tabulated_plan(construction: str, weights: np.ndarray, tuples, tuple_probs: np.ndarray, target_probs, rho,
                   info: dict | None = None) -> NodePlan:
    """A :class:`NodePlan` from a table ``weights [n_tuples, k]`` of ``w_j(S)`` over ``tuples`` (e.g. an LP's
    ``π/Q_k``), repaired by :func:`repaired_plan` so it is exactly feasible with its exact marginal; any tuple
    outside the table (probability 0) gets ``w = 0``."""
    p = np.asarray(target_probs, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    w, a = repaired_plan(weights, np.asarray(tuples, dtype=np.int64).reshape(weights.shape),
                         np.asarray(tuple_probs, dtype=np.float64), float(rho) * p)
    index = {tuple(int(y) for y in S): i for i, S in enumerate(tuples)}

    def select(S):
        i = index.get(tuple(int(y) for y in S))
        return w[i].copy() if i is not None else np.zeros(w.shape[1])

    return NodePlan(construction, rho, p, a, select, info or {})


def lp_plan(target_probs, draft_probs, rho, k, process, position_weights=None) -> NodePlan | None:
    """Rule 1 for any process: the CondOT(ρ) LP plan, repaired and with its exact marginal; with integer
    ``position_weights`` ω [k] the shape rule's plan (:mod:`~univer_theory.plans.shape_lp`, construction
    ``"shape_lp"``): among the α*(ρ)-optimal plans the one with the most ``Σ ω_j π(S, j)``.

    Returns None when HiGHS fails (the LP is always feasible: π = 0).  ``info`` carries the LP value, the
    solver status and the repair's change of α (``lp_value − α``, round-off).
    """
    from solvers.condot import condot_plan

    p, q, rho = check_node_inputs("lp_plan", target_probs, draft_probs, rho, k, process)
    law = tuple_law(q, k, process)
    res = condot_plan(p, q, rho, k, process, support=law, position_weights=position_weights)
    if res.plan is None or res.status.startswith("highs"):
        return None
    probs = np.array([float(pr) for _, pr in law])
    weights = plan_weights(np.asarray(res.plan, dtype=np.float64), probs)
    plan = tabulated_plan("lp" if position_weights is None else "shape_lp", weights, res.tuples,
                          probs, p, rho, {"lp_value": res.value, "lp_status": res.status})
    plan.info["repair_loss"] = res.value - plan.alpha
    return plan
