"""Rule 3 of theory.md §6.3 / §6.5: closed-form α*-optimal plans for ``wor`` with k = 2 children, any V.

Max-flow/min-cut structure of CondOT(ρ) (§4.2): with the optimal cut ``A*`` (lowest p/q ratios) and
``H = V∖A*``, c = ρp, a plan is α*-optimal iff (i) every pair meeting both sides selects its H child with
weight 1, (ii) pairs inside H select an H child with total weight 1 and ``a ≤ c`` on H, (iii) pairs inside
A* give ``a = c`` on A*.  Within a side s (H or A*), a pair ``(y_1, y_2)`` takes child 2 with probability
``(1 − β(y_1))·γ(y_2)`` and child 1 otherwise; the base marginal of x ∈ s is

.. math::  b(x) = q_x\\Big[X_x + \\frac{q(s) − q_x − (1−β_x)G}{1 − q_x} + γ_x E\\Big],
           \\quad G = \\sum_{s} qγ,\\quad E = \\sum_{s} \\frac{q(1−β)}{1−q},

with ``X_x = q(A*)/(1 − q_x) + Σ_{y∈A*} q_y/(1 − q_y)`` on H (pairs meeting A*) and ``X_x = 0`` on A*
(``1 − q_x`` is evaluated as the rest mass ``R_x = Σ_{y≠x} q_y``, as in the wor tuple law).  H needs
``b ≤ c``, A* needs ``b ≥ c``; then every token is thinned by ``t = min(1, c/b)`` (``a = c`` on A*; on H this
only absorbs round-off).  Two families, each settled by a monotone piecewise-linear 1-D equation per side,
solved exactly on its pieces (:func:`first_crossing`), and on A* a third, a sequential claim:

* **β-family** (γ ≡ 1, §6.5): for a trial ``E`` every β_x is ``clip((c_x − lo_x(E))/(hi_x(E) − lo_x(E)))``
  where ``lo/hi`` are b at β_x = 0/1; ``Σ_x clip(c_x, lo_x(E), hi_x(E))`` increases in E and equals the
  side's fixed total P exactly when E is self-consistent.  Feasible iff the clip was not forced.
* **yield/accept** (§6.5): from β ≡ 1 (child 1 always), tokens on the wrong side of their bound
  ("givers", γ = 0) yield to child 2, tokens on the right side ("takers", β = 1) accept it
  (``b_x = b_x(β≡1, γ≡0) − G·q_x(1−β_x)/(1−q_x) + E·q_xγ_x``): on H givers shed exactly their excess and
  E is the root of ``Σ_takers min(q_x E, room_x) = D``; on A* takers receive exactly their deficit at the
  smallest E with γ ≤ 1.
* **claim** (A* only; this toolkit's addition, docs/deviations.md item 55): in ratio order, each token takes the
  least share ``t_x`` of every pair it forms with a later token that brings b up to its cap, and leaves the rest
  to that later token (:func:`claim_family`).  The product families fail on A* where a few high-ratio tokens
  need more than a product form ``(1 − β(y_1))γ(y_2)`` can route to them (measured: 33 nodes of the SmolLM2 and
  Zipf-row wor trees of the benchmark, 3–47 tokens short by up to 5e-4); the claim meets ``b ≥ c`` on 30 of them.

Whenever both sides are feasible the plan attains α*_wor(ρ) (to float round-off); otherwise the rule
returns ``None`` and the caller falls through to another construction.  "Feasible" is also checked on the
result: a plan whose exact α (after the thinning) is below α*(ρ) by more than :data:`OPTIMALITY_TOL` is
declared infeasible — on confident rows (one token holding all but ~1e-14 of q) the side sums cancel and the
families' parameters are round-off, which the thinning turns into a lossless but useless plan.  Rows whose
drafted odds q_x/R_x exceed :data:`MAX_ODDS` (top above ~1 − 9e-7) are declared infeasible outright: there that
round-off can reach ``OPTIMALITY_TOL``, and the verdict would depend on a backend's order of summation.  Measured
(Dirichlet p, q): feasible in 87–99% of instances for V ≤ 6, but only ~40% for flat rows with V = 200.

**One implementation, batched** (:mod:`univer_theory.nx`): every function here takes rows ``[R, V]`` — numpy
arrays (:func:`wor_pair_plan`, the exact core's float path, a batch of one) or torch tensors on any device
(:func:`gpu.wor_plans.wor_pair_weights`, the R nodes of a level).  :func:`pair_rule` builds the plan from the
cut (``alpha_star_and_cut`` / ``gpu.wor_plans.wor_cut_k2``), :func:`pair_weights` evaluates it on tuples.
Each side runs on its own tokens only, compacted in token-id order (:func:`side_columns`, padded to the widest
row; the padding is masked to exact zeros, but the sums' round-off follows the padded width, so a row's last bits
depend on its batch).  On numpy rows :func:`pair_rule` runs as one compiled pass per row with the array form's
floats on that row alone, bit for bit (:mod:`.wor_pair_rows`: the array form's ~300 operations a level cost ~1 ms
in dispatch; a row's floats are its own, the exact core's); the array form is torch's, and is checked against
it.  The checks of these floats stay apart: exact enumeration of the tuple law and the brute-force α*(ρ) over all
cuts (``tests/theory/test_wor_plans.py``).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from ..alpha_star import alpha_star_and_cut
from ..nx import NUMPY, array_module, get_backend
from ..orders import order_ranks, ratio_argsort
from .base import NodePlan
from .node_inputs import check_node_inputs
from .wor_pair_rows import pair_rule_rows

#: Slack allowed on ``b ≤ c`` (H) / ``b ≥ c`` (A*) before a family is declared infeasible, relative to the
#: side's scale ``max(1, max c, max q·q(s)/R)`` (:func:`side_tolerance`): float round-off of O(V) sums whose
#: terms reach that scale — ~1e5 when one token holds all but 1e-5 of q, where b is known to ~1e-11 only.
#: Violations within it are removed by the thinning ``t = min(1, c/b)``, which keeps the plan exactly lossless
#: and costs α at most this much.  Also the (absolute) tolerance of the 1-D searches (:func:`first_crossing`).
FEASIBILITY_TOL = 1e-13
#: A plan counts as α*-optimal (so the rule returns it) when ``α ≥ α*(ρ) − OPTIMALITY_TOL``.
OPTIMALITY_TOL = 1e-9
#: The families cancel terms of the drafted tokens' odds ``q_x/R_x`` (~1/(1 − q_top) on a confident row), so their
#: α carries a round-off of ~ε·max odds: a row is left to the other rules where that can reach ``OPTIMALITY_TOL``
#: (a factor 4 of margin), so that the verdict does not depend on the order of a backend's sums (numpy's pairwise
#: sums and torch's disagreed on ~5% of rows of top 1 − 1e-7 … 1 − 1e-12, by up to 7e-7 of α).
MAX_ODDS = OPTIMALITY_TOL / (4 * 2.0 ** -52)
#: The families, tried in this order on each side (``family`` codes of :func:`solve_side`: their index); the
#: claim family on A* only.
FAMILIES = ("beta", "yield_accept", "claim")


def _arange(n: int, like):
    """``0, …, n − 1`` as an index array beside ``like``."""
    xp = array_module(like)
    return xp.arange(n) if xp is np else xp.arange(n, device=like.device)


def quiet(x):
    """numpy's floating-point warnings off (for values computed on lanes that are then masked); nothing for
    torch (which does not warn)."""
    return np.errstate(all="ignore") if get_backend(x) is NUMPY else contextlib.nullcontext()


def exclusive_cumsum(x, reverse: bool = False, axis: int = -1):
    """``Σ_{j<i} x_j`` (``Σ_{j>i}`` with ``reverse``, summed from the end) along the last axis (or ``axis``: the
    token axis of ``gpu.wor_plans``' ``[R, m, t]`` clock arrays): sequential sums (the backend's
    ``exclusive_cumsum``, :func:`univer_theory.nx.shifted_cumsum`)."""
    return get_backend(x).exclusive_cumsum(x, reverse, axis)


def leave_one_out(v, axis: int = -1):
    """``Σ_{y≠x} v_y`` for every x along the last axis (or ``axis``), from prefix and suffix sums (no
    cancellation for v ≥ 0)."""
    return exclusive_cumsum(v, axis=axis) + exclusive_cumsum(v, reverse=True, axis=axis)


def safe_div(a, b, where, fill: float = 0.0):
    """``a/b`` where ``where`` holds, ``fill`` elsewhere (no division there)."""
    nx = get_backend(a, b)
    return nx.where(where, a / nx.where(where, b, 1.0), fill)


def first_crossing(flo, lo, hi, knots, dslope, slope, active, start_tol=FEASIBILITY_TOL):
    """Per row, the smallest ``E`` in ``[lo, hi]`` with ``f(E) ≥ −FEASIBILITY_TOL`` for a continuous,
    non-decreasing, piecewise-linear ``f`` with ``f(lo) ≤ 0 ≤ f(hi)`` — exactly, from its pieces: ``flo = f(lo)``
    ``[R]`` (evaluated by the caller), its slope ``slope [R]`` just after ``lo`` before any knot, and the slope
    changes ``dslope [R, n]`` at ``knots [R, n]`` (any order; knots outside ``[lo, hi]`` act at its ends, so an
    infinite one is harmless).  With the knots sorted, ``f`` at each is ``f(lo)`` plus the prefix sums of slope ×
    gap; the crossing lies on the piece after the last knot still below ``−FEASIBILITY_TOL`` and is interpolated
    there (that piece's slope is positive: ``f`` rises across it).  ``lo`` itself where ``f(lo) ≥ −start_tol``;
    ``hi`` on rows not ``active``.

    The tolerances make the answer independent of the summation order where ``f`` has a plateau at 0 (the
    β-family when p = q and ρ = 1: every plateau point solves it, and the float sign of ``f`` is round-off
    noise): the search takes the plateau's start.  The plateau starts at ``lo``, and the β-family passes its
    side's scaled tolerance (:func:`side_tolerance`) as ``start_tol``, since its sums' round-off grows with
    their terms (~1e-11 when one token holds all but 1e-5 of q).  One sort of the knots and a few prefix sums,
    where a bracketing search (ITP, before) evaluated ``f`` 10–45 times per row (docs/deviations.md item 46)."""
    nx = get_backend(knots)
    order = nx.argsort(knots)                           # stable: tied knots' slope changes summed in index order
    x = nx.minimum(nx.maximum(nx.take(knots, order), lo[..., None]), hi[..., None])
    E = _crossing(x, nx.take(dslope, order), slope, flo, lo)
    return nx.where(active & (flo < -start_tol), nx.minimum(nx.maximum(E, lo), hi), nx.where(active, lo, hi))


def _crossing(x, d, slope, flo, lo):
    """:func:`first_crossing`'s crossing before its clamp, from the knots ``x [R, n]`` (sorted, clamped to the
    bracket) and their slope changes ``d``: the slope after each knot ``slope + Σ_{≤i} d``, f at each knot
    ``f(lo) + Σ_{≤i} slope·gap`` (cumulative sums), the first knot with ``f ≥ −FEASIBILITY_TOL`` and the
    interpolation on the piece before it.  numpy or torch."""
    nx = get_backend(x)
    after = slope[..., None] + nx.cumsum(d)                                 # the slope after each knot
    before = nx.concat([slope[..., None], after[..., :-1]])
    f_at = flo[..., None] + nx.cumsum(before * (x - nx.concat([lo[..., None], x[..., :-1]])))
    reached = f_at >= -FEASIBILITY_TOL
    n = x.shape[-1]
    piece = nx.where(reached.any(-1), nx.argmax(reached)[..., 0], n)[..., None]     # [R, 1]: after knot piece − 1
    x0, f0 = (nx.take(nx.concat([a[..., None], b]), piece)[..., 0] for a, b in ((lo, x), (flo, f_at)))
    rise = nx.take(nx.concat([before, after[..., -1:]]), piece)[..., 0]
    return nx.where(rise > 0, x0 + (-FEASIBILITY_TOL - f0) / nx.where(rise > 0, rise, 1.0), x0)


def side_columns(mask):
    """The tokens of a side ``mask [R, V]`` compacted, in token-id order: ``(cols [R, M], on [R, M], pos [R, V])``
    with M the most tokens of any row (at least 1), ``on`` the real entries (the padding reads token 0) and
    ``pos`` each side token's column (clipped to ``[0, M)`` elsewhere) — O(V), no sort.  ``int(M)`` is a host
    read (a data-dependent shape)."""
    nx = get_backend(mask)
    count = mask.sum(-1)
    M = max(1, int(count.max()))
    pos = mask.cumsum(-1) - 1
    V = mask.shape[-1]
    tokens = _arange(V, pos) + 0 * pos
    slots = nx.put(0 * pos[..., :1] + _arange(M + 1, pos), nx.where(mask, pos, M), tokens)[..., :M]
    on = _arange(M, pos) < count[..., None]
    return nx.where(on, slots, 0), on, nx.clip(pos, 0, M - 1)


@dataclass(frozen=True)
class Side:
    """One side of the cut on rows ``[R, M]`` (:func:`side_columns`): its drafted tokens' q, rest mass
    ``R_x = Σ_{y≠x} q_y`` (all of V), caps c, cross term X, ``on`` (the real entries; q = c = X = 0 and R = 1
    elsewhere), the bound's direction (``upper``: b ≤ c on H; else b ≥ c on A*) and ``num``, the numerator of
    the claim family's ratio order (p, so that tokens whose p/q tie exactly keep their id order at every ρ; c when
    not given)."""

    q: object
    rest: object
    c: object
    cross: object
    on: object
    upper: bool
    num: object

    @classmethod
    def of(cls, q, rest, c, cross, on, upper: bool, num=None) -> "Side":
        nx = get_backend(q)
        return cls(nx.where(on, q, 0.0), nx.where(on, rest, 1.0), nx.where(on, c, 0.0), nx.where(on, cross, 0.0),
                   on, upper, nx.where(on, c if num is None else num, 0.0))


def side_tolerance(side: Side):
    """``FEASIBILITY_TOL · max(1, max c, max q·q(s)/R)`` per row ``[R]``."""
    xp = array_module(side.q)
    scale = xp.maximum(xp.amax(side.c, -1), xp.amax(side.q * side.q.sum(-1)[..., None] / side.rest, -1))
    return FEASIBILITY_TOL * get_backend(scale).maximum(scale, 1.0)


def side_marginal(side: Side, beta, gamma):
    """Base marginal ``b`` of a side's drafted tokens (module docstring), from the plan's parameters (``gamma``
    None: γ ≡ 1, the β-family's — the same floats without the sums of ``q(1 − γ) = 0``).

    ``1 − q_x`` is the rest mass ``R_x`` (as in the wor tuple law), and the bracket is evaluated as
    ``X_x + (Σ_{y≠x} q_y(1−γ_y) + β_x Σ_{y≠x} q_yγ_y)/R_x + γ_x Σ_{y≠x} q_y(1−β_y)/R_y``
    with leave-one-out sums of non-negative terms: the closed form's ``q(s) − q_x − (1−β_x)G`` cancels
    catastrophically when one token holds almost all of q (errors ~1e-11 seen at 1 − q_x ≈ 3e-6).
    """
    q, rest = side.q, side.rest
    if gamma is None:
        return q * (side.cross + beta * leave_one_out(q) / rest + leave_one_out(q * (1 - beta) / rest))
    kept = leave_one_out(q * (1 - gamma)) + beta * leave_one_out(q * gamma)
    return q * (side.cross + kept / rest + gamma * leave_one_out(q * (1 - beta) / rest))


def beta_family(side: Side, tol):
    """β-family (γ ≡ 1); one clip serves both bound directions (module docstring).  ``tol [R]``: the side's
    scaled slack (:func:`side_tolerance`), for the plateau test at E = 0.  ``(β, None, exists [R])``: γ ≡ 1."""
    nx = get_backend(side.q)
    q, rest, on = side.q, side.rest, side.on
    odds, mass = q / rest, q.sum(-1)
    lo0 = q * (side.cross - odds)                         # b at β_x = 0, E = 0
    span = q * mass[..., None] / rest                    # hi − lo
    total = (lo0 + span).sum(-1)                          # the side's total P (β ≡ 1 ⇒ E = 0)
    spread = on & (span > 0)
    room = nx.where(spread, side.c - lo0, 0.0)           # elsewhere β = 0 (span = 0: no contribution)
    span_or_1 = nx.where(spread, span, 1.0)

    def beta_at(qE):
        return nx.clip((room - qE) / span_or_1, 0.0, 1.0)

    # Σ_x (lo0 + qE + span·β(E)) − P rises in E: each spread token's term has slope q, except 0 on
    # qE ∈ [room − span, room]
    q_or_1 = nx.where(spread, q, 1.0)
    with quiet(q):                                        # a tiny q puts its knots at ±inf: they act at the ends
        knots = nx.concat([nx.where(spread, (room - span) / q_or_1, 0.0), nx.where(spread, room / q_or_1, 0.0)])
    dslope = nx.concat([nx.where(spread, -q, 0.0), nx.where(spread, q, 0.0)])
    zero = nx.zeros_like(total)
    excess = (lo0 + span * beta_at(0 * q)).sum(-1) - total
    E = first_crossing(excess, zero, odds.sum(-1), knots, dslope, mass, on.any(-1), tol)
    return nx.where(on, beta_at(q * E[..., None]), 1.0), None, zero == 0


def yield_accept(side: Side):
    """Yield/accept family: givers (γ = 0) yield child 2, takers (β = 1) accept it.  ``(β, γ, exists [R])``; on A*,
    where no row runs (a host read: none can cover its deficit, or none has one), β ≡ 1 and γ ≡ 0 as they start."""
    nx = get_backend(side.q)
    xp = array_module(side.q)
    q, rest, c, on = side.q, side.rest, side.c, side.on
    base = q * (side.cross + leave_one_out(q) / rest)    # β ≡ 1: child 1 always
    over = nx.where(on, nx.maximum(base - c, 0.0), 0.0)
    under = nx.where(on, nx.maximum(c - base, 0.0), 0.0)
    takers, givers = under > 0, over > 0
    beta, gamma = 1.0 + 0 * q, 0 * q
    ratio = safe_div(under, q, takers)
    if side.upper:                                        # shed the givers' excess into the takers' room
        D = over.sum(-1)
        act = D > 0
        ok = ~act | (under.sum(-1) >= D)
        run = act & ok
        E = first_crossing(-D, nx.zeros_like(D), xp.amax(ratio, -1), ratio,   # Σ_takers min(qE, room) − D:
                           nx.where(takers, -q, 0.0), nx.where(takers, q, 0.0).sum(-1), run)   # slope q to room/q
        G = safe_div(D, E, run)
        give = givers & run[..., None]                    # G = 0 on the rows not run: no division there
        beta = nx.where(give, 1 - safe_div(over * rest, q * G[..., None], give), beta)
        gamma = nx.where(takers & run[..., None],
                         nx.minimum(safe_div(under, q * E[..., None], takers), 1.0), gamma)
    else:                                                 # cover the takers' deficit from the givers' surplus
        D = under.sum(-1)
        act = D > 0
        E = xp.amax(ratio, -1)                            # smallest E with γ ≤ 1, i.e. the largest G = D/E
        cap = nx.where(givers, nx.minimum(safe_div(q, rest, givers),
                                          safe_div(over * E[..., None], D[..., None] + 0 * over,
                                                   givers & act[..., None])), 0.0)
        total = cap.sum(-1)
        ok = ~act | (total >= E)
        run = act & ok
        if not bool(run.any()):         # nothing to cover on any row, or no row can cover it: β ≡ 1, γ ≡ 0
            return beta, gamma, ok
        share = safe_div(E, total, run)
        beta = nx.where(givers & run[..., None], 1 - safe_div(cap * share[..., None] * rest, q, givers), beta)
        gamma = nx.where(takers & run[..., None], safe_div(under, q * E[..., None], takers), gamma)
    return nx.clip(beta, 0.0, 1.0), nx.clip(gamma, 0.0, 1.0), ok


def claim_family(side: Side):
    """Claim family on A* (module docstring): the side's tokens in ratio order (``p/q`` descending — the order of
    ``c/q``, but free of ρ's round-off: sorted by the rounded ``ρp/q``, tokens whose p/q tie exactly moved with ρ's
    last bits, and one ulp of ρ moved E[τ | T] by up to 1.38, docs/deviations.md item 101; ties by token,
    :func:`~univer_theory.orders.ratio_argsort`; the padding last).  With ``u = q/R``, token i of that order
    receives from each earlier token j the share ``1 − t_j`` of their pair and claims ``t_i`` of each pair with a
    later token:

    ``L_i = q_i Σ_{j<i} u_j(1 − t_j) + u_i Σ_{j<i} q_j(1 − t_j)``,  ``K_i = q_i Σ_{l>i} u_l + u_i Σ_{l>i} q_l``,
    ``t_i = clip((c_i − L_i)/K_i, 0, 1)`` (0 where ``K_i = 0``),  ``b_i = L_i + t_i K_i``

    (the pair {x, y} has probability ``q_x q_y (1/R_x + 1/R_y)``; :func:`claim_shares`).  Taking the least share
    leaves the most to the tokens after.  Within the side the ordered pair (y_1, y_2) takes child 2 w.p.
    ``1 − t(y_1)`` when y_1 comes first in the order, else ``t(y_2)`` (:func:`pair_weights`, from β = t, γ = 1 and
    the order's ``rank``).  ``(β, γ, exists, b, rank)`` ``[R, M]`` (``exists [R]``: always; whether ``b ≥ c`` is
    :func:`solve_side`'s check)."""
    nx = get_backend(side.q)
    order = ratio_argsort(side.num, side.q, descending=True)
    q, rest, c = (nx.take(x, order) for x in (side.q, side.rest, side.c))
    u = q / rest
    later = q * exclusive_cumsum(u, reverse=True) + u * exclusive_cumsum(q, reverse=True)
    t, left = claim_shares(q, u, c, later)
    b = left + t * later
    return (nx.put(0 * q, order, t), 1.0 + 0 * q, side.on.any(-1) | True, nx.put(0 * q, order, b),
            order_ranks(order))


def claim_shares(q, u, c, later):
    """The claim family's recurrence on rows in its order ``[R, n]`` (:func:`claim_family`: ``later`` = K):
    ``(t, L)``: the fixed point ``t = Φ(t)`` from t ≡ 0 — Φ is triangular (t_i reads the tokens before i) and
    monotone (larger t before i → less left to i → larger t_i), so the iterates increase to the sequential
    loop's t (:func:`.wor_pair_rows._claim_family`), entry i final after i + 1 passes, and the first pass that
    changes nothing gives the loop's floats (the same sums, in the same order).  One host read per pass."""
    nx = get_backend(q)
    t = 0 * q
    for _ in range(q.shape[-1] + 1):
        left = q * exclusive_cumsum(u * (1 - t)) + u * exclusive_cumsum(q * (1 - t))
        new = nx.where(later > 0, nx.clip((c - left) / nx.where(later > 0, later, 1.0), 0.0, 1.0), 0.0)
        if bool((new == t).all()):
            break
        t = new
    return t, left


def solve_side(side: Side):
    """Per row, the first family (:data:`FAMILIES`; the claim family on A* only) whose base marginal meets the
    side's bound (within :func:`side_tolerance`): ``(β, γ, b, family [R], rank)`` — ``family`` the family's
    index, −1 where none does (the rule does not apply), and β ≡ γ ≡ 1, b ≡ 0 on an empty side (index 0); ``rank``
    each token's position in the claim order where that family is taken, −1 elsewhere (None where it did not run).
    Each family runs on the rows left by the ones before it only (a host read of which rows those are; the
    side itself when that is every row), and its base marginal is formed only where some row has the family (a
    host read; yield/accept on A* mostly has none)."""
    nx, xp = get_backend(side.q), array_module(side.q)
    tol = side_tolerance(side)
    beta, gamma, b, rank = 1.0 + 0 * side.q, 1.0 + 0 * side.q, 0 * side.q, None
    family = nx.where(side.on.any(-1), -1, 0)
    runs = [beta_family, lambda sub, _: yield_accept(sub)]
    if not side.upper:
        runs.append(lambda sub, _: claim_family(sub))
    for i, run in enumerate(runs):
        rows = xp.where(family < 0)[0]
        if rows.shape[0] == 0:
            break
        every = rows.shape[0] == family.shape[0]          # (the first family, mostly): no row gathers
        sub = side if every else Side(*(x[rows] for x in (side.q, side.rest, side.c, side.cross, side.on)),
                                      side.upper, side.num[rows])
        sub_tol = tol if every else tol[rows]
        fb, fg, exists, *claimed = run(sub, sub_tol)
        if claimed:
            fm, fr = claimed
        else:                           # no row has the family (yield/accept on A*, mostly): b is never read
            fm, fr = side_marginal(sub, fb, fg) if bool(exists.any()) else 0 * sub.q, None
        meets = (fm <= sub.c + sub_tol[..., None]) if side.upper else (fm >= sub.c - sub_tol[..., None])
        good = exists & (meets | ~sub.on).all(-1)
        take = good[..., None] & sub.on
        fg = 1.0 if fg is None else fg
        if every:
            beta, gamma, b = (xp.where(take, x, full) for x, full in ((fb, beta), (fg, gamma), (fm, b)))
        else:
            beta[rows], gamma[rows], b[rows] = (xp.where(take, x, full[rows]) for x, full in
                                                ((fb, beta), (fg, gamma), (fm, b)))
        if fr is not None:              # the claim family (the last one): its order where it is taken
            rank = nx.where(side.on, -1, -1)
            rank[rows] = xp.where(take, fr, -1)
        family[rows] = xp.where(good, i, family[rows])
    return beta, gamma, b, family, rank


@dataclass(frozen=True)
class PairRule:
    """Rule 3 on rows ``[R, V]`` (:func:`pair_rule`): ``β, γ``, the thinning ``t``, the marginal ``a = t·b``,
    ``on_h`` (drafted tokens of H), ``feasible [R]`` (both sides solved, ``α ≥ α* − OPTIMALITY_TOL`` and the odds
    at most :data:`MAX_ODDS`), the family index of each side ``family_h, family_a [R]`` (:data:`FAMILIES`; −1:
    none) and ``rank [R, V]``: each A* token's position in the claim order on rows whose A* takes the claim family,
    −1 elsewhere (None where no row's A* ran it)."""

    beta: object
    gamma: object
    thin: object
    marginal: object
    on_h: object
    feasible: object
    family_h: object
    family_a: object
    rank: object


def pair_rule(c, q, alpha_star, in_cut, p=None) -> PairRule:
    """Rule 3 (module docstring) on rows ``c = ρp, q [R, V]`` given the optimal cut ``in_cut [R, V]`` (A*) and
    α*(ρ) ``[R]``, the claim family in the order of ``p/q`` (the target rows; ``c/q`` when None, :class:`Side`) —
    numpy arrays (the compiled pass of :mod:`.wor_pair_rows`, the same floats as :func:`array_pair_rule` on each
    row alone) or torch tensors (:func:`array_pair_rule`)."""
    if get_backend(c, q) is NUMPY:
        return PairRule(*pair_rule_rows(c, q, alpha_star, in_cut, FEASIBILITY_TOL, OPTIMALITY_TOL, MAX_ODDS, p))
    return array_pair_rule(c, q, alpha_star, in_cut, p)


def conditioned(odds):
    """``[R]`` bool: rows whose largest odds ``q_x/R_x [R, V]`` are at most :data:`MAX_ODDS` (numpy or torch)."""
    return get_backend(odds).amax(odds) <= MAX_ODDS


def array_pair_rule(c, q, alpha_star, in_cut, p=None) -> PairRule:
    """:func:`pair_rule` written against the array namespace: numpy arrays or torch tensors."""
    nx = get_backend(c, q)
    drafted = q > 0
    rest = leave_one_out(q)                               # R_x = Σ_{y≠x} q_y, the wor law's "1 − q_x"
    on_h, on_a = drafted & ~in_cut, drafted & in_cut
    beta, gamma, b, rank = 1.0, 1.0, 0.0, None                 # off the drafted support
    families = []
    cross = 0 * q
    for mask, upper in ((on_a, False), (on_h, True)):     # A* first: H's cross term sums over it
        cols, on, pos = side_columns(mask)
        side = Side.of(*(nx.take(x, cols) for x in (q, rest, c, cross)), on, upper,
                       nx.take(c if p is None else p, cols))
        if not upper:
            cross = side.q.sum(-1)[..., None] / rest + (side.q / side.rest).sum(-1)[..., None]
        sb, sg, sm, family, sr = solve_side(side)
        beta, gamma, b = (nx.where(mask, nx.take(x, pos), full) for full, x in ((beta, sb), (gamma, sg), (b, sm)))
        if sr is not None:              # A* only
            rank = nx.where(mask, nx.take(sr, pos), -1)
        families.append(family)
    thin = safe_div(c, b, b > c, 1.0)
    marginal = thin * b
    feasible = (families[0] >= 0) & (families[1] >= 0) & (marginal.sum(-1) >= alpha_star - OPTIMALITY_TOL)
    feasible = feasible & conditioned(safe_div(q, rest, drafted))
    return PairRule(beta, gamma, thin, marginal, on_h, feasible, families[1], families[0], rank)


def pair_weights(rule: PairRule, tuples):
    """The plan on ordered pairs ``tuples [R, T, 2]`` (T per row): ``w [R, T, 2]`` — the H child with weight 1
    on pairs meeting both sides, else child 2 with ``(1 − β(y_1))γ(y_2)``, or ``β(y_2)`` on a claim family's
    pair whose second token comes first in its order (:func:`claim_family`: β = t, γ = 1); times the thinning."""
    nx = get_backend(rule.beta)
    flat = tuples.reshape(tuples.shape[0], -1)

    def at(x):
        return nx.take(x, flat).reshape(tuples.shape)

    h = at(nx.where(rule.on_h, 1.0 + 0 * rule.beta, 0.0))
    h1, h2 = h[..., 0], h[..., 1]
    beta = at(rule.beta)
    second = (1 - beta[..., 0]) * at(rule.gamma)[..., 1]
    if rule.rank is not None:
        rank = at(rule.rank)
        claimed = (rank[..., 1] >= 0) & (rank[..., 0] > rank[..., 1])      # y_2 first in the claim order
        second = nx.where(claimed, beta[..., 1], second)
    w = nx.stack([nx.where(h1 == h2, 1 - second, h1), nx.where(h1 == h2, second, h2)])
    return w * at(rule.thin)


def wor_pair_plan(target_probs, draft_probs, rho, k, process) -> NodePlan | None:
    """α*-optimal closed-form plan for ``wor``, k = 2 (None for other k / process, or where a side has no family):
    :func:`pair_rule` on a batch of one row.

    Parameters
    ----------
    target_probs, draft_probs : p, q [V].
    rho : scaling ρ ∈ [0, 1].
    k : number of children (the rule applies to k = 2).
    process : draft process (the rule applies to ``"wor"``).

    Returns
    -------
    NodePlan whose ``info`` holds the cut (``in_cut``: mask of A*), the per-side family used, β, γ, the claim
    order's ``rank`` (:class:`PairRule`) and the thinning t.
    """
    p, q, rho = check_node_inputs("wor_pair_plan", target_probs, draft_probs, rho, k, process)
    if process != "wor" or k != 2:
        return None
    alpha_star, in_cut = alpha_star_and_cut(p, q, 2, "wor", rho)
    in_cut = np.asarray(in_cut, dtype=bool)
    rule = pair_rule((rho * p)[None], q[None], np.asarray([alpha_star], dtype=np.float64), in_cut[None], p[None])
    if not rule.feasible[0]:
        return None
    names = {}
    for name, mask, family in (("H", rule.on_h[0], rule.family_h[0]), ("A", (q > 0) & in_cut, rule.family_a[0])):
        names[name] = FAMILIES[int(family)] if mask.any() else "empty"

    def select(S) -> np.ndarray:
        return pair_weights(rule, np.asarray([[S]], dtype=np.int64))[0, 0]

    return NodePlan("wor_pair", rho, p, rule.marginal[0], select,
                    {"in_cut": in_cut, "families": names, "beta": rule.beta[0], "gamma": rule.gamma[0],
                     "rank": None if rule.rank is None else rule.rank[0], "thin": rule.thin[0]})
