"""UniVer's without-replacement node plans (theory.md §6.3 rules 3–5, §6.5) batched over the R nodes of a level.

The rules of :mod:`univer_theory.plans.wor_pair`, :mod:`~univer_theory.plans.pts` and
:mod:`~univer_theory.plans.iid_coupling` (their docstrings have the math) on the rows of a level; rows
``c = ρp``, ``q`` ``[R, V]``, float64.  Each returns the plan on the realised children, ``w [R, K]``, and its
token marginal ``a [R, V]``:

* :func:`wor_pair_weights` (k = 2) — the optimal cut ``A*`` of CondOT(ρ) from the ratio-order prefix costs
  (:func:`wor_cut_k2`), then rule 3 itself: :func:`univer_theory.plans.wor_pair.pair_rule` (each side's
  β-family and, where it misses the side's bound, yield/accept, then on A* the claim; all rows at once; on the
  CPU's numpy views one compiled pass per row with the same floats, :mod:`univer_theory.plans.wor_pair_rows`) —
  the one implementation the exact core runs on its one row; ``feasible [R]`` is False where every family fails on
  a side (the caller falls back, as the exact core's ``None``);
* :func:`pts_weights` (any k) — the priority walk's acceptance probabilities θ.  The walk is a triangular
  fixed point ``θ = Φ(θ)`` (θ_y reads sums over the higher-priority tokens), and ``Φ`` is monotone (larger θ
  before y → less availability at y → larger θ_y).  Iterating ``Φ`` from ``θ ≡ 1`` therefore decreases to the
  walk's θ; entry i is final after i + 1 steps at the latest, so stopping at the first step that changes
  nothing returns the walk's θ exactly (measured: 9–16 steps at V = 49 152 instead of a 49 152-step walk;
  :func:`univer_theory.plans.pts.thinning_fixed_point`).  k = 2: ``Φ`` by cumulative sums (closed form,
  :func:`univer_theory.plans.pts.pair_avail`); k ≥ 3: the exponential-clock integral on the exact core's
  quadrature grid, the polynomial products over the tokens before / after y as elementary symmetric sums —
  nested cumulative sums of non-negative terms (:func:`_clock_avail`; 24–29 passes at V = 49 152).  On the CPU
  those passes cost more than one walk (~300× for k ≥ 3, 9–16 passes against one for k = 2), so there the walk
  itself is used (the exact core's compiled walks, :func:`_walk` and
  :func:`univer_theory.plans.pts.pair_thinning_walk`; the ``walk`` argument, :data:`WALKS`); for k ≥ 3 an
  accelerator copies its rows to the host and walks them too (the passes' ``[R, V, 400]`` arrays cost an H200
  12× the time and ~200× the rows' memory of the host walks on whole rows, item 69; the fixed point stays its path
  for k = 2);
* :func:`coupling_weights` (any k) — the i.i.d. layout plan (:func:`gpu.layout.layout_weights`) on every
  multiset of the virtual i.i.d. draw sequences of the realised tuple (``2^{k−1}`` of them: 2, 4, 8 for
  k = 2, 3, 4, where the sequences number 2, 5, 15), mixed with their conditional probabilities — the functions of
  :mod:`univer_theory.plans.iid_coupling` (numpy or torch: one implementation) on the level's tensors;
* :func:`wor_weights` — UniVer's choice among them (for k = 2 rule 3 where feasible; else the better α of PTS
  and the coupling, on small supports rule 1 when better (:mod:`solvers.condot_simplex`), and rule 7 where they
  fall short of α*(ρ)), as :func:`univer_theory.plans.choose.choose_plan`.  α*(ρ) and the cut ``A*`` are the exact core's
  :func:`univer_theory.alpha_star.alpha_star_rows` on the level's rows.

The cut's order (``p/q`` ascending) is sorted once per call and serves α*(ρ), rule 3's cut and the gates; PTS's
(descending) is derived from it in O(V) (:func:`univer_theory.orders.descending_ratio_order`): both break ties to
the lower token id, so on tied ratios neither is the other reversed.

No Python loop over rows: loops run over fixed-point steps (until every row has converged), quadrature chunks,
the children and the virtual sequences; PTS's walk on the CPU is compiled host code looping over priority
positions (rows in cache-sized chunks; on an accelerator, :data:`WALKS`).  Host reads: the convergence tests of
those loops, the clock grid's length (:func:`_clock_grid`) and the sizes of the row subsets each plan runs on
(``nonzero``) — data-dependent shapes and loop counts.  Everything here is written against
:mod:`univer_theory.nx`; on the CPU :func:`wor_weights` is one host call on numpy views of the level's rows
(:func:`gpu.host.on_host`: the same functions, cheaper per call on the narrow rows of a truncated draft), and
:func:`wor_pair_weights`, :func:`pts_weights`, :func:`coupling_weights` called alone are one host call each.
"""
from __future__ import annotations

import math

import torch

from univer_theory.alpha_star import alpha_star_rows
from univer_theory.nx import get_backend
from univer_theory.orders import descending_ratio_order, order_ranks, ratio_argsort, top_tokens
from univer_theory.plans.choose import (ALPHA_TIE, alpha_star_computable, coupling_can_win, full_support_weights,
                                        single_child_rows, single_child_weights, small_lp, support_marginal,
                                        under_ceiling)
from univer_theory.plans.clocks import (LOG_T_RANGE, clock_nodes, grid_panels, log_time_grid, rate_times,
                                        row_weights, thinning_walk)
from univer_theory.plans.first_draw import first_draw_gate, first_draw_marginal, first_draw_rows, first_draw_weights
from univer_theory.plans.iid_coupling import mix_virtual, virtual_draw_probs, virtual_multisets
from univer_theory.plans.pts import pair_avail, pair_thinning_walk, thinning_fixed_point
from univer_theory.plans.wor_pair import (OPTIMALITY_TOL, exclusive_cumsum, leave_one_out, pair_rule,
                                          pair_weights, quiet)

from .condot import condot_weights
from .host import device_kind, on_host
from .layout import layout_weights
from .luce import luce_rows, luce_rows_weights
from .unique import unique_rows


# ----------------------------------------------------------------------------------------- wor pair (rule 3)
def wor_cut_k2(c: torch.Tensor, q: torch.Tensor, rho: torch.Tensor, p: torch.Tensor, order=None):
    """α*(ρ) ``[R]`` and the optimal cut ``A*`` (bool ``[R, V]``) of CondOT(ρ) for two wor children: the
    ratio-order prefix minimising ``ρP_j + r_j(1 + Σ_{x∈G_j} q_x/(1 − q_x))`` (first minimum) —
    :func:`univer_theory.alpha_star.alpha_star_rows`, the exact core's function, on the level's rows (``order``:
    their ratio order when the caller has it)."""
    return alpha_star_rows(p, q, 2, "wor", rho, order)


def wor_pair_weights(c: torch.Tensor, q: torch.Tensor, rho: torch.Tensor, p: torch.Tensor,
                     children: torch.Tensor, order: torch.Tensor | None = None):
    """Rule 3 on rows with two wor children ``children [R, 2]`` (or ``[R, T, 2]``: T tuples per row on one plan):
    ``(w, a [R, V], feasible [R])``, ``w`` shaped as ``children`` — :func:`univer_theory.plans.wor_pair.pair_rule`
    and :func:`~univer_theory.plans.wor_pair.pair_weights` on the level's rows (the functions the exact core's
    ``wor_pair_plan`` runs on its one row; infeasible ↔ its ``None``), from the cut of :func:`wor_cut_k2`
    (``order``: the rows' ratio order when the caller has it)."""
    w, a, feasible = on_host(_pair_rule_weights, c, q, rho, p, children.reshape(q.shape[0], -1, 2), order)
    return w.view(children.shape), a, feasible


def _pair_rule_weights(c, q, rho, p, tuples, order):
    """:func:`wor_pair_weights` on arrays of one backend (numpy on the CPU, :func:`gpu.host.on_host`)."""
    rule = pair_rule(c, q, *wor_cut_k2(c, q, rho, p, order), p)
    return pair_weights(rule, tuples), rule.marginal, rule.feasible


# ----------------------------------------------------------------------------------------- PTS (rule 4)
def _priority(c, q, p, ascending):
    """The priority order (``p/q`` descending, ties by token id, undrafted last) from the ascending ratio order
    ``ascending`` (:func:`univer_theory.orders.descending_ratio_order`: O(V), no second sort): ``order [R, V]``,
    ``rank``, ``on`` (drafted, in order) and ``q``, ``c`` in that order.  numpy or torch."""
    nx = get_backend(c, q)
    order = descending_ratio_order(ascending, p, q)
    return order, order_ranks(order), nx.take(q > 0, order), nx.take(q, order), nx.take(c, order)


def _thinned(theta, avail, order, rank, q, tuples):
    """PTS on the tuples ``[R, T, k]`` from θ and the availabilities in priority order (:func:`_priority`):
    ``w_j = θ_{y_j} Π_{l walked before j} (1 − θ_{y_l})`` ``[R, T, k]``, and the marginal ``a = θ·avail`` back in
    token order ``[R, V]``.  numpy or torch."""
    nx = get_backend(theta, q)
    R, T, k = tuples.shape
    flat = tuples.reshape(R, T * k)
    th = nx.take(nx.put(0 * q, order, theta), flat).reshape(R, T, k)
    rk = nx.take(rank, flat).reshape(R, T, k)
    before = rk[..., None, :] < rk[..., :, None]                         # [.., j, l]: l walked before j
    return th * nx.where(before, (1 - th)[..., None, :], 1.0).prod(-1), nx.put(0 * q, order, theta * avail)


def _symmetric_sums(r, h, k: int, reverse: bool):
    """Over the tokens before each i (after it with ``reverse``), ``r, h [R, m, t]``: the elementary symmetric
    sums ``P_n = e_n(r)`` for n < k and ``D_n = Σ_j h_j e_n(r without j)`` for n < k − 1 — nested exclusive
    cumulative sums of non-negative terms, ``P_n(i) = Σ_{j<i} r_j P_{n−1}(j)``,
    ``D_n(i) = Σ_{j<i} h_j P_n(j) + r_j D_{n−1}(j)``.  numpy or torch."""
    P = [1.0 + 0 * r]
    D = [exclusive_cumsum(h, reverse, axis=1)]
    for n in range(1, k):
        P.append(exclusive_cumsum(r * P[-1], reverse, axis=1))
        if n < k - 1:
            D.append(exclusive_cumsum(h * P[n] + r * D[-1], reverse, axis=1))
    return P, D


#: Element budget of one quadrature chunk of the clock integral (rows × tokens × times per array; about 25
#: such arrays are live at once): cache-sized on the CPU, large on an accelerator (fewer kernel launches).
CLOCK_CHUNK = {"cpu": 2**20, "accelerator": 2**25}
#: Elements of the g-independent parts of every chunk kept across the fixed point's passes (else recomputed
#: each pass): 0.5 GB of float64 on the CPU, 8 GB on an accelerator.
CLOCK_CACHE = {"cpu": 2**26, "accelerator": 2**30}


def _clock_grid(qs, k: int):
    """Every row's Gauss–Legendre grid of the exact core (``plans.clocks``: panels of width 60 from
    ``s = −30``, as many as :func:`~univer_theory.plans.clocks.grid_panels` asks for the row's k-th largest
    rate): ``(s [t], weights [R, t])`` — the panels are the same for every row, a row's weights are 0 past its own
    end (:func:`~univer_theory.plans.clocks.row_weights`).  The grid's length ``t`` (``clock_nodes(k)`` × the most
    panels of any row) is a data-dependent shape: its one host read per call (a fixed 13-panel grid would cost 13×
    on every row).  numpy or torch."""
    nx = get_backend(qs)
    top = nx.top_values(qs, k)
    top = nx.where(top > 0, top, 1.0)
    most = int(grid_panels(top[:, -1]).max())
    s, weights = (nx.asarray(x, qs)
                  for x in log_time_grid(clock_nodes(k), LOG_T_RANGE[0] + (LOG_T_RANGE[1] - LOG_T_RANGE[0]) * most))
    return s, row_weights(weights, s, qs, top)


def _clock_avail(qs, k: int, s, weights):
    """k ≥ 2: ``g ↦ avail`` by the exponential-clock integral of
    :func:`univer_theory.plans.clocks.sequential_thinning_avail` on the rows' grids (:func:`_clock_grid`), all
    tokens at once.  With ``e_z = e^{−q_z T}``, ``f_z = e_z + g_z(1 − e_z)u`` the products over the tokens before y
    (with their ``g``) and after it (``g = 1``) are written ``Π_z ẽ_z · Σ_n e_n(r) u^n`` with
    ``ẽ_z = max(e_z, δ)``, ``r_z = g_z(1 − e_z)/ẽ_z`` and ``D = Π ẽ · Σ_n (Σ_j h_j e_n(r without j)) u^n``,
    ``h_z = g_z q_z e_z/ẽ_z`` (:func:`_symmetric_sums`); ``Π ẽ`` is taken as ``exp`` of a sum of logs.
    ``δ = e^{−λ}`` with ``(k − 1)(λ + log m) ≤ 690`` keeps every ``e_n(r)`` finite in float64; it changes each
    polynomial coefficient by at most ``m·δ`` (``λ ≥ 60`` is required: k ≤ :data:`PTS_MAX_K`).  numpy or
    torch."""
    nx = get_backend(qs)
    R, m = qs.shape
    lam = 690.0 / (k - 1) - math.log(m)
    if lam < 60:
        raise ValueError(f"_clock_avail: k = {k} children over {m} tokens is beyond the float64 range of the "
                         f"scaled clock products (k ≤ {PTS_MAX_K} at V ≤ 2^16)")
    device = device_kind(qs)
    step = max(1, CLOCK_CHUNK[device] // (R * m))
    chunks = [(s[i:i + step], weights[:, i:i + step]) for i in range(0, s.shape[0], step)]

    def fixed(S):
        """The parts of one chunk that do not depend on g: clocks, ratios, sums after y (g = 1), Π_{z≠y} ẽ_z.
        Rates enter as ``q·T`` (``plans.clocks.rate_times``) with the Jacobian T in them."""
        qt = rate_times(qs[..., None], S)                               # q·T [R, m, t]
        e, ring = nx.exp(-qt), -nx.expm1(-qt)
        log_e = nx.maximum(-qt, -lam)
        e_clamped = nx.exp(log_e)
        r, h = ring / e_clamped, qt * e / e_clamped
        Ps, Ds = _symmetric_sums(r, h, k, reverse=True)
        return qt, e, ring, r, h, Ps, Ds, nx.exp(leave_one_out(log_e, axis=1))

    cache = [fixed(S) for S, _ in chunks] if R * m * s.shape[0] * (2 * k + 4) <= CLOCK_CACHE[device] else None

    def avail(g):
        out = nx.zeros_like(qs)
        for i, (S, W) in enumerate(chunks):
            qt, e, ring, r, h, Ps, Ds, scale = cache[i] if cache else fixed(S)
            Pp, Dp = _symmetric_sums(g[..., None] * r, g[..., None] * h, k, reverse=False)   # before y: its g
            first = qt * e * sum(Pp[n] * Ps[k - 1 - n] for n in range(k))
            later = ring * sum(Dp[n] * Ps[k - 2 - n] + Pp[n] * Ds[k - 2 - n] for n in range(k - 1))
            out = out + (scale * (first + later) * W[:, None, :]).sum(-1)
        return nx.maximum(out, 0.0)
    return avail


#: Widest wor node whose PTS θ may come from the fixed point (:func:`_clock_avail`'s float64 range); wider
#: nodes take the walk.
PTS_MAX_K = 8


def _walk(qs, cs, k: int, s, weights):
    """``(θ, avail)`` in priority order by the exact core's priority walk,
    :func:`univer_theory.plans.clocks.thinning_walk` (compiled, on the host, in cache-sized row chunks; the same
    function the exact core runs on its one row): numpy rows directly; tensors are copied to the host and back (a
    sequential walk has no parallel form on an accelerator — the fixed point is its path, :data:`WALKS`)."""
    nx = get_backend(qs)
    theta, avail = thinning_walk(*(nx.to_numpy(x) for x in (qs, cs)), k, nx.to_numpy(s), nx.to_numpy(weights))
    return nx.asarray(theta, qs), nx.asarray(avail, qs)


def _pair_theta(qs, on, cs, walk: str):
    """k = 2: ``(θ, avail, finite)`` on rows in priority order, θ = avail = 0 on the rows where the closed form is
    not finite (``finite [R]``): the compiled walk (:func:`univer_theory.plans.pts.pair_thinning_walk`, on the
    host: one O(m) pass a row) for ``walk = "sequential"``, else the fixed point on the closed form
    (:func:`~univer_theory.plans.pts.pair_avail`, :func:`~univer_theory.plans.pts.thinning_fixed_point`: 9–16
    passes of cumulative sums, each parallel on an accelerator) — the same floats.  numpy or torch."""
    nx = get_backend(qs)
    if walk == "sequential":
        theta, avail, finite = pair_thinning_walk(*(nx.to_numpy(x) for x in (qs, on, cs)))
        return nx.asarray(theta, qs), nx.asarray(avail, qs), nx.asarray(finite, qs) > 0
    avail_of, finite = pair_avail(qs, on)
    with quiet(qs):                     # the rows left out form inf / nan lanes, masked
        theta, avail = thinning_fixed_point(avail_of, on & finite[:, None], cs)
    return theta, avail, finite


#: How PTS's θ is found (the ``walk`` argument of :func:`pts_weights`): ``"fixed_point"`` (batched clock
#: integrals, :func:`_clock_avail`; k = 2: cumulative sums), ``"sequential"`` (the compiled priority walks,
#: :func:`_walk`, :func:`_pair_theta`) or ``"auto"`` — the walk on the CPU; on an accelerator the fixed point for
#: k = 2 and the walk, on the host, for k ≥ 3.  At V = 49 152 (k = 3, 4) the fixed point takes 24–29 passes over
#: ``[R, V, 400]`` arrays: ~300× the walk on one CPU thread (50 s against 0.15 s for one k = 3 row,
#: docs/deviations.md item 37), and on an H200 5.1 s and a 3.7 GB peak for a Zipf-row EAGLE-like wor tree that
#: verifies in 0.42 s with a 13 MB peak when the host walks (item 69) — so an accelerator copies those rows over.  For
#: k = 2 the fixed point's 9–16 passes of cumulative sums are ``[R, V]`` arrays (~3 ms of a ~19 ms SmolLM2
#: binary:4 wor verification at top 1 024 on the CPU, item 49).
WALKS = ("auto", "fixed_point", "sequential")


def pts_weights(c: torch.Tensor, q: torch.Tensor, p: torch.Tensor, children: torch.Tensor, walk: str = "auto",
                order: torch.Tensor | None = None):
    """Rule 4 (PTS) on rows with k wor children ``children [R, k]`` (or ``[R, T, k]``): ``(w, a [R, V])``,
    ``w`` shaped as ``children``, as ``univer_theory.plans.pts.pts_plan(...)`` (module docstring: the walk as a
    fixed point; k = 2 in closed form, k ≥ 3 by the clock integral or the walk, per ``walk`` — :data:`WALKS`).
    The fixed point stops at its first pass that changes nothing (a data-dependent pass count: one host read
    per pass).  ``order``: the rows' ascending ratio order when the caller has it.  On the CPU on numpy views,
    one host call (:func:`gpu.host.on_host`)."""
    if walk not in WALKS:
        raise ValueError(f"pts_weights: walk must be one of {list(WALKS)}, got {walk!r}")
    return on_host(_pts_weights, c, q, p, children, walk, order)


def _clock_theta(qs, on, cs, k: int, walk: str):
    """``(θ, avail)`` in priority order from the clock integral: the walk (:func:`_walk`) for ``walk =
    "sequential"`` or beyond :data:`PTS_MAX_K`, else the fixed point on the batched integral (:func:`_clock_avail`).
    numpy or torch."""
    if walk == "sequential" or k > PTS_MAX_K:
        return _walk(qs, cs, k, *_clock_grid(qs, k))
    return thinning_fixed_point(_clock_avail(qs, k, *_clock_grid(qs, k)), on, cs)


def _pts_weights(c, q, p, children, walk: str, order):
    """:func:`pts_weights` on one backend (:mod:`univer_theory.nx`)."""
    k = children.shape[-1]
    order, rank, on, qs, cs = _priority(c, q, p, ratio_argsort(p, q) if order is None else order)
    if walk == "auto":
        walk = "sequential" if k > 2 or device_kind(q) == "cpu" else "fixed_point"
    if k == 2:
        theta, avail, finite = _pair_theta(qs, on, cs, walk)
        bad = get_backend(qs).nonzero(~finite)[0]
        if bad.shape[0]:                # the closed form overflows there: the clock integral, as the exact core
            theta[bad], avail[bad] = _clock_theta(qs[bad], on[bad], cs[bad], 2, walk)
    else:
        theta, avail = _clock_theta(qs, on, cs, k, walk)
    w, a = _thinned(theta, avail, order, rank, q, children.reshape(q.shape[0], -1, k))
    return w.reshape(children.shape), a


# ----------------------------------------------------------------------------------------- iid coupling (rule 5)
def coupling_weights(c: torch.Tensor, q: torch.Tensor, children: torch.Tensor, p: torch.Tensor | None = None):
    """Rule 5 on rows with k wor children ``children [R, k]`` (all present; or ``[R, T, k]``, T tuples per row):
    the α*_iid layout plan coupled onto the wor tuple, ``(w, a [R, V])``, ``w`` shaped as ``children``, as
    ``iid_coupling_plan(...)`` (``select``, ``marginal``) — its functions on a batch: the virtual sequences'
    conditional probabilities (:func:`~univer_theory.plans.iid_coupling.virtual_draw_probs`), the layout on
    their multisets (one call for every tuple's, on targets built once per row) and the mixing
    (:func:`~univer_theory.plans.iid_coupling.mix_virtual`).  ``p``: the target rows of ``c = ρp`` (the layout's
    order, :func:`gpu.layout.layout_weights`).  On the CPU on numpy views, one host call (:func:`gpu.host.on_host`)."""
    return on_host(_coupling_weights, c, q, children, p)


def _coupling_weights(c, q, children, p=None):
    """:func:`coupling_weights` on one backend (:mod:`univer_theory.nx`)."""
    nx = get_backend(c, q)
    R, k = children.shape[0], children.shape[-1]
    tuples = children.reshape(R, -1, k)
    T = tuples.shape[1]
    pos = nx.index(virtual_multisets(k), q)                               # [M, k]
    M = pos.shape[0]
    w_iid, a = _symmetric_layout(c, q, tuples[:, :, pos].reshape(R, T * M, k), p)
    w = mix_virtual(virtual_draw_probs(q, tuples), w_iid.reshape(R, T, M, k))
    return w.reshape(children.shape), a


def _symmetric_layout(c, q, seqs, p=None):
    """:func:`gpu.layout.layout_weights` on i.i.d. sequences ``seqs [R, n, k]`` (all k present), evaluated once
    per distinct multiset of each row: the layout is symmetric in the positions (``w_j`` is copy j's share), so
    the sequences are sorted, de-duplicated, laid out and the weights put back in place (the slot rule's 24
    orderings of a wor 4-tuple have 24·8 virtual multisets of positions, 35 distinct multisets of tokens).
    numpy or torch."""
    nx = get_backend(c, q)
    R, n, k = seqs.shape
    perm = nx.argsort(seqs)
    canon = nx.take(seqs, perm)
    tree = nx.arange(R, q)
    uniq, inverse = unique_rows(nx.concat([tree[:, None, None] + 0 * canon[..., :1], canon]).reshape(-1, k + 1))
    count = nx.bincount(uniq[:, 0], R)                                     # distinct multisets per row
    start = nx.cumsum(count) - count
    at = start[:, None] + nx.minimum(nx.arange(int(count.max()), q)[None, :], count[:, None] - 1)
    w_uniq, a = layout_weights(c, q, uniq[at, 1:], canon[:, 0] >= 0, p)   # every copy present
    slot = (nx.arange(uniq.shape[0], q) - start[uniq[:, 0]])[inverse].reshape(R, n)
    w_canon = w_uniq[tree[:, None], slot]                                  # [R, n, k]
    return nx.put(0 * w_canon, perm, w_canon), a


# ----------------------------------------------------------------------------------------- the choice
def _first_draw(c, q, children, walk: str):
    """Rule 8 (:mod:`univer_theory.plans.first_draw`) on rows ``c, q [r, V]`` for ``children [r, k]`` or
    ``[r, T, k]``: the inner (k − 1)-child plan is :func:`wor_weights` itself (k − 1 ≥ 2) or the single-child
    rule, on ``(S_2, …, S_k)``; tuples whose first child is not the top token take the room that leaves
    (:func:`univer_theory.plans.first_draw.first_draw_weights`; for the inner plan their tails are replaced by the
    inner row's top k − 1 tokens, a valid tuple whose inner weights are discarded).  numpy or torch."""
    nx = get_backend(c, q)
    t, pi, q_in, rho_in, p_in = first_draw_rows(c, q)
    c_in = rho_in[:, None] * p_in       # c' = ρ'p', formed as the core's inner choice forms it
    lead = (1,) * (children.ndim - 2)
    first = children[..., 0] == t.reshape(-1, *lead)
    k = children.shape[-1]
    tails = nx.where(first[..., None], children[..., 1:], top_tokens(q_in, k - 1).reshape(-1, *lead, k - 1))
    if k > 2:
        w_in, a_in = _wor_weights(c_in, q_in, rho_in, p_in, tails, walk)
    else:
        q1, a_in = single_child_rows(c_in, q_in, "wor")
        w_in = single_child_weights(c_in, q1, tails.reshape(tails.shape[0], -1)).reshape(tails.shape)
    a, tau, u, v = first_draw_marginal(c, q, t, pi, a_in)
    u1 = nx.take(u, children[..., 0].reshape(children.shape[0], -1)).reshape(first.shape)
    second = children[..., 1] == t.reshape(-1, *lead)
    return first_draw_weights(first, w_in, tau.reshape(-1, *lead), u1, second, v.reshape(-1, *lead)), a


def _take(w, a, rows, take, chosen, other):
    """In place, ``(w, a)[rows] = chosen`` where ``take [n]`` holds, ``other`` elsewhere."""
    nx = get_backend(w, a)
    w[rows] = nx.where(take.reshape(-1, *(1,) * (w.ndim - 1)), chosen[0], other[0])
    a[rows] = nx.where(take[:, None], chosen[1], other[1])


def wor_weights(c: torch.Tensor, q: torch.Tensor, rho: torch.Tensor, p: torch.Tensor, children: torch.Tensor,
                walk: str = "auto"):
    """UniVer's automatic choice for k ≥ 2 wor children: for k = 2 rule 3 where feasible (its α within
    ``OPTIMALITY_TOL`` of α*); else the larger α of PTS and the iid coupling (PTS on ties within ``ALPHA_TIE``; the
    coupling, which attains α*_iid(ρ) exactly, built only where it can win: ``choose.coupling_can_win``), replaced
    on draft supports of at most ``SMALL_SUPPORT`` tokens (its LP at most ``MAX_LP_TUPLES`` tuples,
    ``choose.small_lp``) by rule 1 (:func:`gpu.condot.condot_weights`) where its α is larger by more than
    ``ALPHA_TIE``, and elsewhere within the Luce budget by rule 7
    (:func:`gpu.luce.luce_rows_weights`, on rows whose classes of exchangeable tokens fit its budget,
    :func:`gpu.luce.luce_rows`) where its α is larger by more than ``OPTIMALITY_TOL`` —
    :func:`univer_theory.plans.choose.choose_plan`.  As there, rule 7 is fitted only on the rows whose α is below
    α*(ρ) (:func:`univer_theory.alpha_star.alpha_star_rows`) by more than ``OPTIMALITY_TOL``: its α never
    exceeds α*, so the choice is the same (nor where α reaches the ceiling ``ρ·p(supp q)`` of every α less
    ``OPTIMALITY_TOL/2``: ``choose.under_ceiling``); rule 1 is solved on every small support, as there.  Then, on
    the rows still short of α*(ρ) whose top token's first-draw probability exceeded their α by more than
    ``OPTIMALITY_TOL``, rule 8 (:func:`_first_draw`) where it is better by more than ``OPTIMALITY_TOL``, as there.
    ``(w, a [R, V])`` for ``children [R, k]`` or ``[R, T, k]`` (T tuples per row, on one plan per row), ``w``
    shaped as ``children``; ``walk``: how PTS finds θ (:func:`pts_weights`).  Rows with ρ = 0 are never reached:
    ``w = a = 0`` there and no rule is built (``choose.unreached_plan``); rows whose draft support is exactly k
    tokens take ``choose.full_support_weights`` and no other rule.  On the CPU the whole choice is one host
    call on numpy views (:func:`gpu.host.on_host`)."""
    if walk not in WALKS:
        raise ValueError(f"wor_weights: walk must be one of {list(WALKS)}, got {walk!r}")
    return on_host(_wor_weights, c, q, rho, p, children, walk)


def _wor_weights(c, q, rho, p, children, walk: str):
    """:func:`wor_weights` on one backend (:mod:`univer_theory.nx`)."""
    nx = get_backend(c, q)
    w, a = nx.full(children.shape, 0.0, c), nx.zeros_like(c)
    k = children.shape[-1]
    live = rho > 0
    support = (q > 0).sum(-1)                   # drafted tokens per row
    full = live & (support == k)                # every tuple drafts the whole support: α*(ρ) in closed form
    if bool(full.any()):
        rows = nx.nonzero(full)[0]
        w[rows], a[rows] = full_support_weights(c[rows], children[rows]), support_marginal(c[rows], q[rows])
        live = live & ~full
    if not bool(live.all()):
        rows = nx.nonzero(live)[0]
        if rows.shape[0]:
            w[rows], a[rows] = _wor_weights(c[rows], q[rows], rho[rows], p[rows], children[rows], walk)
        return w, a
    order = ratio_argsort(p, q)         # the ratio order of α*(ρ), rule 3's cut and PTS's priority
    if k == 2:
        w_pair, a, feasible = _pair_rule_weights(c, q, rho, p, children.reshape(q.shape[0], -1, 2), order)
        w = w_pair.reshape(children.shape)
    else:
        feasible = ~live                # all False: no row has a plan yet
    rows = nx.nonzero(~feasible)[0]
    if rows.shape[0]:
        w_pts, a_pts = _pts_weights(c[rows], q[rows], p[rows], children[rows], walk, order[rows])
        w[rows], a[rows] = w_pts, a_pts
        star = alpha_star_rows(p[rows], q[rows], k, "iid", rho[rows], order[rows])[0]
        rows = rows[coupling_can_win(star, a_pts.sum(-1), k, support[rows])]  # it attains α*_iid(ρ)
    if rows.shape[0]:
        w_cp, a_cp = _coupling_weights(c[rows], q[rows], children[rows], p[rows])
        _take(w, a, rows, a_cp.sum(-1) > a[rows].sum(-1) + ALPHA_TIE, (w_cp, a_cp), (w[rows], a[rows]))
    small = small_lp(support, k)
    rows = nx.nonzero(~feasible & small)[0]
    if rows.shape[0]:                   # rule 1 on small supports, where it beats them by more than ALPHA_TIE
        w_lp, a_lp, solved = condot_weights(c[rows], q[rows], children[rows], "wor")
        _take(w, a, rows, solved & (a_lp.sum(-1) > a[rows].sum(-1) + ALPHA_TIE), (w_lp, a_lp), (w[rows], a[rows]))
    rows = nx.nonzero(~feasible & ~small & alpha_star_computable(support, k))[0]
    if rows.shape[0]:                   # rules 7 and 8 where the plan so far is short of α*(ρ) by > OPTIMALITY_TOL
        alpha = a[rows].sum(-1)
        below = under_ceiling(c[rows], q[rows], alpha)    # the one-pass gate first: the others on its rows only
        rows, alpha = rows[below], alpha[below]
    if rows.shape[0]:
        first = first_draw_gate(q[rows], alpha, OPTIMALITY_TOL)
        luce = luce_rows(c[rows], q[rows], k)
        rows, first, luce, alpha = rows[first | luce], first[first | luce], luce[first | luce], alpha[first | luce]
    if rows.shape[0]:
        star = alpha_star_rows(p[rows], q[rows], k, "wor", rho[rows], order[rows])[0] - OPTIMALITY_TOL
        fit = rows[luce & (alpha < star)]
        if fit.shape[0]:                # rule 7 where it beats the rest by more than OPTIMALITY_TOL
            w_l, a_l = luce_rows_weights(c[fit], q[fit], children[fit])
            _take(w, a, fit, a_l.sum(-1) > a[fit].sum(-1) + OPTIMALITY_TOL, (w_l, a_l), (w[fit], a[fit]))
        fit = rows[first & (a[rows].sum(-1) < star)]
        if fit.shape[0]:                # rule 8 where it beats the rest by more than OPTIMALITY_TOL
            w_f, a_f = _first_draw(c[fit], q[fit], children[fit], walk)
            _take(w, a, fit, a_f.sum(-1) > a[fit].sum(-1) + OPTIMALITY_TOL, (w_f, a_f), (w[fit], a[fit]))
    return w, a
