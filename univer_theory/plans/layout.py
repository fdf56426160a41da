"""Rule 2: the i.i.d. private-position layout, an α*(ρ)-optimal node plan for any V (theory.md §6.3 item 2).

Each drafted copy j of an i.i.d. tuple ``S = (y_1..y_k)`` draws a private position ``U_j ~ Uniform(I_{y_j})``,
where the sets ``I_y ⊂ [0,1)`` are disjoint with ``|I_y| = q(y)`` (generalised below to sub-densities θ_y;
``I_y`` is the case ``θ_y = 1_{I_y}``).  The copy with the smallest U is selected and
accepted w.p. ``t(y) = min(1, ρp(y)/b(y))``.  Since ``(y_j, U_j)`` are i.i.d. with ``U_j ~ U[0,1)`` for any
layout, ``min_j U_j`` has density ``k(1−u)^{k−1}`` and token y is selected w.p.
``b(y) = μ_k(I_y)``, ``μ_k([l, h)) = (1−l)^k − (1−h)^k``.  The marginal is ``a = min(b, ρp)``.

**Targets (closed form).**  ``c = ρp``, ``F(x) = 1 − (1−x)^k``.  Sort the drafted tokens by ratio ``c/q``
descending, with prefix sums ``X_l`` (of q) and ``C_l`` (of c), and put ``D_l = F(X_l) − C_l``
(``l = 0..m``).  The optimal cut is ``H = first n tokens``, ``n = argmin D`` (A* = the rest, the lowest
ratios), so ``α*(ρ) = c(drafted) + D_n``.  With ``P`` / ``S`` the prefix / suffix minima of D:
on H, ``b(y_l) = c(y_l) − (P_{l−1} − P_l)`` (theory's ``M``); on A*, ``b(y_l) = c(y_l) + S_l − S_{l−1}``
(theory's ``h_j = S_{n+j} − D_n``).  Then ``Σ_{y∈A*} c + Σ_{y∈H} b = α*(ρ)`` and ``Σ b = 1``.

**Blocks.**  The indices where ``P_l = D_l`` (l ≤ n) or ``S_l = D_l`` (l ≥ n) cut the ratio order into blocks;
a block of tokens ``l1+1..l2`` has ``Σ b = F(X_{l2}) − F(X_{l1}) = μ_k([X_{l1}, X_{l2}))``, so it is laid out
inside ``[L, H) = [X_{l1}, X_{l2})`` on its own.  Blocks are built lazily, only when a realised tuple touches them.

**Fractional layout inside a block.**  The plan only needs, per token, a *sub-density* ``θ_y ≥ 0`` on [L, H) with
``Σ_y θ_y = 1``, ``∫θ_y = q(y)``, ``∫θ_y g = b(y)`` (``g(u) = k(1−u)^{k−1}``): then ``U_j`` has density
``θ_{y_j}/q(y_j)``, ``(y_j, U_j)`` has joint density ``θ_y(u)`` and ``U_j ~ U[0,1)`` as before, so the smallest U
is y's w.p. ``∫θ_y g = b(y)`` and ``a = min(b, ρp)`` is unchanged (theory.md §6.3: only layer (i) fixes a).
Merge tokens of equal density ``b/q`` into groups (a group's members share its θ in proportion to q), sort
the groups by density ``d_1 > … > d_G`` and give group g the contiguous interval ``J_g`` of length ``Q_g`` (its
μ_k-mass ``m_g``).  The block is feasible iff the prefix excesses ``E_g = Σ_{h≤g} (m_h − B_h) ≥ 0``
(``E_G = 0``; a set of length λ has μ_k at most that of ``[L, L+λ)``) — the majorisation the closed-form
targets satisfy (round-off clamps are recorded).  With ``ℓ_g = E_g/(d_g − d_{g+1}) ≥ 0`` let
``A = diag(Q) + Laplacian(ℓ)`` (tridiagonal: ``A_gg = Q_g + ℓ_{g−1} + ℓ_g``, ``A_{g,g+1} = −ℓ_g``) and

    θ_y = q(y)·Σ_h (A^{−1})_{h,g(y)} 1_{J_h}.

*Proof.*  A is a symmetric, strictly diagonally dominant M-matrix, so ``A^{−1} ≥ 0`` and θ ≥ 0.  ``A·1 = Q``
gives ``A^{−1}Q = 1``: on ``J_h``, ``Σ_y θ_y = Σ_g Q_g (A^{−1})_{hg} = 1``, and ``∫θ_y = q(y)·(Q^T A^{−1})_g =
q(y)``.  ``(A d)_g = Q_g d_g + ℓ_g(d_g − d_{g+1}) − ℓ_{g−1}(d_{g−1} − d_g) = B_g + E_g − E_{g−1} = m_g``, so
``∫θ_y g = q(y)·(m^T A^{−1})_g = q(y)·d_g = b(y)``.  ∎  (θ_y is the absorption law of a birth–death walk that
starts on ``J_h``: every group mixes with its neighbours at rates ℓ.)
*Computation*, O(n log n) per block, O(G) per realised token: ``A = LDLᵀ`` from both ends with the
subtraction-free pivots ``s'_g = Q_g + (1/ℓ_{g−1} + 1/s'_{g−1})^{−1}`` (``s''`` likewise from the right; a
vectorised scan over 2×2 Möbius matrices with positive entries), then
``(A^{−1})_{gg} = 1/(s'_g + (1/ℓ_g + 1/s''_{g+1})^{−1})`` and ratios ``ℓ/(s + ℓ) < 1`` outwards (cumprod).  No
step subtracts, so θ has relative accuracy ~1e-14 whatever the spread of q and ℓ; μ_k of a group uses its
length ``Q_g``, not differences of edges.  The round-off residual ``E_G`` of the block identity is charged to
the longest group.

**Selection on the realised tuple.**  ``w_j(S) = t(y_j)·∫ f_j(u) Π_{l≠j} (1 − F_l(u)) du`` (f_j = θ_{y_j}/q(y_j),
F_l its CDF): only copies in the earliest block S touches can be smallest (blocks are consecutive intervals); on
that block's group intervals every f is constant and every F affine, so the integrand is a polynomial of degree
≤ k−1, integrated exactly by Gauss–Legendre with ⌈k/2⌉ nodes (exact to degree 2⌈k/2⌉ − 1 ≥ k − 1; theory.md
says ⌈k/2⌉+1, one more than exactness needs); ``Π_{l≠j}`` as prefix × suffix products.
Duplicated tokens keep separate copies (each gets the same share).

**One implementation.**  Every float function here takes rows ``[R, V]`` as numpy arrays or torch tensors
(:mod:`univer_theory.nx`): :func:`layout_rows` (targets, cut, blocks), :func:`mu_k_width`, :func:`mobius_scan`,
:func:`block_layout` (one block per row, rows padded to the largest), :func:`inverse_columns`,
:func:`first_blocks`, :func:`acceptance` and :func:`tuple_weights`.  The exact core's :func:`layout_plan` runs
them on its node as a batch of one (blocks built lazily and cached, ``w(S)`` once per multiset);
:func:`gpu.layout.layout_weights` composes the same functions on the R nodes of a level.  torch's own part is
only batching: several tuples per row lay out each distinct (row, block) once.  On numpy rows
the steps of :func:`layout_rows` after its sort, :func:`block_layout` and the children's columns of
:func:`tuple_weights` run as compiled passes with the array forms' floats (:mod:`.layout_blocks`; the array forms
:func:`array_layout_rows`, :func:`array_block_layout`, :func:`array_child_columns` are torch's), and so do the tuple
integrals (:func:`share_rows`, one tuple at a time); in torch those are formed :data:`TUPLE_CHUNK` elements at a
time (memory bounded whatever the batch).  What checks this code stays separate: the exact enumeration of
``Σ_S Q(S) w(S)``, the LP's α*(ρ) (``solvers.condot``) and the closed form
``univer_theory.alpha_star.alpha_star`` (i.i.d.).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

import numba
import numpy as np

from ..nx import NUMPY, PADDED_LEAF, array_module, get_backend, padded_leaf, padded_sum, padded_tree
from ..orders import ratio_argsort
from .base import NodePlan
from .layout_blocks import block_layout_rows, child_columns_rows, layout_rows_rows
from .node_inputs import check_node_inputs


@lru_cache(maxsize=None)
def gauss_legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss–Legendre nodes and weights on [−1, 1] (cached: ``w(S)`` asks for them once per realised tuple)."""
    return np.polynomial.legendre.leggauss(n)


def mu_k(lo, hi, k: int):
    """``μ_k([lo, hi)) = (1−lo)^k − (1−hi)^k`` (see :func:`mu_k_width`)."""
    xp = array_module(lo)
    if xp is np:
        lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    return mu_k_width(lo, hi - lo, k)


def mu_k_width(lo, width, k, k_max: int | None = None):
    """``μ_k([lo, lo + width))``, evaluated as ``width·Σ_{i<k} (1−lo)^i (1−lo−width)^{k−1−i}`` (no cancellation for
    short pieces; relative accuracy even when ``width`` is below the spacing of floats near ``lo``), the sum by
    Horner's rule in ``A = 1 − lo``: ``s_1 = 1``, ``s_{j+1} = A·s_j + B^j`` with ``B = A − width`` — every term
    non-negative, so ~2k ulps relative, and no powers.

    ``k``: an int, or an integer array broadcasting against ``lo`` (one k per row, e.g. ``[R, 1]``), summed up
    to ``k_max`` terms (default ``max k``; a bound known to the caller spares a host read).  numpy (one compiled
    pass, :func:`_mu_k_rows`, instead of the array form's ~20 temporaries of a block's size) or torch (the array
    form below; the same floats)."""
    if array_module(lo) is np:
        return _mu_k_numpy(lo, width, k, k_max)
    A = 1.0 - lo
    B = A - width
    one = 0.0 * (A + B) + 1.0
    s, power = one, one                                  # s_1 and B^0
    if isinstance(k, (int, np.integer)):
        for _ in range(1, int(k)):
            power = power * B
            s = A * s + power
        return width * s if k > 0 else 0.0 * width
    nx = get_backend(lo, k)
    out = nx.where(k == 1, s, 0.0)
    for j in range(2, (int(k.max()) if k_max is None else k_max) + 1):
        power = power * B
        s = A * s + power
        out = nx.where(k == j, s, out)
    return width * out


def _mu_k_numpy(lo, width, k, k_max: int | None):
    """:func:`mu_k_width` on numpy: the operands broadcast (views), seen as rows ``[-1, n]``, and :func:`_mu_k_rows`
    over them; a 0-d result as a numpy scalar, as the array form's."""
    lo, width = np.asarray(lo, dtype=np.float64), np.asarray(width, dtype=np.float64)
    scalar_k = isinstance(k, (int, np.integer))
    terms = int(k) if scalar_k else (int(np.max(k, initial=0)) if k_max is None else k_max)
    k = np.asarray(k, dtype=np.int64)
    shape = np.broadcast_shapes(lo.shape, width.shape, k.shape)
    lo, width, ks = (np.broadcast_to(x, shape) for x in (lo, width, k))
    n = shape[-1] if shape else 1
    out = np.empty(shape)
    _mu_k_rows(*(x.reshape(-1, n) for x in (lo, width, ks, out)), terms)
    return out[()] if not shape else out


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _mu_k_rows(lo, width, k, out, terms):  # pragma: no cover - compiled
    """``out = μ_k([lo, lo + width))`` entrywise (``[N, n]`` each, views) by :func:`mu_k_width`'s operations in its
    order, at most ``terms`` of them (0 where ``k < 1`` or ``k > terms``, as its ``where``s give)."""
    for i in range(lo.shape[0]):
        for j in range(lo.shape[1]):
            A = 1.0 - lo[i, j]
            B = A - width[i, j]
            s = 0.0 * (A + B) + 1.0
            power, kk = s, k[i, j]
            m = s if kk == 1 else 0.0
            for t in range(2, terms + 1):
                power = power * B
                s = A * s + power
                m = s if kk == t else m
            out[i, j] = width[i, j] * m


def cum_f(X, k):
    """``F(X) = 1 − (1 − X)^k`` row-wise (``X [R, n]``, ``k [R]``), as ``−expm1(k·log1p(−X))`` (``X = 1``: F = 1)."""
    xp = array_module(X)
    with np.errstate(divide="ignore"):                          # X = 1: log1p(−1) = −inf, F = 1 exactly
        return -xp.expm1(k[:, None] * xp.log1p(-get_backend(X).minimum(X, 1.0)))


class LayoutRows(NamedTuple):
    """Closed-form targets of the layout for rows ``[R, V]`` (module docstring), numpy or torch.

    ``b`` [R, V] (0 off the draft support); ``order`` [R, V]: tokens by ratio ``c/q`` descending, ties by token id,
    undrafted last; ``block`` [R, V]: block of the token at each sorted position (−1 off the support);
    ``block_of`` [R, V]: block of each token (−1 off the support); ``X`` [R, V+1]: prefix sums of q along ``order``;
    ``starts`` [R, V]: True where a block starts at that sorted position; ``cut`` [R]: |H| = argmin D;
    ``alpha_star`` [R]: ``c(drafted) + D_n``.
    """

    b: object
    order: object
    block: object
    block_of: object
    X: object
    starts: object
    cut: object
    alpha_star: object


def layout_rows(c, q, k, p=None) -> LayoutRows:
    """The targets ``b`` and the cut / block structure of rows ``c = ρp``, ``q`` ``[R, V]`` with ``k [R]`` i.i.d.
    children each (O(V log V) per row): sort by ratio, prefix sums ``X``, ``C``, ``D = F(X) − C``, ``n = argmin D``,
    prefix / suffix minima ``P``, ``S``; a block starts where the running minimum is attained.  The ratio order is
    ``p/q`` descending when the rows ``p`` are given (the order of ``ρp/q``, ρ a scalar per row, but free of ρ's
    round-off: tokens whose ``p/q`` tie exactly stay in id order for every ρ — sorted by the rounded ``ρp/q`` they
    moved with ρ's last bits, and one ulp of ρ moved E[τ | T] from 0.43 to 2.0, docs/deviations.md item 73), else
    ``c/q``.  On numpy rows the steps after the sort run as compiled passes (:mod:`.layout_blocks`, the same
    floats); on torch rows :func:`array_layout_rows`."""
    if get_backend(c, q) is NUMPY:
        return LayoutRows(*layout_rows_rows(c, q, ratio_argsort(c if p is None else p, q, descending=True), cum_f, k))
    return array_layout_rows(c, q, k, p)


def array_layout_rows(c, q, k, p=None) -> LayoutRows:
    """:func:`layout_rows` written against the array namespace: numpy arrays or torch tensors."""
    nx, xp = get_backend(c, q), array_module(q)
    drafted = q > 0
    order = ratio_argsort(c if p is None else p, q, descending=True)
    on = nx.take(drafted, order)
    qo = nx.take(q, order)
    co = nx.where(on, nx.take(c, order), 0.0)
    zero = 0.0 * qo[:, :1]
    X = nx.concat([zero, nx.cumsum(qo)])
    C = nx.concat([zero, nx.cumsum(co)])
    D = cum_f(X, k) - C
    n = xp.argmin(D, -1)[:, None]
    P, S = nx.cummin(D), nx.cummin(D, reverse=True)
    idx = nx.arange(D.shape[-1], D)[None, :]
    bo = nx.where(idx[:, 1:] <= n, co - (P[:, :-1] - P[:, 1:]), co + (S[:, 1:] - S[:, :-1]))
    b = nx.put(nx.zeros_like(q), order, nx.maximum(bo, 0.0))
    m = nx.sum(on, keepdims=True)
    starts = ((((idx <= n) & (P == D)) | ((idx >= n) & (S == D)) | (idx == 0)) & (idx < m))[:, :-1]
    block = nx.where(on, nx.cumsum(starts) - 1, -1)
    block_of = nx.put(block, order, block)
    alpha = nx.sum(co) + nx.take(D, n)[:, 0]
    return LayoutRows(b, order, block, block_of, X, starts, n[:, 0], alpha)


#: The exponent a zero carries in :func:`mobius_scan`'s wide floats: below any product's or sum's, so a zero term
#: never sets a sum's exponent (exponents are float64 integers, exact to 2^53).
_ZERO_EXP = -float(1 << 40)


def _scaled(x, e):
    """``x·2^e`` for a float64 integer ``e`` (a power of two in two factors, each within float64's range: exact
    unless the result is subnormal).  numpy or torch."""
    xp = array_module(x)
    half = xp.floor(e / 2)
    return (x * xp.exp2(half)) * xp.exp2(e - half)


def _wide(x):
    """``x ≥ 0`` as ``(m, e)`` with ``x = m·2^e``, ``m ∈ [½, 2]`` (0 for a zero, with :data:`_ZERO_EXP`), ``e`` a
    float64 integer: a float whose exponent neither underflows nor overflows (subnormal ``x`` exact).  Float
    operations only (``log2``, ``exp2``; no integer exponents to convert, which inductor's CPU code does not)."""
    nx, xp = get_backend(x), array_module(x)
    pos = x > 0
    e = nx.where(pos, xp.floor(xp.log2(nx.where(pos, x, 1.0))), _ZERO_EXP)
    return nx.where(pos, _scaled(x, nx.where(pos, -e, 0.0)), 0.0), e


def _wide_mul(x, y):
    """The product of two wide floats (``m ∈ [¼, 4]``, renormalised by the next sum)."""
    return x[0] * y[0], x[1] + y[1]


def _wide_add(x, y):
    """The sum of two wide floats ≥ 0: both mantissas scaled to the larger exponent (a term below it by more than
    2^1100 is 0 there), added and renormalised."""
    nx = get_backend(x[0])
    e = nx.maximum(x[1], y[1])
    m, k = _wide(_scaled(x[0], nx.maximum(x[1] - e, -1100.0)) + _scaled(y[0], nx.maximum(y[1] - e, -1100.0)))
    return m, nx.where(m > 0, e + k, _ZERO_EXP)


def mobius_scan(Q, ell, valid):
    """Row-wise ``s_0 = Q_0``, ``s_g = Q_g + (1/ℓ_{g−1} + 1/s_{g−1})^{−1}`` (``= Q_g`` where ``ℓ_{g−1} = 0``) over
    the ``valid`` prefix of each row ``Q [R, G]``, ``ℓ [R, G−1]`` (after it ``s`` stays at its last value).

    A doubling scan of the Möbius maps ``M_g = [[Q_g + ℓ, Q_g ℓ], [1, ℓ]]`` (``ℓ = ℓ_{g−1}``; padding: the
    identity), the array form an accelerator's rows take (numpy rows take the recurrence itself, one compiled loop
    of O(G): :func:`end_pivots`): the prefix products in ⌈log₂ G⌉ batched passes, in wide floats (:func:`_wide`: a
    mantissa and a float64 integer exponent; in float64 the products of two entries underflowed once a row spanned
    ~1e-154 — a confident row's groups of 1e-200 beside 1 — and the pivots came out 0 and NaN).  The recurrence
    forms ``ℓs/(ℓ + s)`` as ``min(ℓ, s)·(max(ℓ, s)/(ℓ + s))`` (``ℓ·s`` underflowed there too, to a relative error of
    1).  All entries are ≥ 0, so no step of either subtracts: every ``s_g`` carries a relative error of a few dozen
    ulps whatever the spread of ``Q`` and ``ℓ``, subnormal entries included."""
    nx = get_backend(Q, ell)
    G = Q.shape[-1]
    lp = nx.concat([0.0 * Q[:, :1], ell])[:, :G]                # ℓ_{g−1}; M_0 maps anything to Q_0
    a, c, d = Q + lp, 0.0 * Q + 1.0, lp + 0.0
    b = _wide_mul(_wide(Q), _wide(lp))
    a[:, 0], c[:, 0], d[:, 0] = 0.0, 0.0, 1.0
    b[0][:, 0], b[1][:, 0] = _wide(Q[:, 0])
    a, c, d = (_wide(nx.where(valid, x, y)) for x, y in ((a, 1.0), (c, 0.0), (d, 1.0)))
    maps = [a, (nx.where(valid, b[0], 0.0), nx.where(valid, b[1], _ZERO_EXP)), c, d]
    step = 1
    while step < G:
        (A, B, C, D), (a, b, c, d) = ([(x[0][:, lo:hi], x[1][:, lo:hi]) for x in maps]
                                      for lo, hi in ((step, G), (0, G - step)))
        products = (_wide_add(_wide_mul(A, a), _wide_mul(B, c)), _wide_add(_wide_mul(A, b), _wide_mul(B, d)),
                    _wide_add(_wide_mul(C, a), _wide_mul(D, c)), _wide_add(_wide_mul(C, b), _wide_mul(D, d)))
        for x, x2 in zip(maps, products):                        # the first `step` entries are final
            x[0][:, step:], x[1][:, step:] = x2
        step *= 2
    (mb, eb), (md, ed) = maps[1], maps[3]
    return _scaled(mb / md, nx.minimum(nx.maximum(eb - ed, -1100.0), 1100.0))


@numba.njit(inline="always")
def _mobius_step(Q_g, lg, s):
    """One step of :func:`mobius_scan`'s recurrence, ``Q_g + ℓs/(ℓ + s)`` (``Q_g`` where ``ℓ = 0``), with
    ``ℓs/(ℓ + s)`` formed as ``lo·(hi/(ℓ + s))``, ``hi/(ℓ + s) ≥ ½`` (``ℓ·s`` underflows)."""
    lo, hi = min(lg, s), max(lg, s)
    return Q_g + (lo * (hi / (lg + s)) if lg > 0 else 0.0)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _end_pivot_rows(Q, ell, G):  # pragma: no cover - compiled
    """:func:`end_pivots` on numpy rows: both recurrences a row at a time, interleaved (two independent chains of
    dependent divisions, so each waits on its own; ~2× one after the other), the same steps as the array form's
    scans and reversals."""
    R, W = Q.shape
    fwd, bwd = np.zeros((R, W)), np.zeros((R, W))
    for r in range(R):
        n = G[r]
        if n == 0:
            continue
        f, b = Q[r, 0], Q[r, n - 1]
        fwd[r, 0], bwd[r, n - 1] = f, b
        for i in range(1, n):
            h = n - 1 - i
            f = _mobius_step(Q[r, i], ell[r, i - 1], f)
            b = _mobius_step(Q[r, h], ell[r, h], b)
            fwd[r, i], bwd[r, h] = f, b
        for i in range(n, W):                   # past the valid prefix: held at the scans' last values
            fwd[r, i], bwd[r, i] = f, b
    return fwd, bwd


def end_pivots(Q, ell, G, valid):
    """``(s', s'')``: the pivots of ``A = diag(Q) + Laplacian(ℓ)`` from the left, :func:`mobius_scan` of each
    row's ``G`` groups, and from the right, the same scan over the groups reversed (``s''_{G−1} = Q_{G−1}``,
    ``s''_g = Q_g + (1/ℓ_g + 1/s''_{g+1})^{−1}``); past ``G`` each holds its last value (``valid``: ``g < G``).
    numpy: one compiled loop of both recurrences (:func:`_end_pivot_rows`); torch: the doubling scans."""
    if array_module(Q) is np:
        return _end_pivot_rows(Q, ell, G)
    nx = get_backend(Q, ell)
    ell_rev = _reverse_valid(nx.concat([ell, 0.0 * ell[:, :1]]), G - 1)[:, :-1]
    return mobius_scan(Q, ell, valid), _reverse_valid(mobius_scan(_reverse_valid(Q, G), ell_rev, valid), G)


def _reverse_valid(x, count):
    """Reverse the first ``count[r]`` entries of every row (the rest stays in place)."""
    nx = get_backend(x)
    i = nx.arange(x.shape[-1], x)[None, :]
    return nx.take(x, nx.where(i < count[:, None], count[:, None] - 1 - i, i))


def block_layout(q, k, rows: LayoutRows, first, k_max: int) -> dict:
    """:func:`array_block_layout` — on numpy rows its compiled pass (:mod:`.layout_blocks`, the same floats), on
    torch rows the array form itself."""
    if get_backend(q) is NUMPY:
        return _with_pivots(block_layout_rows(q, k, rows, first, k_max, mu_k_width))
    return array_block_layout(q, k, rows, first, k_max)


def array_block_layout(q, k, rows: LayoutRows, first, k_max: int) -> dict:
    """Per row, the fractional layout of its block ``first [U]`` (module docstring) from ``layout_rows`` of the
    same rows (``q [U, V]``, ``k [U]``; ``k_max ≥ max k``): the block's tokens grouped by density ``b/q`` (exact
    ties), density descending, group lengths ``Q`` (``widths``), μ_k-masses ``m`` (``masses``), the edges, the
    exchange rates ``ℓ`` (``ell``), the pivots of ``A = diag(Q) + Laplacian(ℓ)`` from both ends (``fwd``,
    ``bwd``: Möbius scans), the ratios ``right``/``left`` that give the columns of ``A⁻¹``, ``clamp`` (the largest
    ``−E_g`` set to 0) and ``slot [U, V+1]`` (token → group, −1 outside the block).  Rows are padded to the
    largest block and group count (``g_valid``); a batch of one is unpadded.  numpy or torch."""
    nx, xp = get_backend(q), array_module(q)
    U, V = q.shape
    f = first[:, None]
    size = nx.sum(rows.block == f)
    start = nx.sum((rows.block >= 0) & (rows.block < f))               # blocks are consecutive in the order
    n = int(size.max())                                                  # data-dependent shape (host read)
    j = nx.arange(n, q)[None, :]
    valid = j < size[:, None]
    tok = nx.take(rows.order, nx.minimum(start[:, None] + j, V - 1))
    lo, hi = nx.take(rows.X, start[:, None]), nx.take(rows.X, (start + size)[:, None])
    qb = nx.where(valid, nx.take(q, tok), 1.0)
    bb = nx.where(valid, nx.take(rows.b, tok), 0.0)
    # groups of equal density b/q, density descending (stable: ties keep the ratio order)
    dens = nx.where(valid, bb / qb, -nx.inf)
    o = nx.argsort(-dens)
    tok, qb, bb, dens = nx.take(tok, o), nx.take(qb, o), nx.take(bb, o), nx.take(dens, o)
    new = nx.concat([valid[:, :1], dens[:, 1:] != dens[:, :-1]]) & valid
    group = nx.cumsum(new) - 1                                           # [U, n], valid entries only
    G = nx.sum(new)
    gmax = int(G.max())
    gi = nx.where(valid, group, gmax)                                    # padding → dump column
    empty = nx.full((U, gmax + 1), 0.0, q)
    Q = nx.scatter_add(empty, gi, nx.where(valid, qb, 0.0))[:, :gmax]
    B = nx.scatter_add(empty, gi, bb)[:, :gmax]
    d = nx.put(empty, nx.where(new, group, gmax), dens)[:, :gmax]
    gidx = nx.arange(gmax, q)[None, :]
    g_valid = gidx < G[:, None]
    Q = nx.where(g_valid, Q, 1.0)                                        # padding: harmless unit groups
    edges = nx.put(nx.concat([lo, lo + nx.cumsum(Q)]), G[:, None], hi)  # the block's end, exactly
    m = mu_k_width(edges[:, :-1], Q, k[:, None], k_max)                 # widths Q, not edge differences
    E = nx.cumsum(nx.where(g_valid, m - B, 0.0))                         # E_g = μ_k([L, edges_{g+1})) − Σ_{h≤g} b_h
    # E_{G−1} = μ_k(block) − Σ b is round-off (the targets' block identity); it is charged to the longest
    # group, where it perturbs every token's ∫θ g by at most q_y·|E_{G−1}|/Q_longest
    last = nx.take(E, (G - 1)[:, None])
    longest = xp.argmax(nx.where(g_valid, Q, -1.0), -1)[:, None]
    E = E - last * (gidx >= longest)
    inner = gidx[:, :-1] < (G - 1)[:, None]                             # ℓ_g for g < G−1
    ell = nx.where(inner, nx.maximum(E[:, :-1], 0.0) / nx.where(inner, d[:, :-1] - d[:, 1:], 1.0), 0.0)
    clamp = nx.maximum(-xp.amin(nx.where(inner, E[:, :-1], nx.inf), -1), 0.0) if gmax > 1 else 0.0 * lo[:, 0]
    slot = nx.put(nx.full((U, V + 1), -1, rows.order), nx.where(valid, tok, V), nx.where(valid, group, -1))
    return _with_pivots({"G": G, "g_valid": g_valid, "edges": edges, "widths": Q, "masses": m, "ell": ell,
                         "clamp": clamp, "slot": slot})


def _with_pivots(lay: dict) -> dict:
    """``lay`` with the pivots of ``A = diag(Q) + Laplacian(ℓ)`` from both ends (``fwd``, ``bwd``: Möbius scans),
    ``bwd_next`` and the ratios ``right`` / ``left`` that give the columns of ``A⁻¹`` — the last steps of
    :func:`block_layout`, from its groups' ``G``, ``g_valid``, ``widths`` and ``ell``.  numpy or torch."""
    nx = get_backend(lay["widths"])
    G, g_valid, Q, ell = lay["G"], lay["g_valid"], lay["widths"], lay["ell"]
    inner = nx.arange(ell.shape[-1], ell)[None, :] < (G - 1)[:, None]  # ℓ_g for g < G−1
    fwd, bwd = end_pivots(Q, ell, G, g_valid)
    bwd_next = nx.concat([bwd[:, 1:], 0.0 * bwd[:, :1] + 1.0])
    return {**lay, "fwd": fwd, "bwd": bwd, "bwd_next": bwd_next,
            "right": nx.where(inner, ell / (bwd_next[:, :-1] + ell), 0.0),  # [U, G−1]
            "left": nx.where(inner, ell / (fwd[:, :-1] + ell), 0.0)}


def inverse_columns(lay: dict, g_of):
    """``x = A⁻¹ e_g`` ``[R, K, G]`` for the groups ``g_of [R, K]`` of each row's block (``lay``: :func:`block_layout`
    of the R rows).  ``x_g = 1/(s'_g + ℓ_g s''_{g+1}/(s''_{g+1} + ℓ_g))``, then outwards
    ``x_{h+1} = x_h·ℓ_h/(s''_{h+1} + ℓ_h)`` (h ≥ g) and ``x_{h−1} = x_h·ℓ_{h−1}/(s'_{h−1} + ℓ_{h−1})`` (h ≤ g):
    products of positive factors < 1 (cumulative products; factors 1 elsewhere)."""
    nx = get_backend(g_of)
    G, fwd, bwd_next, right, left = lay["G"], lay["fwd"], lay["bwd_next"], lay["right"], lay["left"]
    gmax = fwd.shape[-1]
    r_g = nx.take(right, nx.minimum(g_of, max(gmax - 2, 0))) if gmax > 1 else 0.0 * fwd[:, :1]
    x_g = 1.0 / (nx.take(fwd, g_of) + nx.where(g_of + 1 < G[:, None], r_g * nx.take(bwd_next, g_of), 0.0))
    h = nx.arange(gmax, g_of)[None, None, :]                                     # [1, 1, G]
    gk = g_of[:, :, None]
    one = 0.0 * fwd[:, :1] + 1.0
    up = nx.cumprod(nx.where(h >= gk, nx.concat([right, one])[:, None, :], 1.0))   # Π_{g≤i≤h} right_i
    up = nx.concat([0.0 * up[:, :, :1] + 1.0, up[:, :, :-1]])                    # x_h/x_g for h > g
    down = nx.cumprod(nx.where(h < gk, nx.concat([left, one])[:, None, :], 1.0), reverse=True)  # Π_{h≤i<g} left_i
    return x_g[:, :, None] * nx.where(h > gk, up, nx.where(h < gk, down, 1.0))


def first_blocks(block_of, tuples, mask):
    """``(first [R, T], in_first [R, T, K])``: the earliest block that each tuple ``tuples [R, T, K]`` of the rows
    touches (``block_of [R, V]`` of :func:`layout_rows`; ``mask [R, K]`` marks each row's existing children) and
    which children lie in it.  Blocks are consecutive intervals of [0, 1), so only those can hold the smallest
    private position."""
    nx, xp = get_backend(block_of), array_module(block_of)
    R, T, K = tuples.shape
    blk = nx.where(mask[:, None, :], nx.take(block_of, tuples.reshape(R, T * K)).reshape(R, T, K),
                   block_of.shape[-1])
    first = xp.amin(blk, -1)
    return first, blk == first[..., None]


#: Elements (tuples × children × groups) of one chunk of :func:`tuple_weights`' arrays: the integral over a
#: block's groups is formed for this many at a time, so its memory stays a few such arrays whatever the batch.
TUPLE_CHUNK = 2 ** 18
#: Groups of one tile of :func:`share_rows` (whole leaves of :func:`univer_theory.nx.padded_sum`, of
#: :data:`~univer_theory.nx.PADDED_LEAF` groups): its work arrays stay a few tens of kB — within the first-level
#: cache for four children — and off the page-fault path, whatever the block's group count (1 024: 1–8% slower).
SHARE_TILE = 256
assert SHARE_TILE % PADDED_LEAF == 0, "share_rows' tiles hold whole leaves of the group sum"
#: The entries of :func:`block_layout` that :func:`_tuple_shares` reads, per tuple.
_SHARE_KEYS = ("G", "g_valid", "edges", "fwd", "bwd_next", "right", "left")


def acceptance(c, b):
    """``t = min(1, c/b)`` where ``b > 0``, else 0: the thinning of the selected copy (numpy or torch)."""
    nx = get_backend(c, b)
    return nx.where(b > 0, nx.minimum(c / nx.where(b > 0, b, 1.0), 1.0), 0.0)


def tuple_weights(ty, q, tuples, mask, in_first, lay: dict, at):
    """``w [R, T, K]``, ``w_j(S) = t(y_j)·Pr(copy j has the smallest private position | S)``, for tuples
    ``tuples [R, T, K]`` of rows ``q [R, V]`` with the acceptances at their tokens ``ty = t(y_j) [R, T, K]``
    (:func:`acceptance`, at the tuples' tokens alone; ones give the race itself), ``mask [R, K]`` marking the
    existing children (duplicates are separate copies), on the layout of each tuple's earliest block (``in_first``
    of :func:`first_blocks`; ``lay``: :func:`block_layout`, tuple ``i`` — row-major over ``[R, T]`` — on its entry
    ``at[i]``).  Round-off: ``w ≥ 0``, ``Σ w ≤ 1``; a share that is 0/0 (every window of subnormal width: no
    representable mass) is 0.

    The ``[tuples, K, groups]`` integrands are formed :data:`TUPLE_CHUNK` elements at a time (at least one tuple;
    the exact core's batch of one is one chunk), one Gauss–Legendre node at a time.  Tuples are taken in order of
    their block's group count and each chunk's arrays are cut to its largest count, so a level whose blocks range
    from one group to tens of thousands does not integrate every tuple over the largest (padding groups add exact
    zeros: ``f = 0`` on them).  The children's columns are formed once for a run of chunks cut to the same count
    (:func:`_column_runs`) and each chunk integrates its own of them — on whole rows a chunk holds one tuple, and
    the 35 multisets of a 4-child node would form the same 4 columns 35 times.  On numpy rows a run's columns and
    shares are compiled passes (:func:`.layout_blocks.child_columns_rows`, :func:`share_rows`) that read the layout
    rows in place and hold one tuple's integrand at a time, so a run needs no chunks; the floats are the same."""
    nx = get_backend(q)
    R, T, K = tuples.shape
    V = q.shape[-1]
    ty, qy = ty.reshape(R * T, K), nx.take(q, tuples.reshape(R, T * K)).reshape(R * T, K)
    tk = tuples.reshape(R * T, K)
    mk = (mask[:, None, :] & (tuples == tuples)).reshape(R * T, K)
    inf = in_first.reshape(R * T, K)
    # a child's density and CDF depend on its layout entry, token and membership of the first block alone: one
    # column per distinct (entry, token, in_first), shared by the tuples holding it (35 multisets of 4 tokens: 4)
    key = (at[:, None] * V + tk) * 2 + nx.astype(inf, tk)
    nodes, weights = gauss_legendre(math.ceil(K / 2))                  # exact for every k ≤ K (no read of k)
    counts = nx.to_numpy(lay["G"][at])                                 # host read: group counts set the chunks
    by_count = np.argsort(counts, kind="stable")
    share = 0.0 * qy
    for run in _column_runs(counts[by_count], nx.to_numpy(key)[by_count], K):   # host read: the runs' columns
        (lo, _, g), hi = run[0], run[-1][1]
        idx = nx.index(by_count[lo:hi], qy)
        cols, inv = nx.unique(key[idx].reshape(-1))
        first = cols % 2 == 1
        entry, token = cols // 2 // V, cols // 2 % V
        q_col = nx.put(nx.asarray(0.0 * first, qy), inv, qy[idx].reshape(-1))   # the same q at every copy
        group = nx.where(first, lay["slot"][entry, token], 0)
        if nx is NUMPY:     # compiled passes on the layout rows themselves, one tuple at a time: no chunks needed
            f, cdf = child_columns_rows(lay, entry, g, group, q_col, first)
            column = inv.reshape(-1, K)
            share[idx] = share_rows(f, cdf, lay["edges"], entry, column, nx.where(mk[idx], column, f.shape[0]),
                                    nodes, weights)
            continue
        cut = {"edges": g + 1, "right": g - 1, "left": g - 1}
        lays = {name: (lay[name][:, :cut.get(name, g)] if lay[name].ndim == 2 else lay[name])[entry]
                for name in _SHARE_KEYS}                               # not the [U, V+1] slot table
        f, cdf = array_child_columns(lays, group, q_col, first)
        for i, j, _ in run:             # a chunk's columns in ascending key order, as its own unique gives them
            sub, own = nx.unique(inv[(i - lo) * K:(j - lo) * K])
            at_ij = nx.index(by_count[i:j], qy)
            share[at_ij] = _tuple_shares(f[sub], cdf[sub], lays["edges"][sub], own.reshape(-1, K), mk[at_ij], nodes,
                                         weights)
    # share > 0 drops round-off and 0/0; share < ∞ an overflowed node sum (a density 1/q past ~1e307: a subnormal
    # q, its tuples of probability below ~2e-308), which t = 0 would turn into a NaN spread over the tuple
    keep = mk & inf & (share > 0) & (share < nx.inf)
    w = nx.where(keep, ty * nx.where(keep, share, 0.0), 0.0)        # no 0·∞ formed (a RuntimeWarning)
    return (w / nx.maximum(nx.sum(w, keepdims=True), 1.0)).reshape(R, T, K)


def _column_runs(ascending, keys, K: int) -> list:
    """The chunks of :func:`tuple_weights` in runs: ``[[(i, j, g), …], …]`` over the tuples in ascending group
    count ``ascending [n]`` (host ints) — a chunk ``[i, j)`` holds ``(j − i)·K·g ≤ TUPLE_CHUNK`` elements,
    ``g = ascending[j − 1]`` (at least 1; at least one tuple) — and a run is consecutive chunks of one ``g`` whose
    distinct column keys (``keys [n, K]``, host) number at most ``TUPLE_CHUNK / g`` (a run of one chunk may hold
    more: a tuple of K columns wider than that), so a run's columns take no more memory than a chunk's integrand."""
    n, runs, i, seen = ascending.shape[0], [], 0, None
    while i < n:
        j = i + max(1, int(np.searchsorted(ascending[i:] * K * np.arange(1, n - i + 1), TUPLE_CHUNK, side="right")))
        g = max(int(ascending[j - 1]), 1)
        new = np.unique(keys[i:j])
        union = np.union1d(seen, new) if runs and runs[-1][-1][2] == g else None
        if union is not None and union.size * g <= TUPLE_CHUNK:
            runs[-1].append((i, j, g))
            seen = union
        else:
            runs.append([(i, j, g)])
            seen = new
        i = j
    return runs


def array_child_columns(lay, group, q_col, first):
    """``(f [D, G], F [D, G + 1])`` of D children of a chunk of :func:`tuple_weights`' tuples, each on its own
    layout row ``lay`` (:func:`block_layout` entries): the density ``f = θ_y/q_y`` on its block's groups
    (``θ_y = q_y·x``, x the column of ``A⁻¹`` at the child's ``group``; 0 outside the first block) and its CDF at
    the group starts.  numpy or torch; on numpy rows :func:`tuple_weights` runs the compiled pass of
    :mod:`.layout_blocks` instead (``child_columns_rows``: the same floats)."""
    nx = get_backend(q_col)
    x = nx.where(lay["g_valid"] & first[:, None], inverse_columns(lay, group[:, None])[:, 0], 0.0)
    f = (q_col[:, None] * x) / q_col[:, None]
    edges = lay["edges"]
    return f, nx.concat([0.0 * f[:, :1], nx.cumsum(f * (edges[:, 1:] - edges[:, :-1]))])


def survival(lo, rise, node):
    """``1 − F`` of a child at the Gauss–Legendre node ``node ∈ (−1, 1)`` of a group across which its CDF rises
    linearly from ``lo`` by ``rise``: arrays (:func:`_share_integrand`), or floats in the compiled integrand
    (:func:`share_rows`) — one spelling."""
    return 1.0 - (lo + rise * ((1 + node) / 2))


_survival = numba.njit(inline="always")(survival)


def _tuple_shares(f, cdf, edges, column, mask, nodes, weights):
    """``Pr(copy j has the smallest private position | S)`` ``[N, K]`` for a chunk of :func:`tuple_weights`'
    tuples, copy j being child ``column[i, j]`` of :func:`array_child_columns`' ``f``, ``F`` (``edges [D, G + 1]``,
    its block's group edges): ``∫ f_j Π_{l≠j}(1 − F_l)`` over the block's group intervals, ``f_j`` constant on each,
    so the integrand is a polynomial of degree ≤ K−1 there (Gauss–Legendre, ⌈K/2⌉ nodes, exact) — the sum over
    the groups of :func:`_share_integrand` (on numpy rows :func:`tuple_weights` runs :func:`share_rows` instead:
    the same floats).  The sum is :func:`univer_theory.nx.padded_sum`, which the padding groups of a chunk cut to a
    longer block than the tuple's own (exact zeros) do not change: a tuple's shares are the same bits whatever
    tuples share its chunk — in one node's plan, or beside other trees' nodes in a batched level."""
    nx = get_backend(f)
    width = edges[:, 1:] - edges[:, :-1]                                         # [D, G]
    lo, rise = cdf[:, :-1], cdf[:, 1:] - cdf[:, :-1]                             # [D, G]: per distinct child
    at = nx.where(mask, column, f.shape[0])                                      # absent copies: survival 1
    args = (f, lo, rise, width, column, at, nodes, weights)
    return padded_sum(_share_integrand(*args))


def _share_integrand(f, lo, rise, width, column, at, nodes, weights):
    """The integrand of :func:`_tuple_shares` per group ``[N, K, G]``: ``Σ_nodes weight·f_j·Π_{l≠j} (1 − F_l)``
    (:func:`survival` at the node; an absent copy, ``at = D``, has survival 1) times half the group's width;
    the products over the copies before j and after it, each from its end.  numpy or torch."""
    nx = get_backend(f)
    width = width[column[:, 0]][:, None, :]                                      # [N, 1, G]: one block a tuple
    one = nx.full((1, lo.shape[1]), 1.0, lo)                  # not 1 + 0·lo: an absent child's columns may be NaN
    f = f[column]                                                                # [N, K, G]
    K = column.shape[1]
    acc = 0.0 * f
    for node, weight in zip(nodes.tolist(), weights.tolist()):
        surv = nx.concat([survival(lo, rise, node), one], axis=0)[at]           # [N, K, G]
        before, run = [], None                                                  # Π_{l<j} (1 − F_l)
        for j in range(K):
            before.append(run)
            run = surv[:, j] if run is None else run * surv[:, j]
        run = None                                                              # Π_{l>j} (1 − F_l)
        for j in reversed(range(K)):
            others = [x for x in (before[j], run) if x is not None]
            acc[:, j] += f[:, j] * (others[0] * others[1] if len(others) == 2 else others[0] if others else 1.0) \
                * weight
            run = surv[:, j] if run is None else run * surv[:, j]
    return acc * width / 2


@numba.njit(cache=True, nogil=True, error_model="numpy")
def share_rows(f, cdf, edges, entry, column, at, nodes, weights):  # pragma: no cover - compiled
    """:func:`_tuple_shares` on numpy rows ``[N, K]``, the same floats, without its ``[N, K, G]`` integrand (so no
    chunks).  The groups are taken in tiles of whole leaves of the group sum (:func:`univer_theory.nx.padded_sum`:
    :data:`SHARE_TILE` groups).  On a tile each
    distinct child's survival is formed once per node (the array form gathers it per copy), then per tuple the
    products over the copies before and after each, the groups innermost (on views of the tile's columns, indexed
    from 0: indexing the rows at an offset, ``cdf[d, g0 + g]``, kept LLVM from vectorising the loops, 1.7× slower
    on a block of 37 000 groups; each loop over the groups writes one array, so LLVM vectorises it: ~15–20% faster
    than one loop updating the running product beside), the integrand times half the widths of the tuple's block —
    child ``column[i, 0]``'s layout row ``edges[entry[d]]``, where the array form has each child's own edges — and
    each leaf's sum (:func:`univer_theory.nx.padded_leaf`); a copy's leaf sums are added as a tree
    (:func:`univer_theory.nx.padded_tree`).  An
    empty product is 1.0, and ``x·1.0 = x`` exactly, so the array form's missing factors need no case here; ``at``
    marks absent copies with ``D`` (survival 1).  The array form's ~15 passes per node over ``[N, K, G]`` arrays
    cost ~5 ms of a SmolLM2 EAGLE-like wor verification at top 1 024 (35 multisets of the root's four children over
    ~1 000 groups); whole ``[nodes, D, G]`` work arrays, on whole rows, cost more in page faults than in
    arithmetic."""
    N, K = column.shape
    D, G = f.shape
    P = nodes.shape[0]
    L, B = max(1, -(-G // PADDED_LEAF)), SHARE_TILE
    starts = np.minimum(np.arange(L + 1) * PADDED_LEAF, G)
    surv = np.empty((P, D + 1, B))
    surv[:, D] = 1.0                                                            # an absent copy
    acc, before, run, width = np.empty((K, B)), np.empty((K, B)), np.empty(B), np.empty(B)
    leaf_sums = np.empty((N, K, L))
    c0 = 0
    while c0 < L:
        c1 = c0 + 1                                     # a tile: leaves c0 … c1 − 1, at most B groups (one leaf)
        while c1 < L and starts[c1 + 1] - starts[c0] <= B:
            c1 += 1
        g0, m = starts[c0], starts[c1] - starts[c0]
        for n in range(P):
            x = nodes[n]
            for d in range(D):
                lo, hi, out = cdf[d, g0:g0 + m], cdf[d, g0 + 1:g0 + m + 1], surv[n, d]
                for g in range(m):
                    out[g] = _survival(lo[g], hi[g] - lo[g], x)
        for i in range(N):
            lo, hi = edges[entry[column[i, 0]], g0:g0 + m], edges[entry[column[i, 0]], g0 + 1:g0 + m + 1]
            for g in range(m):                          # the widths of the tuple's block
                width[g] = hi[g] - lo[g]
            for j in range(K):
                cj = column[i, j]
                density = f[cj, g0:g0 + m]
                for g in range(m):
                    acc[j, g] = 0.0 * density[g]
            for n in range(P):
                w = weights[n]
                for g in range(m):
                    run[g] = 1.0
                for j in range(K):              # each loop over the groups writes one array: they vectorise
                    kept, factor = before[j], surv[n, at[i, j]]
                    for g in range(m):
                        kept[g] = run[g]
                    for g in range(m):
                        run[g] = run[g] * factor[g]
                for g in range(m):
                    run[g] = 1.0
                for j in range(K - 1, -1, -1):
                    total, density, kept, factor = acc[j], f[column[i, j], g0:g0 + m], before[j], surv[n, at[i, j]]
                    for g in range(m):
                        total[g] += density[g] * (kept[g] * run[g]) * w
                    for g in range(m):
                        run[g] = run[g] * factor[g]
            for j in range(K):
                for g in range(m):
                    acc[j, g] = acc[j, g] * width[g] / 2
                for c in range(c0, c1):
                    leaf_sums[i, j, c] = padded_leaf(acc[j], starts[c] - g0, starts[c + 1] - starts[c])
        c0 = c1
    out = np.empty((N, K))
    for i in range(N):
        for j in range(K):
            out[i, j] = padded_tree(leaf_sums[i, j])
    return out


@dataclass(frozen=True)
class LayoutTargets:
    """Closed-form targets of one node's layout (module docstring; :func:`layout_rows` as a batch of one).

    ``order``: drafted tokens by ratio ``ρp/q`` descending; ``b`` [V] (0 off the draft support);
    ``marginal`` [V] = ``min(b, ρp)``; ``cut``: |H|; ``bounds``: block boundaries (indices into ``order``,
    first 0, last m); ``X`` [V+1]: prefix sums of q along the ratio order; ``alpha_star``: ``c(drafted) + D_n``;
    ``rows``: the batch of one.
    """

    k: int
    draft: np.ndarray
    order: np.ndarray
    b: np.ndarray
    marginal: np.ndarray
    cut: int
    bounds: np.ndarray
    X: np.ndarray
    alpha_star: float
    rows: LayoutRows = field(compare=False, repr=False)


def layout_targets(target_probs, draft_probs, rho, k: int) -> LayoutTargets:
    """``b(y)`` and the cut / block structure for i.i.d. drafting of k children (O(V log V); :func:`layout_rows`)."""
    p = np.asarray(target_probs, dtype=np.float64)
    q = np.asarray(draft_probs, dtype=np.float64)
    c = float(rho) * p
    rows = layout_rows(c[None], q[None], np.array([k]), p[None])
    m = int(np.count_nonzero(q > 0))
    bounds = np.append(np.flatnonzero(rows.starts[0]), m)
    b = rows.b[0]
    return LayoutTargets(k, q, rows.order[0, :m], b, np.minimum(b, c), int(rows.cut[0]), bounds, rows.X[0],
                         float(rows.alpha_star[0]), rows)


@dataclass(frozen=True)
class LayoutBlock:
    """One block ``[L, H)`` of the ratio order with its fractional layout (module docstring):
    :func:`block_layout` of the node's row as a batch of one (``lay``).

    Tokens are merged into *groups* of equal density ``b/q`` (exact ties), sorted by density descending;
    group g holds the contiguous interval ``[edges_g, edges_{g+1})`` of length ``widths_g`` and μ_k-mass
    ``masses_g``; ``clamp``: the largest ``−E_g`` set to 0 (majorisation violated by round-off only).
    """

    lay: dict

    @property
    def edges(self) -> np.ndarray:
        return self.lay["edges"][0]

    @property
    def widths(self) -> np.ndarray:
        return self.lay["widths"][0]

    @property
    def masses(self) -> np.ndarray:
        return self.lay["masses"][0]

    @property
    def clamp(self) -> float:
        return float(self.lay["clamp"][0])

    def density(self, y: int, length: float) -> np.ndarray:
        """``θ_y`` [G] on the group intervals: ``θ_y = q_y·A^{−1} e_g`` (g = y's group, ``q_y = length``;
        :func:`inverse_columns`)."""
        return length * inverse_columns(self.lay, self.lay["slot"][:, [y]])[0, 0]


@dataclass(frozen=True)
class PrivateLayout:
    """The layout ``y ↦ θ_y`` of one node, with blocks built lazily (see module docstring).

    ``block_of`` [V]: index of the block holding each drafted token (−1 off the support).
    """

    targets: LayoutTargets
    block_of: np.ndarray
    _blocks: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, targets: LayoutTargets) -> "PrivateLayout":
        return cls(targets, targets.rows.block_of[0])

    def block(self, i: int) -> LayoutBlock:
        """Block i's :class:`LayoutBlock` (cached)."""
        if i not in self._blocks:
            t = self.targets
            self._blocks[i] = LayoutBlock(block_layout(t.draft[None], np.array([t.k]), t.rows, np.array([i]), t.k))
        return self._blocks[i]

    def _drafted(self, y: int, where: str) -> LayoutBlock:
        if self.block_of[y] < 0:
            raise ValueError(f"PrivateLayout.{where}: token {y} has draft probability 0 (never drafted)")
        return self.block(int(self.block_of[y]))

    def density(self, y: int) -> tuple[np.ndarray, np.ndarray]:
        """``θ_y`` as ``(edges [n+1], values [n])``: ``θ_y = values_i`` on ``[edges_i, edges_{i+1})``, 0 elsewhere."""
        blk = self._drafted(y, "density")
        return blk.edges, blk.density(int(y), float(self.targets.draft[y]))

    def moments(self, y: int) -> tuple[float, float]:
        """``(∫θ_y, ∫θ_y g)`` of the realised density (== ``(q(y), b(y))`` up to round-off)."""
        blk = self._drafted(y, "moments")
        v = blk.density(int(y), float(self.targets.draft[y]))
        return float(v @ blk.widths), float(v @ blk.masses)

    def weights(self, S, accept=None) -> np.ndarray:
        """:func:`tuple_weights` on the realised tuple S (a batch of one): ``w_j(S)`` for acceptances
        ``accept [V]`` (``t``), or with ``accept=None`` (``t ≡ 1``) ``Pr(copy j has the smallest U | S)``."""
        t = self.targets
        tuples = np.asarray(S, dtype=np.int64)[None, None, :]
        mask = np.ones((1, tuples.shape[-1]), dtype=bool)
        first, in_first = first_blocks(self.block_of[None], tuples, mask)
        ty = np.ones(tuples.shape) if accept is None else accept[tuples]
        return tuple_weights(ty, t.draft[None], tuples, mask, in_first, self.block(int(first[0, 0])).lay,
                             np.zeros(1, dtype=np.int64))[0, 0]

    def min_probs(self, S) -> np.ndarray:
        """``Pr(copy j has the smallest private position | S)`` for each position j (sums to 1, but for a tuple
        whose window rounds to width 0 — a token of q below an ulp of its window's edge, e.g. 1e-41 beside 1:
        all 0, a tuple of probability ≤ that q): blocks are consecutive intervals of [0, 1), so only copies in the
        earliest block S touches can hold the smallest U (the others get exactly 0); :meth:`weights` with
        ``t ≡ 1``."""
        return self.weights(S)


def layout_plan(target_probs, draft_probs, rho, k: int, process: str) -> NodePlan | None:
    """Rule 2 as a :class:`NodePlan` (i.i.d. children only; ``None`` for any other process).

    ``marginal = min(b, ρp)`` (Σ = α*(ρ)); ``select(S)[j] = t(y_j)·Pr(copy j has the smallest U | S)``
    (:meth:`PrivateLayout.weights`, the batched :func:`tuple_weights` on a batch of one), evaluated once per
    multiset of tokens (the plan is symmetric in the copies; the i.i.d. coupling asks for many orderings).
    """
    p, q, rho = check_node_inputs("layout_plan", target_probs, draft_probs, rho, k, process)
    if process != "iid":
        return None
    targets = layout_targets(p, q, rho, k)
    layout = PrivateLayout.build(targets)
    accept = acceptance(rho * p, targets.b)
    memo = {}

    def select(S) -> np.ndarray:
        # w(S) is symmetric (w_j is copy j's share): one evaluation per multiset, permuted back
        S = [int(y) for y in S]
        perm = sorted(range(len(S)), key=S.__getitem__)
        key = tuple(S[i] for i in perm)
        if key not in memo:
            memo[key] = layout.weights(key, accept)
        w = np.empty(len(S))
        w[perm] = memo[key]
        return w

    return NodePlan("layout", rho, p, targets.marginal, select,
                    {"alpha_star": targets.alpha_star, "layout": layout, "accept": accept})
