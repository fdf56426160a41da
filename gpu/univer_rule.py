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
  integrals on an accelerator, the exact core's sequential walk per distinct row on the CPU, where it is
  cheaper — ``gpu.wor_plans.CLOCK_WALK``), and on draft supports of at most ``SMALL_SUPPORT`` tokens rule 1
  where it is better: the CondOT(ρ) LP's one tie-broken optimum, every node's LP at once (:mod:`gpu.condot`);
* children with different subtrees (``iid`` / ``wor`` as above), when the shape rule does not apply (its LPs
  would be too large): the plan evaluated on every ordering of S (batched), then the slot rule of
  :mod:`gpu.slot_rule` — k = 2 in closed form; k = 3, 4 the class LP's one tie-broken optimum, every node's
  LP at once; k > ``SLOT_RULE_MAX_K`` — the plan's own weights (no slot rule);
* ``topk`` with ``k ≥ 2``: the fixed top-k list filled in drafting order, ``w_j = min(ρp(y_j), 1 − Σ_{l<j} w_l)``;
  ``greedy`` with ``k ≥ 2``: the closed form of :func:`~univer_theory.plans.choose.greedy_fill_plan` (one pass
  over the vocabulary for the spare capacity, then the realised tuple);
* every node: ``f``, the residual ``[ρp − a]_+`` and the scalings ``s_j`` from ``w``; ``α = Σ a`` (for looped
  nodes the exact plan's own α, so ``f`` matches the exact core's round-off as ``α → 1``).

**Per node, on the CPU in float64 numpy through the exact core** (one :class:`~univer_theory.univer.UniVerRule`
per level call, :meth:`~univer_theory.univer.UniVerRule.weights`): the shape rule's nodes — asymmetric
children on small draft supports, whose plan is an LP on the α*-face against value functions that are
themselves found by a breakpoint search over LPs (:mod:`univer_theory.plans.value_proxy`); the subtrees come
as shape ids, ``LevelContext.child_shapes``, from :attr:`TreeBatch.subtree_shapes`.

Identical looped nodes (same ρ, rows, children and children's subtrees — e.g. one tree repeated across the
batch) are planned once (``torch.unique`` over the level's rows).  Inputs in float32 are planned in float64
(rows renormalised) and the decisions cast back.
"""
from __future__ import annotations

import itertools

import numpy as np
import torch

from univer_theory.plans import value_proxy
from univer_theory.tree import key_size
from univer_theory.univer import SLOT_RULE_MAX_K, UniVerRule

from .engine import LevelContext, LevelDecision
from .layout import layout_weights
from .slot_rule import slot_lp, slot_pair
from .wor_plans import wor_weights


def _single_child(ctx: LevelContext, c: torch.Tensor):
    """``k = 1``: ``(w [R], a [R, V])`` with ``Q_1 = q`` (one-hot top draft token for topk)."""
    y = ctx.children[:, 0]
    q = ctx.draft
    if ctx.process == "topk":
        q = torch.zeros_like(q).scatter(1, q.argmax(-1, keepdim=True), 1)   # argmax: first maximum = lowest id
    qy = q.gather(1, y[:, None]).squeeze(1)
    cy = c.gather(1, y[:, None]).squeeze(1)
    w = torch.where(qy > 0, (cy / torch.where(qy > 0, qy, 1)).clamp(max=1), 0)
    return w, torch.minimum(c, q)


def _plan_nodes(ctx: LevelContext, rows: torch.Tensor):
    """Per unique node of ``rows`` (indices into the level, all with k ≥ 2): ``w [n, K]``, the plans' ``α [n]``
    and their marginals ``a [n, V]`` (float64, on the level's device)."""
    K, V = ctx.children.shape[1], ctx.target.shape[1]
    p = ctx.target[rows].double()
    q = ctx.draft[rows].double()
    rho = ctx.rho[rows].double()
    kids, mask = ctx.children[rows], ctx.child_mask[rows]
    shapes = ctx.child_shapes[rows] if ctx.child_shapes is not None else torch.zeros_like(kids)   # 0: a leaf
    key = torch.cat([rho[:, None], p, q, kids.double(), mask.double(), shapes.double()], 1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    rule = UniVerRule()
    host = uniq.cpu().numpy()
    w = np.zeros((host.shape[0], K))
    alpha = np.zeros(host.shape[0])
    a = np.zeros((host.shape[0], V))
    for i, row in enumerate(host):
        pi, qi = row[1:1 + V], row[1 + V:1 + 2 * V]
        pi, qi = pi / pi.sum(), qi / qi.sum()           # float32 inputs: back onto the simplex in float64
        m = row[1 + 2 * V + K:1 + 2 * V + 2 * K] > 0
        S = tuple(int(y) for y in row[1 + 2 * V:1 + 2 * V + K][m])
        shape = tuple(ctx.shape_keys[int(s)] for s in row[1 + 2 * V + 2 * K:][m])
        plan, wi, _ = rule.weights(pi, qi, float(row[0]), S, ctx.process, shape)
        w[i, np.flatnonzero(m)] = np.asarray(wi, dtype=np.float64)
        alpha[i] = float(plan.alpha)
        a[i] = np.asarray(plan.marginal, dtype=np.float64)
    dev = ctx.target.device
    return tuple(torch.from_numpy(x).to(dev)[inverse] for x in (w, alpha, a))


def _greedy_fill(c: torch.Tensor, q: torch.Tensor, children: torch.Tensor, child_mask: torch.Tensor):
    """``(w [R, K], a [R, V])`` of :func:`univer_theory.plans.choose.greedy_fill_plan` for greedy rows with k ≥ 2:
    the fixed top-(k−1) children first, the drawn child z last (``r = q/q(V∖T)`` off the fixed list T)."""
    R, K = children.shape
    k = child_mask.sum(1)
    j = torch.arange(K, device=c.device)[None, :]
    fixed_pos = child_mask & (j < (k - 1)[:, None])
    z = children.gather(1, (k - 1)[:, None]).squeeze(1)
    in_t = torch.zeros_like(q, dtype=torch.bool).scatter_(1, torch.where(fixed_pos, children, z[:, None]), fixed_pos)
    off = (q > 0) & ~in_t
    r = torch.where(off, q, 0) / torch.where(off, q, 0).sum(1, keepdim=True)
    m = torch.minimum(r, torch.where(off, c, 0))
    last = torch.where(r > 0, m / torch.where(r > 0, r, 1), 0)                   # w_k(x) for every candidate x
    spare = (r - m).sum(1)
    share = torch.where(in_t, c, 0).sum(1)
    phi = torch.where(spare > 0, (share / torch.where(spare > 0, spare, 1)).clamp(max=1), 0)
    split = torch.where(share[:, None] > 0, torch.where(in_t, c, 0) / torch.where(share > 0, share, 1)[:, None], 0)
    # marginals, then the repair of rule 1 (entries of a token with a > c scaled by c/a)
    a = r * last + (phi * (r * (1 - last)).sum(1))[:, None] * split
    shrink = torch.where(a > c, c / torch.where(a > c, a, 1), 1.0)
    w_fixed = (phi * (1 - last.gather(1, z[:, None]).squeeze(1)))[:, None] * split.gather(1, children)
    w = torch.where(fixed_pos, w_fixed, torch.where(j == (k - 1)[:, None], last.gather(1, children), 0))
    return w * shrink.gather(1, children), a * shrink


def _shape_rule_rows(ctx: LevelContext, rows: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """Of ``rows`` (k ≥ 2, children with different subtrees), those where the shape rule plans the node
    (:func:`univer_theory.plans.value_proxy.within_limits`, asked once per distinct support and subtrees)."""
    shapes = torch.where(ctx.child_mask[rows], ctx.child_shapes[rows], -1)
    sig, inverse = torch.unique(torch.cat([support[rows, None], shapes], 1), dim=0, return_inverse=True)
    verdict = [value_proxy.within_limits(int(r[0]), tuple(ctx.shape_keys[int(i)] for i in r[1:] if i >= 0),
                                         ctx.process) for r in sig.tolist()]
    return torch.tensor(verdict, dtype=torch.bool, device=rows.device)[inverse]


def _iid_wor(ctx: LevelContext, p, q, rho, w, a) -> torch.Tensor:
    """Plan the iid / wor nodes with k ≥ 2 that are batched (module docstring) into ``w``, ``a``; their mask."""
    k = ctx.child_mask.sum(1)
    c = rho[:, None] * p
    shapes = ctx.child_shapes if ctx.child_shapes is not None else torch.zeros_like(ctx.children)
    equal = ((shapes == shapes[:, :1]) | ~ctx.child_mask).all(1)
    support = (q > 0).sum(1)
    base = k >= 2
    odd = (base & ~equal).nonzero().squeeze(1)
    slot = torch.zeros_like(base)
    if odd.numel():                     # asymmetric: the shape rule (looped) or the slot rule up to k = 4
        free = ~_shape_rule_rows(ctx, odd, support)
        slot[odd[free & (k[odd] <= SLOT_RULE_MAX_K)]] = True
        base[odd[~free]] = False

    def plan(rows, n, children):
        """The plans of ``rows`` (all with n children) on ``children [r, n]`` or ``[r, T, n]``: ``(w, a)``."""
        if ctx.process == "iid":
            return layout_weights(c[rows], q[rows], children, ctx.child_mask[rows, :n])
        return wor_weights(c[rows], q[rows], rho[rows], p[rows], children)

    for n in k[base].unique().tolist():
        rows = (base & ~slot & (k == n)).nonzero().squeeze(1)
        if rows.numel():
            w[rows, :n], a[rows] = plan(rows, n, ctx.children[rows, :n])
        rows = (slot & (k == n)).nonzero().squeeze(1)
        if rows.numel():                # the plan on every ordering of S (S first), then the slot rule
            perms = list(itertools.permutations(range(n)))
            kids = ctx.children[rows, :n]
            w_all, a[rows] = plan(rows, n, kids[:, perms])
            omega = torch.tensor([1.0 + key_size(key) for key in ctx.shape_keys], dtype=w.dtype,
                                 device=w.device)[shapes[rows, :n]]
            w[rows, :n] = (slot_pair(w_all[:, 0], w_all[:, 1], kids, q[rows], omega, ctx.process) if n == 2
                           else slot_lp(w_all, kids, q[rows], omega, ctx.process, perms))
    return base


def univer_rule(ctx: LevelContext) -> LevelDecision:
    """UniVer at R nodes at once (module docstring); iid / wor / topk / greedy children."""
    dtype = ctx.target.dtype
    p, q, rho = ctx.target.double(), ctx.draft.double(), ctx.rho.double()
    c = rho[:, None] * p
    k = ctx.child_mask.sum(1)
    R, K = ctx.children.shape
    w = torch.zeros(R, K, dtype=torch.float64, device=p.device)
    a = torch.zeros_like(p)
    one = k == 1
    if one.any():
        w1, a1 = _single_child(LevelContext(rho, p, q, ctx.children, ctx.child_mask, ctx.process), c)
        w[:, 0] = torch.where(one, w1, 0)
        a = torch.where(one[:, None], a1, a)
    many = k >= 2
    batched = torch.zeros_like(many)
    if ctx.process == "topk":         # the fixed top-k list, filled in drafting order (plans.choose.topk_fill_plan)
        batched = many
        used = torch.zeros_like(rho)
        cy = c.gather(1, ctx.children)
        for j in range(K):
            wj = torch.where(many & ctx.child_mask[:, j], torch.minimum(cy[:, j], 1 - used).clamp(min=0), 0)
            w[:, j] = torch.where(many, wj, w[:, j])
            used = used + wj
        a = torch.where(many[:, None], torch.zeros_like(a).scatter_add(1, ctx.children, torch.where(
            ctx.child_mask, w, 0)), a)
    elif ctx.process == "greedy":     # closed form (plans.choose.greedy_fill_plan)
        batched = many
        rows = many.nonzero().squeeze(1)
        if rows.numel():
            w[rows], a[rows] = _greedy_fill(c[rows], q[rows], ctx.children[rows], ctx.child_mask[rows])
    else:
        batched = _iid_wor(ctx, p, q, rho, w, a)
    looped = (many & ~batched).nonzero().squeeze(1)
    if looped.numel():
        exact_ctx = LevelContext(rho, p, q, ctx.children, ctx.child_mask, ctx.process, ctx.child_shapes,
                                 ctx.shape_keys)
        w_loop, alpha_loop, a_loop = _plan_nodes(exact_ctx, looped)
        w[looped] = w_loop
        a[looped] = a_loop
    alpha = a.sum(-1)
    if looped.numel():
        alpha[looped] = alpha_loop    # the plan's own α: f = (ρ − α)/(1 − α) is ill-conditioned as α → 1
    scale, used = [], torch.zeros_like(rho)
    for j in range(K):
        den = 1 - used
        scale.append(torch.where(den > 0, w[:, j] / torch.where(den > 0, den, 1), 0).clamp(0, 1))
        used = used + w[:, j]
    stop = torch.where(alpha < 1, (rho - alpha) / torch.where(alpha < 1, 1 - alpha, 1), 1).clamp(0, 1)   # plans/base.py
    residual = (c - a).clamp(min=0)
    scale = torch.stack(scale, 1).to(dtype)
    return LevelDecision(torch.ones_like(scale), scale, stop.to(dtype), residual.to(dtype))
