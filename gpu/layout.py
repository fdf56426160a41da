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
(row, earliest block) once (:func:`gpu.unique.unique_rows`), where the exact core caches its blocks per node, and
the blocks of a level are laid out in buckets of similar size (:func:`_bucketed_layout`), where the exact core has
one block a call.
On the CPU the four functions run on numpy views of the level's tensors (:func:`gpu.host.on_host`).
"""
from __future__ import annotations

import torch

from univer_theory.plans.layout import LayoutRows, acceptance, block_layout, first_blocks, layout_rows, tuple_weights

from .host import on_host
from .unique import unique_rows


def inverse_permutation(order: torch.Tensor) -> torch.Tensor:
    """Row-wise inverse of a permutation ``order [R, V]`` (e.g. a sort's indices): the rank of every entry."""
    return torch.empty_like(order).scatter_(1, order, torch.arange(order.shape[1], device=order.device)
                                            .expand_as(order))


#: What the padding of a layout's group arrays holds (:func:`_bucketed_layout`): nothing that reaches a weight —
#: ``g_valid`` masks every read past a block's G groups; finite values keep the masked arithmetic finite.
_PADDING = {"g_valid": False, "fwd": 1.0, "bwd_next": 1.0, "right": 0.0, "left": 0.0}


#: Blocks laid out in one call, padded to the largest, when (blocks × largest block) is at most this (a level's
#: rows on their drafted support, :mod:`gpu.support`): every call costs its ~100 small operations.
ONE_CALL = 1 << 16


def _bucketed_layout(q: torch.Tensor, k: torch.Tensor, rows: LayoutRows, row: torch.Tensor, block: torch.Tensor,
                     K: int) -> dict:
    """:func:`~univer_theory.plans.layout.block_layout` of the blocks ``block [U]`` of rows ``row [U]``, computed
    in buckets of block sizes within a factor 2 (a level's blocks range from one token to most of the vocabulary;
    one call pads every block to the largest — done when that is small, :data:`ONE_CALL`) and padded together to
    the largest group count for :func:`~univer_theory.plans.layout.tuple_weights` (which reads only ``G`` groups of each, :data:`_PADDING`;
    the edges are padded with each layout's last edge, so every width stays finite)."""
    size = (rows.block[row] == block[:, None]).sum(1)
    bucket = torch.ceil(torch.log2(size.clamp(min=1).double())).long()
    if row.shape[0] * int(size.max()) <= ONE_CALL:    # host read: small enough to pad every block to the largest
        bucket = torch.zeros_like(bucket)
    parts = []
    for b in bucket.unique().tolist():  # host read: the buckets present
        sel = (bucket == b).nonzero().squeeze(1)
        r = row[sel]
        parts.append((sel, on_host(block_layout, q[r], k[r], LayoutRows(*(x[r] for x in rows)), block[sel], K)))
    if len(parts) == 1:
        return parts[0][1]
    U, gmax = row.shape[0], max(lay["g_valid"].shape[-1] for _, lay in parts)
    first = parts[0][1]
    out = {name: first[name].new_empty((U, *first[name].shape[1:])) for name in ("G", "slot")}
    for name in (*_PADDING, "edges"):   # group arrays: gmax + (their width − their layout's group count) columns
        width = gmax + first[name].shape[-1] - first["g_valid"].shape[-1]
        out[name] = first[name].new_full((U, width), _PADDING.get(name, 0.0))
    for sel, lay in parts:
        out["G"][sel], out["slot"][sel] = lay["G"], lay["slot"]
        for name in _PADDING:
            out[name][sel, :lay[name].shape[-1]] = lay[name]
        out["edges"][sel] = lay["edges"][:, -1:]                         # each layout's last edge, then its edges
        out["edges"][sel, :lay["edges"].shape[-1]] = lay["edges"]
    return out


def layout_weights(c: torch.Tensor, q: torch.Tensor, children: torch.Tensor, child_mask: torch.Tensor):
    """``(w, a [R, V])``: the layout plan on the realised i.i.d. tuples ``children [R, K]`` (``child_mask [R, K]``
    marks the k ≥ 2 existing children of each row; duplicates are separate copies) and its marginal
    ``a = min(b, c)`` — ``univer_theory.plans.layout.layout_plan(...)``'s ``select(S)`` and ``marginal``, the same
    functions on a batch.  ``children [R, T, K]`` evaluates T tuples per row (same mask) on targets built once per
    row and lays out each distinct (row, earliest block) once; ``w`` has the shape of ``children``."""
    k = child_mask.sum(1)
    rows = on_host(layout_rows, c, q, k)
    R, K = children.shape[0], children.shape[-1]
    tuples = children.reshape(R, -1, K)
    T = tuples.shape[1]
    first, in_first = on_host(first_blocks, rows.block_of, tuples, child_mask)
    if T == 1:
        row, block, at = torch.arange(R, device=q.device), first[:, 0], torch.arange(R, device=q.device)
    else:                               # one layout per distinct (row, block)
        tr = torch.arange(R, device=q.device).repeat_interleave(T)
        pairs, at = unique_rows(torch.stack([tr, first.reshape(-1)], -1))
        row, block = pairs[:, 0], pairs[:, 1]
    lay = _bucketed_layout(q, k, rows, row, block, K)
    w = on_host(tuple_weights, acceptance(c, rows.b), q, tuples, child_mask, in_first, lay, at)
    return w.view(children.shape), torch.minimum(rows.b, c)
