"""Distinct rows of an integer table, vectorised on every device."""
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


def _unique_rows(rows):
    """:func:`unique_rows` on one backend (:mod:`univer_theory.nx`)."""
    nx = get_backend(rows)
    order = nx.row_order(rows)
    ranked = rows[order]
    new = (ranked != nx.concat([ranked[:1] - 1, ranked[:-1]], axis=0)).any(1)     # differs from the row before
    inverse = order * 0
    inverse[order] = nx.cumsum(new, axis=0) - 1
    return ranked[new], inverse
