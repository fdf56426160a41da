"""The bug zoo (theory.md §3.9): named *lossy* variants the oracle and the Monte Carlo tests must detect.

Used only by tests and studies; each has ``lossless=False`` and is never listed in :data:`VERIFIERS`.
"""
from __future__ import annotations

import numpy as np

from . import engine
from .engine import NodeContext, NodeDecision
from .verifiers import Verifier, rrs_rule, traversal_rule


def _skip_duplicates_rule(ctx: NodeContext) -> NodeDecision:
    """(b) RRS that skips a duplicate i.i.d. child: no attempt *and no residual update* for it."""
    seen, keep = set(), []
    for j, y in enumerate(ctx.children):
        keep.append(y not in seen)
        seen.add(y)
    unique = tuple(y for y, k in zip(ctx.children, keep) if k)
    d = rrs_rule(NodeContext(ctx.rho, ctx.target, ctx.draft, unique, ctx.process, ()))
    it = iter(d.enter)
    enter = tuple(next(it) if k else 0 for k in keep)
    return NodeDecision(enter, (1,) * len(enter), 1, d.residual)


def _original_p_rule(ctx):
    """(c) TV whose correction token at an internal node is drawn from the original ``p``."""
    return traversal_rule(ctx, internal_residual=False)


def _wrong_parent_update_rule(ctx):
    """(d) TV with the parent update ``r ← min(1, R/(1 − Q(y)))`` instead of ``R/(R + 1 − r)``."""
    return traversal_rule(ctx, parent_update=lambda R, r, qy: min(1, R / (1 - qy)) if qy != 1 else 0 * R)


def typical_acceptance_rule(ctx: NodeContext, epsilon=0.09, delta=0.3) -> NodeDecision:
    """(e) Medusa-style typical acceptance: enter the first child with ``p(x) > min(ε, δ·exp(−H(p)))``;
    the next token is then drawn from ``p`` (no residual)."""
    p = np.asarray(ctx.target, dtype=np.float64)
    nz = p[p > 0]
    threshold = min(epsilon, delta * float(np.exp((nz * np.log(nz)).sum())))
    enter, found = [], False
    for y in ctx.children:
        ok = (not found) and p[y] > threshold
        enter.append(1.0 if ok else 0.0)
        found = found or ok
    return NodeDecision(tuple(enter), (1.0,) * len(enter), 1.0, p)


class DeepestFirstTraversal(Verifier):
    """(a) TV that visits the globally deepest leaf first: nodes are decided in order of decreasing depth
    (ties by node id) instead of post-order, which interleaves sibling subtrees.

    Both orders use the same pass-1 decisions and independent node coins (a leaf succeeds w.p. ρ, an internal
    node whose children all failed w.p. its final ``r``); the first success is accepted.  With post-order this
    is exactly TV; with the depth order it is lossy.
    """

    def _cells(self, tree, target_probs, draft_probs, process) -> list:
        """``[((node, Y), prob)]``: where the traversal ends and its token (by node, so duplicate i.i.d. siblings
        with different subtrees stay apart)."""
        p, q = self._check(tree, target_probs, draft_probs, process)
        _, dec = engine.allocate(tree, p, q, process, traversal_rule)
        order = sorted(range(tree.num_nodes), key=lambda u: (-tree.depth[u], u))
        out, survive = [], 1
        for u in order:
            d = dec[u]
            w = survive * d.stop
            out += [((u, int(y)), w * d.residual[y]) for y in np.flatnonzero(d.residual != 0)]
            survive = survive * (1 - d.stop)
        return out

    def law(self, tree, target_probs, draft_probs, process):
        out = {}
        for (u, y), v in self._cells(tree, target_probs, draft_probs, process):
            key = tree.path(u) + (y,)
            out[key] = out.get(key, 0) + v
        return out

    def sample(self, tree, target_probs, draft_probs, process, rng):
        cells = self._cells(tree, target_probs, draft_probs, process)
        (u, y), _ = cells[int(rng.choice(len(cells), p=np.asarray([float(v) for _, v in cells])))]
        path = []
        while u:                    # the sampled node's own path (not the first sibling with its tokens)
            path.append(u)
            u = tree.parent[u]
        return tuple(reversed(path)), y

    def expected_accepted_length(self, tree, target_probs, draft_probs, process):
        return sum((len(k) - 1) * v for k, v in self.law(tree, target_probs, draft_probs, process).items())


BUG_ZOO: dict[str, Verifier] = {v.name: v for v in (
    DeepestFirstTraversal("tv-deepest-first", None, ("iid", "wor"),
                          "(a) TV visiting the globally deepest leaf first", lossless=False),
    Verifier("rrs-skip-duplicates", _skip_duplicates_rule, ("iid",),
             "(b) RRS skipping duplicate i.i.d. children", lossless=False),
    Verifier("tv-original-p", _original_p_rule, ("iid", "wor"),
             "(c) correction token from the original p at internal nodes", lossless=False),
    Verifier("tv-wrong-update", _wrong_parent_update_rule, ("iid", "wor"),
             "(d) parent update r ← min(1, R/(1 − Q(y)))", lossless=False),
    Verifier("typical", typical_acceptance_rule, ("iid", "wor", "topk", "greedy"),
             "(e) Medusa-style typical acceptance", rational=False, lossless=False),
)}
