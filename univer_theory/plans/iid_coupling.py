"""Rule 5 of theory.md §6.3: run an i.i.d. node plan on ``wor`` children through the i.i.d. coupling.

**Coupling.**  Let ``X_1, X_2, …`` be i.i.d. draws from q.  The first k *distinct* values, in order of first
appearance, have exactly the wor law ``Q_k``; the first k draws ``X = (X_1..X_k)`` have the i.i.d. law
``q^k``.  Every value of X is among the first distinct values, so X is a sequence over the tokens of S, and
its distinct values (m ≤ k of them) are the prefix ``y_1..y_m`` of S.  Jointly,

.. math::  \\Pr(X = x,\\ S) = q^k(x)\\prod_{j=m+1}^{k} \\frac{q(y_j)}{R_{j−1}},\\qquad
           \\Pr(X = x \\mid S) = q^k(x) \\Big/ \\prod_{j=1}^{m} \\frac{q(y_j)}{R_{j−1}},

``R_{j−1} = Σ_{z ∉ {y_1..y_{j−1}}} q_z`` (after the first m distinct values, later new values are wor
draws from the rest).  So X given S is a small Markov chain over S: each virtual draw repeats a seen token
or reveals the next token of S.

**Plan.**  Given an i.i.d. plan ``w^iid`` (weights on the positions of X), the wor plan is

.. math::  w_j(S) = \\sum_x \\Pr(X = x \\mid S) \\sum_{i:\\, x_i = y_j} w^{iid}_i(x),

which is in ``[0,1]``, sums to ``≤ 1``, and has token marginal ``a^wor(y) = E[Σ_i 1(X_i = y) w^iid_i(X)]``
``= a^iid(y)`` — identically, for any i.i.d. plan.  With the α*_iid-optimal private-position layout (rule 2,
:func:`~univer_theory.plans.layout.layout_plan`, any V) the wor node attains exactly ``α*_iid(ρ) ≤ α*_wor(ρ)``:
near-optimal when max q is small (few repeats among the virtual draws), poor when one token dominates.
``select`` enumerates the ≤ k^k virtual tuples.
"""
from __future__ import annotations

import numpy as np

from .base import NodePlan
from .layout import layout_plan
from .node_inputs import check_node_inputs


def virtual_draws(S, draft_probs: np.ndarray):
    """``[(x, Pr(X_{1:k} = x | S))]``: the first k i.i.d. draws given the wor tuple S (module docstring).

    Products are summed as logs: on a confident row (tail masses near the smallest denormal) both
    ``q^k(x)`` and the reveal product underflow while their ratio is an ordinary number."""
    k = len(S)
    log_q = np.log(np.asarray(draft_probs, dtype=np.float64)[list(S)])     # drafted: q > 0
    # log Π_{j≤m} q(y_j)/R_{j−1} for m = 0..k; R is summed over the unseen tokens, as in the wor tuple law
    unseen = np.ones(draft_probs.size, dtype=bool)
    log_reveal = [0.0]
    for j, y in enumerate(S):
        log_reveal.append(log_reveal[-1] + log_q[j] - np.log(draft_probs[unseen].sum()))
        unseen[y] = False
    out = []

    def rec(x, m, log_pr):
        if len(x) == k:
            out.append((tuple(x), float(np.exp(log_pr - log_reveal[m]))))
            return
        for j in range(min(m + 1, k)):                  # repeat y_1..y_m, or reveal y_{m+1}
            rec(x + [S[j]], max(m, j + 1), log_pr + log_q[j])
    rec([], 0, 0.0)
    return out


def couple_iid_plan(iid_plan: NodePlan, draft_probs, k: int) -> NodePlan:
    """The wor plan of an i.i.d. plan for the same ``(p, q, ρ, k)`` (module docstring); same marginal."""
    q = np.asarray(draft_probs, dtype=np.float64)
    memo = {}

    def select(S) -> np.ndarray:
        S = tuple(int(y) for y in S)
        if S not in memo:
            slot = {y: j for j, y in enumerate(S)}
            w = np.zeros(k)
            for x, pr in virtual_draws(S, q):
                wx = iid_plan.select(x)
                for i, xi in enumerate(x):
                    w[slot[xi]] += pr * wx[i]
            w = np.clip(w, 0.0, 1.0)                  # round-off only (±1e-16): keep w a valid plan
            memo[S] = w / max(1.0, w.sum())
        return memo[S].copy()

    return NodePlan("iid_coupling", iid_plan.rho, iid_plan.target, iid_plan.marginal, select,
                    {"base": iid_plan.construction, "base_info": iid_plan.info})


def iid_coupling_plan(target_probs, draft_probs, rho, k, process) -> NodePlan | None:
    """Rule 5: the α*_iid-optimal layout plan (rule 2) coupled onto ``wor`` children (None otherwise).

    α = α*_iid(ρ) exactly (the coupling preserves the marginal); compare with PTS (rule 4) per node.
    """
    p, q, rho = check_node_inputs("iid_coupling_plan", target_probs, draft_probs, rho, k, process)
    if process != "wor":
        return None
    return couple_iid_plan(layout_plan(p, q, rho, k, "iid"), q, k)
