"""Global Resolution as a level rule: the batched twin of ``univer_theory.multidraft`` (``gr``).

At each of the R nodes of a level (i.i.d. children, k = |S|): the α*-optimal flat plan at ρ = 1 — ``k = 1``:
``w = min(1, p(y)/q(y))``; ``k ≥ 2``: the private-position layout (:func:`gpu.layout.layout_weights` with target
``c = p``) — applied as in RRS: child j is entered w.p. ``w_j/(1 − Σ_{l<j} w_l)`` with scaling 1, every stop
is 1, and ``Y ~ norm([p − a]_+)`` when no child is taken (:func:`~univer_theory.plans.base.residual_rows`:
``p`` itself where round-off cancels all of it).  SpecHub has no batched twin (its ``hub`` draft law
is not a process of :mod:`gpu.drafting`).
"""
from __future__ import annotations

import torch

from univer_theory.plans.base import residual_rows, shares_rows
from univer_theory.validation import Unsupported

from .engine import LevelContext, LevelDecision
from .layout import layout_weights
from .univer_rule import planning_rows, single_child


def gr_rule(ctx: LevelContext) -> LevelDecision:
    """Global Resolution at R nodes at once (module docstring); i.i.d. children only."""
    if ctx.process != "iid":
        raise Unsupported(f"gr: defined for i.i.d. drafts only, got process {ctx.process!r}")
    dtype = ctx.target.dtype
    p, q, rho = planning_rows(ctx)
    k = ctx.child_mask.sum(1)
    w = torch.zeros(ctx.children.shape, dtype=torch.float64, device=p.device)
    a = torch.zeros_like(p)
    one = k == 1
    if one.any():
        w1, a1 = single_child(LevelContext(torch.ones_like(rho), p, q, ctx.children, ctx.child_mask, "iid"), p)
        w[:, 0] = torch.where(one, w1, 0)
        a = torch.where(one[:, None], a1, a)
    for n in k[k >= 2].unique().tolist():
        rows = (k == n).nonzero().squeeze(1)
        w[rows, :n], a[rows] = layout_weights(p[rows], q[rows], ctx.children[rows, :n], ctx.child_mask[rows, :n])
    enter = shares_rows(w).to(dtype)
    stop = torch.ones_like(rho)
    return LevelDecision(enter, torch.ones_like(enter), stop.to(dtype), residual_rows(p, a, stop).to(dtype))
