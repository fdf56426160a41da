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
that block's group intervals every f is constant, so the integrand is a polynomial of degree ≤ k−1, integrated
exactly by Gauss–Legendre with ⌈k/2⌉+1 nodes.
Duplicated tokens keep separate copies (each gets the same share).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from ..orders import ratio_argsort
from .base import NodePlan
from .node_inputs import check_node_inputs

@lru_cache(maxsize=None)
def gauss_legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss–Legendre nodes and weights on [−1, 1] (cached: ``w(S)`` asks for them once per realised tuple)."""
    return np.polynomial.legendre.leggauss(n)


def mu_k(lo, hi, k: int):
    """``μ_k([lo, hi)) = (1−lo)^k − (1−hi)^k`` (see :func:`mu_k_width`)."""
    return mu_k_width(lo, np.asarray(hi, dtype=np.float64) - np.asarray(lo, dtype=np.float64), k)


def mu_k_width(lo, width, k: int):
    """``μ_k([lo, lo + width))``, evaluated as ``width·Σ_i (1−lo)^i (1−lo−width)^{k−1−i}`` (no cancellation for
    short pieces; relative accuracy even when ``width`` is below the spacing of floats near ``lo``)."""
    A = 1.0 - np.asarray(lo, dtype=np.float64)
    width = np.asarray(width, dtype=np.float64)
    B = A - width
    s = np.zeros(np.broadcast(A, B).shape)
    for i in range(k):
        s = s + A ** i * B ** (k - 1 - i)
    return width * s


@dataclass(frozen=True)
class LayoutTargets:
    """Closed-form targets of the layout (module docstring).

    ``order``: drafted tokens by ratio ``ρp/q`` descending; ``b`` [V] (0 off the draft support);
    ``marginal`` [V] = ``min(b, ρp)``; ``cut``: |H|; ``bounds``: block boundaries (indices into ``order``,
    first 0, last m); ``X`` [m+1]: prefix sums of q along ``order``; ``alpha_star``: ``c(drafted) + D_n``.
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


def layout_targets(target_probs, draft_probs, rho, k: int) -> LayoutTargets:
    """``b(y)`` and the cut / block structure for i.i.d. drafting of k children (O(V log V))."""
    p = np.asarray(target_probs, dtype=np.float64)
    q = np.asarray(draft_probs, dtype=np.float64)
    c = float(rho) * p
    order = ratio_argsort(c, q, descending=True)[:np.count_nonzero(q > 0)]
    X = np.concatenate([[0.0], np.cumsum(q[order])])
    C = np.concatenate([[0.0], np.cumsum(c[order])])
    with np.errstate(divide="ignore"):                          # X = 1: log1p(−1) = −inf, F = 1 exactly
        D = -np.expm1(k * np.log1p(-np.minimum(X, 1.0))) - C      # F(X) − C, F(x) = 1 − (1−x)^k
    n = int(np.argmin(D))
    P = np.minimum.accumulate(D)
    S = np.minimum.accumulate(D[::-1])[::-1]
    co = c[order]
    l = np.arange(1, order.size + 1)
    in_h = l <= n
    bo = np.where(in_h, co - (P[:-1] - P[1:]), co + (S[1:] - S[:-1]))
    b = np.zeros_like(p)
    b[order] = np.maximum(bo, 0.0)
    idx = np.arange(order.size + 1)
    bounds = np.flatnonzero(((idx <= n) & (P == D)) | ((idx >= n) & (S == D)) | (idx == 0) | (idx == order.size))
    marginal = np.minimum(b, c)
    return LayoutTargets(k, q, order, b, marginal, n, bounds, X, float(co.sum() + D[n]))


def _mobius_scan(q: np.ndarray, ell: np.ndarray) -> np.ndarray:
    """``s_0 = q_0``, ``s_l = q_l + (1/ℓ_{l−1} + 1/s_{l−1})^{−1}`` (``= q_l`` where ``ℓ_{l−1} = 0``), vectorised.

    Each step is the Möbius map of ``M_l = [[q_l + ℓ, q_l ℓ], [1, ℓ]]`` (``ℓ = ℓ_{l−1}``); the prefix products
    are formed by a doubling scan (⌈log₂ n⌉ passes).  All entries are ≥ 0, so no step subtracts: every
    ``s_l`` carries a relative error of a few dozen ulps whatever the spread of ``q`` and ``ℓ``.
    """
    n = q.size
    lp = np.concatenate([[0.0], ell])                  # ℓ_{l−1}; M_0 maps anything to q_0
    a, b = q + lp, q * lp
    c, d = np.ones(n), lp.copy()
    a[0], b[0], c[0], d[0] = 0.0, q[0], 0.0, 1.0
    step = 1
    while step < n:
        a2 = a[step:] * a[:-step] + b[step:] * c[:-step]
        b2 = a[step:] * b[:-step] + b[step:] * d[:-step]
        c2 = c[step:] * a[:-step] + d[step:] * c[:-step]
        d2 = c[step:] * b[:-step] + d[step:] * d[:-step]
        top = np.maximum(np.maximum(a2, b2), np.maximum(c2, d2))
        a[step:], b[step:], c[step:], d[step:] = a2 / top, b2 / top, c2 / top, d2 / top
        step *= 2
    return b / d


@dataclass(frozen=True)
class LayoutBlock:
    """One block ``[L, H)`` of the ratio order with its fractional layout (module docstring).

    Tokens are merged into *groups* of equal density ``b/q`` (exact ties), sorted by density descending;
    group g holds the contiguous interval ``[edges_g, edges_{g+1})``.  ``group_of``: token → group;
    ``ell`` [G−1]: the exchange rates ``ℓ_g``; ``fwd`` / ``bwd`` [G]: the subtraction-free pivots ``s'`` / ``s''``
    of the tridiagonal M-matrix ``A = diag(Q) + Laplacian(ℓ)``; ``clamp``: the largest ``−E_g`` set to 0
    (majorisation violated by round-off only).
    """

    edges: np.ndarray
    widths: np.ndarray
    masses: np.ndarray
    group_of: dict
    ell: np.ndarray
    fwd: np.ndarray
    bwd: np.ndarray
    clamp: float

    @classmethod
    def build(cls, lo: float, hi: float, tokens: np.ndarray, lengths: np.ndarray, targets: np.ndarray, k: int):
        """The block of ``tokens`` (lengths ``q``, targets ``b``) inside ``[lo, hi)``; O(n log n)."""
        dens = targets / lengths
        o = np.argsort(-dens, kind="stable")
        tokens, lengths, targets, dens = tokens[o], lengths[o], targets[o], dens[o]
        start = np.concatenate([[True], dens[1:] != dens[:-1]])
        group = np.cumsum(start) - 1
        Q = np.bincount(group, weights=lengths)
        B = np.bincount(group, weights=targets)
        edges = lo + np.concatenate([[0.0], np.cumsum(Q)])
        edges[-1] = hi
        m = mu_k_width(edges[:-1], Q, k)                # widths Q, not edge differences: relative accuracy
        E = np.cumsum(m - B)                            # E_g = μ_k([L, edges_{g+1})) − Σ_{h≤g} b_h
        # E_{G−1} = μ_k(block) − Σ b is round-off (the targets' block identity); it is charged to the longest
        # group, where it perturbs every token's ∫θ g by at most q_y·|E_{G−1}|/Q_longest
        E = E[:-1] - E[-1] * (np.arange(E.size - 1) >= int(np.argmax(Q)))
        d = dens[start]
        ell = np.maximum(E, 0.0) / (d[:-1] - d[1:])
        clamp = float(max(0.0, -E.min())) if E.size else 0.0
        fwd = _mobius_scan(Q, ell)
        bwd = _mobius_scan(Q[::-1], ell[::-1])[::-1]
        return cls(edges, Q, m, dict(zip(tokens.tolist(), group.tolist())), ell, fwd, bwd, clamp)

    def density(self, y: int, length: float) -> np.ndarray:
        """``θ_y`` [G] on the group intervals: ``θ_y = q_y·A^{−1} e_g`` (g = y's group, ``q_y = length``).

        ``x = A^{−1} e_g``: ``x_g = 1/(s'_g + ℓ_g s''_{g+1}/(s''_{g+1} + ℓ_g))``, then outwards
        ``x_{h+1} = x_h·ℓ_h/(s''_{h+1} + ℓ_h)`` (h ≥ g) and ``x_{h−1} = x_h·ℓ_{h−1}/(s'_{h−1} + ℓ_{h−1})`` (h ≤ g):
        products of positive factors < 1.
        """
        g, G = self.group_of[y], self.fwd.size
        right = self.ell[g:] / (self.bwd[g + 1:] + self.ell[g:])
        left = self.ell[:g] / (self.fwd[:g] + self.ell[:g])
        x_g = 1.0 / (self.fwd[g] + (right[0] * self.bwd[g + 1] if g + 1 < G else 0.0))
        x = np.empty(G)
        x[g] = x_g
        x[g + 1:] = x_g * np.cumprod(right)
        x[:g] = x_g * np.cumprod(left[::-1])[::-1]
        return length * x


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
        block_of = np.full(targets.b.size, -1)
        for i in range(targets.bounds.size - 1):
            block_of[targets.order[targets.bounds[i]:targets.bounds[i + 1]]] = i
        return cls(targets, block_of)

    def block(self, i: int) -> LayoutBlock:
        """Block i's :class:`LayoutBlock` (cached)."""
        if i not in self._blocks:
            t = self.targets
            l1, l2 = int(t.bounds[i]), int(t.bounds[i + 1])
            toks = t.order[l1:l2]
            self._blocks[i] = LayoutBlock.build(t.X[l1], t.X[l2], toks, t.draft[toks], t.b[toks], t.k)
        return self._blocks[i]

    def density(self, y: int) -> tuple[np.ndarray, np.ndarray]:
        """``θ_y`` as ``(edges [n+1], values [n])``: ``θ_y = values_i`` on ``[edges_i, edges_{i+1})``, 0 elsewhere."""
        if self.block_of[y] < 0:
            raise ValueError(f"PrivateLayout.density: token {y} has draft probability 0 (never drafted)")
        blk = self.block(int(self.block_of[y]))
        return blk.edges, blk.density(int(y), float(self.targets.draft[y]))

    def moments(self, y: int) -> tuple[float, float]:
        """``(∫θ_y, ∫θ_y g)`` of the realised density (== ``(q(y), b(y))`` up to round-off)."""
        if self.block_of[y] < 0:
            raise ValueError(f"PrivateLayout.moments: token {y} has draft probability 0 (never drafted)")
        blk = self.block(int(self.block_of[y]))
        v = blk.density(int(y), float(self.targets.draft[y]))
        return float(v @ blk.widths), float(v @ blk.masses)

    def min_probs(self, S) -> np.ndarray:
        """``Pr(copy j has the smallest private position | S)`` for each position j (sums to 1).

        Blocks are consecutive intervals of [0, 1), so only copies in the earliest block S touches can hold the
        smallest U (the others get exactly 0).  ``U_j`` has density ``f_j = θ_{y_j}/q(y_j)``; on each group
        interval of that block every ``f`` is constant and every CDF affine, so the integrand
        ``f_j Π_{l≠j} (1 − F_l)`` is a polynomial of degree ≤ k−1: Gauss–Legendre with ⌈k/2⌉+1 nodes is exact.
        """
        k = len(S)
        first = min(int(self.block_of[y]) for y in S)          # blocks are consecutive intervals: only the
        uniq = sorted(set(int(y) for y in S if self.block_of[y] == first))   # earliest one can hold the minimum
        mult = {y: list(S).count(y) for y in uniq}
        q = self.targets.draft
        dens = {y: self.density(y) for y in uniq}
        e = np.unique(np.concatenate([dens[y][0] for y in uniq]))
        el, eh = e[:-1], e[1:]
        mid = 0.5 * (el + eh)
        nodes, weights = gauss_legendre(-(-k // 2) + 1)
        half = 0.5 * (eh - el)
        u = mid[:, None] + half[:, None] * nodes[None, :]                 # [n_intervals, n_nodes]
        f, surv = {}, {}
        for y in uniq:
            ey, vy = dens[y]
            fy = vy / q[y]
            i = np.searchsorted(ey, mid, side="right") - 1
            f[y] = np.where((i >= 0) & (i < fy.size), fy[np.clip(i, 0, fy.size - 1)], 0.0)
            cdf = np.concatenate([[0.0], np.cumsum(fy * np.diff(ey))])
            surv[y] = 1.0 - np.interp(u, ey, cdf)
        share = {}
        for y in uniq:
            g = f[y][:, None] * np.ones_like(u)
            for z in uniq:
                g = g * surv[z] ** (mult[z] - (z == y))
            share[y] = float(((g * weights[None, :]).sum(axis=1) * half).sum())
        return np.array([share.get(int(y), 0.0) for y in S])


def layout_plan(target_probs, draft_probs, rho, k: int, process: str) -> NodePlan | None:
    """Rule 2 as a :class:`NodePlan` (i.i.d. children only; ``None`` for any other process).

    ``marginal = min(b, ρp)`` (Σ = α*(ρ)); ``select(S)[j] = t(y_j)·Pr(copy j has the smallest U | S)``.
    """
    p, q, rho = check_node_inputs("layout_plan", target_probs, draft_probs, rho, k, process)
    if process != "iid":
        return None
    targets = layout_targets(p, q, rho, k)
    layout = PrivateLayout.build(targets)
    c = rho * p
    with np.errstate(divide="ignore", invalid="ignore"):
        accept = np.where(targets.b > 0, np.minimum(1.0, c / targets.b), 0.0)

    def select(S):
        # round-off: keep w a valid plan; a tuple of copies whose windows are all of subnormal width has
        # min-probabilities 0/0 — it carries no representable mass (< 1e-300) and gets w = 0
        with np.errstate(invalid="ignore"):
            w = accept[list(S)] * np.nan_to_num(np.maximum(layout.min_probs(S), 0.0), nan=0.0)
        return w / max(1.0, w.sum())

    return NodePlan("layout", rho, p, targets.marginal, select,
                    {"alpha_star": targets.alpha_star, "layout": layout, "accept": accept})
