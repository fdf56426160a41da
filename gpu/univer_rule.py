"""UniVer as a level rule (theory.md §6.1–§6.3): the batched twin of :class:`univer_theory.univer.UniVerRule`.

At every internal node X (scaling ρ, target p, draft q, realised children S, k = |S|) UniVer uses an
α*(ρ)-optimal node plan ``w``; child j gets the scaling ``s_j = w_j(S)/(1 − Σ_{l<j} w_l(S))`` (0 when the
denominator is 0), and if every child fails X succeeds w.p. ``f = (ρ − α)/(1 − α)`` with
``Y ~ norm(ρp − a)``, ``α = Σ_y a(y)``.

**Batched over the R nodes of a level** (rows ``[R, V]``):

* ``k = 1`` (any process): the unique plan ``w = min(1, ρp(y)/Q_1(y))``, ``a = min(ρp, Q_1)`` (``Q_1 = q``;
  the point mass on the top draft token for ``topk``) — nothing else is needed for these nodes;
* ``iid``, any k ≥ 2: the whole private-position layout (:mod:`gpu.layout`): closed-form targets,
  ``a = min(b, ρp)``, and ``w(S)`` — the earliest block the tuple touches laid out with fractional densities and
  integrated by Gauss–Legendre;
* ``wor``, any k ≥ 2: the automatic choice of :mod:`gpu.wor_plans` — for k = 2 rule 3 (``wor_pair``) where
  feasible; else the larger α of PTS and the iid coupling (PTS's θ for k ≥ 3: the compiled priority walk, on
  the host for an accelerator's rows too, or a fixed point of batched clock integrals when asked for — the
  ``walk`` argument, :data:`gpu.wor_plans.WALKS`), and on draft supports of at most ``SMALL_SUPPORT`` tokens (its LP
  at most ``MAX_LP_TUPLES`` tuples, ``choose.small_lp``) rule 1 where it is better: the CondOT(ρ) LP's one
  tie-broken optimum, every node's LP at once (:mod:`solvers.condot_simplex`);
* children with different subtrees (``iid`` / ``wor``) on supports small enough for its LP: the shape rule
  (:mod:`univer_theory.plans.shape_lp`) — rule 1's LP with the position weights ``ω_j = 1 + |subtree at j|`` as
  a second level, every node's LP at once (:mod:`solvers.condot_simplex`); where it does not apply: the plan above
  evaluated on every ordering of S (batched), then the slot rule (:func:`solvers.slot_rule.slot_weights`, the
  exact core's) — k = 2 in closed form; k = 3, 4 the class LP's one tie-broken optimum, every node's LP at once;
  k > ``SLOT_RULE_MAX_K`` — the plan's own weights (no slot rule);
* ``topk`` with ``k ≥ 2``: the fixed top-k list filled in drafting order, ``w_j = min(ρp(y_j), 1 − Σ_{l<j} w_l)``;
  ``greedy`` with ``k ≥ 2``: the closed form of :func:`~univer_theory.plans.choose.greedy_fill_plan` (one pass
  over the vocabulary for the spare capacity, then the realised tuple);
* every node: ``f``, the residual ``[ρp − a]_+`` and the scalings ``s_j`` from ``w``; ``α = Σ a``.

The children's subtrees come as shape ids, ``LevelContext.child_shapes``, from :attr:`TreeBatch.subtree_shapes`.
Inputs in float32 are planned in float64 (rows renormalised) and the decisions cast back.  The whole rule is written
against :mod:`univer_theory.nx`: on the CPU a level is one host call on numpy views of its rows
(:func:`gpu.host.on_host`), on an accelerator the same code runs in torch.
"""
from __future__ import annotations

import itertools

from solvers.slot_rule import slot_weights
from univer_theory.nx import get_backend
from univer_theory.plans import shape_lp
from univer_theory.plans.base import residual_rows, shares_rows, stop_rows
from univer_theory.plans.choose import fill_weights, greedy_fill_weights, single_child_rows, single_child_weights
from univer_theory.univer import SLOT_RULE_MAX_K
from univer_theory.verifiers import normalise_rows

from .condot import condot_weights
from .engine import LevelContext, LevelDecision
from .host import on_host
from .layout import layout_weights
from .unique import unique_rows
from .wor_plans import WALKS, wor_weights


def single_child(ctx: LevelContext, c):
    """``k = 1``: ``(w [R], a [R, V])`` with ``Q_1 = q`` (one-hot top draft token for topk), by
    :func:`univer_theory.plans.choose.single_child_rows` / ``single_child_weights``.  numpy or torch."""
    q1, a = single_child_rows(c, ctx.draft, ctx.process)
    return single_child_weights(c, q1, ctx.children[:, :1])[:, 0], a


def _greedy_fill(c, q, children, child_mask):
    """``(w [R, K], a [R, V])`` of :func:`univer_theory.plans.choose.greedy_fill_plan` for greedy rows with k ≥ 2:
    the fixed top-(k−1) children first, the drawn child z last
    (:func:`~univer_theory.plans.choose.greedy_fill_weights` on the realised tuple, the exact core's formula on every
    tuple).  numpy or torch."""
    nx = get_backend(c, q)
    K = children.shape[1]
    k = child_mask.sum(-1)
    fixed_pos = child_mask & (nx.arange(K, c)[None, :] < (k - 1)[:, None])
    z = nx.take(children, (k - 1)[:, None])
    in_t = nx.put(q < 0, nx.where(fixed_pos, children, z), fixed_pos)     # the fixed tokens T
    w, a = greedy_fill_weights(c, q, in_t, children[:, None, :], k)
    return w[:, 0], a


def _shape_rule_rows(ctx: LevelContext, k, support):
    """``[R]``: nodes small enough for the shape rule's LP (:func:`univer_theory.plans.shape_lp.within_limits`,
    asked once per distinct (support, k) of the level)."""
    nx = get_backend(k)
    sig, inverse = unique_rows(nx.stack([support, k]))
    verdict = [shape_lp.within_limits(s, n, ctx.process) for s, n in nx.to_numpy(sig).tolist()]
    return (nx.index(verdict, k) > 0)[inverse]


def _sizes(nx, k) -> list:
    """The distinct values of the ints ``k`` (a host read: one plan call per child count)."""
    return sorted(set(nx.to_numpy(k).tolist()))


def _iid_wor(ctx: LevelContext, p, q, rho, c, w, a, walk: str) -> None:
    """Plan the iid / wor nodes with k ≥ 2 (module docstring) into ``w``, ``a`` (``c = ρp``; ``walk``: PTS's,
    :func:`univer_rule`).  numpy or torch."""
    nx = get_backend(p, q)
    k = ctx.child_mask.sum(-1)
    shapes = ctx.child_shapes if ctx.child_shapes is not None else 0 * ctx.children
    omega = nx.asarray(shape_lp.position_weights(ctx.shape_keys), p)[shapes]
    equal = ((shapes == shapes[:, :1]) | ~ctx.child_mask).all(-1)
    base = k >= 2
    uneven = base & ~equal
    shaped = uneven & _shape_rule_rows(ctx, k, (q > 0).sum(-1)) if bool(uneven.any()) else uneven
    slot = uneven & (k <= SLOT_RULE_MAX_K)

    for n in _sizes(nx, k[shaped]):
        rows = nx.nonzero(shaped & (k == n))[0]      # the shape rule; a row whose simplex did not finish leaves it
        w_s, a_s, solved = condot_weights(c[rows], q[rows], ctx.children[rows, :n], ctx.process, omega[rows, :n])
        w[rows[solved], :n], a[rows[solved]] = w_s[solved], a_s[solved]   # for the plan the rules below give it
        shaped[rows[~solved]] = False
    rest = base & ~shaped
    if ctx.process == "iid":            # the layout, every k at once (child_mask); on the slot rule's rows too:
        rows = nx.nonzero(rest)[0]          # it is symmetric in its copies, w(σS) = σ·w(S) — one evaluation
        if rows.shape[0]:                   # (every row: views, not gathers)
            rows = slice(None) if rows.shape[0] == k.shape[0] else rows
            w[rows], a[rows] = layout_weights(c[rows], q[rows], ctx.children[rows], ctx.child_mask[rows], p[rows])
    for n in _sizes(nx, k[rest]):
        kids = ctx.children[:, :n]
        rows = nx.nonzero(rest & ~slot & (k == n))[0]
        if ctx.process == "wor" and rows.shape[0]:
            w[rows, :n], a[rows] = wor_weights(c[rows], q[rows], rho[rows], p[rows], kids[rows], walk)
        rows = nx.nonzero(rest & slot & (k == n))[0]
        if rows.shape[0]:               # the plan on every ordering of S (S first), then the slot rule
            perms = list(itertools.permutations(range(n)))
            at = nx.index(perms, kids)
            if ctx.process == "iid":
                w_all = w[rows, :n][:, at]
            else:
                w_all, a[rows] = wor_weights(c[rows], q[rows], rho[rows], p[rows], kids[rows][:, at], walk)
            w[rows, :n] = slot_weights(w_all, kids[rows], q[rows], omega[rows, :n], ctx.process, perms)[0]


def planning_rows(ctx: LevelContext):
    """``(p, q, ρ)`` in float64; float32 rows are put back onto the simplex (float64 ones are planned as given).
    numpy or torch."""
    nx = get_backend(ctx.target)
    p, q, rho = (nx.asarray(x, x) for x in (ctx.target, ctx.draft, ctx.rho))
    if ctx.target.dtype != p.dtype:
        p, q = normalise_rows(p), normalise_rows(q)
    return p, q, rho


def univer_rule(ctx: LevelContext, walk: str = "auto") -> LevelDecision:
    """UniVer at R nodes at once (module docstring); iid / wor / topk / greedy children.  ``walk``: how PTS finds
    θ for wor children, k = 2 and k ≥ 3 alike (:data:`gpu.wor_plans.WALKS`; bind it with ``functools.partial`` to
    pass the rule to :mod:`gpu.engine`).  On the CPU one host call on numpy views of the level
    (:func:`gpu.host.on_host`)."""
    if walk not in WALKS:
        raise ValueError(f"univer_rule: walk must be one of {list(WALKS)}, got {walk!r}")
    return on_host(_univer_rule, ctx, walk)


def _univer_rule(ctx: LevelContext, walk: str) -> LevelDecision:
    """:func:`univer_rule` on one backend (:mod:`univer_theory.nx`)."""
    nx = get_backend(ctx.target)
    p, q, rho = planning_rows(ctx)
    c = rho[:, None] * p
    k = ctx.child_mask.sum(-1)
    w = nx.full(ctx.children.shape, 0.0, p)
    a = nx.zeros_like(p)
    one = k == 1
    if one.any():
        w1, a1 = single_child(LevelContext(rho, p, q, ctx.children, ctx.child_mask, ctx.process), c)
        w[:, 0] = nx.where(one, w1, 0.0)
        a = nx.where(one[:, None], a1, a)
    many = k >= 2
    if ctx.process == "topk":         # the fixed top-k list, filled in drafting order (plans.choose.topk_fill_plan)
        w = nx.where(many[:, None], fill_weights(nx.take(c, ctx.children), many[:, None] & ctx.child_mask), w)
        a = nx.where(many[:, None], nx.scatter_add(nx.zeros_like(a), ctx.children,
                                                   nx.where(ctx.child_mask, w, 0.0)), a)
    elif ctx.process == "greedy":     # closed form (plans.choose.greedy_fill_plan)
        rows = nx.nonzero(many)[0]
        if rows.shape[0]:
            w[rows], a[rows] = _greedy_fill(c[rows], q[rows], ctx.children[rows], ctx.child_mask[rows])
    else:
        _iid_wor(ctx, p, q, rho, c, w, a, walk)
    alpha = a.sum(-1)
    scale = nx.astype(shares_rows(w), ctx.target)
    stop = stop_rows(rho, alpha)
    return LevelDecision(1.0 + 0 * scale, scale, nx.astype(stop, ctx.target),
                         nx.astype(residual_rows(c, a, stop), ctx.target))
