"""Which node plan UniVer uses at a node (theory.md §6.3): the constructions by name and the automatic choice.

* ``k = 1``: the unique plan ``w = min(1, ρp(y)/Q_1(y))`` (``single``; UniVer == BV on chains);
* ``iid``: rule 2, the private-position layout (α*-optimal, any V);
* ``wor`` at ρ = 0: the node is never reached; the plan selects nothing (``unreached``, no rule is built);
* ``wor`` on a draft support of exactly k tokens: every tuple drafts the whole support, and ``w_j(S) = ρp(S_j)``
  (``full``, :func:`full_support_weights`) reaches the ceiling ``ρ·p(supp q)`` of every α: α*(ρ) in closed form;
* ``wor``: k = 2 → rule 3 (``wor_pair``) when feasible, which it is only when its exact α is within
  ``OPTIMALITY_TOL`` of α*(ρ) (checked on the result, so nothing can beat it by more); otherwise the larger
  exact α of rule 4 (``pts``) and rule 5 (``iid_coupling``; not built where PTS comes within ``ALPHA_TIE`` of
  α*_iid(ρ), which the coupling attains exactly, nor past :data:`COUPLING_MAX_COST`: :func:`coupling_can_win`);
  on a small draft support
  (≤ :data:`SMALL_SUPPORT` tokens, its LP of at most :data:`MAX_LP_TUPLES` ordered tuples: :func:`small_lp`)
  rule 1 (``lp``, α*-optimal) replaces them when it is better by more than :data:`ALPHA_TIE`; elsewhere, where
  they fall short of α*(ρ) by more than ``OPTIMALITY_TOL``: first
  rule 7 (``luce``: α* where its fixed-step fit converges — it can stall short, 0.12 on one tied row near the ρ
  where α*(ρ) leaves ρ·p(supp q), docs/deviations.md item 102) when the classes of exchangeable tokens are
  within the Luce budget
  (:func:`~univer_theory.plans.luce.luce_budget`), then, if still short, rule 8 (``first_draw``, the node seen
  through its first draw, :mod:`~univer_theory.plans.first_draw`) when the top token's first-draw probability π
  exceeds the plan's α by more than that (what rule 8's tuples starting with t can give is at most π); each
  replaces the plan when it is better by more than ``OPTIMALITY_TOL``.  Neither is built when the plan is within
  ``OPTIMALITY_TOL`` of α*(ρ), which gives the same choice as building them always (their α never exceeds α*);
* ``topk``: the fixed top-k list filled in drafting order (``fill``, closed form, α*-optimal, exact in Fraction
  mode); ``greedy``: the closed-form ``greedy_fill`` (α*-optimal);
* rule 6 (``tv``) as the last resort.
"""
from __future__ import annotations

import math

import numpy as np

from ..alpha_star import alpha_star, wor_clocks_max_tokens
from ..nx import get_backend
from ..orders import top_tokens
from ..processes import falling, tuple_law
from ..validation import Unsupported
from .base import NodePlan
from .first_draw import first_draw_gate, first_draw_marginal, first_draw_rows, first_draw_weights
from .iid_coupling import iid_coupling_plan
from .layout import layout_plan
from .lp_plan import lp_plan, table_plan
from .luce import luce_budget, luce_plan, token_classes
from .node_inputs import check_node_inputs
from .pts import pts_plan
from .tv_plan import tv_plan
from .wor_pair import OPTIMALITY_TOL, wor_pair_plan

#: Every construction by its public name, with the draft processes it handles.
CONSTRUCTIONS = {
    "fill": (lambda p, q, rho, k, process: topk_fill_plan(p, q, rho, k), ("topk",)),
    "greedy_fill": (lambda p, q, rho, k, process: greedy_fill_plan(p, q, rho, k), ("greedy",)),
    "layout": (layout_plan, ("iid",)),
    "lp": (lp_plan, ("iid", "wor", "topk", "greedy")),
    "tv": (tv_plan, ("iid", "wor")),
    "wor_pair": (wor_pair_plan, ("wor",)),
    "pts": (pts_plan, ("wor",)),
    "iid_coupling": (iid_coupling_plan, ("wor",)),
    "luce": (luce_plan, ("wor",)),
    "first_draw": (lambda p, q, rho, k, process: first_draw_plan(p, q, rho, k), ("wor",)),
    "full": (lambda p, q, rho, k, process: full_support_plan(p, q, rho, k), ("wor",)),
}

#: Draft supports up to this size may use the exact LP (rule 1) under ``wor`` …
SMALL_SUPPORT = 8
#: … when its ordered tuples number at most this (k ≥ 5 children on 7–8 tokens would make an LP of 2 520–6 720
#: tuples: seconds in HiGHS, gigabytes as the batched layer's dense tableau).
MAX_LP_TUPLES = 2048
#: α differences below this count as ties (the earlier, closed-form construction wins).
ALPHA_TIE = 1e-12
#: How far rule 5's float α may sit from the closed-form α*_iid(ρ) it attains (measured ≤ 6e-15 on the test grid's
#: rows, V ≤ 300; checked to this bound there): the margin of :func:`coupling_can_win`.  On whole tied rows (V = 16 384
#: – 49 152, a draft that is the target cut to its top m tokens) the closed form's prefix sums drift from the
#: coupling's α by −1.0e-12 … +4.8e-13 (the coupling's is the exact α*_iid to 1e-17): there the gate can keep PTS
#: where the coupling is better by up to ~1e-12 (both lossless; a margin that wide would build the coupling at
#: almost every node where PTS reaches α*, a layout per node on whole rows).
COUPLING_GAP = 1e-13
#: Largest ``2^(k−1)·k²·m`` (k children, m drafted tokens) rule 5 is built on: its layouts cover the 2^(k−1)
#: multisets of virtual draws over the support and its chain has a state per subset of the children, so one
#: whole-row SmolLM2 node (m = 49 152) took 0.5 s at k = 8, 14 s at k = 12 and ran out of memory at k = 100, and
#: k = 19 on 32 tokens 38 s.  Wider nodes take PTS (rule 4, lossless at any k); k = 8 on whole rows stays within it.
COUPLING_MAX_COST = 2 ** 29


def small_lp(support, k: int):
    """Where rule 1 is tried under ``wor``: at most :data:`SMALL_SUPPORT` drafted tokens (``support``, an int or
    integer arrays, numpy or torch) whose ordered k-tuples number at most :data:`MAX_LP_TUPLES` (counted on the
    support clipped to SMALL_SUPPORT: 6000·5999·…·5989 wraps an int64)."""
    clipped = get_backend(support).minimum(support, SMALL_SUPPORT)
    return (support <= SMALL_SUPPORT) & (falling(clipped, k) <= MAX_LP_TUPLES)


def single_child_rows(c, q, process: str):
    """k = 1 on float rows ``c = ρp``, ``q`` ``[..., V]`` (numpy or torch, :mod:`univer_theory.nx`):
    ``(Q_1, a = min(c, Q_1))``, ``Q_1 = q`` for iid / wor / greedy, the point mass on the top draft token for
    topk."""
    nx = get_backend(c, q)
    if process == "topk":
        q = nx.put(nx.zeros_like(q), top_tokens(q, 1), 1.0)
    return q, nx.minimum(c, q)


def single_child_weights(c, q1, y):
    """k = 1: ``w(y) = min(1, c(y)/Q_1(y))`` (0 where ``Q_1(y) = 0``) at the tokens ``y [..., n]``; the ratio is
    formed only below 1 (a subnormal ``Q_1(y)`` would overflow it)."""
    nx = get_backend(c, q1, y)
    qy, cy = nx.take(q1, y), nx.take(c, y)
    below = (qy > 0) & (cy < qy)
    return nx.where(below, cy / nx.where(below, qy, 1.0), nx.where(qy > 0, 1.0, 0.0))


def fill_weights(cy, mask=None):
    """topk's fill along the fixed list in drafting order, ``cy = ρp(y_j)`` ``[..., K]``:
    ``w_j = max(0, min(cy_j, 1 − Σ_{l<j} w_l))`` (0 where ``mask`` is False); numpy or torch."""
    nx = get_backend(cy)
    used, out = nx.zeros_like(cy[..., 0]), []
    for j in range(cy.shape[-1]):
        wj = nx.maximum(nx.minimum(cy[..., j], 1.0 - used), 0.0)
        out.append(wj if mask is None else nx.where(mask[..., j], wj, 0.0))
        used = used + out[-1]
    return nx.stack(out)


def greedy_fill_rows(c, q, fixed):
    """greedy, k ≥ 2, on float rows ``c = ρp``, ``q`` ``[..., V]`` with the fixed list T as a mask ``fixed``
    (numpy or torch): ``(r, last, share, a)`` of :func:`greedy_fill_plan` — ``r = q/q(V∖T)`` off T,
    ``last[z] = w_k(S_z) = m_z/r(z)``, ``share = φ·c/c(T)`` on T (child t_i of ``S_z`` gets
    ``share(t_i)·(1 − last[z])``) and the marginal ``a = r·last + share·Σ_z r(z)(1 − last[z])``, before the
    repair that makes ``a ≤ ρp`` exact."""
    nx = get_backend(c, q)
    off = (q > 0) & ~fixed
    qo = nx.where(off, q, 0.0)
    r = qo / nx.sum(qo, keepdims=True)
    m = nx.minimum(r, nx.where(off, c, 0.0))
    last = nx.where(r > 0, m / nx.where(r > 0, r, 1.0), 0.0)
    spare = nx.sum(r - m)
    ct = nx.where(fixed, c, 0.0)
    total = nx.sum(ct, keepdims=True)
    phi = nx.where(spare > 0, nx.minimum(total[..., 0] / nx.where(spare > 0, spare, 1.0), 1.0), 0.0)
    share = nx.where(total > 0, phi[..., None] * ct / nx.where(total > 0, total, 1.0), 0.0)
    return r, last, share, r * last + nx.sum(r * (1.0 - last), keepdims=True) * share


def single_child_plan(target_probs, draft_probs, rho, process) -> NodePlan:
    """k = 1: ``w(y) = min(1, ρp(y)/Q_1(y))``, ``a = min(ρp, Q_1)`` (:func:`single_child_rows`,
    :func:`single_child_weights`; Fraction rows exactly, by a separate computation that checks them).

    ``Q_1 = q`` for iid / wor / greedy; the point mass on the top draft token for topk.
    """
    p, q = np.asarray(target_probs), np.asarray(draft_probs)
    if p.dtype == object:           # Fraction rows: the exact computation, the checker of the float path
        if process == "topk":
            ((top,), _), = tuple_law(q, 1, "topk")
            q = q * 0
            q[top] = 1
        c = rho * p
        a = np.minimum(c, q)

        def select(S):
            (y,) = S
            # Q_1 = 0: w = 0; a Fraction 1, not the int, where ρp(y) ≥ Q_1(y)
            return np.array([min(0 * c[y] + 1, c[y] / q[y]) if q[y] > 0 else 0 * c[y]], dtype=p.dtype)

        return NodePlan("single", rho, p, a, select)
    c = float(rho) * np.asarray(p, dtype=np.float64)
    q1, a = single_child_rows(c, np.asarray(q, dtype=np.float64), process)
    return NodePlan("single", rho, p, a, lambda S: single_child_weights(c, q1, np.asarray(S, dtype=np.int64)))


def topk_fill_plan(target_probs, draft_probs, rho, k: int) -> NodePlan:
    """``topk``: the tuple is the fixed list D of the k most likely draft tokens (``Q_k(D) = 1``); fill it in
    drafting order, ``w_j = min(ρp(y_j), 1 − Σ_{l<j} w_l)`` (:func:`fill_weights`), so ``a(y_j) = w_j ≤ ρp(y_j)``
    and ``α = min(1, ρp(D)) = α*(ρ)``.  Any other tuple has probability 0 and gets ``w = 0``.  Fraction rows
    exactly, by a separate computation that checks the float path.
    """
    p = np.asarray(target_probs)
    (top, _), = tuple_law(np.asarray(draft_probs), k, "topk")
    c = rho * p
    if p.dtype == object:           # Fraction rows: the exact fill, the checker of fill_weights
        w, used = [], 0 * c[0]
        for y in top:
            w.append(max(0 * used, min(c[y], 1 - used)))
            used = used + w[-1]
        w = np.array(w, dtype=p.dtype)
    else:
        w = fill_weights(c[list(top)])
    a = 0 * c
    a[list(top)] = w

    def select(S):
        return w.copy() if tuple(int(y) for y in S) == tuple(top) else 0 * w

    return NodePlan("fill", rho, p, a, select)


def greedy_fill_plan(target_probs, draft_probs, rho, k: int) -> NodePlan:
    """``greedy``, k ≥ 2: tuples ``S_z = (t_1..t_{k−1}, z)`` — the fixed top-(k−1) list T, then z drawn from q off T
    with ``r(z) = q(z)/q(V∖T)``.  With ``c = ρp``: the last child takes what its own token allows,
    ``w_k(z) = m_z/r(z)``, ``m_z = min(r(z), c(z))``; the fixed children share every tuple's remaining capacity
    ``1 − w_k(z)`` in proportion to ``c(t_i)``, scaled by ``φ = min(1, c(T)/L)``, ``L = Σ_z (r(z) − m_z)``.  Then
    ``α = Σ_z m_z + min(c(T), L) = α*(ρ)`` (moving mass from a z to the fixed list is one-for-one, so no plan
    does better).  Float rows: :func:`greedy_fill_weights` on every tuple, as the batched layer on its realised
    one.
    """
    p = np.asarray(target_probs, dtype=np.float64)
    q = np.asarray(draft_probs, dtype=np.float64)
    fixed = [int(t) for t in top_tokens(q, k - 1)]
    in_t = np.zeros(q.shape, dtype=bool)
    in_t[fixed] = True
    z = np.flatnonzero((q > 0) & ~in_t)
    tuples = np.concatenate([np.broadcast_to(np.asarray(fixed, dtype=np.int64), (z.size, k - 1)), z[:, None]], 1)
    w, a = greedy_fill_weights(float(rho) * p[None], q[None], in_t[None], tuples[None], np.array([k]))
    return table_plan("greedy_fill", w[0], tuples, a[0], p, rho)


def greedy_fill_weights(c, q, fixed, tuples, k):
    """:func:`greedy_fill_plan` on rows ``c = ρp``, ``q`` ``[R, V]`` with their fixed lists T as the mask ``fixed``:
    ``(w [R, n, K], a [R, V])`` on the tuples ``tuples [R, n, K]`` of each row (the fixed children at positions
    ``j < k − 1``, z at ``k − 1``, anything beyond ``k [R]``) — ``w_j = share(t_j)·(1 − last[z])``,
    ``w_{k−1} = last[z]`` (:func:`greedy_fill_rows`), then the repair: every weight and the marginal of a token
    with ``a > c`` (by round-off) scaled by ``c/a``, so that ``a ≤ ρp`` holds exactly.  numpy or torch."""
    nx = get_backend(c, q)
    R, n, K = tuples.shape
    _, last, share, a = greedy_fill_rows(c, q, fixed)
    shrink = nx.where(a > c, c / nx.where(a > c, a, 1.0), 1.0)
    j = nx.arange(K, c)
    pos = (k - 1)[:, None, None]
    z = nx.sum(nx.where(j == pos, tuples, 0))                                  # [R, n]
    flat = tuples.reshape(R, n * K)
    at = lambda x: nx.take(x, flat).reshape(R, n, K)                          # noqa: E731
    w = nx.where(j < pos, (1 - nx.take(last, z))[..., None] * at(share), nx.where(j == pos, at(last), 0.0))
    return w * at(shrink), a * shrink


def choose_plan(target_probs, draft_probs, rho, k: int, process: str) -> NodePlan:
    """The automatic choice of the module docstring; ``plan.construction`` records the rule used."""
    if k == 1:
        return single_child_plan(target_probs, draft_probs, rho, process)
    if process == "iid":
        plan = layout_plan(target_probs, draft_probs, rho, k, process)
    elif process == "wor" and float(rho) == 0:
        plan = unreached_plan(target_probs, k)
    elif process == "wor" and np.count_nonzero(np.asarray(draft_probs, dtype=np.float64)) == k:
        plan = full_support_plan(target_probs, draft_probs, rho, k)
    elif process == "wor":
        plan = wor_pair_plan(target_probs, draft_probs, rho, k, process) if k == 2 else None
        if plan is None:
            plan = _pts_or_coupling(target_probs, draft_probs, rho, k)
            q = np.asarray(draft_probs, dtype=np.float64)
            if small_lp(np.count_nonzero(q), k):
                plan = _best([plan, lp_plan(target_probs, draft_probs, rho, k, process)])
            else:
                plan = _short_of_alpha_star(plan, target_probs, q, rho, k)
    elif process == "topk":
        plan = topk_fill_plan(target_probs, draft_probs, rho, k)
    else:
        plan = greedy_fill_plan(target_probs, draft_probs, rho, k)
    if plan is None:
        plan = tv_plan(target_probs, draft_probs, rho, k, process)
    if plan is None:
        raise Unsupported(f"choose_plan: no UniVer construction for process {process!r} at k = {k}")
    return plan


def build_plan(construction: str, target_probs, draft_probs, rho, k: int, process: str) -> NodePlan:
    """A forced construction (``"auto"`` = :func:`choose_plan`); k = 1 always uses :func:`single_child_plan`.

    Raises NotImplementedError when the construction does not handle ``process`` or returns no plan here
    (e.g. ``wor_pair`` infeasible on this node), ValueError on bad node inputs (:func:`check_node_inputs`).
    """
    check_node_inputs("build_plan", target_probs, draft_probs, rho, k, process)
    if construction == "auto":
        return choose_plan(target_probs, draft_probs, rho, k, process)
    if k == 1:
        return single_child_plan(target_probs, draft_probs, rho, process)
    fn, processes = CONSTRUCTIONS[construction]
    plan = fn(target_probs, draft_probs, rho, k, process) if process in processes else None
    if plan is None:
        raise Unsupported(f"build_plan: construction {construction!r} gives no plan for process "
                          f"{process!r}, k = {k} on this node")
    return plan


def under_ceiling(c, q, alpha):
    """``[...]`` bool: where a plan of acceptance ``α`` on rows ``c = ρp``, ``q`` ``[..., V]`` may still fall short of
    α*(ρ) by more than ``OPTIMALITY_TOL``: ``α < ρ·p(supp q) − OPTIMALITY_TOL/2``.  Every plan's α, α*(ρ) included,
    is at most ``ρ·p(supp q) = Σ_{q>0} c`` (``a ≤ ρp``, and ``a = 0`` off the draft support), so elsewhere α is
    within ``OPTIMALITY_TOL/2`` of α*(ρ) — and of its float closed form, within 1e-12 of the LP — and rules 7 and
    8 would not be built: α*(ρ) need not be formed.  numpy or torch."""
    return alpha < get_backend(c, q).sum(support_marginal(c, q)) - OPTIMALITY_TOL / 2


def support_marginal(c, q):
    """``c = ρp`` on the draft support, 0 off it ``[..., V]``: the marginal of :func:`full_support_weights` and,
    summed, the ceiling ``ρ·p(supp q)`` of every α (:func:`under_ceiling`).  numpy or torch."""
    return get_backend(c, q).where(q > 0, c, 0.0)


def alpha_star_computable(m, k: int):
    """Whether rules 7 and 8 can ask for α*(ρ) under ``wor`` with k children on rows of m drafted tokens: k = 2 is a
    closed form, wider nodes a clock integral over the drafted tokens, within float64's range only so far (k = 16
    on 300 tokens is beyond it, :func:`~univer_theory.alpha_star.wor_clocks_max_tokens`); beyond, those rules are
    not tried.  ``m``: an int, or ints one per row (numpy or torch; bools then)."""
    return m <= (math.inf if k <= 2 else wor_clocks_max_tokens(k))


def _short_of_alpha_star(plan, target_probs, q, rho, k: int) -> NodePlan:
    """wor on a large support: rules 7, then 8, where ``plan`` falls short of α*(ρ) by more than ``OPTIMALITY_TOL``
    (module docstring), where α*(ρ) is computable (:func:`alpha_star_computable`); it is computed only when the plan
    is below the ceiling of every α (:func:`under_ceiling`, one pass, asked first) and one of their cheap gates
    passes."""
    if not alpha_star_computable(int(np.count_nonzero(q)), k):
        return plan
    p = np.asarray(target_probs, dtype=np.float64)
    c = float(rho) * p
    alpha = float(plan.alpha)
    if not under_ceiling(c, q, alpha):
        return plan
    first = bool(first_draw_gate(q, alpha, OPTIMALITY_TOL))
    luce = luce_budget(token_classes(q, c)[1], k)
    if not (first or luce):
        return plan
    star = float(alpha_star(target_probs, q, k, "wor", rho)) - OPTIMALITY_TOL
    if luce and alpha < star:
        plan = _best([plan, luce_plan(target_probs, q, rho, k, "wor")], OPTIMALITY_TOL)
    if first and float(plan.alpha) < star:
        plan = _best([plan, first_draw_plan(target_probs, q, rho, k)], OPTIMALITY_TOL)
    return plan


def first_draw_plan(target_probs, draft_probs, rho, k: int) -> NodePlan:
    """Rule 8, wor, k ≥ 2 (:mod:`~univer_theory.plans.first_draw`): on tuples whose first child is the top draft
    token t, :func:`choose_plan`'s (k − 1)-child plan on the others against ``c'``, then t takes what is left; the
    other tuples fill the room that leaves (child 1, or t in second place).  ``info["inner"]`` is the inner plan."""
    p, q, rho = check_node_inputs("first_draw_plan", target_probs, draft_probs, rho, k, "wor")
    if k < 2:
        raise ValueError(f"first_draw_plan: needs k ≥ 2 children, got k = {k}")
    t, pi, q_in, rho_in, p_in = first_draw_rows(rho * p, q)
    inner = choose_plan(p_in, q_in, float(rho_in), k - 1, "wor")
    a, tau, u, v = first_draw_marginal(rho * p, q, t, pi, inner.marginal)
    top = int(t[0])

    def select(S):
        first = int(S[0]) == top
        w_in = inner.select(tuple(S[1:])) if first else np.zeros(k - 1)
        return first_draw_weights(np.asarray(first), np.asarray(w_in, dtype=np.float64), tau, u[int(S[0])],
                                  np.asarray(int(S[1]) == top), v)

    return NodePlan("first_draw", rho, p, a, select, {"inner": inner})


def full_support_weights(c, children):
    """``w_j(S) = c(S_j)`` for ``children [..., k]`` (indices into rows ``c = ρp [..., V]``, ``[R, k]`` or
    ``[R, T, k]`` against ``[R, V]``, or one tuple against one row): the plan of a wor node whose draft support is
    exactly its k tokens.  Every tuple is an ordering of that support, so ``Σ_j w_j(S) = ρ·p(supp q) ≤ ρ`` and
    each token's marginal is ``a(y) = c(y)·Σ_{S∋y} Q_k(S) = c(y)``: ``α = ρ·p(supp q)``, the ceiling of every α
    (:func:`under_ceiling`), so α = α*(ρ) with no float gap (rule 3's families reached it only to ~1e-9 on a
    confident V = 2 row).  numpy or torch."""
    nx = get_backend(c)
    if children.ndim == c.ndim:
        return nx.take(c, children)
    return nx.take(c, children.reshape(children.shape[0], -1)).reshape(children.shape)


def full_support_plan(target_probs, draft_probs, rho, k: int) -> NodePlan:
    """wor, draft support of exactly k tokens: :func:`full_support_weights`, ``a = ρp`` on the support."""
    p, q, rho = check_node_inputs("full_support_plan", target_probs, draft_probs, rho, k, "wor")
    q = np.asarray(q, dtype=np.float64)
    if np.count_nonzero(q) != k:
        return None
    c = float(rho) * np.asarray(p, dtype=np.float64)
    return NodePlan("full", rho, p, support_marginal(c, q), lambda S: full_support_weights(c, np.asarray(S, dtype=np.int64)))


def unreached_plan(target_probs, k: int) -> NodePlan:
    """ρ = 0 (wor): the node is never reached and every plan's marginal is 0 (``a ≤ ρp``); its plan selects no
    child (``w ≡ 0``) and none of rules 1–8 is built — a rule-3 child of a mixed pair, and its whole subtree, has
    ρ = 0."""
    p = np.asarray(target_probs, dtype=np.float64)
    return NodePlan("unreached", 0.0, p, np.zeros(p.size), lambda S: np.zeros(k))


def coupling_can_win(star_iid, alpha_pts, k: int, support):
    """Where rule 5 is built for a node of ``k`` children on ``support`` drafted tokens: within
    :data:`COUPLING_MAX_COST` (``2^(k−1)·k²·support``) and where it can beat PTS's α by more than ``ALPHA_TIE``,
    ``α*_iid(ρ) > α_PTS + ALPHA_TIE − COUPLING_GAP``.  The coupling attains α*_iid(ρ) exactly (theory.md §6.3
    rule 5; its float α within :data:`COUPLING_GAP` of the closed form's), so elsewhere it would lose or tie and
    is not built: the choice is the same (but on whole tied rows, where the closed form drifts ~1e-12:
    :data:`COUPLING_GAP`).  Floats or arrays (numpy or torch)."""
    affordable = support <= COUPLING_MAX_COST // (2 ** (k - 1) * k * k)
    return (star_iid > alpha_pts + (ALPHA_TIE - COUPLING_GAP)) & affordable


def _pts_or_coupling(target_probs, draft_probs, rho, k: int) -> NodePlan:
    """Rules 4 and 5 (wor): the larger α, PTS on ties within ``ALPHA_TIE``; the coupling built only where it can
    win (:func:`coupling_can_win`)."""
    pts = pts_plan(target_probs, draft_probs, rho, k, "wor")
    star = float(alpha_star(target_probs, draft_probs, k, "iid", rho))
    if not coupling_can_win(star, float(pts.alpha), k, int(np.count_nonzero(np.asarray(draft_probs)))):
        return pts
    return _best([pts, iid_coupling_plan(target_probs, draft_probs, rho, k, "wor")])


def _best(plans, tie: float = ALPHA_TIE):
    """The plan with the largest α; on ties (within ``tie``) the earlier one."""
    best = None
    for plan in plans:
        if plan is not None and (best is None or float(plan.alpha) > float(best.alpha) + tie):
            best = plan
    return best
