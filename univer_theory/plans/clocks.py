"""Exponential-clock integrals for without-replacement drafting (theory.md §4.1, §6.5).

A wor tuple of size k is the arrival order of the first k of independent clocks ``E_x ~ Exp(q_x)``.
Probabilities of events "y is among the first k arrivals, and the other arrivals carry weights g" are
integrals over the arrival time ``T`` of a generating polynomial in a marker ``u`` (one ``u`` per arrival
before T); the coefficient of ``u^{k−1}`` selects "exactly k−1 arrivals before T".  ``T`` is integrated by
Gauss–Legendre in ``s = log T`` (the integrands decay double-exponentially for large T and like a power of T
for small T), 400 nodes per panel of width 60.

**The range follows the row.**  The grid starts at ``s = −30`` and ends at ``s_hi = max(30, log(50/q_(k)))``
with ``q_(k)`` the k-th largest clock rate: the k-th arrival comes after ``T`` with probability at most
``Σ_{j≤k} e^{−q_(j) T} ≤ k·e^{−50}`` there.  A fixed ``[−30, 30]`` misses the arrivals of a tail whose rates
are below ~1e-12 (a confident draft row), which made PTS's availabilities — and with them its residual — wrong
by up to the whole tail mass.  **No time is ever formed**: every rate enters as ``q·T = exp(log q + s)``, and
the Jacobian ``dT = T ds`` is carried by the one rate factor of each integrand (``q_y e_y dT = (q_y T) e_y ds``),
so rates down to the smallest denormal stay finite.  ``1 − e^{−qT}`` is taken by expm1.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ..nx import array_module, get_backend

#: Gauss–Legendre nodes per panel of width 60 in log T (theory.md §4.1: 400 nodes on log t ∈ [−30, 30]).
LOG_T_NODES = 400
LOG_T_RANGE = (-30.0, 30.0)
#: The upper end covers ``q_(k)·T ≤ TAIL_RATE_TIME`` (neglected mass ≤ k·e^{−50}).
TAIL_RATE_TIME = 50.0
#: ``log`` of the largest ``q·T`` formed: ``e^{−q·T}`` and ``q·T·e^{−q·T}`` are exactly 0 in float64 beyond ~745,
#: and the cap keeps ``q·T`` finite (an infinite one would give ``∞·0``).
LOG_RATE_TIME_CAP = math.log(1e4)


def grid_panels(slowest_rate):
    """Panels of width 60 from ``s = −30`` that cover ``q_(k)·T ≤ TAIL_RATE_TIME`` for a slowest relevant clock
    rate ``q_(k) > 0`` (module docstring): ``1 + max(0, ⌈(log(50/q_(k)) − 30)/60⌉)``, 1 to 13 in float64.  A
    float, or a torch tensor of rates (one count per row, as floats, on the rates' device: no host read)."""
    width = LOG_T_RANGE[1] - LOG_T_RANGE[0]
    if isinstance(slowest_rate, (int, float)):
        return 1 + max(0, math.ceil((math.log(TAIL_RATE_TIME) - math.log(slowest_rate) - LOG_T_RANGE[1]) / width))
    return 1 + ((math.log(TAIL_RATE_TIME) - slowest_rate.log() - LOG_T_RANGE[1]) / width).ceil().clamp(min=0)


def log_time_upper(slowest_rate: float) -> float:
    """Upper end of the grid in ``s = log T`` for a slowest relevant clock rate (module docstring), on a
    whole-panel boundary (:func:`grid_panels`) so that nearby rows share a grid (and its cache)."""
    if not slowest_rate > 0:
        raise ValueError(f"log_time_upper: the slowest clock rate must be positive, got {slowest_rate!r}")
    return LOG_T_RANGE[0] + (LOG_T_RANGE[1] - LOG_T_RANGE[0]) * grid_panels(float(slowest_rate))


def kth_largest(rates: np.ndarray, k: int) -> float:
    """The k-th largest entry of a non-negative rate vector (the ``q_(k)`` of the module docstring)."""
    rates = np.asarray(rates, dtype=np.float64).ravel()
    return float(np.partition(rates, rates.size - k)[rates.size - k])


@lru_cache(maxsize=16)
def log_time_grid(nodes: int = LOG_T_NODES, upper: float = LOG_T_RANGE[1]):
    """Nodes ``s = log T`` and weights with ``∫_0^∞ h(T) dT ≈ Σ weights·T·h(T)`` on ``[−30, upper]`` (read-only,
    cached: the Legendre nodes cost an eigenvalue problem of size ``nodes``).  The weights are in ``ds``: the
    Jacobian ``T`` is the caller's, folded into a rate (module docstring).

    Equal panels of width 60 with ``nodes`` nodes each (one panel for the default range).
    """
    x, w = np.polynomial.legendre.leggauss(nodes)
    lo = LOG_T_RANGE[0]
    panels = max(1, int(np.ceil((upper - lo) / (LOG_T_RANGE[1] - LOG_T_RANGE[0]))))
    edges = np.linspace(lo, upper, panels + 1)
    half = 0.5 * np.diff(edges)[:, None]
    s = (half * x + 0.5 * (edges[:-1] + edges[1:])[:, None]).ravel()
    weights = (half * w).ravel()
    s.flags.writeable = weights.flags.writeable = False
    return s, weights


def rate_times(rates, s):
    """``q·T = exp(log q + s)`` for rates ``[..., 1]`` against nodes ``s [t]`` (0 where q = 0), never forming T;
    capped at ``e^{LOG_RATE_TIME_CAP}``, where every clock term is exactly 0 or 1.  numpy arrays or torch tensors
    (:mod:`univer_theory.nx`; the batched clock integral of ``gpu.wor_plans`` uses it)."""
    nx = get_backend(rates, s)
    return nx.exp(nx.clip(nx.log(rates) + s, None, LOG_RATE_TIME_CAP))


def _pair_step(state, e, lin, de, reverse: bool = False):
    """``(P, D) ↦ (P·(e + lin·u), D·(e + lin·u) + de·P)`` for polynomials in u truncated at their degree, every
    row at once: ``state [R, 2, k, t]`` (P and D degree-major; with ``reverse`` highest degree first),
    ``e, lin, de [R, t]``.  numpy arrays or torch tensors."""
    out = state * e[:, None, None]
    if reverse:
        out[:, :, :-1] += state[:, :, 1:] * lin[:, None, None]
    else:
        out[:, :, 1:] += state[:, :, :-1] * lin[:, None, None]
    out[:, 1] += de[:, None] * state[:, 0]
    return out


def thinning_walk(qs, cs, k: int, s, weights, head: float = 0.0):
    """PTS's priority walk (module docstring; :func:`sequential_thinning_avail`) on rows already in priority
    order, every row at once: ``qs, cs [R, m]`` (q and ρp; undrafted positions, q = 0, come last and are
    identity steps with θ = 0), nodes ``s [t]`` and weights ``[R, t]`` (0 beyond a row's own panels).  Returns
    ``(θ, avail) [R, m]``.  ``head`` adds ``head·q`` to each availability (the grid's piece below its first node,
    :func:`sequential_thinning_avail`).

    The walk is sequential over the m priority positions, not over rows.  Suffix products over the
    lower-priority tokens (g = 1) are kept highest degree first (the coefficient products need no flip) at ~√m
    checkpoints and rebuilt block by block, so memory is O(√m·k·t) per row.  numpy arrays (the exact core, and
    ``gpu.wor_plans`` on the CPU through views of its tensors) or torch tensors (an accelerator)."""
    xp = array_module(qs)
    R, m = qs.shape
    one = xp.zeros((R, 2, k, s.shape[0]), dtype=qs.dtype, **({} if xp is np else {"device": qs.device}))
    one[:, 0, 0] = 1.0                                                  # (P, D) = (1, 0)
    top = 0 * one
    top[:, 0, k - 1] = 1.0                                              # the suffix's 1, highest degree first
    avail, theta = 0 * qs, 0 * qs

    def clocks(lo, hi):
        """``(e^{−qT}, 1 − e^{−qT}, qT·e^{−qT})`` of positions lo..hi−1 ``[R, hi − lo, t]`` (expm1 keeps tiny q's
        precision; the third carries the Jacobian, module docstring)."""
        x = rate_times(qs[:, lo:hi, None], s)
        e = xp.exp(-x)
        return e, -xp.expm1(-x), x * e

    block = max(1, math.isqrt(m))
    starts = range(0, m, block)
    checkpoints, suf = {}, top
    for start in reversed(starts):
        end = min(start + block, m)
        checkpoints[start] = suf
        E, RING, QE = clocks(start, end)
        for i in range(end - 1, start - 1, -1):
            suf = _pair_step(suf, E[:, i - start], RING[:, i - start], QE[:, i - start], reverse=True)
    pre = one
    for start in starts:
        end = min(start + block, m)
        E, RING, QE = clocks(start, end)
        sufs, suf = [None] * (end - start), checkpoints.pop(start)
        for i in range(end - 1, start - 1, -1):
            sufs[i - start] = suf
            suf = _pair_step(suf, E[:, i - start], RING[:, i - start], QE[:, i - start], reverse=True)
        for i in range(start, end):
            suf, e, ring, qe = sufs[i - start], E[:, i - start], RING[:, i - start], QE[:, i - start]
            sufs[i - start] = None
            first = qe * (pre[:, 0] * suf[:, 0]).sum(1)                               # [u^{k−1}] P_pre·P_suf
            later = ring * ((pre[:, 1, :k - 1] * suf[:, 0, 1:]).sum(1) + (pre[:, 0, :k - 1] * suf[:, 1, 1:]).sum(1))
            av = ((first + later) * weights).sum(-1).clip(min=0) + head * qs[:, i]
            c = cs[:, i]
            th = xp.where(c <= 0, 0.0, xp.where(c >= av, 1.0, c / xp.where(c >= av, 1.0, av)))
            avail[:, i], theta[:, i] = av, th
            g = 1.0 - th
            pre = _pair_step(pre, e, g[:, None] * ring, g[:, None] * qe)
    return theta, avail


def sequential_thinning_avail(draft_probs: np.ndarray, order, c: np.ndarray, k: int,
                              nodes: int = LOG_T_NODES):
    """PTS availabilities and acceptance probabilities (theory.md §6.3 rule 4, §6.5), in one priority pass.

    Walk the drafted tokens in ``order`` (highest priority first).  For token y:
    ``avail(y) = E[1(y∈S) Π_{z∈S, z≺y} (1 − θ_z)]`` under the wor law of S (k children of ``q``), and
    ``θ_y = min(1, c(y)/avail(y))`` (θ = 0 when c(y) = 0).  With ``e_z = e^{−q_z T}``, ``g_z = 1 − θ_z`` for
    z ≺ y and 1 otherwise, ``f_z(T,u) = e_z + g_z(1 − e_z)u`` and
    ``D_{−y} = Σ_{z≠y} g_z q_z e_z Π_{w≠y,z} f_w``:

    ``avail(y) = ∫_0^∞ [u^{k−1}] { q_y e_y Π_{z≠y} f_z + (1 − e_y)·u·D_{−y} } dT``

    (first term: y is the k-th arrival; second: y arrived earlier and z is the k-th).  ``Π_{z≠y}`` splits
    into a prefix product over higher-priority tokens (with their final θ) and a suffix product over
    lower-priority ones (g = 1); both are kept as polynomials truncated at degree k−1, so the pass costs
    O(m·k·nodes) for m drafted tokens (:func:`thinning_walk`, here a batch of one row).

    Parameters
    ----------
    draft_probs : q [V] (float).
    order : drafted tokens (q > 0) in priority order.
    c : ρ·p [V], the caps.
    k : number of wor children (≤ len(order)).

    Returns
    -------
    (avail [V], theta [V]) — zero outside ``order``.
    """
    order = np.asarray([int(x) for x in order], dtype=np.int64)
    qs = np.asarray(draft_probs, dtype=np.float64)[order]
    s, wts = log_time_grid(nodes, log_time_upper(kth_largest(qs, k)))
    # the piece T < e^{lo} of the grid: for k = 1 the integrand is q_y e^{−q(V) T} there (≈ q_y·e^{−30});
    # for k ≥ 2 it is O(T^{k−1}), below 1e-26
    total, t_lo = qs.sum(), math.exp(LOG_T_RANGE[0])
    head = -math.expm1(-total * t_lo) / total if k == 1 else 0.0
    theta_s, avail_s = thinning_walk(qs[None], np.asarray(c, dtype=np.float64)[order][None], k, s, wts[None], head)
    avail = np.zeros(draft_probs.shape[0])
    theta = np.zeros(draft_probs.shape[0])
    avail[order], theta[order] = avail_s[0], theta_s[0]
    return avail, theta
