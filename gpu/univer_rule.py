"""UniVer as a level rule (theory.md §6.1–§6.3): the batched twin of :class:`univer_theory.univer.UniVerRule`.

At every internal node X (scaling ρ, target p, draft q, realised children S, k = |S|) UniVer uses an
α*(ρ)-optimal node plan ``w``; child j gets the scaling ``s_j = w_j(S)/(1 − Σ_{l<j} w_l(S))`` (0 when the
denominator is 0), and if every child fails X succeeds w.p. ``f = (ρ − α)/(1 − α)`` with
``Y ~ norm(ρp − a)``, ``α = Σ_y a(y)``.

**Batched in torch over the R nodes of a level** (rows ``[R, V]``):

* ``k = 1`` (any process): the unique plan ``w = min(1, ρp(y)/Q_1(y))``, ``a = min(ρp, Q_1)`` (``Q_1 = q``;
  the point mass on the top draft token for ``topk``) — nothing else is needed for these nodes;
* ``iid``, any k ≥ 2: the whole private-position layout (:mod:`gpu.layout`): closed-form targets,
  ``a = min(b, ρp)``, and ``w(S)`` — the earliest block the tuple touches laid out with fractional densities and
  integrated by Gauss–Legendre;
* ``wor``, any k ≥ 2: the automatic choice of :mod:`gpu.wor_plans` — for k = 2 rule 3 (``wor_pair``) where
  feasible; else the larger α of PTS and the iid coupling (PTS's θ for k ≥ 3: a fixed point of batched clock
  integrals on an accelerator, the compiled priority walk on the CPU, where it is ~300× cheaper — the
  ``walk`` argument), and on draft supports of at most ``SMALL_SUPPORT`` tokens rule 1
  where it is better: the CondOT(ρ) LP's one tie-broken optimum, every node's LP at once (:mod:`gpu.condot`);
* children with different subtrees (``iid`` / ``wor``) on supports small enough for its LP: the shape rule
  (:mod:`univer_theory.plans.shape_lp`) — rule 1's LP with the position weights ``ω_j = 1 + |subtree at j|`` as
  a second level, every node's LP at once (:mod:`gpu.condot`); where it does not apply: the plan above
  evaluated on every ordering of S (batched), then the slot rule of :mod:`gpu.slot_rule` — k = 2 in closed
  form; k = 3, 4 the class LP's one tie-broken optimum, every node's LP at once; k > ``SLOT_RULE_MAX_K`` —
  the plan's own weights (no slot rule);
* ``topk`` with ``k ≥ 2``: the fixed top-k list filled in drafting order, ``w_j = min(ρp(y_j), 1 − Σ_{l<j} w_l)``;
  ``greedy`` with ``k ≥ 2``: the closed form of :func:`~univer_theory.plans.choose.greedy_fill_plan` (one pass
  over the vocabulary for the spare capacity, then the realised tuple);
* every node: ``f``, the residual ``[ρp − a]_+`` and the scalings ``s_j`` from ``w``; ``α = Σ a``.

The children's subtrees come as shape ids, ``LevelContext.child_shapes``, from :attr:`TreeBatch.subtree_shapes`.
Inputs in float32 are planned in float64 (rows renormalised) and the decisions cast back.
"""
from __future__ import annotations

import itertools

import torch

from univer_theory.plans import shape_lp
from univer_theory.plans.base import residual_rows, shares_rows, stop_rows
from univer_theory.plans.choose import fill_weights, greedy_fill_rows, single_child_rows, single_child_weights
from univer_theory.univer import SLOT_RULE_MAX_K

from .condot import condot_weights
from .engine import LevelContext, LevelDecision
from .layout import layout_weights
from .slot_rule import slot_lp, slot_pair
from .unique import unique_rows
from .wor_plans import wor_weights


def single_child(ctx: LevelContext, c: torch.Tensor):
    """``k = 1``: ``(w [R], a [R, V])`` with ``Q_1 = q`` (one-hot top draft token for topk), by
    :func:`univer_theory.plans.choose.single_child_rows` / ``single_child_weights``."""
    q1, a = single_child_rows(c, ctx.draft, ctx.process)
    return single_child_weights(c, q1, ctx.children[:, :1])[:, 0], a


def _greedy_fill(c: torch.Tensor, q: torch.Tensor, children: torch.Tensor, child_mask: torch.Tensor):
    """``(w [R, K], a [R, V])`` of :func:`univer_theory.plans.choose.greedy_fill_plan` for greedy rows with k ≥ 2:
    the fixed top-(k−1) children first, the drawn child z last (:func:`~univer_theory.plans.choose.greedy_fill_rows`
    on the rows, then the repair: the exact core tabulates the plan over every z, here ``a`` is scaled)."""
    K = children.shape[1]
    k = child_mask.sum(1)
    j = torch.arange(K, device=c.device)[None, :]
    fixed_pos = child_mask & (j < (k - 1)[:, None])
    z = children.gather(1, (k - 1)[:, None]).squeeze(1)
    in_t = torch.zeros_like(q, dtype=torch.bool).scatter_(1, torch.where(fixed_pos, children, z[:, None]), fixed_pos)
    _, last, share, a = greedy_fill_rows(c, q, in_t)
    # the repair of rule 1: entries of a token with a > c scaled by c/a
    shrink = torch.where(a > c, c / torch.where(a > c, a, 1), 1.0)
    w_fixed = (1 - last.gather(1, z[:, None])) * share.gather(1, children)
    w = torch.where(fixed_pos, w_fixed, torch.where(j == (k - 1)[:, None], last.gather(1, children), 0))
    return w * shrink.gather(1, children), a * shrink


def _shape_rule_rows(ctx: LevelContext, k: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """``[R]``: nodes small enough for the shape rule's LP (:func:`univer_theory.plans.shape_lp.within_limits`,
    asked once per distinct (support, k) of the level)."""
    sig, inverse = unique_rows(torch.stack([support, k], 1))
    verdict = [shape_lp.within_limits(s, n, ctx.process) for s, n in sig.tolist()]
    return torch.tensor(verdict, dtype=torch.bool, device=k.device)[inverse]


def _iid_wor(ctx: LevelContext, p, q, rho, w, a, walk: str) -> None:
    """Plan the iid / wor nodes with k ≥ 2 (module docstring) into ``w``, ``a`` (``walk``: PTS's, :func:`univer_rule`)."""
    k = ctx.child_mask.sum(1)
    support = (q > 0).sum(1)
    c = rho[:, None] * p
    shapes = ctx.child_shapes if ctx.child_shapes is not None else torch.zeros_like(ctx.children)
    omega = torch.tensor(shape_lp.position_weights(ctx.shape_keys), dtype=w.dtype, device=w.device)[shapes]
    equal = ((shapes == shapes[:, :1]) | ~ctx.child_mask).all(1)
    base = k >= 2
    uneven = base & ~equal
    shaped = uneven & _shape_rule_rows(ctx, k, support) if bool(uneven.any()) else uneven
    slot = uneven & (k <= SLOT_RULE_MAX_K)

    for n in k[shaped].unique().tolist():
        rows = (shaped & (k == n)).nonzero().squeeze(1)      # the shape rule; a row whose simplex did not finish
        w_s, a_s, solved = condot_weights(c[rows], q[rows], ctx.children[rows, :n], ctx.process, omega[rows, :n])
        w[rows[solved], :n], a[rows[solved]] = w_s[solved], a_s[solved]   # keeps the plan below
        shaped[rows[~solved]] = False
    rest = base & ~shaped
    if ctx.process == "iid":            # the layout, every k at once (child_mask); on the slot rule's rows too:
        rows = rest.nonzero().squeeze(1)    # it is symmetric in its copies, w(σS) = σ·w(S) — one evaluation
        if rows.numel():
            w[rows], a[rows] = layout_weights(c[rows], q[rows], ctx.children[rows], ctx.child_mask[rows])
    for n in k[rest].unique().tolist():
        kids = ctx.children[:, :n]
        rows = (rest & ~slot & (k == n)).nonzero().squeeze(1)
        if ctx.process == "wor" and rows.numel():
            w[rows, :n], a[rows] = wor_weights(c[rows], q[rows], rho[rows], p[rows], kids[rows], walk)
        rows = (rest & slot & (k == n)).nonzero().squeeze(1)
        if rows.numel():                # the plan on every ordering of S (S first), then the slot rule
            perms = list(itertools.permutations(range(n)))
            if ctx.process == "iid":
                w_all = w[rows, :n][:, perms]
            else:
                w_all, a[rows] = wor_weights(c[rows], q[rows], rho[rows], p[rows], kids[rows][:, perms], walk)
            w[rows, :n] = (slot_pair(w_all[:, 0], w_all[:, 1], kids[rows], q[rows], omega[rows, :n], ctx.process)
                           if n == 2 else slot_lp(w_all, kids[rows], q[rows], omega[rows, :n], ctx.process, perms))


def planning_rows(ctx: LevelContext):
    """``(p, q, ρ)`` in float64; float32 rows are put back onto the simplex (float64 ones are planned as given)."""
    p, q, rho = ctx.target.double(), ctx.draft.double(), ctx.rho.double()
    if ctx.target.dtype != torch.float64:
        p, q = (x / torch.where(x.sum(1, keepdim=True) > 0, x.sum(1, keepdim=True), 1) for x in (p, q))
    return p, q, rho


def univer_rule(ctx: LevelContext, walk: str = "auto") -> LevelDecision:
    """UniVer at R nodes at once (module docstring); iid / wor / topk / greedy children.  ``walk``: how PTS finds
    θ for k ≥ 3 wor children (:data:`gpu.wor_plans.WALKS`; bind it with ``functools.partial`` to pass the rule
    to :mod:`gpu.engine`)."""
    dtype = ctx.target.dtype
    p, q, rho = planning_rows(ctx)
    c = rho[:, None] * p
    k = ctx.child_mask.sum(1)
    R, K = ctx.children.shape
    w = torch.zeros(R, K, dtype=torch.float64, device=p.device)
    a = torch.zeros_like(p)
    one = k == 1
    if one.any():
        w1, a1 = single_child(LevelContext(rho, p, q, ctx.children, ctx.child_mask, ctx.process), c)
        w[:, 0] = torch.where(one, w1, 0)
        a = torch.where(one[:, None], a1, a)
    many = k >= 2
    if ctx.process == "topk":         # the fixed top-k list, filled in drafting order (plans.choose.topk_fill_plan)
        w = torch.where(many[:, None], fill_weights(c.gather(1, ctx.children), many[:, None] & ctx.child_mask), w)
        a = torch.where(many[:, None], torch.zeros_like(a).scatter_add(1, ctx.children, torch.where(
            ctx.child_mask, w, 0)), a)
    elif ctx.process == "greedy":     # closed form (plans.choose.greedy_fill_plan)
        rows = many.nonzero().squeeze(1)
        if rows.numel():
            w[rows], a[rows] = _greedy_fill(c[rows], q[rows], ctx.children[rows], ctx.child_mask[rows])
    else:
        _iid_wor(ctx, p, q, rho, w, a, walk)
    alpha = a.sum(-1)
    scale = shares_rows(w).to(dtype)
    return LevelDecision(torch.ones_like(scale), scale, stop_rows(rho, alpha).to(dtype),
                         residual_rows(c, a).to(dtype))
