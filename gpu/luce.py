"""Rule 7 batched: the Luce plan on each row's classes of exchangeable drafted tokens
(:mod:`univer_theory.plans.luce`, whose :func:`~univer_theory.plans.luce.luce_fit` and
:func:`~univer_theory.plans.luce.luce_weights` run here on a level's rows — one implementation; numpy on the
CPU, where :func:`gpu.wor_plans.wor_weights` is one host call, torch on an accelerator).  A row's drafted
tokens are grouped by equal ``(q_y, c_y)`` (:func:`row_classes`, the exact core's
:func:`~univer_theory.plans.luce.token_classes`: classes in the order of their lowest token id), padded with
empty classes (size 0: no composition through them has mass, and they are never live) to the most classes
among the rows; that count is read on the host, since it sets the enumerated compositions.  Identical rows (a
level's siblings under one parent, the same context across a batch of trees) are fitted once.  The budget
(:func:`luce_rows`) and the fit (:func:`luce_rows_weights`) each group their rows: the fit gets the budget's
rows that the caller keeps below α*(ρ), de-duplicated (:func:`gpu.unique.distinct_rows`), and the grouping is a
few sorts.
"""
from __future__ import annotations

from univer_theory.nx import get_backend
from univer_theory.plans.luce import LUCE_FLOOR, LUCE_SUPPORT, luce_budget, luce_fit, luce_weights

from .unique import distinct_rows


def row_classes(c, q):
    """The drafted tokens of each row ``c = ρp, q [R, V]`` grouped by equal ``(q_y, c_y)``, classes in the order
    of their lowest token id, padded to the most classes ``m`` of any row: ``(q_cls, c_cls, sizes [R, m],
    slot [R, V])`` — one member's q and c, the class size (0 on padding) and each token's class (−1 off the
    draft support).  numpy or torch."""
    nx = get_backend(c, q)
    R, V = q.shape
    rows, tok = nx.nonzero(q > 0)
    keys = (c[rows, tok], q[rows, tok], rows)                           # grouped by (row, q, c): stable sorts
    at = nx.arange(rows.shape[0], q)                                    # from the last key; a group keeps its
    for key in keys:                                                    # tokens in id order (nonzero's)
        at = at[nx.argsort(key[at])]
    new = nx.concat([at[:1] >= 0, nx.stack([key[at[1:]] != key[at[:-1]] for key in keys]).any(-1)])
    label = nx.cumsum(new) - 1                                          # each sorted token's class
    inverse = 0 * label
    inverse[at] = label
    sizes = nx.bincount(label, int(new.sum()))
    row, first = rows[at[new]], tok[at[new]]                            # each class's row and lowest token
    order = nx.argsort(row * V + first)                                 # classes by row, then lowest token
    count = nx.bincount(row, R)
    start = nx.cumsum(count) - count
    rank = 0 * order
    rank[order] = nx.arange(order.shape[0], q) - start[row[order]]
    m = int(count.max()) if R else 0
    q_cls, c_cls, size = (nx.full((R, m), 0.0, q) for _ in range(3))
    q_cls[row, rank], c_cls[row, rank], size[row, rank] = keys[1][at[new]], keys[0][at[new]], nx.asarray(sizes, q)
    slot = nx.full((R, V), -1, rows)
    slot[rows, tok] = rank[inverse]
    return q_cls, c_cls, size, slot


def luce_rows(c, q, k: int):
    """``[R]`` bool: the rows whose classes of exchangeable drafted tokens fit
    :func:`~univer_theory.plans.luce.luce_budget` at k children.  Rows with more than :data:`LUCE_SUPPORT`
    distinct draft probabilities are out without being grouped: first those whose largest ``LUCE_SUPPORT + 2``
    values are all distinct (a partial sort, O(V)), then, among the rest, by one sort of the row; the others'
    class sizes are read on the host.  numpy or torch."""
    nx = get_backend(c, q)
    fit = nx.zeros_like(q[:, 0]) > 0
    rows = nx.arange(q.shape[0], q)
    for n in (min(LUCE_SUPPORT + 2, q.shape[1]), q.shape[1]):
        s = nx.top_values(q[rows], n)
        rows = rows[1 + (s[:, 1:] != s[:, :-1]).sum(-1) <= LUCE_SUPPORT + 1]    # 0 counted as a value too
    if rows.shape[0]:
        size = nx.to_numpy(row_classes(c[rows], q[rows])[2]).astype(int)
        fit[rows] = nx.index([luce_budget([n for n in r if n > 0], k) for r in size.tolist()], q) > 0
    return fit


def luce_rows_weights(c, q, children):
    """``(w, a [R, V])``: the Luce plan of rows ``c = ρp``, ``q [R, V]`` on ``children [R, k]`` or ``[R, T, k]``
    (``w`` shaped as ``children``); identical rows are fitted once (:func:`gpu.unique.distinct_rows`).  numpy or
    torch."""
    nx = get_backend(c, q)
    first, inverse = distinct_rows(nx.concat([c, q]))
    q_cls, c_cls, size, slot = row_classes(c[first], q[first])
    phi_s, tau_s, a_s = luce_fit(c_cls, q_cls, children.shape[-1], size)
    drafted, at = slot >= 0, nx.maximum(slot, 0)
    phi = nx.where(drafted, nx.take(phi_s, at), LUCE_FLOOR)[inverse]
    tau = nx.where(drafted, nx.take(tau_s, at), 0.0)[inverse]
    flat = children.reshape(children.shape[0], -1)
    w = luce_weights(nx.take(phi, flat).reshape(children.shape), nx.take(tau, flat).reshape(children.shape))
    return w, nx.where(drafted, nx.take(a_s, at), 0.0)[inverse]
