"""Exponential-clock integrals for without-replacement drafting (theory.md §4.1, §6.5).

A wor tuple of size k is the arrival order of the first k of independent clocks ``E_x ~ Exp(q_x)``.
Probabilities of events "y is among the first k arrivals, and the other arrivals carry weights g" are
integrals over the arrival time ``T`` of a generating polynomial in a marker ``u`` (one ``u`` per arrival
before T); the coefficient of ``u^{k−1}`` selects "exactly k−1 arrivals before T".  ``T`` is integrated by
Gauss–Legendre in ``s = log T`` (the integrands decay double-exponentially for large T and like a power of T
for small T), 400 nodes per panel of width 60 up to k = 4 draws, more beyond (:func:`clock_nodes`).

**The range follows the row.**  The grid starts at ``s = −30`` and ends at ``s_hi = max(30, log(50/q_(k)))``
with ``q_(k)`` the k-th largest clock rate: the k-th arrival comes after ``T`` with probability at most
``Σ_{j≤k} e^{−q_(j) T} ≤ k·e^{−50}`` there.  A fixed ``[−30, 30]`` misses the arrivals of a tail whose rates
are below ~1e-12 (a confident draft row), which made PTS's availabilities — and with them its residual — wrong
by up to the whole tail mass.  The grid goes on to a panel boundary so that rows share it; PTS's walk and fixed
point weight each row's nodes only up to the row's own end (:func:`row_weights`).  **No time is formed whole**:
every rate enters as ``q·T = (q·T₁)·T₂`` with ``T = T₁T₂`` split so that each factor is finite on every grid
(:func:`rate_times`), and the Jacobian ``dT = T ds`` is carried by the one rate factor of each integrand
(``q_y e_y dT = (q_y T) e_y ds``), so rates down to the smallest denormal stay finite.  ``1 − e^{−qT}`` is taken
as ``−expm1(−qT)`` (:mod:`univer_theory.vexp` on numpy rows).
"""
from __future__ import annotations

import math
import threading
from functools import lru_cache

import numba
import numpy as np

from .. import vexp
from ..fpu import flushed
from ..nx import NUMPY, array_module, get_backend

#: Gauss–Legendre nodes per panel of width 60 in log T for k ≤ 4 draws (theory.md §4.1: 400 nodes on
#: log t ∈ [−30, 30]); more draws take more (:func:`clock_nodes`).
LOG_T_NODES = 400
LOG_T_RANGE = (-30.0, 30.0)
#: The upper end covers ``q_(k)·T ≤ TAIL_RATE_TIME`` (neglected mass ≤ k·e^{−50}).
TAIL_RATE_TIME = 50.0
#: The largest ``q·T`` formed: ``e^{−q·T}`` and ``q·T·e^{−q·T}`` are exactly 0 in float64 beyond ~745, and the
#: cap keeps ``q·T`` finite (an infinite one would give ``∞·0``); and its log (α*'s clock integral,
#: :mod:`univer_theory.alpha_star`, forms ``q·t`` as ``exp(log q + log t)``).
RATE_TIME_CAP = 1e4
LOG_RATE_TIME_CAP = math.log(RATE_TIME_CAP)
#: A node's time is formed as two factors ``T = T₁·T₂``, ``T₁ = e^{min(s, TIME_SPLIT)}``: each is finite on every
#: grid (``s ≤ 750``, 13 panels), and ``(q·T₁)·T₂`` stays finite for every rate ≤ 1 until the cap.
TIME_SPLIT = 600.0


def grid_panels(slowest_rate):
    """Panels of width 60 from ``s = −30`` that cover ``q_(k)·T ≤ TAIL_RATE_TIME`` for a slowest relevant clock
    rate ``q_(k) > 0`` (module docstring): ``1 + max(0, ⌈(log(50/q_(k)) − 30)/60⌉)``, 1 to 13 in float64.  A
    float, or an array of rates, numpy or torch (one count per row, as floats, beside the rates: no host read)."""
    width = LOG_T_RANGE[1] - LOG_T_RANGE[0]
    if isinstance(slowest_rate, (int, float)):
        return 1 + max(0, math.ceil((math.log(TAIL_RATE_TIME) - math.log(slowest_rate) - LOG_T_RANGE[1]) / width))
    nx = get_backend(slowest_rate)
    return 1 + nx.maximum(array_module(slowest_rate).ceil(
        (math.log(TAIL_RATE_TIME) - nx.log(slowest_rate) - LOG_T_RANGE[1]) / width), 0.0)


def log_time_upper(slowest_rate: float) -> float:
    """Upper end of the grid in ``s = log T`` for a slowest relevant clock rate (module docstring), on a
    whole-panel boundary (:func:`grid_panels`) so that nearby rows share a grid (and its cache)."""
    if not slowest_rate > 0:
        raise ValueError(f"log_time_upper: the slowest clock rate must be positive, got {slowest_rate!r}")
    return LOG_T_RANGE[0] + (LOG_T_RANGE[1] - LOG_T_RANGE[0]) * grid_panels(float(slowest_rate))


def row_weights(weights, s, rates, top):
    """A row's quadrature weights on the grid ``s`` (:func:`log_time_grid`; ``weights``, ``s`` ``[t]``) for rows of
    clock rates ``rates [R, m]`` whose k largest are ``top [R, k]`` (largest first): ``[R, t]``, 0 at the nodes past
    the row's own end ``T_end``, where the k-th arrival has not come with probability at most ``k·e^{−50}``.  Two
    bounds give it, and the smaller ``T_end`` is taken: ``Σ_{j≤k} e^{−q_(j)T} ≤ k·e^{−q_(k)T}`` (one of the k fastest
    clocks has not arrived: ``q_(k)·T_end =`` :data:`TAIL_RATE_TIME`, the end a grid covers, :func:`grid_panels`,
    going on to a panel boundary so that rows share it), and ``(m + 1)^{k−1}·e^{−Q′T}`` with ``Q′`` the rates but
    the k − 1 largest (every clock outside a set A of at most k − 1 arrived ones has not: ``e^{−(Q − q(A))T}``, at
    most ``Σ_{j<k} C(m, j) ≤ (m + 1)^{k−1}`` sets; ``Q′`` less the round-off of its two sums, m the positive
    rates).  Every term of an availability's integrand is a density of "y is among the first k arrivals and the
    k-th comes at T" (:func:`sequential_thinning_avail`, weights ``g ≤ 1``), so the nodes left out change the
    availabilities, summed over y, by at most ``k²·e^{−50}`` (~3e-21 at k = 4).  The walk steps no node past a
    row's last positive weight (:func:`thinning_walk`; docs/deviations.md item 61).  numpy or torch."""
    nx = get_backend(rates)
    k = top.shape[-1]
    total, m = nx.sum(rates), nx.sum(nx.astype(rates > 0, rates))
    rest = total - nx.sum(top[:, :k - 1]) - 2.0 ** -51 * (m + k) * total
    end = math.log(TAIL_RATE_TIME) - nx.log(top[:, -1])
    spread = nx.log(TAIL_RATE_TIME + (k - 1) * nx.log(m + 1)) - nx.log(nx.where(rest > 0, rest, 1.0))
    end = nx.where(rest > 0, nx.minimum(end, spread), end)
    return nx.where(s[None, :] < end[:, None], weights, 0.0)


def clock_nodes(k: int) -> int:
    """Gauss–Legendre nodes per panel for the clock integrals of k draws: ``200·max(2, ⌈√k⌉)`` (400 up to k = 4,
    600 to 9, 800 to 16, …).  The k-th arrival's density narrows in log T as k grows: on 400 nodes the relative
    error of ``Σ_y Pr(y ∈ S) = k`` (PTS's availabilities at θ = 0, V = 300 and Zipf rows) was ≤ 3.5e-14 up to
    k = 4 but 2.1e-13 at k = 5, 1.4e-12 at 6, 1.6e-9 at 12 and 5e-8 at 16 (α*(1) = 1 − 1.05e-9 where it is 1);
    with this count it is ≤ 1.3e-15 at every k measured up to 100."""
    return 200 * max(2, math.isqrt(max(k, 1) - 1) + 1)


@lru_cache(maxsize=8)
def _legendre_rule(n: int):
    """Gauss–Legendre nodes ``x`` (the roots of ``P_n``) and weights ``2/((1 − x²) P_n′(x)²)`` on [−1, 1]: numpy's
    nodes refined by two Newton steps and the weights formed in ``np.longdouble`` (an 80-bit float on x86-64
    Linux; where it is float64 this is numpy's rule again).  numpy's own weights are off by up to ~5e-10
    relative at the nodes next to ±1 (``1 − x²`` cancels; 400 nodes, more with more nodes), which moved every
    clock integral whose mass sits at a panel's end (``s = 30``: rates ~1e-13) by ~1e-12 — PTS's plan past its
    cap ``ρp`` by 1.2e-12 on a confident row, k = 6."""
    x, w = np.polynomial.legendre.leggauss(n)
    xl = x.astype(np.longdouble)

    def legendre(xl):
        p0, p1 = np.ones_like(xl), xl.copy()
        for j in range(2, n + 1):
            p0, p1 = p1, ((2 * j - 1) * xl * p1 - (j - 1) * p0) / j
        return p1, n * (xl * p1 - p0) / (xl * xl - 1)

    if n > 1:
        for _ in range(2):
            p, dp = legendre(xl)
            xl = xl - p / dp
        _, dp = legendre(xl)
        x, w = xl.astype(np.float64), (2 / ((1 - xl * xl) * dp * dp)).astype(np.float64)
    return x, w


@lru_cache(maxsize=16)
def log_time_grid(nodes: int = LOG_T_NODES, upper: float = LOG_T_RANGE[1]):
    """Nodes ``s = log T`` and weights with ``∫_0^∞ h(T) dT ≈ Σ weights·T·h(T)`` on ``[−30, upper]`` (read-only,
    cached: the Legendre rule costs an eigenvalue problem of size ``nodes``, :func:`_legendre_rule`).  The weights
    are in ``ds``: the Jacobian ``T`` is the caller's, folded into a rate (module docstring).

    Equal panels of width 60 with ``nodes`` nodes each (one panel for the default range).
    """
    x, w = _legendre_rule(nodes)
    lo = LOG_T_RANGE[0]
    panels = max(1, int(np.ceil((upper - lo) / (LOG_T_RANGE[1] - LOG_T_RANGE[0]))))
    edges = np.linspace(lo, upper, panels + 1)
    half = 0.5 * np.diff(edges)[:, None]
    s = (half * x + 0.5 * (edges[:-1] + edges[1:])[:, None]).ravel()
    weights = (half * w).ravel()
    s.flags.writeable = weights.flags.writeable = False
    return s, weights


def node_times(s):
    """``(T₁, T₂)`` with ``T₁·T₂ = e^s`` at the nodes ``s [t]`` (:data:`TIME_SPLIT`; ``T₂ = 1`` exactly below it),
    numpy or torch."""
    nx = get_backend(s)
    return nx.exp(nx.minimum(s, TIME_SPLIT)), nx.exp(nx.maximum(s - TIME_SPLIT, 0.0))


def rate_times(rates, s, out=None):
    """``q·T = min((q·T₁)·T₂, RATE_TIME_CAP)`` for rates ``[..., 1]`` against nodes ``s [t]`` (:func:`node_times`):
    one rounded product below :data:`TIME_SPLIT` (two above it), exactly 0 where q = 0, finite for subnormal
    rates (docs/deviations.md item 65: it was ``exp(log q + s)``, whose rounded ``log q`` moved it by up to ~850
    ulp at q = 1e-300).  numpy arrays (one compiled pass, :func:`_rate_time`) or torch tensors (the same operations,
    on ``T₁, T₂`` from the backend's ``exp``); ``out``: a C-contiguous numpy array of the result's shape to write it
    into."""
    nx = get_backend(rates, s)
    t1, t2 = node_times(s)
    if nx is NUMPY:                  # in place: the walk's [R, m, t] grids are MBs, each temporary page-faulted
        rates = np.asarray(rates, dtype=np.float64)
        if rates.shape[-1:] != (1,) or np.ndim(s) != 1:
            raise ValueError(f"rate_times: rates [..., 1] against nodes [t], got {rates.shape} and {np.shape(s)}")
        shape = rates.shape[:-1] + t1.shape
        x = np.empty(shape) if out is None else out
        if not (x.flags.c_contiguous and x.shape == shape and x.dtype == np.float64):   # written through a flat view
            raise ValueError(f"rate_times: out must be a C-contiguous float64 numpy array of shape {shape}, got "
                             f"{np.shape(x)} {getattr(x, 'dtype', None)}")
        _rate_time_rows(np.ascontiguousarray(rates).reshape(-1), t1, t2, x.reshape(-1, t1.shape[0]))
        return x
    return nx.minimum((rates * t1) * t2, RATE_TIME_CAP)


@numba.njit(cache=True, inline="always", error_model="numpy")
def _rate_time(q, t1, t2):  # pragma: no cover - compiled
    """``min((q·T₁)·T₂, RATE_TIME_CAP)`` (:func:`rate_times`; a NaN stays NaN)."""
    x = (q * t1) * t2
    return RATE_TIME_CAP if x > RATE_TIME_CAP else x


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _rate_time_rows(rates, t1, t2, out):  # pragma: no cover - compiled
    """``out[i, n] = q_i·T_n`` (``out [N, t]``, a view; :func:`_rate_time`)."""
    for i in range(rates.shape[0]):
        for n in range(t1.shape[0]):
            out[i, n] = _rate_time(rates[i], t1[n], t2[n])


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
    ``0/max(avail, 1) = 0``.  The spelling of θ on arrays (the fixed point,
    :func:`univer_theory.plans.pts.thinning_fixed_point`); the compiled walks take it on scalars from
    :func:`walk_acceptance`.  Numpy arrays or torch tensors."""
    return c_num / array_module(avail).maximum(avail, c_den)


@numba.njit(inline="always")
def walk_acceptance(avail, c_num, c_den):  # pragma: no cover - compiled
    """:func:`acceptance` on one position's floats, the same operations, inside the compiled walks
    (:func:`_prefix_walk`; k = 2, :func:`univer_theory.plans.pts.pair_thinning_walk`)."""
    return c_num / max(avail, c_den)


#: Bytes of the polynomial states of one chunk of rows of :func:`thinning_walk` (:func:`walk_states` states of
#: ``2·k·t`` floats a row, and where they fit beside them the row's clock factors, ``3·m·t`` floats, formed
#: once instead of once per pass): cache-sized — at V = 49 152 one row a chunk, many rows at small V (three
#: rows at V = 49 152 in one chunk took 1.4× as long as one at a time).
WALK_BYTES = 2**23


def walk_states(m: int, k: int) -> int:
    """How many ``[2, k, t]`` polynomial states :func:`thinning_walk` holds per row of m positions in blocks (a
    short row, one block, holds m + 3 within half of :data:`WALK_BYTES`, :func:`_walk_plan`): one
    checkpoint per block of ``b = ⌈√m⌉`` positions, the suffix state after each position of one block, and the
    prefix and running suffix — ``2⌈√m⌉ + 2`` at most; plus the block's clock factors (3 ``[t]`` arrays per
    position, ``3/(2k)`` of a state each; the whole row's instead when they fit in :data:`WALK_BYTES`)."""
    block = _walk_block(m)
    return -(-m // block) + block + 2 + -(-3 * block // (2 * k))


def _walk_block(m: int) -> int:
    """Positions per block of :func:`thinning_walk` (``⌈√m⌉``: the checkpoints and one block's states balance)."""
    return math.isqrt(m - 1) + 1 if m > 1 else 1


def _walk_plan(m: int, k: int, t: int) -> tuple[int, bool, int]:
    """``(block, kept, bytes a row)`` of :func:`thinning_walk` on rows of m positions with k children and t nodes:
    one block of all m positions (every suffix state kept: no checkpoint pass, two compiled calls a chunk) when a
    row's states and clock factors fit in half of :data:`WALK_BYTES` (a few hundred positions: the call overhead
    of the blocks is then a third of the walk; at ~1 000 positions the blocked walk, whose blocks stay in cache,
    is as fast); else blocks of ``⌈√m⌉`` positions with their checkpoints (:func:`walk_states`), the row's clock
    factors formed once (``kept``) when they fit beside them.  The blocks change which states are held, not the
    floats: a suffix state is the same steps from the end."""
    t = max(t, 1)
    whole = 8 * t * (2 * k * (m + 3) + 3 * m)
    if whole <= WALK_BYTES // 2:
        return m, True, whole
    states = 8 * t * 2 * k * walk_states(m, k)
    kept = states + 8 * t * 3 * m <= WALK_BYTES
    return _walk_block(m), kept, states + kept * 8 * t * 3 * m


#: Smallest drafted clock rate of a chunk of rows that :func:`thinning_walk` walks — clock factors and compiled
#: passes — with subnormal floats flushed to 0 (:func:`univer_theory.fpu.flushed`: the polynomial lanes of the
#: largest times decay through the subnormal range, which made the passes ~2.5× slower at V = 49 152).  A
#: flushed term is below 2^-1022 and changes an availability by at most ~1e-305 absolute; rows with smaller rates
#: (confident rows' subnormal tails, whose availabilities are themselves that small and are kept to their
#: relative precision) are walked unflushed.
FLUSH_MIN_RATE = 2.0 ** -900


#: Relative weight of an availability's integrand below the walk's first kept node (:func:`early_nodes`).
EARLY_TAIL = 2.0 ** -56
#: Below this ``γ(k, x)/(k − 1)!`` (formed as ``1 − e^{−x}Σ_{j<k} x^j/j!``) is round-off, and a cut from it could
#: drop nodes its bound does not allow (k = 40, x = 2: 203 nodes cut where 195 may be): :func:`early_nodes` cuts none.
EARLY_SHARE_FLOOR = 1e-12


def early_nodes(k: int, s: np.ndarray, fastest: float, total: float) -> int:
    """How many leading nodes of the grid ``s`` (ascending) the walk leaves out for k children on rows whose rates
    are at most ``fastest`` and sum to at most ``total``: those below ``s_lo = log T_lo`` with
    ``T_lo = (k·EARLY_TAIL·c^{k−1}·γ(k, Q/q_max))^{1/k}/Q`` (``c = 1 − e^{−1}``, ``Q = total``, ``q_max = fastest``,
    γ the lower incomplete gamma function) — about −12.7 for k = 3 on a Zipf row truncated to its top 1 024
    (q_max ≈ 0.17), −9.3 for k = 4 (q_max ≈ 0.07); below the grid's start (−30) for k = 1, whose piece under it is
    the walk's ``head``.  0 when ``fastest`` is not positive.

    Every term of an availability's integrand is ``h(T) = q_y·Π_{z∈A} g_z(1 − e^{−q_z T})·Π_{z∉A} e^{−q_z T}`` with
    |A| = k − 1 (or the D-term's like product: ``(1 − e^{−q_y T})·g_z q_z e^{−q_z T}`` and k − 2 factors
    ``g(1 − e^{−qT})``, the same power of T), so with ``K = q_y Π_A g_z q_z`` (its like): ``h(T) ≤ K·T^{k−1}`` for
    all T, and on ``T ≤ 1/q_max``, where every ``q·T ≤ 1`` and ``1 − e^{−x} ≥ c·x``, ``h(T) ≥ K·(cT)^{k−1}e^{−QT}``;
    so ``∫_0^∞ h ≥ K c^{k−1} γ(k, Q/q_max)/Q^k`` and ``∫_0^{T_lo} h ≤ K T_lo^k/k ≤ EARLY_TAIL·∫_0^∞ h``.  Leaving
    out the nodes below ``s_lo`` therefore changes every availability by at most :data:`EARLY_TAIL` of itself
    (twice that for the nodes' spacing) — below its quadrature error (~1e-14) and its ulp (docs/deviations.md
    item 63)."""
    if not fastest > 0:
        return 0
    x = total / fastest                                   # ≥ 1; γ(k, x) = (k − 1)!·(1 − e^{−x} Σ_{j<k} x^j/j!)
    terms = [j * math.log(x) - math.lgamma(j + 1) for j in range(k)]
    largest = max(terms)
    log_sum = largest + math.log(sum(math.exp(t - largest) for t in terms))
    share = -math.expm1(log_sum - x)                      # γ(k, x)/(k − 1)!; γ in logs: 171! overflows a float
    if not share > EARLY_SHARE_FLOOR:                     # round-off at large k and small x: no cut
        return 0
    log_gamma = math.lgamma(k) + math.log(share)
    lower = (math.log(k * EARLY_TAIL) + log_gamma + (k - 1) * math.log(-math.expm1(-1.0))) / k - math.log(total)
    return int(np.count_nonzero(np.asarray(s) < lower))


_scratch = threading.local()


def _workspace(size: int) -> np.ndarray:
    """This thread's float64 scratch buffer, ``size`` entries of it (grown, never shrunk: at most the clock factors
    of one chunk of :func:`thinning_walk`, :data:`WALK_BYTES`).  The clock factors are MBs, and a fresh array is
    page-faulted in on every call — ~1 200 faults of a SmolLM2 EAGLE-like wor verification at top 1 024, more time
    than the exponentials that fill them on a virtual machine."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.size < size:
        buf = _scratch.buf = np.empty(size)
    return buf[:size]


def _clock_factors(qs: np.ndarray, times):
    """``(e^{−qT}, 1 − e^{−qT}, qT·e^{−qT})`` of the positions ``qs [R, J]`` at the nodes of ``times``
    (:func:`node_times` ``(T₁, T₂) [t]``), ``[R, J, t]`` each (``1 − e^{−qT}`` as ``−expm1(−qT)``, which keeps tiny
    q's precision; the third carries the Jacobian, module docstring), in this thread's :func:`_workspace` — valid
    until the next call.  One compiled pass (:func:`_clock_factor_rows`)."""
    t1, t2 = times
    t = t1.shape[0]
    e, ring, qe = _workspace(3 * qs.size * t).reshape(3, *qs.shape, t)
    _clock_factor_rows(np.ascontiguousarray(qs, dtype=np.float64).reshape(-1), t1, t2, e.reshape(-1, t),
                       ring.reshape(-1, t), qe.reshape(-1, t))
    return e, ring, qe


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _clock_factor_rows(rates, t1, t2, e, ring, qe):  # pragma: no cover - compiled
    """:func:`_clock_factors` into the views ``e, ring, qe [N, t]``: per rate and node ``qT`` (:func:`_rate_time`),
    ``e^{−qT}`` and ``1 − e^{−qT}`` (:mod:`univer_theory.vexp`: within 2 ulp of the C library's ``exp`` and
    ``−expm1``, in a loop that vectorises; docs/deviations.md item 65) and ``qT·e^{−qT}``."""
    for i in range(rates.shape[0]):
        q, e_i, ring_i, qe_i = rates[i], e[i], ring[i], qe[i]
        for n in range(t1.shape[0]):
            qt = _rate_time(q, t1[n], t2[n])
            f = vexp.exp(-qt)
            e_i[n] = f
            ring_i[n] = vexp.one_minus_exp(qt, f)
            qe_i[n] = qt * f


@numba.njit(cache=True, inline="always")
def _step(src, dst, e, ring, qe, r, i, g):
    """Position i's factor on row r's polynomial state ``(P, D) [2, k, t]`` (degree lowest first), from ``src``
    into ``dst`` (the same array: in place): ``(P, D) ↦ (P·f, D·f + g·qT e·P)`` with ``f = e + g(1 − e)u``,
    truncated at degree k − 1 (clock factors ``e, ring = 1 − e, qe = qT·e`` ``[R, J, t]``; g = 1 for the suffix,
    exactly the same floats).  Degrees are stepped highest first, so in place each reads its own and the next
    lower degree before either is overwritten."""
    k, t = src.shape[1], src.shape[2]
    for j in range(k - 1, -1, -1):
        for n in range(t):
            d = src[1, j, n] * e[r, i, n] + g * qe[r, i, n] * src[0, j, n]
            p = src[0, j, n] * e[r, i, n]
            if j:
                lin = g * ring[r, i, n]
                d += src[1, j - 1, n] * lin
                p += src[0, j - 1, n] * lin
            dst[1, j, n] = d
            dst[0, j, n] = p


@numba.njit(cache=True)
def _suffix_steps(state, e, ring, qe, j0, j1, after):
    """Step each row's suffix ``(P, D)`` (``state [R, 2, k, t]``; g = 1, degree lowest first) back over the
    positions ``j1 − 1, …, j0`` of the clock factors ``[R, J, t]``, in place; with ``after [R, ≥ j1 − j0, 2, k, t]``
    (else ``[0, …]``), also keep the suffix after each position i as ``after[:, i − j0]`` (:func:`_step`, g = 1):
    each step then reads the state kept after its position and writes the next one into ``after`` (the same floats
    as stepping in place and copying each state out, without the copies: 14–21% of a walk)."""
    R = state.shape[0]
    for r in range(R):
        st = state[r]
        if after.shape[0] == 0 or j1 <= j0:         # (an empty span: nothing to step or keep)
            for i in range(j1 - 1, j0 - 1, -1):
                _step(st, st, e, ring, qe, r, i, 1.0)
            continue
        kept = after[r]
        kept[j1 - 1 - j0] = st
        for i in range(j1 - 1, j0, -1):
            _step(kept[i - j0], kept[i - 1 - j0], e, ring, qe, r, i, 1.0)
        _step(kept[0], st, e, ring, qe, r, j0, 1.0)


@numba.njit(cache=True)
def _prefix_walk(prefix, after, e, ring, qe, j0, j1, w, lo, hq, c_num, c_den, theta, avail):
    """The walk over one block — positions ``j0 … j1 − 1`` of the clock factors ``[R, J, t]`` — of each row from
    its prefix ``(P, D)`` before the block (``prefix [R, 2, k, t]``, updated in place): ``avail(y) = Σ_t w·(qT
    e_y·[u^{k−1}]P·S + (1 − e_y)·[u^{k−2}](D·S + P·S_D)) + hq_y`` against the suffix ``(S, S_D) = after[r, i − j0]``,
    then ``θ_y = c⁺/max(avail, c′)`` (:func:`walk_acceptance`) and the prefix step (:func:`_step`) with
    ``g = 1 − θ_y``.  The factors start at position ``lo`` of the rows' ``hq, c_num, c_den`` and of the outputs
    ``theta, avail [R, m]``."""
    R, k, t = prefix.shape[0], prefix.shape[2], prefix.shape[3]
    first, later = np.empty(t), np.empty(t)     # per node: [u^{k−1}]P·S and [u^{k−2}](D·S + P·S_D)
    for r in range(R):
        pre = prefix[r]
        for i in range(j0, j1):
            suf = after[r, i - j0]
            for n in range(t):                  # the node loops innermost: they vectorise
                first[n] = pre[0, 0, n] * suf[0, k - 1, n]
                later[n] = 0.0
            for j in range(1, k):
                for n in range(t):
                    first[n] += pre[0, j, n] * suf[0, k - 1 - j, n]
            for j in range(k - 1):
                for n in range(t):
                    later[n] += pre[1, j, n] * suf[0, k - 2 - j, n] + pre[0, j, n] * suf[1, k - 2 - j, n]
            total = 0.0
            for n in range(t):
                total += w[r, n] * (qe[r, i, n] * first[n] + ring[r, i, n] * later[n])
            av = max(total, 0.0) + hq[r, lo + i]
            th = walk_acceptance(av, c_num[r, lo + i], c_den[r, lo + i])
            theta[r, lo + i], avail[r, lo + i] = th, av
            _step(pre, pre, e, ring, qe, r, i, 1.0 - th)


@numba.njit(cache=True)
def _checkpoint_span(state, e, ring, qe, lo, block, checkpoints):
    """The backward pass over the blocks of positions ``lo, …, lo + J − 1`` (clock factors ``[R, J, t]``; ``lo`` a
    multiple of ``block``), last block first: each row's suffix ``state [R, 2, k, t]`` stepped over a block
    (:func:`_suffix_steps`), then kept as ``checkpoints[b − 1]`` (the suffix after block b − 1); block 0 is not
    stepped (nothing before it needs its suffix)."""
    none = np.empty((0, block) + state.shape[1:])
    J = e.shape[1]
    for j0 in range(((J - 1) // block) * block, -1, -block):
        b = (lo + j0) // block
        if b == 0:
            break
        _suffix_steps(state, e, ring, qe, j0, min(j0 + block, J), none)
        checkpoints[b - 1] = state


@numba.njit(cache=True)
def _forward_span(prefix, checkpoints, after, e, ring, qe, w, lo, block, hq, c_num, c_den, theta, avail):
    """The forward pass over the blocks of positions ``lo, …, lo + J − 1`` (clock factors ``[R, J, t]``): per block
    b, its suffix states swept back from ``checkpoints[b]`` into ``after`` (:func:`_suffix_steps`), then the block
    walked from the running ``prefix`` (:func:`_prefix_walk`)."""
    J = e.shape[1]
    for j0 in range(0, J, block):
        j1 = min(j0 + block, J)
        _suffix_steps(checkpoints[(lo + j0) // block].copy(), e, ring, qe, j0, j1, after)
        _prefix_walk(prefix, after, e, ring, qe, j0, j1, w, lo, hq, c_num, c_den, theta, avail)


def _walk_chunk(q, cs, k: int, s_t, w, head: float, block: int, kept: bool):
    """:func:`thinning_walk` on one chunk of rows ``q, cs [n, m]`` over the nodes ``s_t [t]`` it keeps (weights
    ``w [n, t]``) in blocks of ``block`` positions: the clock factors formed once for the chunk when ``kept`` (each
    pass one compiled call, :func:`_checkpoint_span`, :func:`_forward_span`), else a block at a time (a call a
    block)."""
    n, m, t = q.shape[0], q.shape[1], s_t.shape[0]
    blocks = -(-m // block)
    spans = [(0, m)] if kept else [(b * block, min(m, (b + 1) * block)) for b in range(blocks)]
    times = node_times(s_t)
    factors = _clock_factors(q, times) if kept else None

    def clocks(lo, hi):
        """The clock factors of positions ``lo:hi`` of the chunk's rows."""
        return factors if kept else _clock_factors(q[:, lo:hi], times)

    c_num, c_den = (np.ascontiguousarray(x) for x in acceptance_caps(cs))
    hq = head * q
    state = np.zeros((n, 2, k, t))
    state[:, 0, 0] = 1.0                                            # the empty product (P, D) = (1, 0)
    checkpoints = np.empty((blocks, n, 2, k, t))
    checkpoints[-1] = state
    for lo, hi in reversed(spans):                                  # checkpoints[b]: the suffix after block b
        if hi > block:
            _checkpoint_span(state, *clocks(lo, hi), lo, block, checkpoints)
    prefix = np.zeros((n, 2, k, t))
    prefix[:, 0, 0] = 1.0
    th, av = np.empty((n, m)), np.empty((n, m))
    after = np.empty((n, block, 2, k, t))
    for lo, hi in spans:
        _forward_span(prefix, checkpoints, after, *clocks(lo, hi), w, lo, block, hq, c_num, c_den, th, av)
    return th, av


def thinning_walk(qs, cs, k: int, s, weights, head: float = 0.0):
    """PTS's priority walk (module docstring; :func:`sequential_thinning_avail`) on rows already in priority
    order: ``qs, cs [R, m]`` (q and ρp; undrafted positions, q = 0, come last and are identity steps with
    θ = 0), nodes ``s [t]`` and weights ``[R, t]`` (0 beyond a row's own panels), numpy arrays.  Returns
    ``(θ, avail) [R, m]``.  ``head`` adds ``head·q`` to each availability (the grid's piece below its first node,
    :func:`sequential_thinning_avail`).

    The walk is sequential over the m priority positions; the arithmetic of each position is compiled
    (:func:`_prefix_walk`, :func:`_suffix_steps`, every row of a chunk in one call; the loops over the nodes
    innermost).  The suffix products over the lower-priority tokens (g = 1) are stepped once from the end,
    keeping a checkpoint at the end of each block of ``b = ⌈√m⌉`` positions; going forward, each block's suffix
    states are swept back from its checkpoint, then the block is walked: per position the availability (the
    product of the prefix and suffix polynomials, its ``u^{k−1}`` coefficient, summed over the nodes), θ and one
    prefix step.  A short row is one block (:func:`_walk_plan`).  The clock factors are formed by numpy
    (:func:`_clock_factors`, in a scratch buffer kept per thread) for the chunk's rows at once when they fit in
    :data:`WALK_BYTES` (m ≲ 3 000; each pass is then one compiled call), else a block at a time, in each of the
    two passes.  Only the nodes from :func:`early_nodes` to the rows' last positive weight are stepped (the
    others add below 2^-56 of each availability, or nothing; the grid's own end, :func:`row_weights`: 74 of the
    default grid's 400 nodes remain on a Zipf row at V = 49 152, k = 3), padded with identity nodes to a
    multiple of :data:`WALK_LANES` (:func:`_lane_padded`).  The sum over the nodes is reassociated
    against a plain walk (every term non-negative).  A chunk whose drafted rates are all at least
    :data:`FLUSH_MIN_RATE` is walked with subnormal floats as 0 (:func:`univer_theory.fpu.flushed`).  Memory:
    :func:`walk_states` states of ``2·k·t`` floats a row, rows in chunks of :data:`WALK_BYTES`."""
    qs, cs, s, weights = (np.ascontiguousarray(x, dtype=np.float64) for x in (qs, cs, s, weights))
    R, m = qs.shape
    theta, avail = np.zeros((R, m)), np.zeros((R, m))
    t0 = early_nodes(k, s, float(np.max(qs, initial=0.0)), float(np.max(qs.sum(-1), initial=0.0)))
    positive = np.flatnonzero((weights > 0).any(0))
    t1 = max(t0, int(positive[-1]) + 1 if positive.size else 0)
    s, weights = _lane_padded(s[t0:t1], weights[:, t0:t1])
    block, kept, row_bytes = _walk_plan(m, k, s.shape[0])
    step = max(1, WALK_BYTES // row_bytes)
    for r0 in range(0, R, step):
        rows = slice(r0, min(R, r0 + step))
        q = qs[rows]
        with flushed(np.min(q, initial=np.inf, where=q > 0) >= FLUSH_MIN_RATE):
            theta[rows], avail[rows] = _walk_chunk(q, cs[rows], k, s, weights[rows], head, block, kept)
    return theta, avail


#: The walk's node count is padded to a multiple of this (:func:`_lane_padded`): float64 lanes of a 512-bit
#: vector, so its loops over the nodes have no scalar remainder (7–10% of a walk at t = 59, 75).
WALK_LANES = 8


def _lane_padded(s, weights):
    """The walk's nodes ``s [t]`` and weights ``[R, t]`` padded to a multiple of :data:`WALK_LANES` nodes with
    ``s = −∞`` and weight 0: there ``T = 0``, so every clock factor is the identity (``e = 1``, ``1 − e = 0``,
    ``qT·e = 0``, exactly), each state's lanes stay finite and each availability adds ``0·(…) = +0`` per padded
    node — the same floats as the walk over ``s`` alone.  The weights come back C-contiguous."""
    pad = -s.shape[0] % WALK_LANES
    padded = np.zeros((weights.shape[0], s.shape[0] + pad))
    padded[:, :s.shape[0]] = weights
    return np.concatenate([s, np.full(pad, -np.inf)]), padded


def sequential_thinning_avail(draft_probs: np.ndarray, order, c: np.ndarray, k: int, nodes: int | None = None):
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
    nodes : Gauss–Legendre nodes per panel (default :func:`clock_nodes` of k).

    Returns
    -------
    (avail [V], theta [V]) — zero outside ``order``.
    """
    order = np.asarray([int(x) for x in order], dtype=np.int64)
    qs = np.asarray(draft_probs, dtype=np.float64)[order]
    top = NUMPY.top_values(qs[None], k)
    s, wts = log_time_grid(nodes or clock_nodes(k), log_time_upper(top[0, -1]))
    # the piece T < e^{lo} of the grid: for k = 1 the integrand is q_y e^{−q(V) T} there (≈ q_y·e^{−30});
    # for k ≥ 2 it is O(T^{k−1}), below 1e-26
    total, t_lo = qs.sum(), math.exp(LOG_T_RANGE[0])
    head = -math.expm1(-total * t_lo) / total if k == 1 else 0.0
    theta_s, avail_s = thinning_walk(qs[None], np.asarray(c, dtype=np.float64)[order][None], k, s,
                                     row_weights(wts, s, qs[None], top), head)
    avail = np.zeros(draft_probs.shape[0])
    theta = np.zeros(draft_probs.shape[0])
    avail[order], theta[order] = avail_s[0], theta_s[0]
    return avail, theta
