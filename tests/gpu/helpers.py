"""Shared helpers of the gpu tests: padded inputs from exact-core models, (path, Y) counts, and
the torch bug zoo (lossy level rules, test-only)."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from gpu import TreeBatch
from gpu.engine import LevelContext
from gpu.rules import rrs_rule, tv_rule


def padded_rows(trees, model, dtype=torch.float64):
    """``(batch, target_probs, draft_probs)`` for exact-core trees and a model (padded rows: uniform)."""
    batch = TreeBatch.from_trees(trees)
    V = model.vocab_size
    p = torch.full((len(trees), batch.max_nodes, V), 1.0 / V, dtype=torch.float64)
    q = p.clone()
    for b, t in enumerate(trees):
        pn, qn = model.node_probs(t)
        p[b, :t.num_nodes] = torch.from_numpy(np.asarray(pn, dtype=np.float64))
        q[b, :t.num_nodes] = torch.from_numpy(np.asarray(qn, dtype=np.float64))
    return batch, p.to(dtype), q.to(dtype)


def on_device(device, batch, *rows):
    """``(batch, *rows)`` moved to ``device``."""
    return (batch.to(device), *(x.to(device) for x in rows))


def cell_counts(result, tree) -> dict:
    """``{(path tokens…, Y): count}`` of a batch of verifications of one tree (all rows the same tree)."""
    V = int(result.next_token.max()) + 1
    key = result.accepted_nodes.new_tensor([0])
    end = result.accepted_nodes.gather(1, result.num_accepted[:, None]).squeeze(1)
    key = end * V + result.next_token
    counts = torch.bincount(key.cpu(), minlength=tree.num_nodes * V)
    out: dict = {}
    for code in counts.nonzero().flatten().tolist():
        u, y = divmod(code, V)
        cell = tree.path(u) + (y,)
        out[cell] = out.get(cell, 0) + int(counts[code])
    return out


# ------------------------------------------------------------------------------------------------------------
# Torch bug zoo (theory.md §3.9): the same lossy variants as univer_theory.zoo.BUG_ZOO
# ------------------------------------------------------------------------------------------------------------
def skip_duplicates_rule(ctx: LevelContext):
    """(b) RRS that skips a duplicate i.i.d. child: no attempt and no residual update for it."""
    K = ctx.children.shape[1]
    same = (ctx.children[:, :, None] == ctx.children[:, None, :]) & ctx.child_mask[:, None, :]
    earlier = torch.ones(K, K, dtype=torch.bool).tril(-1)
    dup = (same & earlier).any(-1) & ctx.child_mask
    d = rrs_rule(dataclasses.replace(ctx, child_mask=ctx.child_mask & ~dup))
    return dataclasses.replace(d, enter=torch.where(dup, 0, d.enter))


def original_p_rule(ctx: LevelContext):
    """(c) TV whose correction token at an internal node comes from the original p."""
    return dataclasses.replace(tv_rule(ctx), residual=ctx.target)


def wrong_update_rule(ctx: LevelContext):
    """(d) TV with the parent update ``r ← min(1, R/(1 − Q(y)))``."""
    def update(R, r, qy):
        return torch.where(qy != 1, (R / torch.where(qy != 1, 1 - qy, 1)).clamp(max=1), 0)
    return tv_rule(ctx, parent_update=update)


#: torch rule → name of its exact twin in univer_theory.BUG_ZOO.
TORCH_ZOO = {"rrs-skip-duplicates": skip_duplicates_rule, "tv-original-p": original_p_rule,
             "tv-wrong-update": wrong_update_rule}


def repeated(tree, pn, qn, n):
    """One tree with node rows ``pn``, ``qn`` (numpy ``[N, V]``) repeated n times: ``(batch, target_probs,
    draft_probs)``."""
    one = TreeBatch.from_trees([tree])
    rows = lambda x: torch.tensor(x, dtype=torch.float64).expand(n, *x.shape).contiguous()
    batch = TreeBatch(one.parent.expand(n, -1).contiguous(), one.token.expand(n, -1).contiguous(),
                      one.num_nodes.expand(n).contiguous())
    return batch, rows(pn), rows(qn)
