"""Closed forms of the node-level optimum α*(ρ) (theory.md §4.1, §4.2): CondOT(ρ) without an LP.

One node, target ``p``, draft ``q``, k children drawn from the tuple law ``Q_k`` of a process (§1).
CondOT(ρ) is the flat multi-draft OT with the target scaled by ``ρ ∈ [0, 1]`` (ρ = 1: flat OT, §4.1).
Max-flow = min-cut gives

.. math::  α^*(ρ) = \\min_{A ⊆ V} \\big[ ρ\\,p(A) + \\Pr(S ⊄ A) \\big],

A being the tokens whose target capacity is cut.  Per process:

* ``iid`` and ``wor``: a minimising A is a prefix of :func:`ratio_order` (p/q ascending, q = 0 last), so
  ``α*(ρ) = min_j [ρ P_j + Pr(S ⊄ G_j)]`` over the V + 1 prefixes ``G_j`` (``P_j`` prefix sums of p).
  iid: ``Pr(S ⊄ G_j) = 1 − Q_j^k``.  wor: exponential clocks (:func:`prob_subset_wor_prefixes`), or the
  closed form of :func:`prob_subset_wor_k2` for k = 2 (k = 1: ``Pr = q(G)``).
* ``greedy`` (top-(k−1) set T plus one draw from ``q_T = norm(q·1[∉T])``): A must contain T to pay less
  than 1, and then each x ∉ T is in A iff ``ρp(x) < q_T(x)``:
  ``α*(ρ) = ρ p(T) + Σ_{x∉T} min(ρ p(x), q_T(x))``.
* ``topk`` (the deterministic set D of the k most likely draft tokens): ``α*(ρ) = min(1, ρ p(D)) = ρ p(D)``.

Every function accepts rows ``[..., V]`` (leading batch axes, float64) and a ``rho`` that is a scalar or
broadcasts to the batch shape.  Ties of the minimum are resolved towards the smallest cut (first prefix).

**One implementation** (:mod:`.nx`): the formulas — ratio-order prefix costs, ``Pr(S ⊄ G_j)`` for iid, wor
k = 2 and the wor clock integral for k ≥ 3, the greedy and topk forms, the first minimising prefix — are written
once against the array namespace, :func:`alpha_star_rows`: numpy rows for the exact core (its public functions
below validate the inputs, then call it on their rows, a batch of one), torch tensors ``[R, V]`` for
:mod:`gpu` (``gpu.wor_plans``: the wor k = 2 cut of rule 3, and the α*(ρ) gate of rule 7), on any device.  The
cost is ``O(V log V)`` for the order plus, for wor k ≥ 3, ``O(k·m·nodes)`` for the clock integral over the first m
columns of the order, m the most drafted tokens of any row (later prefixes have r = 0 and miss nothing).
Host reads (data-dependent sizes): m, and the clock integral's grid, clamp and per-chunk extents.
"""
from __future__ import annotations

import math
import numbers

import numba
import numpy as np

from .nx import NUMPY, array_module, get_backend
from .orders import order_ranks, ratio_argsort, top_tokens
from .plans.clocks import LOG_RATE_TIME_CAP, LOG_T_RANGE, clock_nodes, log_time_grid, log_time_upper
from .processes import PROCESSES
from .validation import check_choice, check_int, check_simplex

# Exponential-clock integrals (§4.1) use the shared Gauss–Legendre grid of plans.clocks (clock_nodes(k) nodes per
# panel of log t ∈ [−30, 30]: 400 up to k = 4, 600 to k = 9, …).  The upper end grows to log(50/r) for a complement
# mass r < 50·e^{−30} (more panels of the same rule), so the neglected tail ``∫_{t_hi}^∞ r e^{−rt} dt = e^{−50}``
# stays below 2e-22; rates enter as ``r·t = exp(log r + log t)`` (no t is formed, so denormal masses stay finite).


# ----------------------------------------------------------------------------------------- validation
def _check_rows(where: str, target_probs, draft_probs) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(check_simplex(target_probs, where, "target_probs"), dtype=np.float64)
    q = np.asarray(check_simplex(draft_probs, where, "draft_probs"), dtype=np.float64)
    if p.shape != q.shape:
        raise ValueError(f"{where}: target_probs shape {p.shape} and draft_probs shape {q.shape} differ "
                         f"(vocabularies V = {p.shape[-1]} vs V = {q.shape[-1]})")
    return p, q


def _check_k(where: str, draft_probs: np.ndarray, k, process: str) -> int:
    check_choice(process, PROCESSES, where, "process")
    k = check_int(k, where, "k", 1)
    if process != "iid":
        support = int(np.count_nonzero(draft_probs > 0, axis=-1).min())
        if k > support:
            raise ValueError(f"{where}: process {process!r} drafts k = {k} distinct tokens but a draft_probs row "
                             f"has only {support} tokens with positive probability")
    return k


def _check_rho(where: str, rho, batch_shape: tuple) -> np.ndarray:
    raw = np.asarray(rho)
    real = raw.dtype.kind in "iuf" or (raw.dtype == object and all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) for v in raw.flat))      # Fractions too
    if not real:                        # "0.5" was read as 0.5, 0.5 + 0j and "abc" were numpy's errors
        raise ValueError(f"{where}: rho must be a real number (or one per row) in [0, 1], got {rho!r}")
    r = raw.astype(np.float64)
    outside = raw.dtype == object and any(v < 0 or v > 1 for v in raw.flat)    # exact ρ: 1 + 1e-30 is 1.0 as a float
    if outside or not np.all(np.isfinite(r)) or np.any(r < 0) or np.any(r > 1):
        raise ValueError(f"{where}: rho must lie in [0, 1], got {rho!r}")
    try:
        return np.broadcast_to(r, batch_shape)
    except ValueError:
        raise ValueError(f"{where}: rho of shape {r.shape} does not broadcast to the batch shape "
                         f"{batch_shape}") from None


def check_node_inputs(where: str, target_probs, draft_probs, k, process: str, rho=1.0):
    """Validate one node's inputs for CondOT(ρ): ``(p, q, k, ρ)`` as float64 rows ``[..., V]``, int, and a ρ
    broadcast to the batch shape.  Raises ValueError naming ``where``, the argument, the rule and the value."""
    p, q = _check_rows(where, target_probs, draft_probs)
    k = _check_k(where, q, k, process)
    return p, q, k, _check_rho(where, rho, p.shape[:-1])


def _out(values: np.ndarray):
    """0-d results as Python floats, batches as arrays."""
    return float(values) if np.ndim(values) == 0 else values


# ----------------------------------------------------------------------------------------- orders
def ratio_order(target_probs, draft_probs) -> np.ndarray:
    """Tokens sorted by ``p(y)/q(y)`` ascending, tokens with ``q = 0`` last, ties by token id ``[..., V]``.

    The prefixes of this order contain a minimising cut A* of CondOT(ρ) for iid and wor drafting (§4.1).
    """
    p, q = _check_rows("ratio_order", target_probs, draft_probs)
    return ratio_argsort(p, q)


def _top_mask(q, m: int):
    """The m most likely tokens of each row (:func:`~univer_theory.orders.top_tokens`) as a mask."""
    nx = get_backend(q)
    return nx.put(nx.zeros_like(q), top_tokens(q, m), 1.0) > 0


def _suffix_mass(q_sorted):
    """``r_j = Σ_{i ≥ j} q_sorted[i]`` for j = 0..V (``r_V = 0``): the mass outside prefix j, summed directly
    (not as 1 − Q_j) so that a small complement keeps its relative precision."""
    nx = get_backend(q_sorted)
    return nx.concat([nx.cumsum(q_sorted, reverse=True), nx.zeros_like(q_sorted[..., :1])])


def _prefix(x_sorted):
    """``Σ_{i < j} x_sorted[i]`` for j = 0..V."""
    nx = get_backend(x_sorted)
    return nx.concat([nx.zeros_like(x_sorted[..., :1]), nx.cumsum(x_sorted)])


def _safe_div(a, b, where):
    """``a/b`` where ``where`` holds, 0 elsewhere (no division by the masked entries)."""
    nx = get_backend(a, b)
    return nx.where(where, a / nx.where(where, b, 1.0), 0.0)


# ----------------------------------------------------------------------------------------- Pr_wor(S ⊆ G)
def _wor_miss_k2(q_sorted):
    """``Pr_wor(S ⊄ G_j) = r_j (1 + Σ_{x∈G_j} q_x/(1 − q_x))`` for k = 2, all prefixes ``[..., V+1]``.

    ``1 − q_x`` is summed from the other tokens, so a dominant token keeps the tail's precision.  Its odds
    ``q_x/(1 − q_x)`` overflow when the rest is subnormal; since ``r_j ≤ 1 − q_x`` whenever x ∈ G_j, that one
    term is taken as ``q_x·(r_j/(1 − q_x))`` (≤ q_x) instead."""
    nx = get_backend(q_sorted)
    V = q_sorted.shape[-1]
    r = _suffix_mass(q_sorted)
    others = _prefix(q_sorted)[..., :-1] + r[..., 1:]
    top = array_module(q_sorted).argmax(q_sorted, -1)[..., None]          # the only x with 1 − q_x < 1/2
    odds = _safe_div(q_sorted, others, (q_sorted > 0) & (nx.arange(V, q_sorted) != top))
    top_others, top_q = nx.take(others, top), nx.take(q_sorted, top)
    in_prefix = nx.arange(V + 1, q_sorted) > top                          # G_j holds the top token
    top_term = top_q * _safe_div(r, top_others, in_prefix & (top_q > 0) & (top_others > 0))   # ≤ q_top there
    return r * (1.0 + _prefix(odds)) + top_term


#: Elements of one time chunk of the clock integral (rows × nodes × tokens per array, ~6 such arrays live).
CLOCK_CHUNK = 2**17
#: ``log`` of the largest value an elementary symmetric sum of the clock odds may reach (float64 max ≈ e^{709}).
LOG_SUM_RANGE = 700.0
#: The clamp ``δ = e^{−λ}`` of :func:`_wor_miss_clocks` must keep its error ``V·δ`` below ``e^{−CLAMP_MARGIN}``.
CLAMP_MARGIN = 37.0
#: A clock with ``q·t ≥ SURE_RING`` has rung by t except with probability ``e^{−50}``: a prefix holding k such
#: clocks has ``Pr[N_G(t) < k] ≤ k·e^{−50}``, and its term is dropped.
SURE_RING = 50.0
#: A prefix whose ``r·t`` lies outside ``[e^{−46}, e^{6.7}]`` at node t adds below ``1e-20·w_t`` there
#: (``r t e^{−r t} ≤ r t``, resp. ``≤ e^{−800}``): those prefixes are not computed, nodes without others skipped.
LOG_RATE_TIME_SPAN = (-46.0, 6.7)


def wor_clocks_max_tokens(k: int) -> float:
    """The most tokens V whose clock integral of α*(ρ) for ``wor`` with k ≥ 3 children is within float64's range
    (:func:`_clock_clamp`: ``λ = LOG_SUM_RANGE/(k − 1) − log V`` must keep ``log V − λ ≤ −CLAMP_MARGIN``):
    ``e^{(LOG_SUM_RANGE/(k − 1) − CLAMP_MARGIN)/2}`` — ~6e5 at k = 12, ~4e4 at k = 13, ~125 at k = 16."""
    return math.exp((LOG_SUM_RANGE / max(k - 1, 1) - CLAMP_MARGIN) / 2)


def wor_clocks_in_range(V: int, k: int) -> bool:
    """Whether the clock integral of α*(ρ) for ``wor`` (k ≥ 3) over V tokens is within float64's range
    (:func:`wor_clocks_max_tokens`: about k ≤ 12 at V = 128 000, k ≤ 17 at V = 10)."""
    return V <= wor_clocks_max_tokens(k)


def _clock_clamp(V: int, k: int) -> float:
    """``λ`` with ``(k − 1)(λ + log V) ≤`` :data:`LOG_SUM_RANGE`: the clamped odds ``r_x ≤ e^{λ}`` keep every
    ``e_n(r) ≤ (V e^{λ})^n``, n < k, finite.  Raises ValueError when ``V·e^{−λ}`` cannot stay below
    ``e^{−37}`` (:func:`wor_clocks_in_range`)."""
    lam = LOG_SUM_RANGE / max(k - 1, 1) - math.log(V)
    if not wor_clocks_in_range(V, k):
        raise ValueError(f"_wor_miss_clocks: k = {k} children over V = {V} tokens is beyond the float64 range of "
                         f"the clock integral's elementary symmetric sums")
    return lam


def _symmetric_below(odds, k: int):
    """``Σ_{n<k} e_n(odds_0..odds_j)`` for every prefix j along the last axis: ``e_n`` of the prefixes by the
    nested cumulative sums ``e_n(j) = Σ_{i≤j} odds_i e_{n−1}(i − 1)`` (non-negative terms, no cancellation).
    numpy: the sums fused in one compiled pass (:func:`_symmetric_below_rows`)."""
    nx = get_backend(odds)
    V = odds.shape[-1]
    if k == 1:
        return nx.zeros_like(odds) + 1.0
    if nx is NUMPY:
        return _symmetric_below_rows(odds.reshape(math.prod(odds.shape[:-1]), V), k).reshape(odds.shape)
    e_n = nx.cumsum(odds)
    total = e_n + 1.0
    for _ in range(2, k):                                                  # e_n lives at j = n−1..V−1
        e_n = nx.cumsum(odds[..., V - e_n.shape[-1] + 1:] * e_n[..., :-1])
        total[..., V - e_n.shape[-1]:] += e_n
    return total


@numba.njit(cache=True, nogil=True)
def _symmetric_below_rows(odds, k):  # pragma: no cover - compiled
    """:func:`_symmetric_below` on rows ``odds [R, V]`` (k ≥ 2), the same floats: one pass per n, each forming
    ``e_n`` from ``e_{n−1}`` with its running sum in a register and adding it to the total as it goes (``(e_1 + 1) +
    e_2 + …``, the array form's order).  ``e_1`` is held in the total until the second pass adds ``1 + e_2`` (one
    store an entry: a second stream of stores made a pass ~10× slower); ``e_n`` for n ≥ 2 is kept beside it only
    when a later pass needs it (k ≥ 4).  The array form's 2k − 1 passes over ``[nodes, V]`` were half of α*(ρ) at
    V = 128 000, k = 3."""
    R, V = odds.shape
    total, prev = np.empty((R, V)), np.empty(V if k > 3 else 0)
    if V == 0:
        return total
    one = 1.0 if k == 2 else 0.0                        # k = 2: the total is e_1 + 1 at once
    for r in range(R):
        o, tot = odds[r], total[r]
        acc = o[0]                                      # e_1(j): the cumulative sum of the odds
        tot[0] = acc + one
        for j in range(1, V):
            acc = acc + o[j]
            tot[j] = acc + one
        if k == 2:
            continue
        tot[0] = tot[0] + 1.0                           # no e_2 at j = 0
        if V == 1:
            continue
        acc = o[1] * o[0]                               # e_2(1) = odds_1·e_1(0)
        last = tot[1]
        tot[1] = (last + 1.0) + acc
        if k > 3:
            prev[1] = acc                               # e_2 lives at j ≥ 1
        for j in range(2, V):
            cur = tot[j]                                # e_1(j)
            acc = acc + o[j] * last
            tot[j] = (cur + 1.0) + acc
            if k > 3:
                prev[j] = acc
            last = cur
        for n in range(3, min(k, V + 1)):               # e_n(j), j ≥ n − 1, from last = e_{n−1}(j − 1)
            last = prev[n - 1]
            acc = o[n - 1] * prev[n - 2]
            prev[n - 1] = acc
            tot[n - 1] += acc
            for j in range(n, V):
                cur = prev[j]
                acc = acc + o[j] * last
                prev[j] = acc
                tot[j] += acc
                last = cur
    return total


def _sure_extent(log_q, s: float, k: int) -> int:
    """Tokens (a prefix of the order) whose prefixes matter at node ``s = log t``: up to the k-th clock with
    ``q·t ≥`` :data:`SURE_RING` in every row (all V where a row has fewer).  A host read."""
    nx = get_backend(log_q)
    hits = nx.cumsum(nx.asarray(log_q >= math.log(SURE_RING) - s, log_q))
    before = nx.sum(nx.asarray(hits < k, log_q))                           # tokens before the k-th sure ring
    return int(min(float(before.max()) + 1, log_q.shape[-1]))


def _live_prefixes(log_r, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per node ``s = log t`` (host numpy): whether any prefix has ``log(r t)`` in :data:`LOG_RATE_TIME_SPAN`,
    and the number of prefixes up to the last with ``log(r t)`` above its lower end (``log_r [B, V]``
    non-increasing).  A host read of ``[B, nodes]`` counts."""
    nx = get_backend(log_r)
    lo, hi = LOG_RATE_TIME_SPAN
    neg = -log_r                                                           # ascending
    above_hi = nx.to_numpy(nx.searchsorted_each(neg, nx.asarray(s - hi, log_r)))              # log r > hi − s
    above_lo = nx.to_numpy(nx.searchsorted_each(neg, nx.asarray(s - lo, log_r), right=True))  # log r ≥ lo − s
    return (above_lo > above_hi).any(axis=0), above_lo.max(axis=0)


def _wor_miss_clocks(q_sorted, k: int, chunk: int = CLOCK_CHUNK):
    """``Pr_wor(S ⊄ G_j)`` for every prefix ``G_j`` of ``q_sorted [B, V]`` by exponential clocks (numpy or torch).

    Token x rings at ``E_x ~ Exp(q_x)``; S is the first k rings, so ``S ⊄ G`` iff fewer than k tokens of G
    ring before the first ring outside G, ``T ~ Exp(r)``, ``r = q(V∖G)``:
    ``Pr(S ⊄ G) = ∫_0^∞ r e^{−rt} Pr[N_G(t) < k] dt``, ``N_G(t) = Σ_{x∈G} Bern(1 − e_x)``, ``e_x = e^{−q_x t}``.
    The Poisson-binomial law of every prefix at once: ``Pr[N_{G_j}(t) = n] = Π_{x∈G_j} e_x · e_n(odds_x: x∈G_j)``
    with the odds ``(1 − e_x)/e_x = expm1(q_x t)`` (:func:`_symmetric_below`).  The clocks are clamped at
    ``q_x t ≤ λ`` (:func:`_clock_clamp`) to keep the sums finite: each factor ``e_x + (1 − e_x)u`` moves by at
    most ``δ = e^{−λ}``, every probability by at most ``V·δ < e^{−37}``.  Two kinds of Gauss–Legendre nodes:

    * no clock clamped (``q_max t ≤ λ``): ``Π_{x∈G_j} e_x · e^{−r_j t} = e^{−t·q(V)}``, so the term is
      ``r_j · [t e^{−t q(V)} w_t] · Σ_{n<k} e_n`` — the bracket a weight per node (nodes where it underflows,
      t ≳ 745, are skipped: their terms are below e^{−40});
    * clamped (large t; rates enter as ``exp(log q + log t)``, ``plans.clocks``, so subnormal tails stay finite):
      ``exp(log(r t) − r t − Σ_{x∈G_j} min(q_x t, λ)) · Σ_{n<k} e_n``, over the prefixes up to the k-th sure
      ring (:func:`_sure_extent`; the later ones are below ``k e^{−50}``) and the last with ``r t ≥ e^{−46}``,
      at the nodes where some prefix has ``r t`` in ``[e^{−46}, e^{6.7}]`` (:func:`_live_prefixes`).

    Nodes are processed in chunks of ~:data:`CLOCK_CHUNK` elements per array.  The piece ``t < e^{−30}`` is
    added in closed form (``N = 0`` there up to ``O(e^{−30})``); the upper end covers ``r t ≤ 50`` for the
    smallest positive r.  Exact values where the integral is degenerate: 1 when G has fewer than k drafted
    tokens, 0 when r = 0.  The rows share one grid, clamp and chunking (set by the batch's smallest mass,
    largest q and widest extents; a row's own values move by the dropped terms' bound, below 1e-20); those
    sizes are host reads.
    """
    nx, xp = get_backend(q_sorted), array_module(q_sorted)
    B, V = q_sorted.shape
    r = _suffix_mass(q_sorted)                                              # [B, V+1]
    s, wt = log_time_grid(clock_nodes(k), log_time_upper(min(1.0, float(nx.where(r > 0, r, 1.0).min()))))
    lam = _clock_clamp(V, k)
    n_pos = _prefix(nx.asarray(q_sorted > 0, q_sorted))                     # [B, V+1]
    plain = s <= math.log(lam / float(q_sorted.max()))                      # no clock clamped
    t = np.exp(s[plain])                                                    # ≤ λ/q_max ≤ λV: finite
    live = wt[plain] * t * np.exp(-t * float(r[:, 0].min())) > 0            # some row's weight is positive
    t = nx.asarray(t[live], q_sorted)
    w_plain = nx.asarray(wt[plain][live], q_sorted) * t * nx.exp(-t * r[:, :1])   # [B, n]
    sums = nx.zeros_like(q_sorted)
    step = max(1, chunk // (B * V))
    for lo in range(0, t.shape[0], step):
        below = _symmetric_below(nx.expm1(q_sorted[:, None, :] * t[lo:lo + step, None]), k)
        sums = sums + xp.einsum("bcv,bc->bv", below, w_plain[:, lo:lo + step])
    miss = nx.concat([nx.zeros_like(r[:, :1]) + 1.0, r[:, 1:] * sums])
    log_q, log_r = nx.log(q_sorted), nx.log(r[:, 1:])
    live, extent = _live_prefixes(log_r, s[~plain])
    s, wt, extent = s[~plain][live], wt[~plain][live], extent[live]
    lo = 0
    while lo < s.size:
        sure = _sure_extent(log_q, s[lo], k)
        step = max(1, chunk // (B * max(1, min(sure, extent[lo]))))
        S, W = nx.asarray(s[lo:lo + step, None], q_sorted), nx.asarray(wt[lo:lo + step], q_sorted)
        J = max(1, min(sure, int(extent[lo:lo + step].max())))
        lo += S.shape[0]
        neg_log_e = nx.minimum(nx.exp(nx.minimum(log_q[:, None, :J] + S, LOG_RATE_TIME_CAP)), lam)
        below = _symmetric_below(nx.expm1(neg_log_e), k)                   # [B, c, J]
        log_rt = nx.minimum(log_r[:, None, :J] + S, LOG_RATE_TIME_CAP)
        log_rt = log_rt - nx.exp(log_rt)                                   # log(r t e^{−r t})
        log_rt = log_rt - nx.cumsum(neg_log_e)                             # + log Π_{x∈G_{j+1}} max(e_x, δ)
        miss[:, 1:J + 1] += xp.einsum("bcv,c->bv", below * nx.exp(log_rt), W)
    miss = miss - nx.expm1(-r * math.exp(LOG_T_RANGE[0]))                  # the piece t < e^{−30}
    miss = nx.where(n_pos < k, 1.0, nx.where(r == 0, 0.0, miss))
    return nx.clip(miss, 0.0, 1.0)


def _wor_miss(q_sorted, k: int):
    """``Pr_wor(S ⊄ G_j)`` for all prefixes of ``q_sorted [..., V]`` (ratio order: undrafted tokens last) →
    ``[..., V+1]`` (dispatch on k).  The integrals run over the first m columns, m the most drafted tokens of any
    row (a host read): every later prefix has ``r = 0`` and misses nothing."""
    nx = get_backend(q_sorted)
    if k == 1:
        return _suffix_mass(q_sorted)
    if math.prod(q_sorted.shape[:-1]) == 0:                                # no rows
        return nx.concat([q_sorted, q_sorted[..., :1]])
    m = max(1, int(nx.sum(nx.asarray(q_sorted > 0, q_sorted)).max()))
    head = q_sorted[..., :m]
    if k == 2:
        miss = _wor_miss_k2(head)
    else:
        miss = _wor_miss_clocks(head.reshape(-1, m), k).reshape(head.shape[:-1] + (m + 1,))
    return nx.concat([miss, nx.zeros_like(q_sorted[..., m:])])


def prob_subset_wor_prefixes(draft_probs, order, k: int) -> np.ndarray:
    """``Pr_wor(S ⊆ G_j)`` for every prefix ``G_j`` (first j tokens of ``order``), j = 0..V → ``[..., V+1]``.

    Always the exponential-clock integral of §4.1 (also for k ≤ 2, for cross-checking the closed forms):
    ``Pr(S ⊆ G) = ∫_0^∞ r e^{−rt} Pr[Σ_{x∈G} B_x(t) ≥ k] dt``, ``r = 1 − q(G)``, ``B_x(t) ~ Bern(1 − e^{−q_x t})``;
    O(k·V·nodes).  Accuracy ~1e-14 on well-conditioned rows.
    """
    where = "prob_subset_wor_prefixes"
    q = np.asarray(check_simplex(draft_probs, where, "draft_probs"), dtype=np.float64)
    k = _check_k(where, q, k, "wor")
    order = _check_order(where, order, q.shape)
    q_sorted = np.take_along_axis(q, order, axis=-1)
    flat = q_sorted.reshape(-1, q.shape[-1])
    miss = _wor_miss_clocks(flat, k).reshape(q.shape[:-1] + (q.shape[-1] + 1,))
    return 1.0 - miss


def _check_order(where: str, order, shape: tuple) -> np.ndarray:
    order = np.asarray(order)
    if order.shape != shape or not np.issubdtype(order.dtype, np.integer) or not np.array_equal(
            np.sort(order, axis=-1), np.broadcast_to(np.arange(shape[-1]), shape)):
        raise ValueError(f"{where}: order must be a permutation of the {shape[-1]} tokens per row with shape "
                         f"{shape}, got shape {order.shape}")
    return order


def _order_set_first(where: str, mask, shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    mask = np.asarray(mask)
    if mask.dtype != bool or mask.shape != shape:
        raise ValueError(f"{where}: G_mask must be a boolean array of shape {shape}, got {mask.dtype} {mask.shape}")
    return np.argsort(~mask, axis=-1, kind="stable"), mask.sum(axis=-1)


def prob_subset_wor(draft_probs, G_mask, k: int):
    """``Pr_wor(S ⊆ G)`` for a token set G (boolean ``G_mask [..., V]``), by exponential clocks."""
    where = "prob_subset_wor"
    q = np.asarray(check_simplex(draft_probs, where, "draft_probs"), dtype=np.float64)
    order, size = _order_set_first(where, G_mask, q.shape)
    all_prefixes = prob_subset_wor_prefixes(q, order, k)
    return _out(np.take_along_axis(all_prefixes, size[..., None], axis=-1)[..., 0])


def prob_subset_wor_k2(draft_probs, G_mask):
    """k = 2 closed form ``Pr_wor(S ⊆ G) = 1 − r − r Σ_{x∈G} q_x/(1 − q_x)``, ``r = 1 − q(G)`` (§4.1):
    ``Σ_{x∈G} q_x (q(G) − q_x)/(1 − q_x)`` rewritten."""
    where = "prob_subset_wor_k2"
    q = np.asarray(check_simplex(draft_probs, where, "draft_probs"), dtype=np.float64)
    _check_k(where, q, 2, "wor")
    order, size = _order_set_first(where, G_mask, q.shape)
    miss = _wor_miss_k2(np.take_along_axis(q, order, axis=-1))
    return _out(1.0 - np.take_along_axis(miss, size[..., None], axis=-1)[..., 0])


# ----------------------------------------------------------------------------------------- α*(ρ)
def _prefix_cut(p, rho, miss, order):
    """Minimise ``ρ P_j + Pr(S ⊄ G_j)`` over prefixes (the first minimum); returns (value, cut mask)."""
    nx = get_backend(p, miss)
    cost = rho[..., None] * _prefix(nx.take(p, order)) + miss
    j = array_module(cost).argmin(cost, -1)[..., None]
    return nx.take(cost, j)[..., 0], order_ranks(order) < j


def _iid_miss(q_sorted, k: int):
    """``1 − Q_j^k = 1 − (1 − r_j)^k`` for all prefixes, accurate for small complements r_j (r_0 = 1:
    ``log1p(−1) = −∞`` gives exactly 1)."""
    nx = get_backend(q_sorted)
    return -nx.expm1(k * nx.log1p(-nx.minimum(_suffix_mass(q_sorted), 1.0)))


def alpha_star_rows(p, q, k: int, process: str, rho, order=None):
    """``(α*(ρ) [...], A* [..., V])`` on float64 rows ``p, q [..., V]`` — numpy arrays (the exact core: one row,
    a batch of one) or torch tensors (:mod:`gpu`: the R nodes of a level, on any device), ``rho`` a scalar or an
    array of the batch shape.  The one implementation behind :func:`alpha_star_and_cut` (which validates its
    inputs; here they are the caller's): ``α*(ρ) = min_A [ρ p(A) + Pr(S ⊄ A)]`` per process (module docstring),
    A* the first minimising prefix for iid / wor.  ``order``: the rows' ``ratio_argsort(p, q)`` when the caller
    has it already (iid / wor; else it is sorted here)."""
    check_choice(process, PROCESSES, "alpha_star_rows", "process")
    check_int(k, "alpha_star_rows", "k", 1)
    nx = get_backend(p, q)
    rho = nx.asarray(rho, p)
    if process in ("iid", "wor"):
        order = ratio_argsort(p, q) if order is None else order
        q_sorted = nx.take(q, order)
        miss = _iid_miss(q_sorted, k) if process == "iid" else _wor_miss(q_sorted, k)
        return _prefix_cut(p, rho, miss, order)
    if process == "topk":
        cut = _top_mask(q, k)
        return rho * nx.sum(nx.where(cut, p, 0.0)), cut
    top = _top_mask(q, k - 1)                                              # greedy
    rest = nx.where(top, 0.0, q)
    q_rest = rest / nx.sum(rest, keepdims=True)
    c = rho[..., None] * p
    return nx.sum(nx.where(top, c, nx.minimum(c, q_rest))), top | (c < q_rest)


def alpha_star_and_cut(target_probs, draft_probs, k: int, process: str, rho=1.0, where: str = "alpha_star"):
    """``(α*(ρ), A*)``: the CondOT(ρ) value ``[...]`` and a minimising cut ``A*`` (boolean ``[..., V]``).

    ``α*(ρ) = min_A [ρ p(A) + Pr(S ⊄ A)]`` (module docstring for the per-process forms); A* is the set of
    tokens whose target capacity ``ρ p(y)`` is saturated by the max-flow, the complement H = V∖A* holds the
    tokens that keep spare target mass.  Among equal costs the smallest prefix is returned.  Validated numpy
    rows (a ValueError names ``where``); the formulas are :func:`alpha_star_rows`.
    """
    p, q, k, rho = check_node_inputs(where, target_probs, draft_probs, k, process, rho)
    value, cut = alpha_star_rows(p, q, k, process, rho)
    return _out(value), cut


def alpha_star(target_probs, draft_probs, k: int, process: str, rho=1.0):
    """CondOT(ρ) value ``α*(ρ) = min_A [ρ p(A) + Pr(S ⊄ A)]`` for ``process`` ∈ iid / wor / topk / greedy (each
    process's closed form: the module docstring)."""
    return alpha_star_and_cut(target_probs, draft_probs, k, process, rho)[0]


def optimal_cut(target_probs, draft_probs, k: int, process: str, rho=1.0) -> np.ndarray:
    """A minimising cut ``A*`` of CondOT(ρ) as a boolean mask ``[..., V]`` (see :func:`alpha_star_and_cut`)."""
    return alpha_star_and_cut(target_probs, draft_probs, k, process, rho)[1]
