"""The i.i.d. private-position layout (UniVer's rule 2, theory.md §6.3) on the R nodes of a level.

One implementation: :mod:`univer_theory.plans.layout` writes every formula of the layout once for numpy and torch
rows (its docstring has the math and the proofs); the exact core runs it on one node as a batch of one, and
:func:`layout_weights` composes the same functions on the level's tensors ``c = ρp``, ``q`` ``[R, V]``:

* :func:`~univer_theory.plans.layout.layout_rows` — the closed-form targets ``b``, the cut and the block of every
  drafted token (sort by ratio, prefix sums, ``D = F(X) − C``, prefix / suffix minima);
* :func:`~univer_theory.plans.layout.first_blocks` — the earliest block each realised tuple touches (only it can
  hold the smallest private position);
* :func:`~univer_theory.plans.layout.block_layout` — that block's groups, μ_k-masses, exchange rates and the
  pivots of ``A = diag(Q) + Laplacian(ℓ)`` (doubling scans of 2×2 Möbius matrices), rows padded to the largest;
* :func:`~univer_theory.plans.layout.tuple_weights` — ``w_j(S) = t(y_j)·Pr(copy j has the smallest position | S)``
  by Gauss–Legendre on the group intervals, chunked (:data:`~univer_theory.plans.layout.TUPLE_CHUNK`).

What is torch's own here is the batching: several tuples per row (``children [R, T, K]``) lay out each distinct
(row, earliest block) once (``torch.unique``), where the exact core caches its blocks per node.
"""
from __future__ import annotations

import torch

from univer_theory.plans.layout import LayoutRows, acceptance, block_layout, first_blocks, layout_rows, tuple_weights


def inverse_permutation(order: torch.Tensor) -> torch.Tensor:
    """Row-wise inverse of a permutation ``order [R, V]`` (e.g. a sort's indices): the rank of every entry."""
    return torch.empty_like(order).scatter_(1, order, torch.arange(order.shape[1], device=order.device)
                                            .expand_as(order))


def layout_weights(c: torch.Tensor, q: torch.Tensor, children: torch.Tensor, child_mask: torch.Tensor):
    """``(w, a [R, V])``: the layout plan on the realised i.i.d. tuples ``children [R, K]`` (``child_mask [R, K]``
    marks the k ≥ 2 existing children of each row; duplicates are separate copies) and its marginal
    ``a = min(b, c)`` — ``univer_theory.plans.layout.layout_plan(...)``'s ``select(S)`` and ``marginal``, the same
    functions on a batch.  ``children [R, T, K]`` evaluates T tuples per row (same mask) on targets built once per
    row and lays out each distinct (row, earliest block) once; ``w`` has the shape of ``children``."""
    k = child_mask.sum(1)
    rows = layout_rows(c, q, k)
    R, K = children.shape[0], children.shape[-1]
    tuples = children.reshape(R, -1, K)
    T = tuples.shape[1]
    first, in_first = first_blocks(rows.block_of, tuples, child_mask)
    if T == 1:
        at = torch.arange(R, device=q.device)
        lay = block_layout(q, k, rows, first[:, 0], K)
    else:                               # one layout per distinct (row, block)
        tr = torch.arange(R, device=q.device).repeat_interleave(T)
        pairs, at = torch.unique(torch.stack([tr, first.reshape(-1)], -1), dim=0, return_inverse=True)
        row = pairs[:, 0]
        lay = block_layout(q[row], k[row], LayoutRows(*(x[row] for x in rows)), pairs[:, 1], K)
    w = tuple_weights(acceptance(c, rows.b), q, tuples, child_mask, in_first, lay, at)
    return w.view(children.shape), torch.minimum(rows.b, c)
