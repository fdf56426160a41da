"""Draft processes (theory.md §1): how the children of one node are drawn from ``q = q(·|s)``.

* ``iid``: k independent draws (duplicates kept as separate children);
* ``wor``: sequential draws without replacement, ``Pr(x_1..x_k) = Π_j q(x_j)/R_j`` with ``R_j`` the mass of
  the tokens not yet drawn, summed over them (``= 1 − Σ_{l<j} q(x_l)`` in exact arithmetic, but that
  difference cancels on a confident row: docs/deviations.md item 5);
* ``topk``: the k most likely tokens of q, most likely first (point mass on that ordered tuple; ties broken by lower
  token id);
* ``greedy``: top-(k−1) of q (in that order) plus one draw from q restricted to the other tokens;
* ``hub`` (SpecHub's two-draft law, k = 2 only; exact core only, not in :data:`PROCESSES`): with the hub
  ``a = argmax q`` (lower id on ties), ``x_1 ~ q``; ``x_2 = a`` if ``x_1 ≠ a``, else ``x_2 ~ norm(q·1[≠a])``.
  So ``Q(i, a) = q(i)`` and ``Q(a, i) = q(a)·q(i)/(1 − q(a))`` for i ≠ a; every pair contains the hub.

Each child's subtree is then drafted independently given its own prefix.  This module gives the exact
ordered-tuple law ``Q_k(S)`` (float or Fraction), samplers, and enumeration of all trees of a shape.
"""
from __future__ import annotations

import math
from fractions import Fraction
from itertools import product
from typing import Iterator

import numpy as np

from .models import Model, check_model_type
from .nx import get_backend
from .orders import top_tokens
from .tree import DraftTree, TreeShape, as_shape
from .validation import check_choice, check_int, check_simplex

PROCESSES = ("iid", "wor", "topk", "greedy")
#: SpecHub's draft law (module docstring); the exact oracle enumerates it, the batched layer does not.
HUB = "hub"
#: Every process the exact core (tuple laws, enumeration, exact verifiers) accepts.
EXACT_PROCESSES = PROCESSES + (HUB,)


def _top_tokens(q: np.ndarray, m: int) -> list[int]:
    return [int(x) for x in top_tokens(q, m)]


def hub_token(draft_row) -> int:
    """SpecHub's hub ``a = argmax q`` (lower id on ties), the token every ``hub`` pair contains."""
    return _top_tokens(np.asarray(draft_row), 1)[0]


def _check_k(q: np.ndarray, k: int, process: str, where: str) -> None:
    """``q`` one probability row (to float tolerance, Fraction rows included: the exact checkers enumerate the
    laws of float rows' exact values), ``process`` known, and ``k`` children drawable from q under it."""
    check_choice(process, EXACT_PROCESSES, where, "process")
    if np.ndim(q) != 1:
        raise ValueError(f"{where}: the draft row q must be one row [V], got shape {np.shape(q)}")
    check_simplex(np.asarray(q, dtype=np.float64), where, "the draft row q")
    support = int(np.count_nonzero(q))
    check_int(k, where, "number of children k", 1)
    if process == HUB and k != 2:
        raise ValueError(f"{where}: process 'hub' (SpecHub) drafts exactly 2 children, got k = {k}")
    if process != "iid" and k > support:
        raise ValueError(f"{where}: process {process!r} drafts {k} distinct tokens but q has only {support} "
                         f"tokens with positive probability (a row at a small draft temperature underflows to a "
                         f"few tokens: raise the draft temperature, or draft i.i.d. children)")


def check_rng(rng, where: str) -> None:
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"{where}: rng must be a numpy Generator (np.random.default_rng(seed)), got "
                         f"{type(rng).__name__}")


def tuple_law(q: np.ndarray, k: int, process: str) -> list[tuple[tuple[int, ...], object]]:
    """All ordered child tuples ``S`` with ``Q_k(S) > 0``, as ``[(S, Q_k(S))]`` (exact for Fraction rows).  The row
    is checked to float tolerance, a Fraction row too (:func:`_check_k`): the law of a Fraction row off the simplex
    by less than ``SIMPLEX_ATOL`` sums exactly to what its row implies, not to 1 (``evaluate`` refuses such rows)."""
    _check_k(q, k, process, "tuple_law")
    q = np.asarray(q)                   # a list row (Fractions stay Fractions)
    support = [x for x in range(q.size) if q[x] > 0]
    if process == "iid":
        out = []
        for S in product(support, repeat=k):
            pr = q[S[0]]
            for x in S[1:]:
                pr = pr * q[x]
            out.append((S, pr))
        return out
    if process == "wor":
        out = []

        def rec(prefix, pr):
            if len(prefix) == k:
                out.append((tuple(prefix), pr))
                return
            rest = [x for x in support if x not in prefix]
            # the remaining mass is summed, not taken as 1 − Σ drawn: that cancels catastrophically
            # when a drawn token carries almost all of q
            rest_mass = sum(q[x] for x in rest)
            for x in rest:          # the ratio first: pr·q(x) underflows where the rest is subnormal
                rec(prefix + [x], pr * (q[x] / rest_mass))
        rec([], q.dtype.type(1) if q.dtype != object else Fraction(1))
        return out
    top = _top_tokens(q, k if process == "topk" else k - 1)
    if process == "topk":
        return [(tuple(top), q.dtype.type(1) if q.dtype != object else Fraction(1))]
    rest = [x for x in support if x not in top]
    rest_mass = sum(q[x] for x in rest)
    if process == HUB:
        (a,) = top
        return [((x, a), q[x]) for x in rest] + [((a, x), q[a] * (q[x] / rest_mass)) for x in rest]
    return [(tuple(top) + (x,), q[x] / rest_mass) for x in rest]


def tuple_count(support: int, k: int, process: str) -> int:
    """How many ordered k-tuples :func:`tuple_law` lists for a row with ``support`` tokens of positive probability
    (k ≤ support where the tokens are distinct): ``support^k`` (iid), ``support!/(support − k)!`` (wor), 1 (topk),
    ``support − k + 1`` (greedy: the top k − 1, then any other token), ``2(support − 1)`` (hub: every pair holds
    the hub, first or second) — a closed form, for sizing an enumeration before it starts."""
    check_choice(process, EXACT_PROCESSES, "tuple_count", "process")
    if process == "iid":
        return support ** k
    if k > support:
        return 0
    return {"wor": math.perm(support, k), "topk": 1, "greedy": support - k + 1, HUB: 2 * (support - 1)}[process]


def falling(n, r: int):
    """``n!/(n − r)!`` — the ordered r-tuples of n distinct tokens — elementwise (0 when r > n); ints, numpy or
    torch integers."""
    nx = get_backend(n)
    out = 1 + 0 * n
    for i in range(r):
        out = out * nx.maximum(n - i, 0)
    return out


def wor_remaining(members, outside):
    """``R_i = q(V∖S) + Σ_{l≥i} q(y_l)`` ``[..., k]``: the mass not yet drawn before each member of wor tuples, from
    the members' probabilities ``members [..., k]`` (in draw order) and the unseen mass ``outside [...] =
    q(V∖S)``, summed over the unseen tokens by the caller (never ``1 − Σ drawn``).  Float rows, numpy or torch."""
    return get_backend(members, outside).cumsum(members, reverse=True) + outside[..., None]


def wor_tuple_probs(members, outside):
    """``Q_k(S) = Π_i q(y_i)/R_i`` of wor tuples (:func:`wor_remaining`: ``members [..., k]``, ``outside [...]``)
    ``[...]``; a factor whose ``R_i`` is 0 (nothing left to draw) makes the tuple 0.  Float rows, numpy or torch
    (the one float form; :func:`tuple_law` is its exact enumeration oracle)."""
    nx = get_backend(members, outside)
    rest = wor_remaining(members, outside)
    drawable = rest > 0
    return nx.where(drawable, members / nx.where(drawable, rest, 1.0), 0.0).prod(-1)


def tuple_members(q, tuples, process: str):
    """``(members [..., T, k], outside)``: the draft probabilities of the tokens of ordered tuples
    ``tuples [..., T, k]`` under float rows ``q [..., V]`` (numpy or torch, batch axes alike) and, for ``wor``,
    each tuple's unseen mass ``q(V∖S)`` ``[..., T]`` (``None`` for ``iid``).

    The unseen mass is ``q(V∖U) + q(U∖S)``, U the tokens of the row's T tuples: one masked sum over V per row
    (no ``[T, V]`` intermediate) plus a sum over U's distinct tokens — both sums of non-negative terms, so
    nothing cancels.  The second costs ``O((Tk)^2)`` per row: meant for few tuples per row (a slot-rule class,
    where U = S; the virtual draws of the iid coupling), not for a row's whole law."""
    check_choice(process, ("iid", "wor"), "tuple_members", "process")
    nx = get_backend(q, tuples)
    n = tuples.shape[-2] * tuples.shape[-1]
    flat = tuples.reshape(tuples.shape[:-2] + (n,))
    members = nx.take(q, flat)                                                  # [..., Tk]
    if process == "iid":
        return members.reshape(tuples.shape), None
    unseen_u = nx.sum(nx.put(q, flat, 0.0))                                     # q(V∖U) [...]
    # each entry's first equal entry is itself (a token's first occurrence) [..., Tk]; entry in tuple t [..., T, Tk]
    first = nx.argmax(flat[..., :, None] == flat[..., None, :])[..., 0] == nx.arange(n, flat)
    in_s = flat[..., None, :] == tuples[..., :, :1]
    for j in range(1, tuples.shape[-1]):            # k slices, not a reduction over an axis of k
        in_s = in_s | (flat[..., None, :] == tuples[..., :, j:j + 1])
    in_u = nx.sum(nx.where(first[..., None, :] & ~in_s, members[..., None, :], 0.0))   # q(U∖S) [..., T]
    return members.reshape(tuples.shape), unseen_u[..., None] + in_u


def tuple_probs(q, tuples, process: str):
    """``Q_k(S)`` ``[..., T]`` of ordered tuples ``tuples [..., T, k]`` (token ids) under float draft rows
    ``q [..., V]`` (numpy or torch, batch axes alike): ``iid`` ``Π q(y_i)``, ``wor`` :func:`wor_tuple_probs` on
    :func:`tuple_members` (its docstring: the unseen mass, and the cost)."""
    check_choice(process, ("iid", "wor"), "tuple_probs", "process")
    members, outside = tuple_members(q, tuples, process)
    return members.prod(-1) if process == "iid" else wor_tuple_probs(members, outside)


def sample_children(q: np.ndarray, k: int, process: str, rng: np.random.Generator) -> tuple[int, ...]:
    """Draw one ordered child tuple from ``Q_k`` (Gumbel-top-k for ``wor``): the draws read the row in float64, the
    fixed top tokens of ``topk`` / ``greedy`` / ``hub`` the row's own order (an exact row's Fractions may tie once
    rounded)."""
    _check_k(q, k, process, "sample_children")
    if process != "topk":                           # the top k tokens: no draw
        check_rng(rng, "sample_children")
    qf = np.asarray(q, dtype=np.float64)
    if process == "iid":
        return tuple(int(x) for x in rng.choice(qf.size, size=k, p=qf))
    if process == "wor":
        with np.errstate(divide="ignore"):
            keys = np.log(qf) + rng.gumbel(size=qf.size)
        return tuple(int(x) for x in np.argsort(-keys, kind="stable")[:k])
    top = _top_tokens(np.asarray(q), k if process == "topk" else k - 1)    # q's own order: an exact row's entries
    if process == "topk":                                                # may tie once rounded to float64
        return tuple(top)
    rest = qf.copy()
    rest[top] = 0.0
    if process == HUB:
        first = int(rng.choice(qf.size, p=qf))
        return (first, top[0]) if first != top[0] else (first, int(rng.choice(qf.size, p=rest / rest.sum())))
    return tuple(top) + (int(rng.choice(qf.size, p=rest / rest.sum())),)


def sample_tree(model: Model, shape: TreeShape, process: str, rng: np.random.Generator) -> DraftTree:
    """Draft one tree of the given shape (or its text): each node's children from ``Q_k(·|s(u))``."""
    check_model_type(model, "sample_tree")          # its rows are checked where drawn from (sample_children)
    shape = as_shape(shape, "sample_tree")
    if process != "topk":                           # the top k tokens: no draw
        check_rng(rng, "sample_tree")
    tokens = [-1] * shape.num_nodes
    paths: list[tuple[int, ...]] = [()] * shape.num_nodes
    for u in range(shape.num_nodes):
        kids = shape.children[u]
        if kids:
            S = sample_children(model.draft(paths[u]), len(kids), process, rng)
            for c, y in zip(kids, S):
                tokens[c], paths[c] = y, paths[u] + (y,)
    return DraftTree(shape.parent, tuple(tokens), model.vocab_size)


def enumerate_trees(model: Model, shape: TreeShape, process: str) -> Iterator[tuple[DraftTree, object]]:
    """Every tree of ``shape`` with positive probability, with its exact probability ``Q(T)``.

    Nodes are filled in node order; the count is the product over internal nodes of the tuple counts, so keep
    V and the shape small (V = 4, wor: `2,2` has 12³ = 1 728 trees, `2,2,2` 12⁷ ≈ 3.6·10⁷).
    """
    check_model_type(model, "enumerate_trees")
    shape = as_shape(shape, "enumerate_trees")
    internal = [u for u in range(shape.num_nodes) if shape.children[u]]

    def rec(i, tokens, paths, pr):
        if i == len(internal):
            yield DraftTree(shape.parent, tuple(tokens), model.vocab_size), pr
            return
        u = internal[i]
        kids = shape.children[u]
        for S, qs in tuple_law(model.draft(paths[u]), len(kids), process):
            t2, p2 = list(tokens), list(paths)
            for c, y in zip(kids, S):
                t2[c], p2[c] = y, paths[u] + (y,)
            yield from rec(i + 1, t2, p2, pr * qs)

    one = model.draft(()).dtype.type(1) if not model.exact else Fraction(1)
    yield from rec(0, [-1] * shape.num_nodes, [()] * shape.num_nodes, one)


def count_trees(model: Model, shape: TreeShape, process: str) -> int:
    """Number of trees :func:`enumerate_trees` yields, without building them: one :func:`tuple_law` per prefix,
    so its cost grows with the prefixes like the enumeration's (for a size before building, full support:
    :func:`tuple_count` per node)."""
    check_model_type(model, "count_trees")
    shape = as_shape(shape, "count_trees")

    def rec(u, prefix):
        kids = shape.children[u]
        if not kids:
            return 1
        total = 0
        for S, _ in tuple_law(model.draft(prefix), len(kids), process):
            n = 1
            for c, y in zip(kids, S):
                n *= rec(c, prefix + (y,))
            total += n
        return total
    return rec(0, ())
