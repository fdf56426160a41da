"""Level rules: the baseline verifiers of :mod:`univer_theory.verifiers` on ``R`` nodes at once (theory.md §3).

Each rule loops over the sibling index ``j`` (children in drafting order) and updates per-node state rows
``[R, V]``; a node without a j-th child keeps its state (``torch.where`` on ``child_mask``).  Shapes:
``ctx.target``/``ctx.draft`` ``[R, V]``, ``ctx.children``/``ctx.child_mask`` ``[R, K]``, ``ctx.rho`` ``[R]``.
"""
from __future__ import annotations

import torch

from .engine import LevelContext, LevelDecision


def _at(rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``rows[r, tokens[r]]`` → ``[R]``."""
    return rows.gather(1, tokens[:, None]).squeeze(1)


def _normalise(x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` per row; an all-zero row stays zero (as :func:`univer_theory.verifiers.normalise`)."""
    return x / x.sum(-1, keepdim=True).clamp(min=torch.finfo(x.dtype).tiny)


def _without(rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``norm(rows·1[≠ token])`` per row."""
    return _normalise(rows.scatter(1, tokens[:, None], 0))


def _ratio_min1(num: torch.Tensor, den: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``min(1, num/den)`` where ``mask`` (den > 0 there: validated), 0 elsewhere."""
    return torch.where(mask, (num / torch.where(mask, den, 1)).clamp(max=1), 0)


def _keep(mask: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.view(-1, *([1] * (new.ndim - 1))), new, old)


def nss_rule(ctx: LevelContext) -> LevelDecision:
    """Target-only (§3.1): child j entered w.p. ``P(y_j)``, then ``P ← norm(P·1[≠y_j])``; all missed: ``Y ~ P``."""
    P = ctx.target
    enter = []
    for j in range(ctx.children.shape[1]):
        y, m = ctx.children[:, j], ctx.child_mask[:, j]
        enter.append(torch.where(m, _at(P, y), 0))
        P = _keep(m, _without(P, y), P)
    one = torch.ones_like(ctx.rho)
    return LevelDecision(torch.stack(enter, 1), torch.ones_like(ctx.children, dtype=P.dtype), one, P)


def _recursive_rejection(ctx: LevelContext, without_replacement: bool) -> LevelDecision:
    P, Q = ctx.target, ctx.draft
    enter = []
    for j in range(ctx.children.shape[1]):
        y, m = ctx.children[:, j], ctx.child_mask[:, j]
        enter.append(_ratio_min1(_at(P, y), _at(Q, y), m))
        P_new = _normalise((P - Q).clamp(min=0))
        if without_replacement:
            Q = _keep(m, _without(Q, y), Q)
        P = _keep(m, P_new, P)
    return LevelDecision(torch.stack(enter, 1), torch.ones_like(ctx.children, dtype=P.dtype),
                         torch.ones_like(ctx.rho), P)


def rrs_rule(ctx: LevelContext) -> LevelDecision:
    """RRS (§3.3): accept ``y`` w.p. ``min(1, P(y)/Q(y))``; on rejection ``P ← norm([P − Q]_+)``; ``Y ~ P``.
    A duplicate i.i.d. child is tried again (always rejected, residual still updated)."""
    return _recursive_rejection(ctx, without_replacement=False)


def rrsw_rule(ctx: LevelContext) -> LevelDecision:
    """RRSw (§3.4): RRS plus ``Q ← norm(Q·1[≠y])`` after each rejection."""
    return _recursive_rejection(ctx, without_replacement=True)


def kseq_rho_star(target: torch.Tensor, draft: torch.Tensor, k: torch.Tensor, iters: int = 64) -> torch.Tensor:
    """SpecTr K-SEQ's ``ρ* ∈ [1, k]`` per row (§3.5), float64: root of ``1 − (1 − β(ρ))^k − ρβ(ρ)`` with
    ``β(ρ) = Σ_x min(q(x), p(x)/ρ)``, ``ρ* = 1`` if ``f(1) ≤ 0``; returns the bracket's upper end (as
    :func:`univer_theory.kseq_rho_star`, so the accepted masses never exceed ``min(p, ρ* q)``).

    ``β(ρ) = Σ_{p/q ≥ ρ} q + (1/ρ) Σ_{p/q < ρ} p`` is read off prefix sums of the rows sorted by ``p/q``, so
    each of the ``iters`` fixed bisection steps costs one ``searchsorted`` per row (no host sync).  float64
    throughout: the root of f moves by ~|δf| / |f'|, and float32 sums would put ``ρ*`` off by ~1e-7·k.
    """
    p, q = target.to(torch.float64), draft.to(torch.float64)
    ratio = torch.where(q > 0, p / torch.where(q > 0, q, 1), torch.inf)
    ratio, order = ratio.sort(-1)
    p_s, q_s = p.gather(1, order), q.gather(1, order)
    zero = torch.zeros_like(p_s[:, :1])
    p_below = torch.cat([zero, p_s.cumsum(-1)], 1)                          # Σ_{l<m} p, [R, V+1]
    q_above = torch.cat([q_s.flip(-1).cumsum(-1).flip(-1), zero], 1)         # Σ_{l≥m} q
    k = k.to(torch.float64)

    def f(rho):
        m = torch.searchsorted(ratio, rho[:, None], right=False)
        beta = q_above.gather(1, m).squeeze(1) + p_below.gather(1, m).squeeze(1) / rho
        return 1.0 - (1.0 - beta) ** k - rho * beta

    lo, hi = torch.ones_like(k), k.clone()
    for _ in range(iters):  # 64 halvings of a bracket of width ≤ K reach adjacent float64 values
        mid = 0.5 * (lo + hi)
        up = f(mid) > 0
        lo, hi = torch.where(up, mid, lo), torch.where(up, hi, mid)
    return torch.where(f(torch.ones_like(k)) <= 0, 1.0, hi)


def kseq_rule(ctx: LevelContext) -> LevelDecision:
    """SpecTr K-SEQ (§3.5): accept each child w.p. ``min(1, p(y)/(ρ* q(y)))``; all rejected:
    ``Y ~ norm([p − m]_+)``, ``m = min(ρ* q, p)·(1 − (1−β)^k)/(ρ* β)`` the accepted mass (float64)."""
    k = ctx.child_mask.sum(1)
    if ctx.children.shape[1] == 1:   # k = 1 everywhere: f(1) = 0, so ρ* = 1 (token-level SpS), no search
        rho = torch.ones_like(k, dtype=torch.float64)
    else:
        rho = kseq_rho_star(ctx.target, ctx.draft, k)
    p, q = ctx.target.to(torch.float64), ctx.draft.to(torch.float64)
    beta = torch.minimum(q, p / rho[:, None]).sum(-1)
    scale = torch.where(beta > 0, (1.0 - (1.0 - beta) ** k) / (rho * torch.where(beta > 0, beta, 1)), 0)
    mass = torch.minimum(rho[:, None] * q, p) * scale[:, None]
    residual = _normalise((p - mass).clamp(min=0)).to(ctx.target.dtype)
    y, m = ctx.children, ctx.child_mask
    enter = _ratio_min1(p.gather(1, y), rho[:, None] * q.gather(1, y), m).to(ctx.target.dtype)
    return LevelDecision(enter, torch.ones_like(enter), torch.ones_like(ctx.rho), residual)


def tv_rule(ctx: LevelContext, parent_update=None) -> LevelDecision:
    """Traversal Verification at each node (§3.7), iid or wor children.

    ``s_j = min(1, r·P(y_j)/Q(y_j))``; after child j: ``D = [rP − Q]_+``, ``R = ΣD``, ``P ← D/R``,
    ``r ← R/(R + (1 − r))`` (``R = 0 → r ← 0``; written so that ``r = 1`` stays exactly 1 at the root), and for
    wor ``Q ← norm(Q·1[≠y_j])``.  The node succeeds w.p. the final ``r`` with ``Y ~ P``.
    ``parent_update(R, r, Q(y))`` replaces the ``r`` update; it exists only for the bug zoo (§3.9 (d)).
    """
    r, P, Q = ctx.rho, ctx.target, ctx.draft
    scale = []
    for j in range(ctx.children.shape[1]):
        y, m = ctx.children[:, j], ctx.child_mask[:, j]
        scale.append(_ratio_min1(r * _at(P, y), _at(Q, y), m))
        D = (r[:, None] * P - Q).clamp(min=0)
        R = D.sum(-1)
        if parent_update is None:
            r_new = torch.where(R > 0, R / (R + (1 - r)), 0)
        else:
            r_new = parent_update(R, r, _at(Q, y))
        P_new = torch.where(R[:, None] > 0, D / R.clamp(min=torch.finfo(D.dtype).tiny)[:, None], P)
        if ctx.process == "wor":
            Q = _keep(m, _without(Q, y), Q)
        r, P = _keep(m, r_new, r), _keep(m, P_new, P)
    scale = torch.stack(scale, 1)
    return LevelDecision(torch.ones_like(scale), scale, r, P)
