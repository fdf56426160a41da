"""Score draft-tree nodes with a causal LM in one forward pass (tree attention).

The KV cache holds the context ``x_0 … x_{n−1}`` at cache slots ``0 … n−1`` (position ids = slots) and possibly
more entries after it: a longer sequence whose tail must stay hidden, or tree nodes fed earlier.  A tree node u
of depth d spells the prefix ``s(u)``; it is fed at position ``n − 1 + d`` and may attend to

* the context slots ``< n`` (``context_len``), and
* the cache slots of its ancestors and of itself (:func:`gpu.tree_attention_mask`) — nothing else,

through a 4-D additive mask ``[1, 1, Q, K]`` (0 where allowed, the dtype's minimum elsewhere).  The logits at
u are then the model's next-token logits after ``context · s(u)``, equal to sequential decoding up to float
round-off.  The root's logits are the context's last logits and are never recomputed here.
"""
from __future__ import annotations

import torch

from ..tree_batch import TreeBatch, tree_attention_mask


def tree_bias(ancestors: torch.Tensor, node_slot: torch.Tensor, context_len: int, kv_len: int,
              dtype=torch.float32) -> torch.Tensor:
    """Additive mask ``[1, 1, Q, kv_len]``: query i sees the context slots ``< context_len`` and the slot
    ``node_slot[j]`` of every tree node j with ``ancestors[i, j]`` (``ancestors [Q, N]`` bool; ``node_slot [N]``
    long, −1 for nodes without a slot, e.g. the root, whose state is the context)."""
    device = ancestors.device
    node_slot = node_slot.to(device)
    allowed = torch.zeros(ancestors.shape[0], kv_len, dtype=torch.bool, device=device)
    allowed[:, :context_len] = True
    has = (node_slot >= 0).nonzero().squeeze(1)
    unslotted = (node_slot < 0) & (torch.arange(node_slot.numel(), device=device) > 0)
    if (ancestors & unslotted).any():
        raise ValueError("tree_bias: a query attends to a non-root tree node that has no cache slot")
    allowed[:, node_slot[has]] |= ancestors[:, has]
    bias = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return bias.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]


@torch.inference_mode()
def forward_nodes(model, cache, nodes: list[int], tokens: torch.Tensor, positions: torch.Tensor,
                  ancestors: torch.Tensor, node_slot: torch.Tensor, context_len: int) -> torch.Tensor:
    """Feed tree ``nodes`` (``tokens [Q]`` at ``positions [Q]``, ancestor rows ``ancestors [Q, N]``) on top of
    ``cache``; returns their logits ``[Q, V]`` (fp32).  ``node_slot [N]`` gets the new cache slots of ``nodes``.
    """
    cache_len = cache.get_seq_length()
    if context_len > cache_len:
        raise ValueError(f"forward_nodes: context_len {context_len} exceeds the cached length {cache_len}")
    device = next(model.parameters()).device
    node_slot[nodes] = torch.arange(cache_len, cache_len + len(nodes))
    bias = tree_bias(ancestors, node_slot, context_len, cache_len + len(nodes)).to(device)
    out = model(input_ids=tokens.reshape(1, -1).to(device), position_ids=positions.reshape(1, -1).to(device),
                attention_mask=bias, past_key_values=cache, use_cache=True)
    return out.logits[0].float()


def score_tree(model, cache, batch: TreeBatch, context_len: int, root_logits: torch.Tensor) -> torch.Tensor:
    """Logits ``[N, V]`` of every node of the single tree in ``batch`` (``B = 1``): row 0 is ``root_logits`` (the
    context's last logits), the others come from one forward of nodes ``1 … N−1``.  The cache is restored."""
    if batch.batch_size != 1:
        raise ValueError(f"score_tree: batch must hold one tree, got {batch.batch_size}")
    n = int(batch.num_nodes[0])
    nodes = list(range(1, n))
    cache_len = cache.get_seq_length()
    try:
        logits = forward_nodes(model, cache, nodes, batch.token[0, 1:n], batch.positions(context_len - 1)[0, 1:n],
                               tree_attention_mask(batch)[0, 1:n, :n], torch.full((n,), -1), context_len)
    finally:
        cache.crop(cache_len)
    return torch.cat([root_logits.reshape(1, -1).float(), logits], dim=0)
