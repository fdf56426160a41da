"""Rule 7 batched: the Luce plan on each row's classes of exchangeable drafted tokens
(:mod:`univer_theory.plans.luce`, whose :func:`~univer_theory.plans.luce.luce_fit` and
:func:`~univer_theory.plans.luce.luce_weights` run here on torch tensors — one implementation).  A row's drafted
tokens are grouped by equal ``(q_y, c_y)`` (:func:`row_classes`, the exact core's
:func:`~univer_theory.plans.luce.token_classes`: classes in the order of their lowest token id), padded with
empty classes (size 0: no composition through them has mass, and they are never live) to the most classes
among the rows; that count is read on the host, since it sets the enumerated compositions.  Identical rows (a
level's siblings under one parent, the same context across a batch of trees) are fitted once.  The budget
(:func:`luce_rows`) and the fit (:func:`luce_rows_weights`) each group their rows: the fit gets the budget's
rows that the caller keeps below α*(ρ), de-duplicated, and the grouping is a few sorts (~0.05 s on 4 rows at
V = 49 152).
"""
from __future__ import annotations

import torch

from univer_theory.plans.luce import LUCE_FLOOR, LUCE_SUPPORT, luce_budget, luce_fit, luce_weights


def row_classes(c: torch.Tensor, q: torch.Tensor):
    """The drafted tokens of each row ``c = ρp, q [R, V]`` grouped by equal ``(q_y, c_y)``, classes in the order
    of their lowest token id, padded to the most classes ``m`` of any row: ``(q_cls, c_cls, sizes [R, m],
    slot [R, V])`` — one member's q and c, the class size (0 on padding) and each token's class (−1 off the
    draft support)."""
    R, V = q.shape
    rows, tok = (q > 0).nonzero(as_tuple=True)
    keys = (c[rows, tok], q[rows, tok], rows)                           # grouped by (row, q, c): stable sorts
    at = torch.arange(rows.numel(), device=q.device)                    # from the last key (torch.unique over
    for key in keys:                                                    # [N, 3] rows costs ~10× these sorts)
        at = at[torch.sort(key[at], stable=True).indices]
    new = torch.ones_like(at, dtype=torch.bool)
    new[1:] = torch.stack([key[at[1:]] != key[at[:-1]] for key in keys]).any(0)
    label = new.cumsum(0) - 1                                           # each sorted token's class
    inverse = torch.empty_like(label).scatter_(0, at, label)
    sizes = torch.bincount(label, minlength=int(new.sum()))
    uniq = torch.stack([key[at[new]].to(q.dtype) for key in reversed(keys)], 1)     # (row, q, c) per class
    first = torch.full((uniq.shape[0],), V, dtype=torch.long, device=q.device).scatter_reduce(0, inverse, tok, "amin")
    row = uniq[:, 0].long()
    order = torch.argsort(row * V + first)                              # classes by row, then lowest token
    count = torch.bincount(row, minlength=R)
    start = count.cumsum(0) - count
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=q.device) - start[row[order]]
    m = int(count.max()) if R else 0
    q_cls, c_cls, size = (torch.zeros(R, m, dtype=q.dtype, device=q.device) for _ in range(3))
    q_cls[row, rank], c_cls[row, rank], size[row, rank] = uniq[:, 1], uniq[:, 2], sizes.to(q.dtype)
    slot = torch.full((R, V), -1, dtype=torch.long, device=q.device)
    slot[rows, tok] = rank[inverse]
    return q_cls, c_cls, size, slot


def luce_rows(c: torch.Tensor, q: torch.Tensor, k: int) -> torch.Tensor:
    """``[R]`` bool: the rows whose classes of exchangeable drafted tokens fit
    :func:`~univer_theory.plans.luce.luce_budget` at k children.  Rows with more than :data:`LUCE_SUPPORT`
    distinct draft probabilities are out without being grouped: first those whose largest ``LUCE_SUPPORT + 2``
    values are all distinct (a top-k, O(V)), then, among the rest, by one sort of the row; the others' class
    sizes are read on the host."""
    fit = torch.zeros(q.shape[0], dtype=torch.bool, device=q.device)
    rows = torch.arange(q.shape[0], device=q.device)
    for values in (lambda x: x.topk(min(LUCE_SUPPORT + 2, x.shape[1]), 1).values, lambda x: x.sort(1).values):
        s = values(q[rows])
        rows = rows[1 + (s[:, 1:] != s[:, :-1]).sum(1) <= LUCE_SUPPORT + 1]    # 0 counted as a value too
    if rows.numel():
        size = row_classes(c[rows], q[rows])[2]
        fit[rows] = torch.tensor([luce_budget([n for n in r if n > 0], k) for r in size.long().tolist()],
                                 dtype=torch.bool, device=q.device)
    return fit


def luce_rows_weights(c: torch.Tensor, q: torch.Tensor, children: torch.Tensor):
    """``(w, a [R, V])``: the Luce plan of rows ``c = ρp``, ``q [R, V]`` on ``children [R, k]`` or ``[R, T, k]``
    (``w`` shaped as ``children``)."""
    V = q.shape[1]
    rows, inverse = torch.unique(torch.cat([c, q], 1), dim=0, return_inverse=True)   # identical rows fit once
    c_u, q_u = rows[:, :V], rows[:, V:]
    q_cls, c_cls, size, slot = row_classes(c_u, q_u)
    phi_s, tau_s, a_s = luce_fit(c_cls, q_cls, children.shape[-1], size)
    drafted, at = slot >= 0, slot.clamp(min=0)
    phi = torch.where(drafted, phi_s.gather(1, at), LUCE_FLOOR)[inverse]
    tau = torch.where(drafted, tau_s.gather(1, at), 0.0)[inverse]
    flat = children.flatten(1)
    w = luce_weights(phi.gather(1, flat).view(children.shape), tau.gather(1, flat).view(children.shape))
    return w, torch.where(drafted, a_s.gather(1, at), 0.0)[inverse]
