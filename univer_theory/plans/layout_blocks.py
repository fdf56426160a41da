"""Rule 2's layout (:mod:`.layout`) on numpy rows as compiled passes — the array forms' floats, bit for bit.

The layout's functions are written once against the array namespace (numpy or torch rows); on numpy rows three
of them run here instead: the targets and blocks after the ratio sort (:func:`layout_rows_rows`, for
:func:`.layout.layout_rows`), a block's density groups, exchange rates and pivots (:func:`block_layout_rows`, for
:func:`.layout.block_layout`) and the children's densities and CDFs of the tuple integrals
(:func:`child_columns_rows`, for :func:`.layout.tuple_weights`, read from the layout rows in place; the
integrals themselves are :func:`.layout.share_rows`).  Their array forms' ~100 operations a level cost
~2–3 ms a level at top 1 024, mostly in dispatch and in passes over padded ``[U, n]`` arrays; the passes here cost
a block's stable sort and a few loops (docs/deviations.md item 66).  They follow the array forms step by step,
with the same floats in the same order, including what depends on the batch:

* a row's block sits in ``n`` columns, ``n`` the largest block of the batch, and is sorted over all ``n`` (its
  padding last: density −∞); its groups sit in ``gmax`` columns, the most of any row, padded as the array form
  pads them (unit groups of zero mass, the masked values of every ``where``);
* sorts are stable (:func:`univer_theory.nx.stable_argsort_row`, the permutation of the array form's
  :meth:`univer_theory.nx.NumpyBackend.argsort`); group sums add in index order (``scatter_add``), prefix sums
  and products run sequentially from their first term (``cumsum``, ``cumprod``), prefix and suffix minima as
  ``np.minimum``'s accumulations; ``np.argmin`` / ``np.argmax`` take the first extreme (a NaN first);
* ``np.maximum`` / ``np.minimum`` keep their NaN and signed-zero rules (:func:`univer_theory.nx.np_max`,
  :func:`~univer_theory.nx.np_min`); a product with a mask multiplies by 1.0 or 0.0, as numpy's bool-to-float
  cast does.  What is one formula of :mod:`.layout` in its own right stays there, applied between the passes:
  the μ_k-masses (:func:`.layout.mu_k_width`), ``F(X) = −expm1(k·log1p(−X))`` (the C library's, as numpy calls
  it), the row sums and a block's pivots and ratios (:func:`.layout._with_pivots`: the pivots from both ends,
  :func:`.layout.end_pivots`, on numpy rows one compiled loop of both recurrences).

``tests/theory/test_layout.py`` runs each against its array form on seeded grids (ragged batches, density ties,
confident rows, single-group blocks and blocks of hundreds of groups, every kind of cut) and asserts equal bytes.
The math is the array forms'; their docstrings state it.
"""
from __future__ import annotations

import numba
import numpy as np

from ..nx import np_max, np_min, stable_argsort_row


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _block_rows(q, b, order, X, block, first):  # pragma: no cover - compiled
    """The rows' blocks sorted into density groups: ``(tok, dens, filled, group [U, n], size, G [U], lo, hi [U])``
    — the tokens of each row's block ``first`` in the ratio order (``n`` columns, padding past ``size``), stably
    sorted by density ``b/q`` descending, whether each sorted position holds a token of the block (``filled``: it
    came from a position before ``size``), and its group (counted from 0 over the positions before ``size``)."""
    U, V = q.shape
    size, start = np.zeros(U, np.int64), np.zeros(U, np.int64)
    for u in range(U):                  # counts in registers, not in size[u]: the loop then vectorises
        row, f0, s, st = block[u], first[u], 0, 0
        for v in range(V):
            f = row[v]
            s += f == f0
            st += f >= 0 and f < f0
        size[u], start[u] = s, st
    n = size.max()
    tok, dens = np.empty((U, n), np.int64), np.empty((U, n))
    filled, group, G = np.empty((U, n), np.bool_), np.empty((U, n), np.int64), np.zeros(U, np.int64)
    lo, hi = np.empty(U), np.empty(U)
    raw_tok, raw_dens = np.empty(n, np.int64), np.empty(n)
    for u in range(U):
        lo[u], hi[u] = X[u, start[u]], X[u, start[u] + size[u]]
        for j in range(n):
            t = order[u, min(start[u] + j, V - 1)]
            raw_tok[j] = t
            raw_dens[j] = -(b[u, t] / q[u, t]) if j < size[u] else -(-np.inf)
        o = stable_argsort_row(raw_dens)
        count = 0
        for j in range(n):
            tok[u, j], dens[u, j], filled[u, j] = raw_tok[o[j]], -raw_dens[o[j]], o[j] < size[u]
            if j < size[u] and (j == 0 or dens[u, j] != dens[u, j - 1]):
                count += 1
            group[u, j] = count - 1
        G[u] = count
    return tok, dens, filled, group, size, G, lo, hi


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _group_sums(q, b, tok, dens, filled, group, size, G, lo, hi):  # pragma: no cover - compiled
    """``(Q, B, d, edges)`` of :func:`.layout.array_block_layout` from :func:`_block_rows`: the group lengths (unit
    lengths past a row's G groups), the group sums of b, the densities and the edges (``lo`` plus the lengths'
    prefix sums, the block's end ``hi`` at edge G)."""
    U = tok.shape[0]
    gmax = G.max()
    Q, B, d = np.zeros((U, gmax)), np.zeros((U, gmax)), np.zeros((U, gmax))
    edges = np.empty((U, gmax + 1))
    for u in range(U):      # group sums in index order from 0.0, in registers (a group's tokens are consecutive)
        Qu, Bu, du, qu, bu, tu, fu, gu, de = Q[u], B[u], d[u], q[u], b[u], tok[u], filled[u], group[u], dens[u]
        at, q_sum, b_sum = -1, 0.0, 0.0
        for j in range(size[u]):
            if gu[j] != at:                                 # a group starts: the last one's sums, this one's density
                if at >= 0:
                    Qu[at], Bu[at] = q_sum, b_sum
                at, q_sum, b_sum = gu[j], 0.0, 0.0
                du[at] = de[j]
            q_sum += qu[tu[j]] if fu[j] else 1.0
            b_sum += bu[tu[j]] if fu[j] else 0.0
        if at >= 0:
            Qu[at], Bu[at] = q_sum, b_sum
        for g in range(G[u], gmax):
            Q[u, g] = 1.0
        edges[u, 0], acc = lo[u], 0.0
        for g in range(gmax):
            acc = Q[u, g] if g == 0 else acc + Q[u, g]
            edges[u, g + 1] = lo[u] + acc
        edges[u, G[u]] = hi[u]
    return Q, B, d, edges


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _exchange_rates(Q, B, d, m, G, lo):  # pragma: no cover - compiled
    """``(ell, clamp)`` of :func:`.layout.array_block_layout` from the groups' lengths, b-sums, densities and
    μ_k-masses ``m``: the excesses ``E`` (prefix sums, their round-off residual charged from the longest group
    on), ``ℓ_g = max(E_g, 0)/(d_g − d_{g+1})`` and the largest ``−E_g`` clamped."""
    U, gmax = Q.shape
    E, ell, clamp = np.empty(gmax), np.empty((U, max(gmax - 1, 0))), np.empty(U)
    for u in range(U):      # one quantity a loop (the excesses' sum, the longest, the rates, their least), so
        acc = 0.0           # each runs at its own speed (one loop tracking the largest and the least: 2.6× slower)
        for g in range(gmax):
            term = m[u, g] - B[u, g] if g < G[u] else 0.0
            acc = term if g == 0 else acc + term
            E[g] = acc
        longest = np.argmax(Q[u, :G[u]]) if G[u] > 0 else 0     # the first largest (a NaN first), as np.argmax
        last = E[G[u] - 1]
        for g in range(gmax):
            E[g] = E[g] - last * (1.0 if g >= longest else 0.0)
        rates, dens, inner = ell[u], d[u], G[u] - 1
        for g in range(gmax - 1):
            rates[g] = np_max(E[g], 0.0) / (dens[g] - dens[g + 1]) if g < inner else 0.0
        low = np.amin(E[:inner]) if inner > 0 else np.inf        # the least inner excess (a NaN first)
        clamp[u] = np_max(-low, 0.0) if gmax > 1 else 0.0 * lo[u]
    return ell, clamp


def block_layout_rows(q, k, rows, first, k_max: int, mu_k_width) -> dict:
    """:func:`.layout.array_block_layout` on numpy rows (module docstring) up to its pivots: the dict's ``G``,
    ``g_valid``, ``edges``, ``widths``, ``masses``, ``ell``, ``clamp`` and ``slot``, the same floats (the caller adds
    the rest, :func:`.layout._with_pivots`, as the array form does).  ``mu_k_width``: the masses' one formula
    (:func:`.layout.mu_k_width`), applied between the passes."""
    q, b, X = (np.ascontiguousarray(x, np.float64) for x in (q, rows.b, rows.X))
    order, block, first = (np.ascontiguousarray(x, np.int64) for x in (rows.order, rows.block, first))
    tok, dens, filled, group, size, G, lo, hi = _block_rows(q, b, order, X, block, first)
    Q, B, d, edges = (np.ascontiguousarray(x) for x in _group_sums(q, b, tok, dens, filled, group, size, G, lo, hi))
    m = mu_k_width(edges[:, :-1], Q, np.asarray(k)[:, None], k_max)   # widths Q, not edge differences
    ell, clamp = _exchange_rates(Q, B, d, m, G, lo)
    return {"G": G, "g_valid": np.arange(Q.shape[1])[None, :] < G[:, None], "edges": edges, "widths": Q,
            "masses": m, "ell": ell, "clamp": clamp, "slot": _slot_rows(tok, group, size, q.shape[1])}


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _slot_rows(tok, group, size, V):  # pragma: no cover - compiled
    """The array form's ``slot [U, V + 1]``: each of a row's ``size`` block tokens ``tok`` → its ``group``, −1
    elsewhere (the dump column V included)."""
    U = tok.shape[0]
    slot = np.full((U, V + 1), -1, np.int64)
    for u in range(U):
        for j in range(size[u]):
            slot[u, tok[u, j]] = group[u, j]
    return slot


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _child_column_rows(G, g_valid, edges, fwd, bwd_next, right, left, entry, gmax, group, q_col,  # pragma: no cover
                       first):
    """:func:`.layout.array_child_columns` (with :func:`.layout.inverse_columns`) column by column, each on its
    layout row ``entry[d]`` cut to ``gmax`` groups: ``x = A⁻¹ e_g`` from its diagonal entry outwards by running
    products of the ratios (the array form's cumulative products over all ``gmax`` columns have factors 1.0 off
    their side, so each side's products are these from the diagonal on, the same floats: ``1.0·x = x``),
    ``f = (q·x)/q`` and the CDF's sequential prefix sums."""
    D = group.shape[0]
    f, cdf = np.empty((D, gmax)), np.empty((D, gmax + 1))
    ratio = np.empty(gmax)
    for d in range(D):
        r, g = entry[d], group[d]
        r_g = right[r, min(g, max(gmax - 2, 0))] if gmax > 1 else 0.0 * fwd[r, 0]
        x_g = 1.0 / (fwd[r, g] + (r_g * bwd_next[r, g] if g + 1 < G[r] else 0.0))
        if first[d]:                    # the array form's products, less its leading factors 1.0 (exact)
            one = 0.0 * fwd[r, 0] + 1.0                     # the ratios' appended last factor
            run = 1.0
            for h in range(min(g, gmax) - 1, -1, -1):
                run = run * (left[r, h] if h < gmax - 1 else one)
                ratio[h] = run
            if g < gmax:
                ratio[g], run = 1.0, 1.0
                for h in range(g + 1, gmax):
                    run = run * right[r, h - 1]
                    ratio[h] = run
        acc = 0.0
        for h in range(gmax):
            x = x_g * ratio[h] if g_valid[r, h] and first[d] else 0.0
            f[d, h] = (q_col[d] * x) / q_col[d]
            term = f[d, h] * (edges[r, h + 1] - edges[r, h])
            acc = term if h == 0 else acc + term
            cdf[d, h + 1] = acc
        cdf[d, 0] = 0.0 * f[d, 0]
    return f, cdf


def child_columns_rows(lay: dict, entry, gmax: int, group, q_col, first):
    """:func:`.layout.array_child_columns` on numpy rows (module docstring): ``(f, F)`` of the columns on the
    layout rows ``entry`` of ``lay`` (:func:`.layout.block_layout`) cut to ``gmax`` groups — the same floats as
    the array form on those rows cut (:func:`.layout.tuple_weights`' chunks), without gathering them."""
    G, g_valid = np.ascontiguousarray(lay["G"], np.int64), np.ascontiguousarray(lay["g_valid"], np.bool_)
    edges, fwd, bwd_next, right, left = (np.ascontiguousarray(lay[name], np.float64)
                                         for name in ("edges", "fwd", "bwd_next", "right", "left"))
    return _child_column_rows(G, g_valid, edges, fwd, bwd_next, right, left, np.ascontiguousarray(entry, np.int64),
                              min(gmax, fwd.shape[1]), np.ascontiguousarray(group, np.int64),
                              np.ascontiguousarray(q_col, np.float64), np.ascontiguousarray(first, np.bool_))


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _sorted_sums(c, q, order):  # pragma: no cover - compiled
    """``(on, qo, co, X, C)`` of :func:`.layout.array_layout_rows`: the rows in the ratio order ``order``, the drafted
    mask, q and c (0 off the draft), and their prefix sums from 0 (sequential)."""
    R, V = q.shape
    on, qo, co = np.empty((R, V), np.bool_), np.empty((R, V)), np.empty((R, V))
    X, C = np.empty((R, V + 1)), np.empty((R, V + 1))
    for r in range(R):
        for l in range(V):
            t = order[r, l]
            on[r, l], qo[r, l] = q[r, t] > 0, q[r, t]
            co[r, l] = c[r, t] if q[r, t] > 0 else 0.0
        zero = 0.0 * qo[r, 0]
        X[r, 0], C[r, 0] = zero, zero
        for l in range(V):
            X[r, l + 1] = qo[r, 0] if l == 0 else X[r, l] + qo[r, l]
            C[r, l + 1] = co[r, 0] if l == 0 else C[r, l] + co[r, l]
    return on, qo, co, X, C


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _cut_blocks(D, co, on, order):  # pragma: no cover - compiled
    """``(b, block, block_of, starts, n)`` of :func:`.layout.array_layout_rows` from ``D = F(X) − C``: the cut
    ``n = argmin D`` (np.argmin: the first least, a NaN first), the prefix and suffix minima (np.minimum's
    accumulations), the targets, the block starts and the blocks in the order and per token."""
    R, V = co.shape
    b, block, block_of = np.zeros((R, V)), np.empty((R, V), np.int64), np.empty((R, V), np.int64)
    starts, n = np.empty((R, V), np.bool_), np.zeros(R, np.int64)
    P, S = np.empty(V + 1), np.empty(V + 1)
    for r in range(R):
        low, high = D[r, 0], D[r, V]            # P and S: running minima carried in registers, not re-read
        P[0], S[V] = low, high
        for l in range(1, V + 1):
            if low == low and (D[r, l] < low or D[r, l] != D[r, l]):
                n[r] = l                        # argmin: where the prefix minimum first drops to its last value
            low, high = np_min(low, D[r, l]), np_min(high, D[r, V - l])
            P[l], S[V - l] = low, high
        m = 0
        for l in range(V):
            m += on[r, l]
        count = 0
        for l in range(V):
            bo = co[r, l] - (P[l] - P[l + 1]) if l + 1 <= n[r] else co[r, l] + (S[l + 1] - S[l])
            b[r, order[r, l]] = np_max(bo, 0.0)
            starts[r, l] = ((l <= n[r] and P[l] == D[r, l]) or (l >= n[r] and S[l] == D[r, l]) or l == 0) and l < m
            count += starts[r, l]
            block[r, l] = count - 1 if on[r, l] else -1
            block_of[r, order[r, l]] = block[r, l]
    return b, block, block_of, starts, n


def layout_rows_rows(c, q, order, cum_f, k):
    """:func:`.layout.array_layout_rows` on numpy rows given their ratio order (module docstring): its fields, the
    same floats; ``F(X)`` from ``cum_f`` (the C library's ``expm1`` and ``log1p``, as the array form's)."""
    c, q = (np.ascontiguousarray(x, np.float64) for x in (c, q))
    order = np.ascontiguousarray(order, np.int64)
    on, qo, co, X, C = _sorted_sums(c, q, order)
    D = cum_f(X, k) - C
    b, block, block_of, starts, n = _cut_blocks(D, co, on, order)
    return b, order, block, block_of, X, starts, n, co.sum(-1) + D[np.arange(D.shape[0]), n]
