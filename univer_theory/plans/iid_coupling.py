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
seen or reveals the next one; Bell(k) of them).

**Multisets.**  The probability depends on x through its multiset alone (which positions, how many copies of
each), and the layout plan is symmetric in the positions (a copy's share depends on its token and the multiset
alone), so ``Σ_{i: x_i = y_j} w^iid_i(x)`` is the same for every x of a multiset and the sum over x is one over
the multisets, each weighted by its number of sequences: :func:`virtual_multisets`, ``2^{k−1}`` of them (8 for
k = 4, 512 for k = 10, where Bell(10) = 115 975 sequences would be laid out).

Every float function here takes numpy arrays (the exact core: one tuple, a batch of one) or torch tensors
(``gpu.wor_plans.coupling_weights``: the R nodes of a level, T tuples each) — one implementation;
:func:`univer_theory.processes.tuple_law` and the plan's enumerated marginal are its exact checks.
``select`` evaluates the i.i.d. plan on the ``2^{k−1}`` virtual multisets.
"""
from __future__ import annotations

import math
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
def virtual_multisets(k: int) -> tuple[tuple[int, ...], ...]:
    """The multisets of the virtual sequences of :func:`growth_strings`, each as its positions in ascending order:
    ``c_j ≥ 1`` copies of positions ``0..m−1`` (a composition of k: ``2^{k−1}`` of them, where there are Bell(k)
    strings — 512 against 115 975 at k = 10), in lexicographic order."""
    out = []

    def rec(x):
        if len(x) == k:
            out.append(tuple(x))
            return
        rec(x + [x[-1]])                                # one more copy of the last position
        rec(x + [x[-1] + 1])                            # or the next position
    rec([0])
    return tuple(out)


@lru_cache(maxsize=None)
def _multiset_table(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(pos [M, k], repeat [M, k], revealed [M], ways [M])`` of :func:`virtual_multisets`: the positions, which
    copies repeat a position, how many positions each reveals (m) and how many virtual sequences have that
    multiset: ``Π_j C(s_j − 1, c_j − 1)``, ``s_j = c_j + … + c_{m−1}`` (of the ``s_j`` draws of positions
    ``j..m−1`` the first is position j's first copy — first appearances come in position order — and its other
    ``c_j − 1`` copies take any of the other ``s_j − 1``), an integer, exact as a float."""
    pos = np.array(virtual_multisets(k), dtype=np.int64).reshape(-1, k)
    repeat = np.concatenate([np.zeros((pos.shape[0], 1), dtype=bool), pos[:, 1:] == pos[:, :-1]], 1)
    ways = []
    for x in pos.tolist():
        counts = np.bincount(x)
        rest = np.cumsum(counts[::-1])[::-1]
        ways.append(math.prod(math.comb(int(s) - 1, int(c) - 1) for s, c in zip(rest, counts)))
    return pos, repeat, pos[:, -1] + 1, np.array(ways, dtype=np.float64)


def virtual_draw_probs(draft_probs, tuples):
    """``Pr(X_{1:k} = x | S)`` ``[..., T, M]`` for the wor tuples ``tuples [..., T, k]`` of rows ``draft_probs
    [..., V]``, x any virtual sequence of each of the M multisets of :func:`virtual_multisets` (module docstring,
    float form: ``Π_{j≤m} R_{j−1}·Π_{repeats} q`` depends on x through its multiset alone).  numpy arrays or
    torch tensors, batch axes alike."""
    nx = get_backend(draft_probs, tuples)
    pos, repeat, revealed, _ = _multiset_table(tuples.shape[-1])
    members, outside = tuple_members(draft_probs, tuples, "wor")                  # [..., T, k], [..., T]
    reveal = nx.cumprod(wor_remaining(members, outside))                          # Π_{j≤m} R_{j−1}, m = 1..k
    drawn = members[..., nx.index(pos, tuples)]                                   # [..., T, M, k]
    repeats = nx.where(nx.index(repeat, tuples) > 0, drawn, 1.0).prod(-1)          # Π_{repeats} q(x_i)
    return reveal[..., nx.index(revealed - 1, tuples)] * repeats


def mix_virtual(pr, w_iid):
    """The wor plan ``w [..., k]`` from a position-symmetric i.i.d. plan on the virtual multisets, ``w_iid [..., M,
    k]`` (multiset M's copies in the order of :func:`virtual_multisets`) with their sequences' conditional
    probabilities ``pr [..., M]`` (:func:`virtual_draw_probs`).  The plan being symmetric in the positions (the
    layout: a copy's share depends on its token and the multiset alone), every sequence of a multiset has the
    same probability and, permuted, the same weights, so the module's sum over the sequences is one over the
    multisets: ``w_j = Σ_M ways_M·pr_M Σ_{i: copy i of M is position j} w^iid_{M,i}`` (a scatter in multiset
    order: no ``[M, k, k]`` one-hot), round-off clipped to [0, 1] and scaled to ``Σ w ≤ 1``.  numpy or torch."""
    nx = get_backend(pr, w_iid)
    M, k = w_iid.shape[-2:]
    pos, _, _, ways = _multiset_table(k)
    lead = tuple(pr.shape[:-1])
    terms = ((pr * nx.asarray(ways, pr))[..., None] * w_iid).reshape(lead + (M * k,))
    at = nx.index(pos.reshape(-1), pr)
    w = nx.scatter_add(nx.zeros_like(terms[..., :k]), nx.full(lead + (M * k,), 0, at) + at, terms)
    w = nx.clip(w, 0.0, 1.0)
    return w / nx.maximum(nx.sum(w, keepdims=True), 1.0)


def virtual_draws(S, draft_probs: np.ndarray):
    """``[(x, Pr(X_{1:k} = x | S))]``: the first k i.i.d. draws given the wor tuple S (module docstring;
    :func:`virtual_draw_probs` on a batch of one)."""
    S = tuple(int(y) for y in S)
    pr = virtual_draw_probs(np.asarray(draft_probs, dtype=np.float64), np.asarray([S], dtype=np.int64))[0]
    multiset = {x: i for i, x in enumerate(virtual_multisets(len(S)))}
    return [(tuple(S[j] for j in s), float(pr[multiset[tuple(sorted(s))]])) for s in growth_strings(len(S))]


def couple_iid_plan(iid_plan: NodePlan, draft_probs, k: int) -> NodePlan:
    """The wor plan of a position-symmetric i.i.d. plan (the layout) for the same ``(p, q, ρ, k)`` (module
    docstring, :func:`mix_virtual`); same marginal."""
    q = np.asarray(draft_probs, dtype=np.float64)
    memo = {}

    def select(S) -> np.ndarray:
        S = tuple(int(y) for y in S)
        if S not in memo:
            pr = virtual_draw_probs(q, np.asarray([S], dtype=np.int64))                  # [1, M]
            w_iid = np.stack([iid_plan.select(tuple(S[j] for j in s)) for s in virtual_multisets(k)])
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
