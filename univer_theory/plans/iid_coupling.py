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

**Float form.**  Each first appearance ``x_i = y_j`` (a *reveal*, j ≤ m) cancels against the factor
``q(y_j)`` of the reveal product, so

.. math::  \\Pr(X = x \\mid S) = \\prod_{j=1}^{m} R_{j−1} \\prod_{i:\\ x_i \\text{ repeats}} q(x_i),

a product of remaining masses (:func:`univer_theory.processes.wor_remaining`, the one remaining-mass form of
``Q_k``: sums of non-negative terms, never ``1 − Σ drawn``) and repeated draft probabilities — no division and
no log: nothing cancels, and on a confident row (tail masses near the smallest denormal) the terms that would
underflow in ``q^k(x)`` and in the reveal product never form.  The virtual sequences are the restricted-growth
strings over the k positions (:func:`growth_strings`: 2, 5, 15, 52 for k = 2..5; each draw repeats a position
seen or reveals the next one).

Every float function here takes numpy arrays (the exact core: one tuple, a batch of one) or torch tensors
(``gpu.wor_plans.coupling_weights``: the R nodes of a level, T tuples each) — one implementation;
:func:`univer_theory.processes.tuple_law` and the plan's enumerated marginal are its exact checks.
``select`` evaluates the i.i.d. plan on the ≤ Bell(k) virtual tuples.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..nx import get_backend
from ..processes import tuple_members, wor_remaining
from .base import NodePlan
from .layout import layout_plan
from .node_inputs import check_node_inputs


@lru_cache(maxsize=None)
def growth_strings(k: int) -> tuple[tuple[int, ...], ...]:
    """The virtual i.i.d. draw sequences of a wor k-tuple as position indices (restricted-growth strings): each
    draw repeats a position already seen or reveals the next one, in the order of :func:`virtual_draws`."""
    out = []

    def rec(x, m):
        if len(x) == k:
            out.append(tuple(x))
            return
        for j in range(min(m + 1, k)):                  # repeat y_1..y_m, or reveal y_{m+1}
            rec(x + [j], max(m, j + 1))
    rec([], 0)
    return tuple(out)


@lru_cache(maxsize=None)
def _string_table(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(pos [n, k], repeat [n, k], revealed [n])`` of :func:`growth_strings`: the positions, which draws repeat a
    position seen before, and how many positions each string reveals (m)."""
    pos = np.array(growth_strings(k), dtype=np.int64)
    seen = np.maximum.accumulate(pos, axis=1)
    repeat = np.concatenate([np.zeros((pos.shape[0], 1), dtype=bool), pos[:, 1:] <= seen[:, :-1]], 1)
    return pos, repeat, seen[:, -1] + 1


def virtual_draw_probs(draft_probs, tuples):
    """``Pr(X_{1:k} = x | S)`` ``[..., T, n]`` for the wor tuples ``tuples [..., T, k]`` of rows ``draft_probs
    [..., V]`` and the n virtual sequences x of :func:`growth_strings` (module docstring, float form:
    ``Π_{j≤m} R_{j−1}·Π_{repeats} q``).  numpy arrays or torch tensors, batch axes alike."""
    nx = get_backend(draft_probs, tuples)
    pos, repeat, revealed = _string_table(tuples.shape[-1])
    members, outside = tuple_members(draft_probs, tuples, "wor")                  # [..., T, k], [..., T]
    reveal = nx.cumprod(wor_remaining(members, outside))                          # Π_{j≤m} R_{j−1}, m = 1..k
    drawn = members[..., nx.index(pos, tuples)]                                   # [..., T, n, k]
    repeats = nx.where(nx.index(repeat, tuples) > 0, drawn, 1.0).prod(-1)          # Π_{repeats} q(x_i)
    return reveal[..., nx.index(revealed - 1, tuples)] * repeats


def mix_virtual(pr, w_iid):
    """The wor plan ``w [..., k]`` from the i.i.d. plan on the virtual sequences, ``w_iid [..., n, k]`` with their
    conditional probabilities ``pr [..., n]`` (:func:`virtual_draw_probs`):
    ``w_j = Σ_n pr_n Σ_{i: draw i of sequence n is position j} w^iid_{n,i}`` (a scatter in sequence order: no
    ``[n, k, k]`` one-hot), round-off clipped to [0, 1] and scaled to ``Σ w ≤ 1``.  numpy or torch."""
    nx = get_backend(pr, w_iid)
    n, k = w_iid.shape[-2:]
    pos = nx.index(_string_table(k)[0].reshape(-1), pr)
    lead = tuple(pr.shape[:-1])
    terms = (pr[..., None] * w_iid).reshape(lead + (n * k,))
    w = nx.scatter_add(nx.zeros_like(terms[..., :k]), nx.full(lead + (n * k,), 0, pos) + pos, terms)
    w = nx.clip(w, 0.0, 1.0)
    return w / nx.maximum(nx.sum(w, keepdims=True), 1.0)


def virtual_draws(S, draft_probs: np.ndarray):
    """``[(x, Pr(X_{1:k} = x | S))]``: the first k i.i.d. draws given the wor tuple S (module docstring;
    :func:`virtual_draw_probs` on a batch of one)."""
    S = tuple(int(y) for y in S)
    pr = virtual_draw_probs(np.asarray(draft_probs, dtype=np.float64), np.asarray([S], dtype=np.int64))[0]
    return [(tuple(S[j] for j in s), float(x)) for s, x in zip(growth_strings(len(S)), pr)]


def couple_iid_plan(iid_plan: NodePlan, draft_probs, k: int) -> NodePlan:
    """The wor plan of an i.i.d. plan for the same ``(p, q, ρ, k)`` (module docstring); same marginal."""
    q = np.asarray(draft_probs, dtype=np.float64)
    memo = {}

    def select(S) -> np.ndarray:
        S = tuple(int(y) for y in S)
        if S not in memo:
            pr = virtual_draw_probs(q, np.asarray([S], dtype=np.int64))                  # [1, n]
            w_iid = np.stack([iid_plan.select(tuple(S[j] for j in s)) for s in growth_strings(k)])
            memo[S] = mix_virtual(pr, w_iid[None])[0]
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
