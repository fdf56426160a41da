"""Rule 2: the i.i.d. private-position layout, an α*(ρ)-optimal node plan for any V (theory.md §6.3 item 2).

Each drafted copy j of an i.i.d. tuple ``S = (y_1..y_k)`` draws a private position ``U_j ~ Uniform(I_{y_j})``,
where the sets ``I_y ⊂ [0,1)`` are disjoint with ``|I_y| = q(y)``.  The copy with the smallest U is selected and
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
inside the interval ``[X_{l1}, X_{l2})`` on its own.  Most blocks are single tokens (window = block); inside
a larger block the tokens, in descending density ``b/q``, each take a window of length ``q(y)`` on the
concatenated free part of the block whose μ_k equals ``b(y)`` (the window's μ_k decreases as it slides
right: the bracket is found among the free-interval boundaries, then bisection); the last token takes
what is left.  Blocks are placed lazily, only when a realised tuple touches them.

**Selection on the realised tuple.**  ``w_j(S) = t(y_j)·∫ g_j(u) Π_{l≠j} (1 − G_l(u)) du`` (g_j the density,
G_l the CDF of U_l): on the elementary intervals between the realised tokens' piece boundaries the
integrand is a polynomial of degree ≤ k−1, integrated exactly by Gauss–Legendre with ⌈k/2⌉+1 nodes.
Duplicated tokens keep separate copies (each gets the same share).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .base import NodePlan
from .node_inputs import check_node_inputs

_BISECTION_STEPS = 200


def mu_k(lo, hi, k: int):
    """``μ_k([lo, hi)) = (1−lo)^k − (1−hi)^k``, evaluated as ``(hi−lo)·Σ_i (1−lo)^i (1−hi)^{k−1−i}``
    (no cancellation for short pieces)."""
    A, B = 1.0 - np.asarray(lo, dtype=np.float64), 1.0 - np.asarray(hi, dtype=np.float64)
    s = np.zeros(np.broadcast(A, B).shape)
    for i in range(k):
        s = s + A ** i * B ** (k - 1 - i)
    return (np.asarray(hi, dtype=np.float64) - np.asarray(lo, dtype=np.float64)) * s


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
    drafted = np.flatnonzero(q > 0)
    order = drafted[np.argsort(-(c[drafted] / q[drafted]), kind="stable")]
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


def _mu1(lo: float, hi: float, k: int) -> float:
    """Scalar :func:`mu_k` in plain floats (hot loop of the window search)."""
    A, B = 1.0 - lo, 1.0 - hi
    return (hi - lo) * sum(A ** i * B ** (k - 1 - i) for i in range(k))


def _place_block(lo: float, hi: float, tokens: np.ndarray, lengths: np.ndarray, targets: np.ndarray, k: int):
    """Greedy window placement inside one block ``[lo, hi)`` (module docstring).

    Tokens in descending density ``b/q``; each takes the window ``[φ, φ + q)`` of the concatenated free part
    (free coordinate φ) with ``μ_k = b``.  ``W(φ)`` is non-increasing; it is smooth between the points where
    φ or φ + q crosses a free-interval boundary, so a binary search over those boundaries brackets the root
    and a safeguarded Newton step finishes it.  Cost per token: O(log n) scalar evaluations plus O(n) array
    updates (n = free intervals, at most the number of tokens placed).

    Returns ``{token: (piece_lo [n], piece_hi [n])}`` (sorted, touching pieces merged) and the worst clamp
    ``|μ_k(window) − b|`` when a target lay outside the reachable range (round-off only on every instance met).
    """
    free_lo, free_hi = np.array([lo]), np.array([hi])
    seq = np.argsort(-(targets / lengths), kind="stable")
    out: dict = {}
    clamp = 0.0
    for pos, t in enumerate(seq):
        y, beta = int(tokens[t]), float(targets[t])
        if pos == seq.size - 1:                     # the last token takes what is left
            out[y] = _merge(free_lo, free_hi)
            break
        cumF = np.concatenate([[0.0], np.cumsum(free_hi - free_lo)])
        cumM = np.concatenate([[0.0], np.cumsum(mu_k(free_lo, free_hi, k))])
        total, last = float(cumF[-1]), free_lo.size - 1
        length = min(float(lengths[t]), total)
        top = total - length

        def at(psi):
            """Free interval and actual position of free coordinate ``psi``."""
            i = min(max(int(np.searchsorted(cumF, psi, side="right")) - 1, 0), last)
            return i, min(float(free_lo[i]) + (psi - float(cumF[i])), float(free_hi[i]))

        def window(phi):
            (i, x), (j, z) = at(phi), at(phi + length)
            return float(cumM[j] - cumM[i]) + _mu1(float(free_lo[j]), z, k) - _mu1(float(free_lo[i]), x, k)

        w0, w1 = window(0.0), window(top)
        if w0 <= beta or top <= 0:
            clamp, phi = max(clamp, beta - w0), 0.0
        elif w1 >= beta:
            clamp, phi = max(clamp, w1 - beta), top
        else:
            a_, b_ = 0.0, top                       # window(a_) > beta > window(b_)
            for cuts in (cumF, cumF - length):      # bracket between consecutive breakpoints
                lo_i = int(np.searchsorted(cuts, a_, side="right"))
                hi_i = int(np.searchsorted(cuts, b_, side="left")) - 1
                while lo_i <= hi_i:
                    m = (lo_i + hi_i) // 2
                    if window(float(cuts[m])) >= beta:
                        a_, lo_i = float(cuts[m]), m + 1
                    else:
                        b_, hi_i = float(cuts[m]), m - 1
            phi = a_
            for _ in range(_BISECTION_STEPS):       # safeguarded Newton on the smooth piece
                (i, x), (j, z) = at(phi), at(phi + length)
                f = window(phi) - beta
                slope = k * ((1.0 - z) ** (k - 1) - (1.0 - x) ** (k - 1))
                if f >= 0:
                    a_ = phi
                else:
                    b_ = phi
                nxt = phi - f / slope if slope < 0 else 0.5 * (a_ + b_)
                if not a_ < nxt < b_:
                    nxt = 0.5 * (a_ + b_)
                if nxt == phi or f == 0 or not a_ < nxt < b_:
                    break
                phi = nxt
        (i, x), (j, z) = at(phi), at(phi + length)
        if i == j:
            out[y] = _merge(np.array([x]), np.array([z]))
        else:
            out[y] = _merge(np.concatenate([[x], free_lo[i + 1:j + 1]]), np.concatenate([free_hi[i:j], [z]]))
        new_lo = np.concatenate([free_lo[:i], [free_lo[i], z], free_lo[j + 1:]])
        new_hi = np.concatenate([free_hi[:i], [x, free_hi[j]], free_hi[j + 1:]])
        keep = new_hi > new_lo
        free_lo, free_hi = new_lo[keep], new_hi[keep]
        if free_lo.size == 0:                       # only round-off lengths remain for the rest
            free_lo, free_hi = np.array([hi]), np.array([hi])
    return out, clamp


def _merge(lo: np.ndarray, hi: np.ndarray):
    """Sort pieces and merge touching ones; drop empty pieces."""
    o = np.argsort(lo, kind="stable")
    lo, hi = lo[o], hi[o]
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    if lo.size <= 1:
        return lo, hi
    start = np.concatenate([[True], lo[1:] > hi[:-1]])
    grp = np.cumsum(start) - 1
    new_hi = np.zeros(int(grp[-1]) + 1)
    np.maximum.at(new_hi, grp, hi)
    return lo[start], new_hi


@dataclass(frozen=True)
class PrivateLayout:
    """The layout ``y ↦ I_y`` of one node, with blocks placed lazily (see module docstring).

    ``block_of`` [V]: index of the block holding each drafted token (−1 off the support).
    """

    targets: LayoutTargets
    block_of: np.ndarray
    _placed: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, targets: LayoutTargets) -> "PrivateLayout":
        block_of = np.full(targets.b.size, -1)
        for i in range(targets.bounds.size - 1):
            block_of[targets.order[targets.bounds[i]:targets.bounds[i + 1]]] = i
        return cls(targets, block_of)

    def place_block(self, i: int) -> tuple[dict, float]:
        """Pieces of every token of block i and the clamp error (cached)."""
        if i not in self._placed:
            t = self.targets
            l1, l2 = int(t.bounds[i]), int(t.bounds[i + 1])
            toks = t.order[l1:l2]
            if toks.size == 1:
                self._placed[i] = ({int(toks[0]): (t.X[l1:l1 + 1], t.X[l2:l2 + 1])}, 0.0)
            else:
                self._placed[i] = _place_block(t.X[l1], t.X[l2], toks, t.draft[toks], t.b[toks], t.k)
        return self._placed[i]

    def pieces(self, y: int) -> tuple[np.ndarray, np.ndarray]:
        """``I_y`` as sorted disjoint pieces ``(lo [n], hi [n])``."""
        if self.block_of[y] < 0:
            raise ValueError(f"PrivateLayout.pieces: token {y} has draft probability 0 (never drafted)")
        return self.place_block(int(self.block_of[y]))[0][y]

    def placed_mu(self, y: int) -> float:
        """``μ_k(I_y)`` of the placed windows (== b(y) up to round-off)."""
        lo, hi = self.pieces(y)
        return float(mu_k(lo, hi, self.targets.k).sum())

    def min_probs(self, S) -> np.ndarray:
        """``Pr(copy j has the smallest private position | S)`` for each position j (sums to 1)."""
        k = len(S)
        uniq = sorted(set(int(y) for y in S))
        mult = {y: list(S).count(y) for y in uniq}
        q = self.targets.draft
        cdf_x, cdf_y, edges = {}, {}, []
        for y in uniq:
            lo, hi = self.pieces(y)
            cdf_x[y] = np.column_stack([lo, hi]).ravel()
            cdf_y[y] = np.concatenate([[0.0], np.cumsum(hi - lo)]).repeat(2)[1:-1] / q[y]
            edges.append(cdf_x[y])
        e = np.unique(np.concatenate(edges))
        el, eh = e[:-1], e[1:]
        mid = 0.5 * (el + eh)
        owner = np.full(mid.size, -1)
        for y in uniq:
            lo, hi = self.pieces(y)
            i = np.searchsorted(lo, mid, side="right") - 1
            inside = (i >= 0) & (mid < hi[np.maximum(i, 0)])
            owner[inside] = y
        nodes, weights = np.polynomial.legendre.leggauss(-(-k // 2) + 1)
        half = 0.5 * (eh - el)
        u = (0.5 * (el + eh))[:, None] + half[:, None] * nodes[None, :]      # [n_intervals, n_nodes]
        surv = {y: 1.0 - np.interp(u, cdf_x[y], cdf_y[y]) for y in uniq}
        share = {}
        for y in uniq:
            f = np.ones_like(u) / q[y]
            for z in uniq:
                f = f * surv[z] ** (mult[z] - (z == y))
            sel = owner == y
            share[y] = float(((f[sel] * weights[None, :]).sum(axis=1) * half[sel]).sum())
        return np.array([share[int(y)] for y in S])


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
        w = accept[list(S)] * np.maximum(layout.min_probs(S), 0.0)     # round-off: keep w a valid plan
        return w / max(1.0, w.sum())

    return NodePlan("layout", rho, p, targets.marginal, select,
                    {"alpha_star": targets.alpha_star, "layout": layout, "accept": accept})
