"""Draft a tree with the draft model's KV cache (theory.md §1), depth by depth.

:func:`gpu.draft_tree` walks the skeleton: at depth d it asks for the rows ``q(·|s(u))`` of the nodes of that
depth, then draws every internal node's ordered children ``S ~ Q_k`` (``iid``, ``wor``, ``topk``, ``greedy``).
Here the rows come from the draft model: the nodes of depth d are fed in one forward on top of the draft's
KV cache (:meth:`.ragged_cache.RaggedCache.feed`; their ancestors were fed at earlier depths), so a tree of
depth D costs D small forwards after the root row (leaves are not fed: no verifier reads their row).

Shape specs (:func:`tree_shape`): anything :meth:`TreeShape.parse` reads — ``binary:D`` (branching 2 to depth D),
``chain:D``, ``eagle`` / ``eagle:W`` (the sparse EAGLE-like tree of :func:`univer_theory.tree.eagle_like_shape`),
``"3,2"``, ``"((..),.)"`` — of at most :data:`MAX_DECODE_NODES` nodes.
"""
from __future__ import annotations

import torch

from univer_theory import DraftTree, TreeShape

from ..drafting import draft_tree as draft_skeleton
from ..probs import probs_from_logits
from ..tree_batch import TreeBatch, tree_attention_mask
from .ragged_cache import RaggedCache


#: Most nodes of a decoding tree: one target forward scores them all (an ``[N, context + N]`` attention bias per
#: layer, every node's row of V logits), so ``8,8,8`` (585 nodes) took ~14 s a step on 2 cores and ``64,64,64``
#: (266 305) asked the allocator for 70 GB.
MAX_DECODE_NODES = 1024


def tree_shape(spec: str) -> TreeShape:
    """The :class:`TreeShape` named by ``spec`` (:meth:`TreeShape.parse`: ``binary:D``, ``chain:D``, ``eagle[:W]``,
    ``"3,2"``, ``"((..),.)"``), of at most :data:`MAX_DECODE_NODES` nodes."""
    return check_decode_shape(TreeShape.parse(spec), "tree_shape", repr(spec))


def check_decode_shape(shape: TreeShape, where: str, name: str = "shape") -> TreeShape:
    """``shape``, or a ValueError unless it is a :class:`TreeShape` of at most :data:`MAX_DECODE_NODES` nodes."""
    if not isinstance(shape, TreeShape):
        raise ValueError(f"{where}: {name} must be a TreeShape, got {type(shape).__name__}")
    if shape.num_nodes > MAX_DECODE_NODES:
        raise ValueError(f"{where}: {name} has {shape.num_nodes} nodes, beyond the {MAX_DECODE_NODES} a "
                         f"decoding tree may have (one target forward scores every node)")
    return shape


def ancestors(shape: TreeShape) -> torch.Tensor:
    """``[N, N]`` bool: ``[i, j]`` iff skeleton node j is an ancestor of node i or i itself."""
    return tree_attention_mask(TreeBatch.from_trees([DraftTree.from_shape(shape, [0] * (shape.num_nodes - 1))]))[0]


def draft_tree_cached(cache: RaggedCache, root_logits: torch.Tensor, shape: TreeShape, process: str,
                      temperature: float, generator: torch.Generator | None = None, keep_logits: bool = False,
                      top: int | None = None):
    """Draft one tree of ``shape`` per request of ``cache`` after its committed context, depth by depth.

    ``root_logits [B, V]``: the draft's logits after each context.  The nodes of one depth are fed in one forward
    on top of the cache, each seeing its committed context and its ancestors (:meth:`RaggedCache.feed`);
    leaves are never fed (no verifier reads their draft row).  The fed nodes stay in the cache as scratch.

    ``top``: draft from each row's ``top`` most likely tokens only (:func:`gpu.probs.probs_from_logits`; None: the
    whole row).  Every process but ``iid`` drafts k distinct tokens at a node, so its rows keep at least the
    widest node's k tokens of positive probability (:func:`gpu.probs.support_floor`: a row at a small
    temperature, or a one-hot row at temperature 0, underflows otherwise).

    Returns ``(batch, draft_probs [B, N, V] float64, node_slot [N], logits)``: ``node_slot[u]`` is node u's
    cache slot (−1: the root, a leaf); ``logits [B, N, V]`` the draft's logits per node (row 0 the root's, NaN
    at leaves) when ``keep_logits``, else None.
    """
    B = root_logits.shape[0]
    widest = shape.max_children
    support = widest if process != "iid" and widest > 1 else None     # k distinct tokens of positive q a node
    anc = ancestors(shape)
    depth = torch.tensor(shape.depth)
    node_slot = torch.full((shape.num_nodes,), -1)
    first = cache.size
    kept = None
    if keep_logits:
        kept = torch.full((B, shape.num_nodes, root_logits.shape[-1]), float("nan"))
        kept[:, 0] = root_logits.cpu()

    def rows(token: torch.Tensor, nodes: list[int]) -> torch.Tensor:
        if nodes == [0]:
            logits = root_logits[:, None]
        else:
            start = cache.size
            node_slot[nodes] = torch.arange(start, start + len(nodes))
            visible = torch.zeros(len(nodes), start + len(nodes) - first, dtype=torch.bool)
            for i, u in enumerate(nodes):
                visible[i, node_slot[anc[u] & (node_slot >= 0)] - first] = True
            positions = cache.lengths[:, None] - 1 + depth[nodes][None]
            logits = cache.feed(token[:, nodes].cpu(), positions, visible.expand(B, -1, -1))
            if kept is not None:
                kept[:, nodes] = logits.cpu()
        return probs_from_logits(logits.double(), temperature, top, support)

    batch, probs = draft_skeleton(shape, rows, process, B, generator)
    return batch, probs, node_slot, kept
