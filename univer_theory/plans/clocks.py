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


def acceptance_caps(c):
    """The two forms of the caps ``c = ρp`` in PTS's acceptance probability (:func:`acceptance`):
    ``(c⁺, c′)`` — ``c`` where ``c > 0``, else 0 and 1.  Numpy arrays or torch tensors."""
    nx = get_backend(c)
    positive = c > 0
    return nx.where(positive, c, 0.0), nx.where(positive, c, 1.0)


def acceptance(avail, c_num, c_den):
    """PTS's acceptance probability ``θ = min(1, c/avail)`` (0 where ``c = 0``; theory.md §6.3 rule 4) from the
    caps' forms ``(c⁺, c′)`` of :func:`acceptance_caps`, branch-free: ``θ = c⁺/max(avail, c′)`` — where c > 0,
    ``c ≥ avail`` gives ``c/c = 1`` exactly and otherwise the quotient ``c/avail`` itself; where c = 0,
    ``0/max(avail, 1) = 0``.  The one spelling of θ: the walk (:func:`thinning_walk`) and the fixed point
    (:func:`univer_theory.plans.pts.thinning_fixed_point`).  Numpy arrays or torch tensors."""
    return c_num / array_module(avail).maximum(avail, c_den)


#: Blocks of the priority order whose suffix states :func:`thinning_walk` rebuilds at once (one vectorised
#: backward step per position of a block serves all of them).
WALK_GROUP = 4


def walk_states(m: int, k: int) -> int:
    """How many ``[2, k, t]`` polynomial states' worth of memory :func:`thinning_walk` holds per row for m
    positions: one checkpoint per block of ``b = ⌊√⌈m/WALK_GROUP⌉⌋`` positions, the coefficient arrays of one
    group of :data:`WALK_GROUP` blocks, 3 scratch states per block of a group, 4 buffers, and the group's clock
    factors (5 ``[t]`` arrays per position, ``5/(2k)`` of a state) — about ``(4 + 5/k)·√m`` at
    ``WALK_GROUP = 4`` (2√m before the reorganisation of docs/deviations.md item 33)."""
    block = max(1, math.isqrt(-(-m // WALK_GROUP)))
    blocks = -(-m // block)
    group = min(WALK_GROUP, blocks)
    return blocks + group * (block + 3) + 4 + -(-5 * group * block // (2 * k))


def _step_views(state, out, reverse: bool = False):
    """The views :func:`_pair_step` reads and writes for ``state → out`` (both ``[..., 2, k, t]``, distinct
    memory; with ``reverse`` degree runs highest first): built once per pair of buffers."""
    lo, hi = (slice(1, None), slice(None, -1)) if reverse else (slice(None, -1), slice(1, None))
    return state, out, state[..., lo, :], out[..., hi, :], state[..., 0:1, :, :], out[..., 1:2, :, :]


def _pair_step(views, e, lin, de, coef=None):
    """``(P, D) ↦ (P·(e + lin·u), D·(e + lin·u) + de·P)`` for polynomials in u truncated at their degree, written
    into the ``out`` of ``views`` (:func:`_step_views`); ``e, lin, de [..., 1, 1, t]`` broadcast against the
    states' leading axes.  With ``coef`` (degree highest first only), also ``[de·P + lin·D⁺ ; lin·P⁺]`` into it
    (``X⁺`` the next lower degree, 0 below degree 0: the terms of the step that are not ``e·state``).  numpy
    arrays or torch tensors (``multiply(…, out=)`` and in-place adds, spelled alike)."""
    state, out, state_lo, out_hi, state_p, out_d = views
    xp = array_module(state)
    xp.multiply(state, e, out=out)
    shifted = state_lo * lin
    crossed = de * state_p
    out_hi += shifted
    out_d += crossed
    if coef is not None:
        xp.add(crossed[..., 0, :-1, :], shifted[..., 1, :, :], out=coef[..., 0, :-1, :])
        coef[..., 0, -1, :] = crossed[..., 0, -1, :]
        coef[..., 1, :-1, :] = shifted[..., 0, :, :]
    return out


def _suffix_sweep(first, last, bufs, e, ring, qe, weights=None, coef=None):
    """Step the suffix (g = 1, degree highest first) back through positions ``j = J−1, …, 0`` of a block:
    ``first`` is the suffix after the block, ``last`` receives the suffix before it; ``e, ring, qe [J, ...,
    1, 1, t]`` position-major, ``bufs`` two scratch states shaped as ``first``.  With ``coef [J, ..., 2, k, t]``
    (zero in ``[1, k−1]``), each position's availability coefficients (:func:`thinning_walk`) times
    ``weights``."""
    alternate = [_step_views(bufs[1], bufs[0], reverse=True), _step_views(bufs[0], bufs[1], reverse=True)]
    cur = first
    for j in range(e.shape[0] - 1, -1, -1):
        out = last if j == 0 else bufs[j % 2]
        views = alternate[j % 2] if cur is bufs[(j + 1) % 2] and out is bufs[j % 2] else \
            _step_views(cur, out, reverse=True)
        _pair_step(views, e[j], ring[j], qe[j], None if coef is None else coef[j])
        if coef is not None:
            coef[j] *= weights
        cur = out


def thinning_walk(qs, cs, k: int, s, weights, head: float = 0.0):
    """PTS's priority walk (module docstring; :func:`sequential_thinning_avail`) on rows already in priority
    order, every row at once: ``qs, cs [R, m]`` (q and ρp; undrafted positions, q = 0, come last and are
    identity steps with θ = 0), nodes ``s [t]`` and weights ``[R, t]`` (0 beyond a row's own panels).  Returns
    ``(θ, avail) [R, m]``.  ``head`` adds ``head·q`` to each availability (the grid's piece below its first node,
    :func:`sequential_thinning_avail`).

    The walk is sequential over the m priority positions, not over rows; only the prefix (θ-dependent) is
    stepped in that loop.  How the arithmetic is organised:

    * the suffix products over the lower-priority tokens (g = 1, highest degree first) are stepped once from
      the end, keeping a checkpoint at the end of each block of ``b = ⌊√⌈m/WALK_GROUP⌉⌋`` positions;
    * going forward, the suffix states of :data:`WALK_GROUP` blocks at a time are swept back from their
      checkpoints, one backward step serving all of the group's blocks; that step's own terms (``lin·shift``
      and ``de·P``, :func:`_pair_step`) give each position's coefficient array ``F_y [2, k, t]`` (times the
      weights) — the availability is linear in the prefix state
      ``(P, D)`` before y: ``avail(y) = Σ_{j,t} P_j F_y^P[j] + D_j F_y^D[j]`` with
      ``F_y^P[j] = w·(q_y T e_y·P^suf_{k−1−j} + (1 − e_y)·D^suf_{k−2−j})`` and
      ``F_y^D[j] = w·(1 − e_y)·P^suf_{k−2−j}`` (w the quadrature weights);
    * per position the walk then does one matrix product (the availability), θ (:func:`acceptance`, no
      branches) and one prefix step into a preallocated buffer.

    Every step is the same float operations in the same order as a plain walk; only the availability's sum
    (now one dot product over ``2·k·t`` terms, all non-negative) is reassociated (docs/deviations.md item 33).
    Memory per row: :func:`walk_states` states of ``2·k·t`` floats (≈ (4 + 5/k)·√m; the exact core's one
    row, ``gpu.wor_plans`` row chunks).  numpy arrays (the exact core, and ``gpu.wor_plans`` on the CPU through
    views of its tensors) or torch tensors (an accelerator)."""
    xp = array_module(qs)
    R, m = qs.shape
    t = s.shape[0]
    n = 2 * k * t
    dev = {} if xp is np else {"device": qs.device}
    block = max(1, math.isqrt(-(-m // WALK_GROUP)))
    blocks = -(-m // block)
    if blocks * block > m:                                      # pad with identity steps (q = 0, θ = 0)
        pad = 0 * qs[:, :blocks * block - m]
        qs, cs = xp.concatenate([qs, pad], 1), xp.concatenate([cs, pad], 1)
    w = weights[:, None, None, :]                                               # [R, 1, 1, t]

    def clocks(lo, hi):
        """``(e^{−qT}, 1 − e^{−qT}, qT·e^{−qT})`` of positions lo..hi−1, position-major
        ``[hi − lo, R, 1, 1, t]`` (expm1 keeps tiny q's precision; the third carries the Jacobian, module
        docstring)."""
        x = rate_times(qs[:, lo:hi, None], s).swapaxes(0, 1)[:, :, None, None, :]
        minus = -x
        e = xp.exp(minus)
        return e, -xp.expm1(minus), x * e

    # the suffix pass (g = 1), from the end: checkpoints[b] is the suffix over the positions after block b
    checkpoints = xp.zeros((blocks, R, 2, k, t), dtype=qs.dtype, **dev)
    checkpoints[-1, :, 0, k - 1] = 1.0                                 # the suffix's 1, highest degree first
    bufs = [xp.zeros((R, 2, k, t), dtype=qs.dtype, **dev) for _ in range(2)]
    for b in range(blocks - 1, 0, -1):
        _suffix_sweep(checkpoints[b], checkpoints[b - 1], bufs, *clocks(b * block, (b + 1) * block))

    pre = [xp.zeros((R, 2, k, t), dtype=qs.dtype, **dev) for _ in range(2)]
    pre[0][:, 0, 0] = 1.0                                                       # (P, D) = (1, 0)
    forward = [_step_views(pre[0], pre[1]), _step_views(pre[1], pre[0])]
    flat = [x.reshape(R, 1, 1, n) for x in pre]
    cur = 0                                                                     # pre[cur] is the prefix state
    group = min(WALK_GROUP, blocks)
    coefs = xp.zeros((group, block, R, 2, k, t), dtype=qs.dtype, **dev)
    scratch = [xp.zeros((group, R, 2, k, t), dtype=qs.dtype, **dev) for _ in range(3)]
    avail, theta = [], []
    for g0 in range(0, blocks, group):
        g1 = min(g0 + group, blocks)
        lo, hi = g0 * block, g1 * block
        E, RING, QE = clocks(lo, hi)
        # the group's blocks swept back together from their checkpoints, position-major within the block:
        # coefs[g, j] are the coefficients of position (g0 + g)·block + j
        G = g1 - g0
        F = coefs[:G]
        _suffix_sweep(checkpoints[g0:g1], scratch[2][:G], [x[:G] for x in scratch[:2]],
                      *(x.reshape(G, block, *x.shape[1:]).swapaxes(0, 1) for x in (E, RING, QE)),
                      weights=w, coef=F.swapaxes(0, 1))
        F = F.reshape(hi - lo, R, 1, n, 1)
        c_num, c_den = acceptance_caps(cs[:, lo:hi].T.reshape(hi - lo, R, 1, 1, 1))
        hq = head * qs[:, lo:hi].T.reshape(hi - lo, R, 1, 1, 1) if head else None
        rq = xp.stack([RING, QE], 1)                                            # [L, 2, R, 1, 1, t]
        for i, (f, num, den, e, ring_qe) in enumerate(zip(F, c_num, c_den, E, rq)):
            av = flat[cur] @ f                              # [R, 1, 1, 1]; ≥ 0: a sum of non-negative terms
            if hq is not None:
                av = av + hq[i]
            th = acceptance(av, num, den)
            avail.append(av)
            theta.append(th)
            lin, de = (1.0 - th) * ring_qe                  # g·(1 − e), g·qT·e
            _pair_step(forward[cur], e, lin, de)
            cur = 1 - cur
    return xp.stack(theta).reshape(-1, R)[:m].T, xp.stack(avail).reshape(-1, R)[:m].T


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
