"""The i.i.d. private-position layout (UniVer's rule 2, theory.md §6.3) batched over the R nodes of a level.

The batched twin of :mod:`univer_theory.plans.layout` (its docstring has the math and the proofs): for rows
``c = ρp``, ``q`` ``[R, V]`` with ``k`` i.i.d. children each,

* :func:`layout_targets` — the closed-form targets ``b`` and the block of every drafted token: sort by ratio
  ``c/q`` descending (ties by token id), prefix sums ``X``, ``C``, ``D = F(X) − C`` with ``F(x) = 1 − (1−x)^k``,
  ``n = argmin D``, prefix / suffix minima; a block starts where the running minimum is attained;
* :func:`layout_weights` — ``w_j(S) = t(y_j)·Pr(copy j has the smallest private position | S)`` on the realised
  tuples, ``t = min(1, c/b)``.  Only the *earliest* block that S touches can hold the smallest position (blocks
  are consecutive intervals of [0, 1)), so each row lays out that one block: its tokens sorted by density
  ``b/q`` into groups of equal density, group lengths ``Q``, μ_k-masses ``m``, prefix excesses ``E``, exchange
  rates ``ℓ``, the subtraction-free pivots of ``A = diag(Q) + Laplacian(ℓ)`` by a doubling scan of 2×2 Möbius
  matrices, the realised tokens' columns of ``A⁻¹`` (cumulative products outwards), and the piecewise-polynomial
  integral by Gauss–Legendre on the group intervals.

Every step is a sort, a cumulative sum / product / minimum, a gather or a doubling scan over the padded rows —
no loop over rows or over the vocabulary (loops run over the ≤ log₂ V scan passes and the k children).
Float64 throughout; agrees with the exact core to round-off (tests: 1e-12).
"""
from __future__ import annotations

import math

import torch

from univer_theory.orders import ratio_argsort
from univer_theory.plans.layout import gauss_legendre


def inverse_permutation(order: torch.Tensor) -> torch.Tensor:
    """Row-wise inverse of a permutation ``order [R, V]`` (e.g. a sort's indices): the rank of every entry."""
    return torch.empty_like(order).scatter_(1, order, torch.arange(order.shape[1], device=order.device)
                                            .expand_as(order))


def _cum_f(X: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``F(X) = 1 − (1 − X)^k`` row-wise (``k [R]``), by ``−expm1(k·log1p(−X))`` as the exact core."""
    return -torch.expm1(k.to(X.dtype)[:, None] * torch.log1p(-X.clamp(max=1.0)))


def layout_targets(c: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
    """``(b [R, V], order [R, V], block [R, V], X [R, V+1], bounds)`` of the layout.

    ``order``: tokens by ratio ``c/q`` descending (undrafted last); ``block[r, l]``: block of the token at sorted
    position l (−1 off the support); ``bounds[r, l]`` True where a block starts at sorted position l.
    """
    drafted = q > 0
    order = ratio_argsort(c, q, descending=True)
    on = drafted.gather(1, order)
    qo = q.gather(1, order)
    co = torch.where(on, c.gather(1, order), 0)
    zero = torch.zeros_like(qo[:, :1])
    X = torch.cat([zero, qo.cumsum(-1)], 1)
    C = torch.cat([zero, co.cumsum(-1)], 1)
    D = _cum_f(X, k) - C
    n = D.argmin(-1, keepdim=True)
    P = D.cummin(-1).values
    S = D.flip(-1).cummin(-1).values.flip(-1)
    idx = torch.arange(D.shape[1], device=q.device)[None, :]
    l = idx[:, 1:]
    bo = torch.where(l <= n, co - (P[:, :-1] - P[:, 1:]), co + (S[:, 1:] - S[:, :-1])).clamp(min=0)
    b = torch.zeros_like(q).scatter(1, order, bo)
    m = on.sum(1, keepdim=True)
    bounds = ((((idx <= n) & (P == D)) | ((idx >= n) & (S == D)) | (idx == 0)) & (idx < m))[:, :-1]
    block = torch.where(on, bounds.long().cumsum(-1) - 1, -1)
    return b, order, block, X, bounds


def _mu_k_width(lo: torch.Tensor, width: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``μ_k([lo, lo + width)) = width·Σ_i (1−lo)^i (1−lo−width)^{k−1−i}`` (no cancellation), ``k [R]``."""
    A = 1.0 - lo
    B = A - width
    s = torch.zeros_like(lo)
    for i in range(int(k.max())):
        on = (i < k)[:, None]
        s = s + torch.where(on, A ** i * B ** (k[:, None] - 1 - i).clamp(min=0), 0)
    return width * s


def _mobius_scan(Q: torch.Tensor, ell: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Row-wise ``s_0 = Q_0``, ``s_g = Q_g + (1/ℓ_{g−1} + 1/s_{g−1})^{−1}`` over the valid prefix of each row,
    as :func:`univer_theory.plans.layout._mobius_scan` (same matrices, same doubling passes, same scaling)."""
    R, G = Q.shape
    lp = torch.cat([torch.zeros_like(Q[:, :1]), ell], 1)[:, :G]
    a, b = Q + lp, Q * lp
    c, d = torch.ones_like(Q), lp.clone()
    a[:, 0], b[:, 0], c[:, 0], d[:, 0] = 0.0, Q[:, 0], 0.0, 1.0
    a, b, c, d = (torch.where(valid, x, y) for x, y in ((a, 1.0), (b, 0.0), (c, 0.0), (d, 1.0)))   # pad: identity
    step = 1
    while step < G:
        a2 = a[:, step:] * a[:, :-step] + b[:, step:] * c[:, :-step]
        b2 = a[:, step:] * b[:, :-step] + b[:, step:] * d[:, :-step]
        c2 = c[:, step:] * a[:, :-step] + d[:, step:] * c[:, :-step]
        d2 = c[:, step:] * b[:, :-step] + d[:, step:] * d[:, :-step]
        top = torch.maximum(torch.maximum(a2, b2), torch.maximum(c2, d2))
        a = torch.cat([a[:, :step], a2 / top], 1)
        b = torch.cat([b[:, :step], b2 / top], 1)
        c = torch.cat([c[:, :step], c2 / top], 1)
        d = torch.cat([d[:, :step], d2 / top], 1)
        step *= 2
    return b / d


def _reverse_valid(x: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Reverse the first ``count[r]`` entries of every row (the rest stays in place)."""
    i = torch.arange(x.shape[1], device=x.device)[None, :]
    return x.gather(1, torch.where(i < count[:, None], count[:, None] - 1 - i, i))


def layout_weights(c: torch.Tensor, q: torch.Tensor, children: torch.Tensor, child_mask: torch.Tensor):
    """``(w, a [R, V])``: the layout plan on the realised i.i.d. tuples ``children [R, K]`` (``child_mask [R, K]``
    marks the k ≥ 2 existing children of each row; duplicates are separate copies) and its marginal
    ``a = min(b, c)``, as ``univer_theory.plans.layout.layout_plan(...)`` (``select(S)``, ``marginal``) to
    round-off.  ``children [R, T, K]`` evaluates T tuples per row (same mask) on targets built once per row and
    lays out each distinct (row, earliest block) once; ``w`` has the shape of ``children``."""
    k = child_mask.sum(1)
    b, order, block, X, bounds = layout_targets(c, q, k)
    a = torch.minimum(b, c)
    R, K = children.shape[0], children.shape[-1]
    tuples = children.reshape(R, -1, K)
    T = tuples.shape[1]
    rank = inverse_permutation(order)
    mask = child_mask[:, None, :].expand(R, T, K)
    blk = torch.where(mask, block.gather(1, rank.gather(1, tuples.reshape(R, -1))).view(R, T, K),
                      torch.iinfo(torch.long).max)
    first = blk.min(-1).values                                                   # earliest block each tuple touches
    tr = torch.arange(R, device=q.device).repeat_interleave(T)                   # the row of every tuple
    if T == 1:
        at = tr
        lay = _block_layout(q, k, b, order, block, X, bounds, first[:, 0])
    else:                               # one layout per distinct (row, block)
        pairs, at = torch.unique(torch.stack([tr, first.view(-1)], -1), dim=0, return_inverse=True)
        row = pairs[:, 0]
        lay = _block_layout(q[row], k[row], b[row], order[row], block[row], X[row], bounds[row], pairs[:, 1])
    flat = tuples.reshape(R * T, K)
    in_first = (blk == first[..., None]).reshape(R * T, K)
    g_of = torch.where(in_first, lay.pop("slot")[at[:, None], flat], 0)         # group of each child in its block
    val = [x.gather(1, tuples.reshape(R, -1)).view(R * T, K) for x in (c, q, b)]
    w = _tuple_weights(*val, child_mask[tr], in_first, g_of, lay, at)
    return w.view(children.shape), a


def _block_layout(q, k, b, order, block, X, bounds, first) -> dict:
    """Per row, the layout of its block ``first [U]`` (module docstring): the block's tokens grouped by density
    ``b/q``, the group edges, the pivots of ``A`` from both ends (Möbius scans) and the ratios that give the
    columns of ``A⁻¹``; ``slot [U, V+1]`` maps a token to its group (−1 outside the block)."""
    U = q.shape[0]
    first = first[:, None]
    # the tokens of the block: sorted positions [start, start + size)
    start = torch.where(bounds & (block == first), torch.arange(bounds.shape[1], device=q.device), bounds.shape[1]
                        ).min(1).values
    size = (block == first).sum(1)
    n = int(size.max())
    j = torch.arange(n, device=q.device)[None, :]
    valid = j < size[:, None]
    at = (start[:, None] + j).clamp(max=order.shape[1] - 1)
    tok = order.gather(1, at)
    lo, hi = X.gather(1, start[:, None]), X.gather(1, (start + size)[:, None])
    qb = torch.where(valid, q.gather(1, tok), 1.0)
    bb = torch.where(valid, b.gather(1, tok), 0.0)
    # groups of equal density b/q, density descending (stable: ties keep the ratio order)
    dens = torch.where(valid, bb / qb, -torch.inf)
    o = torch.sort(-dens, dim=1, stable=True).indices
    tok, qb, bb, dens = tok.gather(1, o), qb.gather(1, o), bb.gather(1, o), dens.gather(1, o)
    new = torch.cat([torch.ones_like(valid[:, :1]), dens[:, 1:] != dens[:, :-1]], 1) & valid
    group = new.long().cumsum(1) - 1                                             # [U, n], valid entries only
    G = new.sum(1)
    gmax = int(G.max())
    gi = torch.where(valid, group, gmax)                                         # padding → dump column
    Q = torch.zeros(U, gmax + 1, dtype=q.dtype, device=q.device).scatter_add_(1, gi, torch.where(valid, qb, 0))[:, :gmax]
    B = torch.zeros(U, gmax + 1, dtype=q.dtype, device=q.device).scatter_add_(1, gi, bb)[:, :gmax]
    d = torch.zeros(U, gmax + 1, dtype=q.dtype, device=q.device).scatter_(1, torch.where(new, group, gmax),
                                                                           dens)[:, :gmax]
    g_valid = torch.arange(gmax, device=q.device)[None, :] < G[:, None]
    Q = torch.where(g_valid, Q, 1.0)                                             # padding: harmless unit groups
    edges = torch.cat([lo, lo + Q.cumsum(1)], 1)
    edges = edges.scatter(1, G[:, None], hi)                                     # the block's end, exactly
    m = _mu_k_width(edges[:, :-1], Q, k)
    E = torch.where(g_valid, m - B, 0).cumsum(1)
    last = E.gather(1, (G - 1)[:, None])
    longest = torch.where(g_valid, Q, -1.0).argmax(1, keepdim=True)
    gidx = torch.arange(gmax, device=q.device)[None, :]
    E = E - last * (gidx >= longest)                                             # round-off charged to the longest group
    inner = gidx[:, :-1] < (G - 1)[:, None]                                      # ℓ_g for g < G−1
    ell = torch.where(inner, E[:, :-1].clamp(min=0) / torch.where(inner, d[:, :-1] - d[:, 1:], 1.0), 0.0)
    fwd = _mobius_scan(Q, ell, g_valid)
    ell_rev = _reverse_valid(torch.cat([ell, torch.zeros_like(ell[:, :1])], 1), G - 1)[:, :-1]
    bwd = _reverse_valid(_mobius_scan(_reverse_valid(Q, G), ell_rev, g_valid), G)
    slot = torch.full((U, q.shape[1] + 1), -1, dtype=torch.long, device=q.device)
    slot.scatter_(1, torch.where(valid, tok, q.shape[1]), torch.where(valid, group, -1))   # padding → dump column
    bwd_next = torch.cat([bwd[:, 1:], torch.ones(U, 1, dtype=q.dtype, device=q.device)], 1)
    return {"G": G, "g_valid": g_valid, "edges": edges, "fwd": fwd, "bwd_next": bwd_next, "slot": slot,
            "right": torch.where(inner, ell / (bwd_next[:, :-1] + ell), 0.0),   # [U, G−1]
            "left": torch.where(inner, ell / (fwd[:, :-1] + ell), 0.0)}


#: Elements (tuples × children × groups) of one chunk of :func:`_tuple_weights`' arrays: the integral over a
#: block's groups is formed for this many at a time, so its memory stays a few such arrays whatever the batch.
TUPLE_CHUNK = 2 ** 18


def _tuple_weights(cy, qy, by, child_mask, in_first, g_of, lay, at) -> torch.Tensor:
    """``w [R, K]`` of :func:`layout_weights` for tuples with values ``c, q, b`` at their children ``[R, K]``,
    on their earliest block's layout (``lay[n][at]``: :func:`_block_layout` of each tuple's block, read a chunk
    at a time; ``in_first`` marks the children in that block and ``g_of`` their groups).  The
    ``[R, K, groups]`` integrands are formed
    :data:`TUPLE_CHUNK` elements at a time (at least one tuple), one Gauss–Legendre node at a time."""
    R, K = g_of.shape
    gmax = lay["g_valid"].shape[1]
    nodes, weights = gauss_legendre(math.ceil(K / 2) + 1)       # exact for every k ≤ K (no read of k)
    step = max(1, TUPLE_CHUNK // (K * gmax))
    share = torch.cat([_tuple_shares(g_of[i:i + step], qy[i:i + step], child_mask[i:i + step],
                                     in_first[i:i + step], {n: x[at[i:i + step]] for n, x in lay.items()},
                                     nodes, weights)
                       for i in range(0, R, step)]) if R else torch.zeros_like(qy)
    accept = torch.where(by > 0, torch.minimum(torch.ones_like(by), cy / torch.where(by > 0, by, 1)), 0)
    w = torch.where(child_mask & in_first, accept * share.clamp(min=0), 0.0)
    return w / w.sum(1, keepdim=True).clamp(min=1.0)


def _tuple_shares(g_of, qy, child_mask, in_first, lay, nodes, weights) -> torch.Tensor:
    """``Pr(copy j has the smallest private position | S) / t(y_j)`` ``[R, K]`` for a chunk of
    :func:`_tuple_weights`' tuples: ``∫ f_j Π_{l≠j}(1 − F_l)`` over the block's group intervals."""
    R, K = g_of.shape
    G, g_valid, edges, fwd, bwd_next = lay["G"], lay["g_valid"], lay["edges"], lay["fwd"], lay["bwd_next"]
    right, left = lay["right"], lay["left"]
    gmax = g_valid.shape[1]
    gidx = torch.arange(gmax, device=qy.device)[None, :]
    # columns of A⁻¹ for the realised tokens of the block: x_g, then products of ratios < 1 outwards
    has_right = g_of + 1 < G[:, None]
    r_g = right.gather(1, g_of.clamp(max=max(gmax - 2, 0))) if gmax > 1 else torch.zeros_like(qy)
    x_g = 1.0 / (fwd.gather(1, g_of) + torch.where(has_right, r_g * bwd_next.gather(1, g_of), 0.0))
    h = gidx[:, None, :]                                                         # [1, 1, G]
    gk = g_of[:, :, None]
    one = torch.ones(R, 1, dtype=qy.dtype, device=qy.device)
    r_full = torch.cat([right, one], 1)[:, None, :].expand(R, K, gmax)
    l_full = torch.cat([left, one], 1)[:, None, :].expand(R, K, gmax)
    up = torch.where(h >= gk, r_full, 1.0).cumprod(-1)                          # Π_{g≤i≤h} right_i
    up = torch.cat([torch.ones_like(up[:, :, :1]), up[:, :, :-1]], -1)          # x_h/x_g for h > g
    down = torch.where(h < gk, l_full, 1.0).flip(-1).cumprod(-1).flip(-1)       # Π_{h≤i<g} left_i
    x = x_g[:, :, None] * torch.where(h > gk, up, torch.where(h < gk, down, 1.0))
    del up, down
    x = torch.where(g_valid[:, None, :] & in_first[:, :, None], x, 0.0)
    f = (qy[:, :, None] * x) / qy[:, :, None]                                    # θ_y/q_y, as the exact core
    del x
    # Gauss–Legendre on every group interval, exact for the piecewise polynomial, one node at a time
    width = (edges[:, 1:] - edges[:, :-1])[:, None, :]                           # [R, 1, G]
    cdf = torch.cat([torch.zeros_like(f[:, :, :1]), (f * width).cumsum(-1)], -1)  # F_l at group starts
    lo, rise = cdf[:, :, :-1], cdf[:, :, 1:] - cdf[:, :, :-1]
    acc = torch.zeros_like(f)
    for node, weight in zip(nodes.tolist(), weights.tolist()):
        surv = torch.where(child_mask[:, :, None], 1.0 - (lo + rise * ((1 + node) / 2)), 1.0)   # [R, K, G]
        for jj in range(K):
            others = torch.cat([surv[:, :jj], surv[:, jj + 1:]], 1).prod(1) if K > 1 else torch.ones_like(surv[:, 0])
            acc[:, jj] += f[:, jj] * others * weight
    return (acc * width / 2).sum(-1)
