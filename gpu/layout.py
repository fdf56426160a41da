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

What is the batch's own here is its bookkeeping: several tuples per row (``children [R, T, K]``) lay out each
distinct (row, earliest block) once (:func:`gpu.unique.unique_rows`), where the exact core caches its blocks per
node, and the blocks of a level are laid out in buckets of similar size (:func:`_bucketed_layout`), where the exact
core has one block a call.  That too is written against :mod:`univer_theory.nx`, so on the CPU the whole
composition runs on numpy views of the level's tensors, one host call (:func:`gpu.host.on_host`), where the
targets, the block layouts and the children's columns are compiled passes with the same floats
(:mod:`univer_theory.plans.layout_blocks`).
"""
from __future__ import annotations

import torch

from univer_theory.nx import array_module, get_backend
from univer_theory.plans.layout import LayoutRows, acceptance, block_layout, first_blocks, layout_rows, tuple_weights

from .host import on_host
from .unique import unique_rows


#: What the padding of a layout's group arrays holds (:func:`_bucketed_layout`): nothing that reaches a weight —
#: ``g_valid`` masks every read past a block's G groups; finite values keep the masked arithmetic finite.
_PADDING = {"g_valid": False, "fwd": 1.0, "bwd_next": 1.0, "right": 0.0, "left": 0.0}


#: Blocks laid out in one call, padded to the largest, when (blocks × largest block) is at most this (a level's
#: rows on their drafted support, :mod:`gpu.support`): every call costs its ~100 small operations.
ONE_CALL = 1 << 16


def _bucketed_layout(q, k, rows: LayoutRows, row, block, K: int, in_order: bool = False) -> dict:
    """:func:`~univer_theory.plans.layout.block_layout` of the blocks ``block [U]`` of rows ``row [U]``, computed
    in buckets of block sizes within a factor 2 (a level's blocks range from one token to most of the vocabulary;
    one call pads every block to the largest — done when that is small, :data:`ONE_CALL`) and padded together to
    the largest group count for :func:`~univer_theory.plans.layout.tuple_weights` (which reads only ``G`` groups
    of each, :data:`_PADDING`; the edges are padded with each layout's last edge, so every width stays finite).
    ``in_order``: ``row`` is every row of ``q`` in order (one tuple a row), which are then read in place.  numpy or
    torch (:mod:`univer_theory.nx`)."""
    nx, xp = get_backend(q), array_module(q)
    size = nx.sum((rows.block if in_order else rows.block[row]) == block[:, None])
    if row.shape[0] * int(size.max()) <= ONE_CALL:    # host read: small enough to pad every block to the largest
        if in_order:                                     # row = every row in order: no gathers
            return block_layout(q, k, rows, block, K)
        return block_layout(q[row], k[row], LayoutRows(*(x[row] for x in rows)), block, K)
    bucket = xp.ceil(xp.log2(nx.asarray(nx.maximum(size, 1), q)))
    parts = []
    for b in sorted(set(bucket.tolist())):              # host read: the buckets present
        sel = nx.nonzero(bucket == b)[0]
        r = row[sel]
        parts.append((sel, block_layout(q[r], k[r], LayoutRows(*(x[r] for x in rows)), block[sel], K)))
    gmax = max(lay["g_valid"].shape[-1] for _, lay in parts)
    back = nx.argsort(nx.concat([sel for sel, _ in parts]))       # the parts' rows, concatenated, back in order
    out = {name: nx.concat([lay[name] for _, lay in parts], axis=0)[back] for name in ("G", "slot")}
    for name in (*_PADDING, "edges"):   # group arrays: gmax + (their width − their layout's group count) columns
        padded = []
        for _, lay in parts:
            x = lay[name]
            fill = nx.full((x.shape[0], gmax - lay["g_valid"].shape[-1]), _PADDING.get(name, 0.0), x)
            padded.append(nx.concat([x, x[:, -1:] + fill if name == "edges" else fill]))   # edges: the last one
        out[name] = nx.concat(padded, axis=0)[back]
    return out


def layout_weights(c: torch.Tensor, q: torch.Tensor, children: torch.Tensor, child_mask: torch.Tensor,
                   p: torch.Tensor | None = None):
    """``(w, a [R, V])``: the layout plan on the realised i.i.d. tuples ``children [R, K]`` (``child_mask [R, K]``
    marks the k ≥ 2 existing children of each row; duplicates are separate copies) and its marginal
    ``a = min(b, c)`` — ``univer_theory.plans.layout.layout_plan(...)``'s ``select(S)`` and ``marginal``, the same
    functions on a batch.  ``children [R, T, K]`` evaluates T tuples per row (same mask) on targets built once per
    row and lays out each distinct (row, earliest block) once; ``w`` has the shape of ``children``.  ``p``: the
    target rows of ``c = ρp``, whose ``p/q`` order the layout then follows (``layout_rows``).  On the CPU on numpy
    views (:func:`gpu.host.on_host`)."""
    return on_host(_layout_weights, c, q, children, child_mask, p)


def _layout_weights(c, q, children, child_mask, p=None):
    """:func:`layout_weights` on one backend (:mod:`univer_theory.nx`)."""
    nx = get_backend(c, q)
    k = nx.sum(child_mask)
    rows = layout_rows(c, q, k, p)
    R, K = children.shape[0], children.shape[-1]
    tuples = children.reshape(R, -1, K)
    T = tuples.shape[1]
    first, in_first = first_blocks(rows.block_of, tuples, child_mask)
    tree = nx.arange(R * T, q) // T                     # each tuple's row
    if T == 1:
        row, block, at = tree, first[:, 0], tree
    else:                               # one layout per distinct (row, block)
        pairs, at = unique_rows(nx.stack([tree, first.reshape(-1)]))
        row, block = pairs[:, 0], pairs[:, 1]
    lay = _bucketed_layout(q, k, rows, row, block, K, in_order=T == 1)
    flat = tuples.reshape(R, T * K)                     # t = min(1, c/b) at the tuples' tokens alone
    ty = acceptance(nx.take(c, flat), nx.take(rows.b, flat)).reshape(R, T, K)
    w = tuple_weights(ty, q, tuples, child_mask, in_first, lay, at)
    return w.reshape(children.shape), nx.minimum(rows.b, c)
