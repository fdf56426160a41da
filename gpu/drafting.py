"""Batched draft processes (theory.md §1) and batched tree drafting.

``sample_children(draft_probs [R, V], k, process, generator) -> [R, k]`` draws the ordered children of ``R``
nodes at once:

* ``iid``: k inverse-CDF draws from q (float64 uniforms, :func:`gpu.probs.sample_rows`);
* ``wor``: Gumbel-top-k, the top k of ``log q + G`` (``G = −log E``, E ~ Exp(1)) in decreasing order — exactly
  the sequential without-replacement law ``Π_j q(x_j)/(1 − Σ_{l<j} q(x_l))``, in order;
* ``topk``: the k most likely tokens (ties to the lower id: :func:`univer_theory.processes.top_tokens`);
* ``greedy``: top-(k−1) plus one draw from q restricted to the other tokens.
"""
from __future__ import annotations

import functools

import torch

from univer_theory import PROCESSES, TreeShape
from univer_theory.tree import as_shape
from univer_theory.orders import top_tokens
from univer_theory.validation import check_choice, check_int

from .probs import check_generator, check_rows, check_tensor, sample_rows
from .tree_batch import TreeBatch


def sample_children(draft_probs: torch.Tensor, k: int, process: str,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Ordered children ``[R, k]`` of ``R`` nodes with draft rows ``draft_probs [R, V]`` (see module docstring).

    >>> q = torch.tensor([[0.1, 0.6, 0.3]])
    >>> sample_children(q, 2, "topk").tolist()
    [[1, 2]]
    """
    where = "sample_children"
    check_choice(process, PROCESSES, where, "process")
    if not torch.is_tensor(draft_probs) or draft_probs.ndim != 2:
        raise ValueError(f"{where}: draft_probs must be a [R, V] tensor")
    check_rows(where, "draft_probs", draft_probs)
    check_int(k, where, "number of children k", 1)
    check_generator(where, generator, draft_probs.device)
    k = int(k)
    if draft_probs.shape[0] == 0:
        return torch.empty(0, k, dtype=torch.long, device=draft_probs.device)
    if process != "iid":
        support = int((draft_probs > 0).sum(-1).min())
        if k > support:
            raise ValueError(f"{where}: process {process!r} drafts {k} distinct tokens but a draft row has only "
                             f"{support} tokens with positive probability (rows at a low draft temperature "
                             f"underflow to a few tokens: draft from probs_from_logits(..., support={k}), raise "
                             f"the draft temperature, or draft i.i.d. children)")
    R, V = draft_probs.shape
    if process == "iid":
        return sample_rows(draft_probs, generator, num_samples=k)
    if process == "wor":
        # Gumbel-top-k: the top k of log q + G, G = −log E a Gumbel, E ~ Exp(1).  E is float64: float32
        # exponentials are quantised at the extremes (the tail that lets a low-probability token win) and make
        # exact key ties (undefined topk order) likely at large V.  In logs, not as q/E: a subnormal q's quotient
        # rounds onto the subnormal grid (q = 5e-324·(1, 1, 1) drew its tokens 0.35 : 0.37 : 0.27) or to 0.
        # q = 0 tokens get key −inf and are never chosen (k ≤ support).
        e = torch.empty(R, V, dtype=torch.float64, device=draft_probs.device).exponential_(generator=generator)
        q = draft_probs.to(torch.float64)
        keys = torch.where(q > 0, q.log() - e.clamp(min=torch.finfo(torch.float64).tiny).log(), -torch.inf)
        return keys.topk(k, dim=-1, sorted=True).indices
    top = top_tokens(draft_probs, k if process == "topk" else k - 1)
    if process == "topk":
        return top
    return torch.cat([top, sample_rows(scaled_rows(draft_probs.scatter(1, top, 0)), generator)[:, None]], 1)


def scaled_rows(rows: torch.Tensor) -> torch.Tensor:
    """``rows [R, V]`` ≥ 0 each times the power of two that brings its maximum into [0.5, 1) (a zero row as it
    is): the same laws, exactly, for :func:`gpu.probs.sample_rows`, whose draw ``U·Σ`` on a row of subnormal
    total (the rest of a confident draft after its top tokens) rounds onto a grid of a few steps — 5e-324·(1, 2, 3)
    drew its tokens 1/6 : 1/3 : 1/2.  Two factors, each finite: one ``2^{1073}`` overflows."""
    _, e = torch.frexp(rows.amax(-1, keepdim=True))
    half = -e // 2
    two = torch.tensor(2.0, dtype=rows.dtype, device=rows.device)
    return rows * two.pow(half) * two.pow(-e - half)


def draft_tree(shape: TreeShape, draft_probs, process: str, batch_size: int,
               generator: torch.Generator | None = None, device=None) -> tuple[TreeBatch, torch.Tensor]:
    """Draft ``batch_size`` trees of one skeleton ``shape``, depth by depth.

    Parameters
    ----------
    shape : the skeleton (a ``TreeShape`` or its text, ``"2,2"``), shared by the batch; slot u of every tree is
        skeleton node u.
    draft_probs : either a callable ``(token [B, N], nodes list[int]) -> [B, len(nodes), V]`` giving
        ``q(·|s(u))`` at skeleton nodes ``nodes`` of one depth (``token`` holds the tokens drafted so far, −1
        elsewhere), or precomputed rows that ignore the drafted tokens: ``[V]`` (context-free), ``[N, V]``
        (per slot) or ``[B, N, V]``.
    process : draft process of every node's children.

    Returns
    -------
    ``(TreeBatch, draft rows [B, N, V])``: the rows a verifier of this batch needs.  A callable is asked at the
    root and the internal nodes only — no verifier reads ``q`` at a drafted leaf (nothing is drafted from it),
    so a leaf's row is uniform (a valid row, never used) and a real draft model skips its deepest forward.
    """
    where = "draft_tree"
    check_choice(process, PROCESSES, where, "process")
    shape = as_shape(shape, where)
    check_int(batch_size, where, "batch_size", 1)
    N, B = shape.num_nodes, int(batch_size)
    if callable(draft_probs):
        def source(token, nodes):
            q = draft_probs(token, nodes)
            check_tensor(where, "the draft_probs callable's rows", q)
            if q.ndim != 3 or q.shape[:2] != (B, len(nodes)):
                raise ValueError(f"{where}: the draft_probs callable must return a [B, len(nodes), V] = "
                                 f"[{B}, {len(nodes)}, V] tensor, got "
                                 f"{list(q.shape)}")
            return q                    # its rows are checked where children are drawn from them
    else:
        try:
            rows = torch.as_tensor(draft_probs, device=device)
        except (TypeError, ValueError, RuntimeError, AssertionError) as err:
            raise ValueError(f"{where}: draft_probs must be rows [V], [N, V] or [B, N, V] (a tensor or an array) or "
                             f"a callable, got {type(draft_probs).__name__} ({err})") from None
        check_tensor(where, "draft_probs", rows)                     # (a sparse row failed inside expand)
        if rows.ndim == 1:
            rows = rows.expand(B, N, rows.shape[0])
        elif rows.ndim == 2:
            rows = rows.expand(B, *rows.shape)
        if rows.ndim != 3 or rows.shape[:2] != (B, N):
            raise ValueError(f"{where}: draft_probs rows must be [V], [N, V] or [B, N, V] with [B, N] = [{B}, {N}], "
                             f"got {list(rows.shape)}")
        check_rows(where, "draft_probs", rows)

        def source(token, nodes):
            return rows[:, nodes]
    token = torch.full((B, N), -1, dtype=torch.long, device=device)
    out = None
    depth = shape.depth
    for d in range(shape.max_depth + 1):
        nodes = [u for u in range(N) if depth[u] == d and (u == 0 or shape.children[u] or not callable(draft_probs))]
        if not nodes:
            break
        q = source(token, nodes)
        if out is None:
            out = torch.full((B, N, q.shape[-1]), 1.0 / q.shape[-1], dtype=q.dtype, device=q.device)
            token = token.to(q.device)
        elif (q.shape[-1], q.dtype, q.device) != (out.shape[-1], out.dtype, out.device):
            raise ValueError(f"{where}: the draft_probs callable returned rows of V = {q.shape[-1]}, {q.dtype} on "
                             f"{q.device} at depth {d}, but V = {out.shape[-1]}, {out.dtype} on {out.device} at the "
                             f"root: every depth's rows must share them")
        out[:, nodes] = q
        by_k: dict[int, list[int]] = {}
        for i, u in enumerate(nodes):
            if shape.children[u]:
                by_k.setdefault(len(shape.children[u]), []).append(i)
        for k, idx in by_k.items():
            rows_k = q[:, idx].reshape(-1, q.shape[-1])
            kids = sample_children(rows_k, k, process, generator).view(B, len(idx), k)
            for col, i in enumerate(idx):
                token[:, list(shape.children[nodes[i]])] = kids[:, col]
    return skeleton_batch(shape, B, token.device).with_tokens(token), out


@functools.lru_cache(maxsize=64)
def skeleton_batch(shape: TreeShape, batch_size: int, device: torch.device) -> TreeBatch:
    """``batch_size`` trees of ``shape`` (every drafted token 0), one per (shape, size, device) and kept: the batch
    whose derived structure every batch :func:`draft_tree` drafts with that skeleton shares
    (:meth:`TreeBatch.with_tokens`) — a decode loop drafting one shape derives its depths, children and
    per-depth node lists once."""
    N = shape.num_nodes
    parent = torch.tensor(shape.parent, dtype=torch.long, device=device).expand(batch_size, N).contiguous()
    token = torch.where(parent >= 0, 0, -1)
    return TreeBatch(parent, token, torch.full((batch_size,), N, dtype=torch.long, device=device))
