"""Distinct rows of a table, vectorised on every device."""
from __future__ import annotations

from univer_theory.nx import get_backend

from .host import on_host


def unique_rows(rows):
    """``torch.unique(rows, dim=0, return_inverse=True)`` for ``rows [M, K]`` (distinct rows in lexicographic
    order, and each row's index among them) from the table's lexicographic order (``nx.row_order``: numpy's
    lexsort on the CPU, K stable sorts on an accelerator), where the CPU's ``unique(dim=0)`` compares rows one
    by one (~10× slower on a level's few hundred rows).  Tensors (on the CPU through numpy,
    :func:`gpu.host.on_host`) or numpy arrays."""
    return on_host(_unique_rows, rows)


def _groups(rows):
    """``(order, new, inverse)``: the table's stable lexicographic order, which sorted rows differ from the one
    before (``new``, in that order) and each row's group (:mod:`univer_theory.nx`)."""
    nx = get_backend(rows)
    order = nx.row_order(rows)
    ranked = rows[order]
    new = nx.concat([order[:1] >= 0, (ranked[1:] != ranked[:-1]).any(1)])
    inverse = order * 0
    inverse[order] = nx.cumsum(new, axis=0) - 1
    return order, new, inverse


def _unique_rows(rows):
    """:func:`unique_rows` on one backend (:mod:`univer_theory.nx`)."""
    order, new, inverse = _groups(rows)
    return rows[order[new]], inverse


def distinct_rows(x):
    """Groups of identical rows of a wide float table ``x [M, n]`` (a level's probability rows):
    ``(first [U], inverse [M])`` — the first row of each group and each row's group, ``x[first][inverse] == x``.
    The rows are grouped by two fingerprints (their sum and their sum weighted by the column index: the same
    arithmetic on equal rows) in :func:`unique_rows`' order, then every group is confirmed entry by entry; should
    different rows share both fingerprints, each row is its own group (still exact, only not de-duplicated).
    Sorting the rows themselves would cost n sorts.  numpy or torch."""
    nx = get_backend(x)
    order, new, inverse = _groups(nx.stack([x.sum(-1), (x * nx.arange(x.shape[1], x)).sum(-1)]))
    first = order[new]
    if bool((x[first][inverse] == x).all()):
        return first, inverse
    every = nx.arange(x.shape[0], x)
    return every, every
