"""Rule 1: the exact CondOT(ρ) LP on the draft support as a node plan (theory.md §4.2, §6.3 item 1).

The LP gives ``π(S, j)`` over every ordered tuple with ``Q_k(S) > 0``; the plan is ``w_j(S) = π(S, j)/Q_k(S)``.
The LP's optimum is usually a face; the plan is its one point under the tie-break of ``solvers.tie_break``,
carrying round-off, not a solver's tolerance.  ``iid`` / ``wor``: the lexicographic simplex on the node's row as a
batch of one (:func:`solvers.condot_simplex.condot_table`, the same function the batched layer runs on a level, so
both take the same plan from the same floats; HiGHS' :func:`solvers.condot.condot_plan` is the tests' oracle).
``topk`` / ``greedy`` (their tuples are not the support's ordered tuples; only the forced construction uses them):
HiGHS' plan recomputed from its optimal basis (:func:`solvers.condot.condot_plan`).  Round-off would still leak
1:1 into the output law, so the plan actually used is repaired to be *exactly* feasible in floats and its
marginal is recomputed from it:

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
    rule's ``z/Q_k`` too, :mod:`solvers.slot_rule`) — numpy arrays or torch tensors."""
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
    (:mod:`solvers.condot_simplex`, a batch of nodes, on support ranks)."""
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
    return table_plan(construction, w, tuples, a, p, rho, info)


def table_plan(construction: str, w: np.ndarray, tuples, marginal: np.ndarray, p: np.ndarray, rho,
               info: dict | None = None) -> NodePlan:
    """A :class:`NodePlan` from a repaired table ``w [n_tuples, k]`` over ``tuples`` with its marginal; any tuple
    outside the table gets ``w = 0``."""
    index = {tuple(int(y) for y in S): i for i, S in enumerate(tuples)}

    def select(S):
        i = index.get(tuple(int(y) for y in S))
        return w[i].copy() if i is not None else np.zeros(w.shape[1])

    return NodePlan(construction, rho, p, marginal, select, info or {})


def lp_plan(target_probs, draft_probs, rho, k, process, position_weights=None) -> NodePlan | None:
    """Rule 1 for any process: the CondOT(ρ) LP plan, repaired and with its exact marginal; with integer
    ``position_weights`` ω [k] the shape rule's plan (:mod:`~univer_theory.plans.shape_lp`, construction
    ``"shape_lp"``): among the α*(ρ)-optimal plans the one with the most ``Σ ω_j π(S, j)``.

    Returns None when the solver fails (the LP is always feasible: π = 0; the simplex may hit its pivot cap,
    HiGHS may fail).
    """
    p, q, rho = check_node_inputs("lp_plan", target_probs, draft_probs, rho, k, process)
    omega = check_position_weights("lp_plan", position_weights, k)
    construction = "lp" if omega is None else "shape_lp"
    if process in ("iid", "wor"):
        from solvers.condot_simplex import condot_table

        sup, tup, w, a, solved = condot_table((rho * p)[None], q[None], k, process,
                                              None if omega is None else omega[None])
        return table_plan(construction, w[0], sup[0][tup], a[0], p, rho) if solved[0] else None
    from solvers.condot import condot_plan

    law = tuple_law(q, k, process)
    res = condot_plan(p, q, rho, k, process, support=law, position_weights=omega)
    if res.plan is None or res.status.startswith("highs"):
        return None
    probs = np.array([float(pr) for _, pr in law])
    return tabulated_plan(construction, plan_weights(np.asarray(res.plan, dtype=np.float64), probs), res.tuples,
                          probs, p, rho)


def check_position_weights(where: str, position_weights, k: int) -> np.ndarray | None:
    """The shape rule's ω as k integers in float64 (None stays None); else a ValueError naming ``where``."""
    if position_weights is None:
        return None
    omega = np.asarray(position_weights, dtype=np.float64)
    if omega.shape != (k,) or not np.all(np.isfinite(omega)) or not np.array_equal(omega, np.round(omega)):
        raise ValueError(f"{where}: position_weights must be {k} integers (one per child position), "
                         f"got {position_weights!r}")
    return omega
