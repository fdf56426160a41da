"""Rule 1 and the shape rule at a level's nodes: :func:`solvers.condot_simplex.condot_table` (the exact core's
own float implementation, every node's LP at once) read at each node's realised children."""
from __future__ import annotations

from solvers.condot_simplex import condot_table, tuple_rank
from univer_theory.nx import get_backend

from .unique import distinct_rows


def condot_weights(c, q, children, process: str, position_weights=None):
    """Rule 1's plan (with the shape rule's ``position_weights`` ω ``[R, k]`` when given) for ``iid`` / ``wor``
    rows ``c = ρp [R, V]``, ``q [R, V]`` with small draft supports: ``(w, a [R, V], solved [R])`` with ``w`` shaped
    as ``children [R, k]`` or ``[R, T, k]`` (T orderings each); ``solved`` is False where the simplex did not
    finish.  Identical rows are solved once (:func:`gpu.unique.distinct_rows`).  numpy or torch."""
    nx = get_backend(c, q)
    R, V = q.shape
    k = children.shape[-1]
    omega = nx.full((R, 0), 0.0, q) if position_weights is None else nx.asarray(position_weights, q)
    first, inverse = distinct_rows(nx.concat([c, q, omega]))
    sup, _, w_all, a, solved = condot_table(c[first], q[first], k, process, omega[first])
    flat = children.reshape(R, -1, k)
    ranks = nx.take(nx.cumsum(q > 0) - 1, flat.reshape(R, -1)).reshape(flat.shape)    # each child's support rank
    w = w_all[inverse[:, None], tuple_rank(ranks, sup.shape[1], process)]    # [R, T, k]
    return w.reshape(children.shape), a[inverse], solved[inverse]
