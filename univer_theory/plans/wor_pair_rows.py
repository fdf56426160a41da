"""Rule 3 (:mod:`.wor_pair`) on numpy rows as one compiled pass per row — the array form's floats, bit for bit.

:func:`.wor_pair.pair_rule` is written once against the array namespace (numpy or torch rows ``[R, V]``); on
numpy rows it runs here instead.  The array form's ~300 operations a level on sides of a few hundred tokens cost
1.0–2.5 ms a level (1–8 rows) at top 1 024, mostly in dispatch; one pass per row costs a few tenths of a ms a
row, most of it the stable sorts of each side's knots (a radix sort, :func:`univer_theory.nx.stable_argsort_row`;
measured on the SmolLM2-drafted wor binary:4 trees of the benchmark: rule 3 7.3 → 2.2 ms a tree).
:func:`pair_rule_rows` follows the array form step by step, with the same floats in the same order as the array
form on that row alone (a batch of one, the exact core's):

* a side's tokens sit in ``M`` columns, ``M`` the row's own count (not the batch's widest side, which the array
  form pads to with q = c = 0, R = 1: numpy's pairwise sums group by the length, and on a confident row, whose
  β-family cancels terms of ~1/(1 − q(top)), that round-off moved α by 5e-9 past ``OPTIMALITY_TOL`` — rule 3
  feasible alone and not beside a wider row), and its sums run over those M columns as numpy's do
  (:func:`univer_theory.nx.np_sum_row`: numpy's pairwise summation, whose grouping depends on the length);
* prefix and suffix sums are sequential from their first term (:func:`univer_theory.nx._cumsum_rows`);
* sorts are stable (:func:`univer_theory.nx.stable_argsort_row`; the array form's
  :func:`univer_theory.nx.NumpyBackend.argsort`), the
  1-D crossing is :func:`.wor_pair._crossing`'s piece scan, the claim family's recurrence is the loop that
  :func:`.wor_pair.claim_shares`' fixed point reaches;
* ``np.maximum`` / ``np.minimum`` / ``np.clip`` keep their NaN and signed-zero rules (:func:`univer_theory.nx.np_max`,
  :func:`~univer_theory.nx.np_min`, :func:`_clip`).

``tests/theory/test_wor_plans.py`` runs both on seeded grids (sides of every family, confident rows, ragged
batches) and asserts equal arrays.  The math is the array form's; its docstrings state it.
"""
from __future__ import annotations

import numba
import numpy as np

from ..nx import _cumsum_rows, np_max, np_min, np_sum_row, stable_argsort_row
from ..orders import RATIO_SCALE


# ----------------------------------------------------------------------------------------- numpy's elementwise rules
@numba.njit(cache=True, inline="always", error_model="numpy")
def _clip(x, lo, hi):  # pragma: no cover - compiled
    """``np.clip(x, lo, hi)``: ``lo`` where ``x < lo``, then ``hi`` where above it (NaN and −0.0 kept)."""
    y = lo if x < lo else x
    return hi if y > hi else y


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _exclusive(x, reverse):  # pragma: no cover - compiled
    """``Σ_{j<i} x_j`` (``Σ_{j>i}`` with ``reverse``) of one row: the numpy backend's own compiled sums
    (:func:`univer_theory.nx._cumsum_rows`, summed in order from the first term) on it as a batch of one."""
    return _cumsum_rows(x.reshape(1, x.shape[0]), reverse, True)[0]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _leave_one_out(v):  # pragma: no cover - compiled
    """:func:`.wor_pair.leave_one_out` of one row: the sums before each entry plus the sums after it."""
    return _exclusive(v, False) + _exclusive(v, True)


# ----------------------------------------------------------------------------------------- the 1-D crossing
@numba.njit(cache=True, nogil=True, error_model="numpy")
def _first_crossing(flo, lo, hi, knots, dslope, slope, active, start_tol, tol):  # pragma: no cover - compiled
    """:func:`.wor_pair.first_crossing` of one row: the knots sorted stably and clamped to ``[lo, hi]``, the piece
    scan of :func:`.wor_pair._crossing` up to the first knot where f reaches ``−tol``, the interpolation, the
    clamp."""
    if not active:
        return hi
    if not flo < -start_tol:
        return lo
    order = stable_argsort_row(knots)
    x0, f0, rise = lo, flo, slope                       # the piece before the first knot
    gaps, changes, prev = 0.0, 0.0, lo                  # Σ slope·gap, Σ slope changes, the last knot
    for i in range(order.shape[0]):
        x = np_min(np_max(knots[order[i]], lo), hi)
        d = dslope[order[i]]
        changes = d if i == 0 else changes + d
        term = rise * (x - prev)
        gaps = term if i == 0 else gaps + term
        f_at = flo + gaps
        if f_at >= -tol:
            break
        x0, f0, rise, prev = x, f_at, slope + changes, x
    E = x0 + (-tol - f0) / rise if rise > 0 else x0
    return np_min(np_max(E, lo), hi)


# ----------------------------------------------------------------------------------------- the families
@numba.njit(cache=True, nogil=True, error_model="numpy")
def _marginal(q, rest, cross, beta, gamma, general):  # pragma: no cover - compiled
    """:func:`.wor_pair.side_marginal` of one side's row (``general`` False: γ ≡ 1, the β-family's form)."""
    if not general:
        return q * (cross + beta * _leave_one_out(q) / rest + _leave_one_out(q * (1 - beta) / rest))
    kept = _leave_one_out(q * (1 - gamma)) + beta * _leave_one_out(q * gamma)
    return q * (cross + kept / rest + gamma * _leave_one_out(q * (1 - beta) / rest))


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _beta_family(q, rest, c, cross, on, tol, feas_tol):  # pragma: no cover - compiled
    """:func:`.wor_pair.beta_family` of one side's row: β."""
    M = q.shape[0]
    odds = q / rest
    mass = np_sum_row(q)
    lo0 = q * (cross - odds)
    span = q * mass / rest
    total = np_sum_row(lo0 + span)
    room, span1, knots, dslope = np.zeros(M), np.ones(M), np.zeros(2 * M), np.zeros(2 * M)
    for j in range(M):
        if on[j] and span[j] > 0:
            room[j], span1[j] = c[j] - lo0[j], span[j]
            knots[j], knots[M + j] = (room[j] - span[j]) / q[j], room[j] / q[j]
            dslope[j], dslope[M + j] = -q[j], q[j]
    start = np.empty(M)
    for j in range(M):
        start[j] = lo0[j] + span[j] * _clip((room[j] - 0.0) / span1[j], 0.0, 1.0)
    excess = np_sum_row(start) - total
    E = _first_crossing(excess, 0.0, np_sum_row(odds), knots, dslope, mass, on.any(), tol, feas_tol)
    beta = np.ones(M)
    for j in range(M):
        if on[j]:
            beta[j] = _clip((room[j] - q[j] * E) / span1[j], 0.0, 1.0)
    return beta


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _yield_accept(q, rest, c, cross, on, upper, feas_tol):  # pragma: no cover - compiled
    """:func:`.wor_pair.yield_accept` of one side's row: ``(β, γ, exists)``."""
    M = q.shape[0]
    base = q * (cross + _leave_one_out(q) / rest)
    over, under, ratio = np.zeros(M), np.zeros(M), np.zeros(M)
    taken, dslope = np.zeros(M), np.zeros(M)            # q and −q on the takers, 0 elsewhere
    for j in range(M):
        if on[j]:
            over[j], under[j] = np_max(base[j] - c[j], 0.0), np_max(c[j] - base[j], 0.0)
        if under[j] > 0:
            ratio[j], taken[j], dslope[j] = under[j] / q[j], q[j], -q[j]
    beta, gamma = np.ones(M), np.zeros(M)
    top = ratio[0]                                      # np.amax(ratio)
    for j in range(1, M):
        top = np_max(top, ratio[j])
    if upper:
        D = np_sum_row(over)
        act = D > 0
        ok = (not act) or np_sum_row(under) >= D
        if act and ok:
            E = _first_crossing(-D, 0.0, top, ratio, dslope, np_sum_row(taken), True, feas_tol, feas_tol)
            G = D / E
            for j in range(M):
                if over[j] > 0:
                    beta[j] = 1 - over[j] * rest[j] / (q[j] * G)
                if under[j] > 0:
                    gamma[j] = np_min(under[j] / (q[j] * E), 1.0)
    else:
        D = np_sum_row(under)
        act = D > 0
        E = top
        cap = np.zeros(M)
        for j in range(M):
            if over[j] > 0:
                cap[j] = np_min(q[j] / rest[j], over[j] * E / (D + 0 * over[j]) if act else 0.0)
        total = np_sum_row(cap)
        ok = (not act) or total >= E
        if act and ok:
            share = E / total
            for j in range(M):
                if over[j] > 0:
                    beta[j] = 1 - cap[j] * share * rest[j] / q[j]
                if under[j] > 0:
                    gamma[j] = under[j] / (q[j] * E)
    for j in range(M):
        beta[j], gamma[j] = _clip(beta[j], 0.0, 1.0), _clip(gamma[j], 0.0, 1.0)
    return beta, gamma, ok


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _claim_family(q, rest, c, num):  # pragma: no cover - compiled
    """:func:`.wor_pair.claim_family` of one side's row (``num``: its ratio order's numerator, p): ``(t, b, rank)``
    in column order."""
    M = q.shape[0]
    key = np.empty(M)
    for j in range(M):                                  # ratio_argsort(num, q, descending=True)'s keys
        key[j] = -((num[j] * RATIO_SCALE) / q[j]) if q[j] > 0 else np.inf
    order = stable_argsort_row(key)
    qo, ro, co = q[order], rest[order], c[order]
    u = qo / ro
    later = qo * _exclusive(u, True) + u * _exclusive(qo, True)
    t, left = np.zeros(M), np.zeros(M)
    A, B = 0.0, 0.0                                     # Σ_{j<i} u_j(1 − t_j), Σ_{j<i} q_j(1 − t_j)
    for i in range(M):
        left[i] = qo[i] * A + u[i] * B
        if later[i] > 0:
            t[i] = _clip((co[i] - left[i]) / later[i], 0.0, 1.0)
        A += u[i] * (1 - t[i])
        B += qo[i] * (1 - t[i])
    b = left + t * later
    t_out, b_out, rank = np.zeros(M), np.zeros(M), np.empty(M, np.int64)
    for i in range(M):
        t_out[order[i]], b_out[order[i]], rank[order[i]] = t[i], b[i], i
    return t_out, b_out, rank


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _solve_side(q, rest, c, cross, on, upper, feas_tol, num):  # pragma: no cover - compiled
    """:func:`.wor_pair.solve_side` of one side's row (``num``: the claim order's numerator): ``(β, γ, b, family,
    rank, claim_ran)``."""
    M = q.shape[0]
    beta, gamma, b, rank = np.ones(M), np.ones(M), np.zeros(M), np.full(M, -1, np.int64)
    if not on.any():
        return beta, gamma, b, 0, rank, False
    scale = np_max(np.max(c), np.max(q * np_sum_row(q) / rest))
    tol = feas_tol * np_max(scale, 1.0)
    for family in range(2 if upper else 3):
        fr = rank
        if family == 0:
            fb, fg = _beta_family(q, rest, c, cross, on, tol, feas_tol), np.ones(M)
            exists = True
            fm = _marginal(q, rest, cross, fb, fg, False)
        elif family == 1:
            fb, fg, exists = _yield_accept(q, rest, c, cross, on, upper, feas_tol)
            fm = _marginal(q, rest, cross, fb, fg, True) if exists else np.zeros(M)
        else:
            fb, fm, fr = _claim_family(q, rest, c, num)
            fg, exists = np.ones(M), True
        good = exists
        for j in range(M):
            if on[j] and not (fm[j] <= c[j] + tol if upper else fm[j] >= c[j] - tol):
                good = False
        if good:
            for j in range(M):
                if on[j]:
                    beta[j], gamma[j], b[j], rank[j] = fb[j], fg[j], fm[j], fr[j]
            return beta, gamma, b, family, rank, family == 2
    return beta, gamma, b, -1, rank, not upper


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _pair_rule_rows(c, q, num, alpha_star, in_cut, feas_tol, opt_tol, max_odds):  # pragma: no cover - compiled
    """:func:`.wor_pair.pair_rule` row by row (module docstring); its fields as arrays, ``rank`` −1 where no
    claim family was taken, and whether any row's A* ran the claim family."""
    R, V = q.shape
    drafted = q > 0
    on_a, on_h = drafted & in_cut, drafted & ~in_cut
    beta, gamma, b = np.ones((R, V)), np.ones((R, V)), np.zeros((R, V))
    thin, marginal = np.ones((R, V)), np.zeros((R, V))
    rank = np.full((R, V), -1, np.int64)
    family_a, family_h = np.empty(R, np.int64), np.empty(R, np.int64)
    feasible = np.zeros(R, np.bool_)
    claim_ran = False
    for r in range(R):
        rest = _leave_one_out(q[r])
        cross = np.zeros(V)
        for side in range(2):                           # A* first: H's cross term sums over it
            mask, upper = (on_a[r], False) if side == 0 else (on_h[r], True)
            M = max(1, mask.sum())                      # the row's own side: its floats are its own
            cols = np.zeros(M, np.int64)
            on = np.zeros(M, np.bool_)
            n = 0
            for v in range(V):
                if mask[v]:
                    cols[n], on[n] = v, True
                    n += 1
            sq, srest, sc, scross, snum = np.zeros(M), np.ones(M), np.zeros(M), np.zeros(M), np.zeros(M)
            for j in range(n):
                v = cols[j]
                sq[j], srest[j], sc[j], scross[j], snum[j] = q[r, v], rest[v], c[r, v], cross[v], num[r, v]
            sb, sg, sm, family, sr, ran = _solve_side(sq, srest, sc, scross, on, upper, feas_tol, snum)
            for j in range(n):
                v = cols[j]
                beta[r, v], gamma[r, v], b[r, v] = sb[j], sg[j], sm[j]
                if not upper:
                    rank[r, v] = sr[j]
            if upper:
                family_h[r] = family
            else:
                family_a[r] = family
                claim_ran |= ran
                total_q, total_odds = np_sum_row(sq), np_sum_row(sq / srest)
                cross = total_q / rest + total_odds
        for v in range(V):
            if b[r, v] > c[r, v]:
                thin[r, v] = c[r, v] / b[r, v]
        marginal[r] = thin[r] * b[r]
        feasible[r] = family_a[r] >= 0 and family_h[r] >= 0 and np_sum_row(marginal[r]) >= alpha_star[r] - opt_tol
        for v in range(V):                              # .wor_pair.conditioned: the odds at most max_odds
            if drafted[r, v] and rest[v] > 0 and not q[r, v] / rest[v] <= max_odds:
                feasible[r] = False
    return beta, gamma, thin, marginal, on_h, feasible, family_h, family_a, rank, claim_ran


def pair_rule_rows(c, q, alpha_star, in_cut, feas_tol: float, opt_tol: float, max_odds: float, p=None):
    """:func:`.wor_pair.pair_rule` on numpy rows ``c = ρp, q, in_cut [R, V]``, ``alpha_star [R]`` (``p``: the target
    rows, the claim family's ratio order; c when None): the fields of its :class:`~.wor_pair.PairRule` in order
    (``rank`` None where no row's A* ran the claim family)."""
    c, q = (np.ascontiguousarray(x, np.float64) for x in (c, q))
    num = c if p is None else np.ascontiguousarray(p, np.float64)
    *fields, rank, claim_ran = _pair_rule_rows(c, q, num, np.ascontiguousarray(alpha_star, np.float64),
                                               np.ascontiguousarray(in_cut, np.bool_), feas_tol, opt_tol, max_odds)
    return (*fields, rank if claim_ran else None)
