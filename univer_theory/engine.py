"""The one verification engine: node rules, allocated top-down, decided post-order (theory.md §3.7, §6.1).

Every tree verifier of this package is a *node rule*.  At node u with scaling ``ρ`` (its prefix acceptance
probability, 1 at the root), given the realised children ``S = (y_1..y_k)``, a rule returns a
:class:`NodeDecision`:

* ``enter[j]`` — probability that child j is entered (a top-down coin; RRS-style rules use it, TV / UniVer
  leave it at 1),
* ``scale[j]`` — the scaling ``s_j`` handed to child j (TV / UniVer; RRS-style rules hand 1),
* ``stop`` — probability ``f`` that u itself succeeds once every child has failed,
* ``residual`` — the law of the correction token ``Y`` emitted when u succeeds.

**Pass 1 (top-down):** decisions depend only on ``(p_u, q_u, ρ_u, process, S)``, so all of them are computed
from the root down.  **Pass 2 (post-order):** child j is tried after children ``1..j−1`` failed; it
succeeds with ``enter[j]·σ_j`` where ``σ_j`` is its own success probability; if all fail, u succeeds with
``stop``.  A drafted leaf succeeds with probability ``ρ`` and emits ``Y ~ p`` (bonus token).

Per tree this yields the exact law of (accepted path, Y), a sampler, and the analytic expected accepted
length (each node returns ``(σ, e)`` = success probability and expected accepted tokens below it).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Callable

import numpy as np

from .tree import DraftTree, TreeShape


@dataclass(frozen=True)
class NodeContext:
    """What a node rule may look at: on-tree information only."""

    rho: object                      # scaling ρ of the node (float or Fraction)
    target: np.ndarray               # p(·|s(u)) [V]
    draft: np.ndarray                # q(·|s(u)) [V]
    children: tuple[int, ...]        # realised child tokens S in drafting order
    process: str                     # draft process of the children
    child_shapes: tuple[str, ...]    # nested key of each child position's subtree (tree.split_key, §6.3)
    prefix: tuple[int, ...] = ()     # tokens on the path root → u (the univer-va oracle looks values up)


@dataclass(frozen=True)
class NodeDecision:
    """Output of a node rule (see module docstring); ``info`` is free-form trace data (e.g. UniVer's α)."""

    enter: tuple
    scale: tuple
    stop: object
    residual: np.ndarray
    info: dict = field(default_factory=dict, compare=False)


NodeRule = Callable[[NodeContext], NodeDecision]


def leaf_decision(ctx: NodeContext) -> NodeDecision:
    """A drafted leaf: succeed w.p. ρ, emit the bonus token ``Y ~ p``."""
    return NodeDecision((), (), ctx.rho, ctx.target)


def _unit(x) -> bool:
    """``0 ≤ x ≤ 1`` for a float, Fraction or sympy number; False for NaN or a value that cannot be compared."""
    try:
        return bool(0 <= x <= 1)
    except TypeError:
        return False


def _residual_outside(residual) -> str | None:
    """Why the residual is not a finite nonnegative row (its first entry negative, infinite or NaN), else None: the
    law emits it as it is, so a NaN made the law NaN (its rule unnamed) and a negative entry a loss.  No bound
    above 1: a valid row may hold 1 + 5e-10 (``check_simplex``'s tolerance), and RRS's residual is then ``p``."""
    r = np.asarray(residual)
    try:
        inside = np.asarray((r >= 0) & (r < np.inf), dtype=bool)
    except TypeError:
        return f"a residual of {r.dtype} entries, not numbers"
    if inside.all():
        return None
    y = int(np.flatnonzero(~inside)[0])
    return f"residual entry {r[y]} (token {y}) negative, infinite or NaN"


def check_decision(d, k: int, V: int, rule, u: int, exact: bool = False) -> None:
    """ValueError naming the rule and node unless ``d`` is a :class:`NodeDecision` with one ``enter`` and one
    ``scale`` entry per child, each in [0, 1], ``stop`` in [0, 1] and a finite nonnegative ``[V]`` residual (a
    short tuple was cut short by ``zip``, an entry above 1 read as a probability, a NaN residual made the law NaN —
    the oracle then flagged a loss it could not name);
    with ``exact`` (rows of Fractions) every one of them rational: a float there turned E[τ] and the distance into
    floats and decided losslessness to the float tolerance, without a word."""
    name = getattr(rule, "__name__", type(rule).__name__)
    if not isinstance(d, NodeDecision):
        raise ValueError(f"node rule {name} returned {type(d).__name__} at node {u}, not a NodeDecision")
    listed = all(isinstance(x, (tuple, list)) or (isinstance(x, np.ndarray) and x.ndim == 1)
                 for x in (d.enter, d.scale))
    why = (f"enter and scale must list one entry per child, got {type(d.enter).__name__} and "
           f"{type(d.scale).__name__}" if not listed else
           f"{len(d.enter)} enter and {len(d.scale)} scale entries for {k} children"
           if len(d.enter) != k or len(d.scale) != k else
           f"a residual of shape {np.shape(d.residual)}, not [{V}]" if np.shape(d.residual) != (V,) else
           next((f"{what} {x} outside [0, 1]" for what, xs in (("enter", d.enter), ("scale", d.scale),
                                                               ("stop", (d.stop,)))
                 for x in xs if not _unit(x)), None) or _residual_outside(d.residual))
    if exact and not why:
        why = next((f"{what} {x!r} is a {type(x).__name__} in exact mode (rows of Fractions): the rule must compute "
                    f"in Fractions, or its Verifier say rational=False"
                    for what, xs in (("enter", d.enter), ("scale", d.scale), ("stop", (d.stop,)),
                                     ("residual entry", d.residual))
                    for x in xs if not isinstance(x, numbers.Rational)), None)
    if why:
        raise ValueError(f"node rule {name} at node {u}: {why}")


def allocate(tree: DraftTree, target_probs: np.ndarray, draft_probs: np.ndarray, process: str,
             rule: NodeRule) -> tuple[list, list]:
    """Pass 1: ``(rho[N], decision[N])`` from the root down."""
    n = tree.num_nodes
    exact = target_probs.dtype == object
    rho: list = [None] * n
    rho[0] = 1 if exact else 1.0
    dec: list = [None] * n
    for u in range(n):
        kids = tree.children[u]
        ctx = NodeContext(rho[u], target_probs[u], draft_probs[u], tree.child_tokens(u), process,
                          tuple(tree.subtree_keys[c] for c in kids), tree.paths[u])
        dec[u] = rule(ctx) if kids else leaf_decision(ctx)
        if kids:
            check_decision(dec[u], len(kids), target_probs.shape[-1], rule, u, exact)
        if u == 0:  # the root never fails: once its children failed, the traversal ends there with Y
            dec[u] = replace(dec[u], stop=1 if exact else 1.0)
        for c, s in zip(kids, dec[u].scale):
            rho[c] = s
    return rho, dec


def tree_law(tree: DraftTree, target_probs, draft_probs, process, rule) -> dict:
    """Exact law ``{(path tokens…, Y): prob}`` of one verification of ``tree`` (coins marginalised)."""
    _, dec = allocate(tree, target_probs, draft_probs, process, rule)
    laws: list = [None] * tree.num_nodes
    for u in range(tree.num_nodes - 1, -1, -1):
        laws[u] = _combine(dec[u], [(tree.token[c], laws[c]) for c in tree.children[u]])
    return laws[0]


def _combine(d: NodeDecision, child_laws) -> dict:
    """Law of a node from its decision and its children's laws (post-order step)."""
    out: dict = {}
    fail = 1
    for (y, sub), a in zip(child_laws, d.enter):
        if a == 0 or not sub:
            continue
        sigma = 0
        for key, v in sub.items():
            k2 = (y,) + key
            out[k2] = out.get(k2, 0) + fail * a * v
            sigma += v
        fail = fail * (1 - a * sigma)
    w = fail * d.stop
    if w != 0:
        for y in np.flatnonzero(d.residual != 0):
            out[(int(y),)] = out.get((int(y),), 0) + w * d.residual[y]
    return out


def tree_expected_accepted(tree: DraftTree, target_probs, draft_probs, process, rule):
    """``E[τ | T]``: expected accepted tokens, analytic (no enumeration of coins), O(N·V)."""
    _, dec = allocate(tree, target_probs, draft_probs, process, rule)
    one = Fraction(1) if np.asarray(target_probs).dtype == object else 1   # a Fraction even where every coin is 1
    sigma: list = [None] * tree.num_nodes
    e: list = [None] * tree.num_nodes
    for u in range(tree.num_nodes - 1, -1, -1):
        d = dec[u]
        fail, s_u, e_u = one, 0 * one, 0 * one
        for c, a in zip(tree.children[u], d.enter):
            s_u = s_u + fail * a * sigma[c]
            e_u = e_u + fail * a * (sigma[c] + e[c])
            fail = fail * (1 - a * sigma[c])
        sigma[u], e[u] = s_u + fail * d.stop, e_u
    return e[0]


def tree_sample(tree: DraftTree, target_probs, draft_probs, process, rule, rng: np.random.Generator):
    """One verification: ``(accepted node ids (root excluded), Y)``."""
    _, dec = allocate(tree, target_probs, draft_probs, process, rule)

    def visit(u):
        d = dec[u]
        for c, a in zip(tree.children[u], d.enter):
            if rng.random() < float(a):
                got = visit(c)
                if got is not None:
                    return (c,) + got[0], got[1]
        if rng.random() < float(d.stop):
            res = np.asarray(d.residual, dtype=np.float64)
            return (), int(rng.choice(res.size, p=res / res.sum()))
        return None

    return visit(0)  # never None: the root's stop is 1


def expected_law(model, shape: TreeShape, process: str, rule: NodeRule, tuple_law_fn, on_node=None) -> dict:
    """Model-level law ``Σ_T Q(T)·law_T`` by recursion over prefixes instead of whole trees.

    Valid because sibling subtrees are drafted independently given ``S``: the failure probabilities of
    earlier siblings and the law of a later sibling are independent, so expectations factor through
    :func:`_combine`.  Cost: one node-rule call per (skeleton node, prefix, tuple) instead of per tree.
    ``on_node(info)``, if given, is called once per distinct internal (node, prefix, ρ) with the rule's
    ``NodeDecision.info`` (e.g. to count which UniVer construction each node plan used).
    """
    memo: dict = {}

    def rec(u: int, prefix: tuple, rho) -> dict:
        key = (u, prefix, rho)
        if key in memo:
            return memo[key]
        p, q = model.target(prefix), model.draft(prefix)
        kids = shape.children[u]
        if not kids:
            out = _combine(NodeDecision((), (), rho, p), [])
            memo[key] = out
            return out
        out: dict = {}
        told = on_node is None          # once per node: a node of law {} (ρ = 0) leaves ``out`` empty
        for S, qs in tuple_law_fn(q, len(kids), process):
            ctx = NodeContext(rho, p, q, S, process, tuple(shape.subtree_keys[c] for c in kids), prefix)
            d = rule(ctx)
            check_decision(d, len(kids), len(p), rule, u, p.dtype == object)
            if not u:                   # the root: rho = 1, never fails
                d = replace(d, stop=rho)
            if not told:
                on_node(d.info)
                told = True
            child = [(y, rec(c, prefix + (y,), s)) for c, y, s in zip(kids, S, d.scale)]
            for k2, v in _combine(d, child).items():
                out[k2] = out.get(k2, 0) + qs * v
        memo[key] = out
        return out

    exact = model.exact
    try:
        return rec(0, (), 1 if exact else 1.0)
    finally:
        rec = None          # rec -> its closure cell -> rec: its memo freed now, not by the cyclic GC
