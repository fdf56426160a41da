"""Rule 7: the Luce plan — choose from S in proportion to fitted weights (wor, enumerable supports; theory.md §6.3).

**Why.**  Routing each tuple's unit mass to its own tokens realises exactly the polymatroid of the coverage
function ``f(A) = Pr(S ∩ A ≠ ∅)``; CondOT(ρ) is its intersection with the box ``a ≤ c = ρp``, whose largest
``a(V)`` is α*(ρ).  PTS walks one fixed priority with one θ per token, and so only reaches some of those points:
where a flat-ish tail must share the tuples evenly it misses α* by up to ~5% (docs/deviations.md item 25).

**The plan.**  With a reject option of weight ``e^{−T}`` present in every tuple, pick token y ∈ S w.p.

.. math::  π_y(S) = \\frac{e^{φ_y}}{e^{−T} + \\sum_{z∈S} e^{φ_z}},\\qquad φ ≤ 0,

— a Luce (conditional-logit) choice, the entropic smoothing of the max-flow with temperature ``1/T`` — with
``φ`` maximising the concave

.. math::  G(φ) = \\sum_y c_y φ_y − \\sum_S Q(S) \\log\\Big(e^{−T} + \\sum_{z∈S} e^{φ_z}\\Big),\\qquad
           ∇G = c − b,\\quad b_y = \\sum_S Q(S)\\, π_y(S).

At the optimum ``b_y = c_y`` where ``φ_y < 0`` (saturated tokens) and ``b_y ≤ c_y`` where ``φ_y = 0`` (the
unsaturated class, which takes every tuple it meets); the dual ``μ = −φ/T`` of the max-flow orders the saturated
classes, strict priority in the limit ``T → ∞`` (PTS is the limit where every class is one token).  Large T
makes the smoothing's loss exponentially small; any remainder only lowers α: the plan used is thinned,
``w_y(S) = τ_y π_y(S)`` with ``τ = min(1, c/b)``, so ``a = τ·b ≤ c`` is its exact marginal, computed from the
same numbers as ``select`` (losslessness does not rest on convergence).

**Solver.**  Projected Newton on the drafted tokens over the sets of the support (``Q(S)`` summed over the k!
orders in the remaining-mass form): T doubled from :data:`LUCE_START` to :data:`LUCE_CAP` with a fixed number of
steps at each (no data-dependent stopping); each step moves along the Jacobi-scaled Newton direction or the
scaled gradient (an ascent direction whatever clipping at ``φ ≤ 0`` does to Newton's), taking the best of a fixed
ladder of lengths, 0 included, by G's change computed as ``log1p`` of the change of each set's normaliser — G
itself is a difference of terms ~T, too coarse to rank steps near the optimum — so G never decreases.  Every function here takes numpy
arrays (the exact core, a batch of one) or torch tensors (``gpu.wor_plans``, batched): one implementation.
**Exchangeable tokens share one weight.**  Tokens with equal ``(q_y, c_y)`` are exchangeable: G is symmetric
under swapping them and concave, so its maximisers include a point with one ``φ`` per class of such tokens, and
the fit runs on the classes.  A class i of ``n_i`` tokens enters as one coordinate with cap ``n_i c_i`` and the
sets become class compositions ``(m_i)``, ``Σ m_i = k``, ``m_i ≤ n_i``, each of probability
``Π_i C(n_i, m_i)·Q(S)`` for any one set S of that composition; the class's choice share is ``m_i e^{φ_i}/den``
and a member's marginal is the class's over ``n_i``.  With every class a single token this is the plan above
verbatim.  A flat tail of any size is one class: the audit row ``q = (1 − (V−1)e, e, …, e)`` with a flat target
tail is two classes at every V.  Practical where the classes number at most :data:`LUCE_SUPPORT` and their
compositions fit :data:`LUCE_SETS` (:func:`luce_budget`).
"""
from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np

from ..nx import array_module
from .base import NodePlan
from .node_inputs import check_node_inputs
from ..processes import wor_tuple_probs

#: Largest draft support the Luce plan is built on (its Newton system is m × m per row).
LUCE_SUPPORT = 16
#: Largest number of sets ``C(m, k)`` enumerated.
LUCE_SETS = 2048
#: Widest node the fit is built for: every composition's k! orders are enumerated (k = 8 on 12 tokens: 6 s;
#: k = 9 on 13: 44 s; k = 11 on 12: a MemoryError; k = 12 on 16 asked for ~46 GB).
LUCE_MAX_K = 8
#: ``T``: the reject option's weight is ``e^{−T}``; classes sit ~``μT`` apart (module docstring).  Reached by
#: doubling from :data:`LUCE_START`, each stage starting from the last one's φ (a continuation: at small T the
#: Newton steps find the Luce weights inside the classes, larger T only pulls the classes apart).
LUCE_CAP = 512.0
LUCE_START = 4.0
#: Smallest ``φ``: below the reject option, a token is never chosen (weights are compared in log space).
LUCE_FLOOR = -2 * LUCE_CAP
#: Newton steps per value of T (fixed, so numpy and torch run the same arithmetic).
LUCE_ITERS = 12
#: Newton steps at the final T (where the classes that compete with the reject option settle; 48 left a tied
#: row near the ρ where α*(ρ) leaves ρ·p(supp q) 3.5e-3 short of α*).
LUCE_FINAL_ITERS = 96
#: Step lengths tried each Newton step: 0 (stay), then 1, 1/2, …, 2^-30.
LUCE_STEPS = (0.0,) + tuple(2.0 ** -i for i in range(31))


@lru_cache(maxsize=64)
def class_sets(caps: tuple, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The compositions of k draws over classes of at most ``caps[i]`` members, each written as its k class
    indices in ascending order (lexicographic order: with every cap 1, the k-subsets of ``range(len(caps))``),
    ``[n, k]``, and every ordering of k positions ``[k!, k]``."""
    sets = [s for s in itertools.combinations_with_replacement(range(len(caps)), k)
            if all(s.count(i) <= caps[i] for i in set(s))]
    orders = np.array(list(itertools.permutations(range(k))), dtype=np.int64)
    return np.array(sets, dtype=np.int64).reshape(-1, k), orders


def composition_count(caps, k: int) -> int:
    """How many compositions :func:`class_sets` would list: the coefficient of ``x^k`` in
    ``Π_i (1 + x + … + x^{caps_i})`` (no enumeration)."""
    count = [1] + [0] * k
    for cap in caps:
        count = [sum(count[j - t] for t in range(min(cap, j) + 1)) for j in range(k + 1)]
    return count[k]


def luce_budget(sizes, k: int) -> bool:
    """Whether classes of ``sizes`` exchangeable drafted tokens (:func:`token_classes`; all 1 when no two
    drafted tokens tie) fit the fit's budget at k children: k ≤ :data:`LUCE_MAX_K`, at most :data:`LUCE_SUPPORT`
    classes, at least k tokens, at most :data:`LUCE_SETS` compositions."""
    sizes = [int(n) for n in sizes]
    return (k <= LUCE_MAX_K and 0 < len(sizes) <= LUCE_SUPPORT and sum(sizes) >= k
            and composition_count(tuple(min(n, k) for n in sizes), k) <= LUCE_SETS)


def token_classes(q: np.ndarray, c: np.ndarray):
    """The drafted tokens (``q > 0``) grouped by equal ``(q_y, c_y)``, classes in the order of their lowest
    token id: ``(first [m], sizes [m], members)`` — each class's lowest token, its size, and the class of each
    drafted token (``[support]``, in token-id order; ``support = flatnonzero(q > 0)``)."""
    support = np.flatnonzero(q > 0)
    _, first, inverse, sizes = np.unique(np.stack([q[support], c[support]], 1), axis=0, return_index=True,
                                         return_inverse=True, return_counts=True)
    rank = np.argsort(first, kind="stable")
    relabel = np.empty_like(rank)
    relabel[rank] = np.arange(rank.size)
    return support[first[rank]], sizes[rank], relabel[inverse.ravel()]


def set_probs(qs, sizes, sets, orders, onehot):
    """``Q`` of each class composition ``sets [n, k]`` (class indices, ``onehot [n, k, m]``; :func:`class_sets`)
    under class rows ``qs [R, m]`` (one member's q) and ``sizes [R, m]`` (members per class):
    ``Π_i C(n_i, m_i)`` sets of that composition, each of the wor probability of its k! orders
    (:func:`univer_theory.processes.wor_tuple_probs`, ``R_i = q(V∖S) + Σ_{l≥i} q(y_l)`` with
    ``q(V∖S) = Σ_i (n_i − m_i) q_i`` summed over the unseen tokens, never ``1 − Σ drawn``, which cancels on a
    confident row; theory.md §4.1).  ``[R, n]``; a composition through a padded class (size 0) gets 0."""
    xp = array_module(qs)
    members = qs[:, sets]                                              # [R, n, k]
    drawn = onehot.sum(1)[None]                                        # m_i [1, n, m]
    left = sizes[:, None, :] - drawn                                   # n_i − m_i [R, n, m]
    outside = (qs[:, None, :] * xp.maximum(left, 0 * left)).sum(-1)   # q(V∖S) [R, n], no subtraction
    count = 1 + 0 * outside                                            # Π_i C(n_i, m_i)
    for j in range(sets.shape[-1]):
        count = count * xp.where(drawn > j, (sizes[:, None, :] - j) / (j + 1), 1 + 0 * left).prod(-1)
    total = 0 * outside
    for order in orders:
        total = total + wor_tuple_probs(members[..., order], outside)
    return count * total


def _member_choice(ps, cap: float = LUCE_CAP):
    """``(log den [...], π [..., k])`` for the members' weights ``ps = φ_S [..., k]``: ``den = e^{−T} + Σ e^{φ}``
    in log space, shifted by the largest weight (any T and class gap stay finite), ``π_j = e^{φ_j}/den``."""
    xp = array_module(ps)
    top = xp.maximum(xp.amax(ps, -1), -cap + 0 * ps[..., 0])
    es = xp.exp(ps - top[..., None])
    den = es.sum(-1) + xp.exp(-cap - top)
    return top + xp.log(den), es / den[..., None]


def _choice(phi, sets, onehot, cap: float = LUCE_CAP):
    """The choice of every set ``sets [n, k]`` under ``φ [R, m]``: the members' shares ``[R, n, k]``
    (:func:`_member_choice`) and the same spread over the support, ``π [R, n, m]``."""
    shares = _member_choice(phi[..., sets], cap)[1]
    return shares, array_module(phi).einsum("rnj,njm->rnm", shares, onehot)


def _newton_step(phi, c, probs, sets, onehot, live, floor, eye, steps, cap):
    """One projected step on ``G`` at reject weight ``e^{−cap}`` (module docstring): the best of the Jacobi-scaled
    Newton and scaled-gradient moves along the step lengths ``steps`` (0 included, so G never decreases), each
    move at most ``cap`` long in every coordinate."""
    xp = array_module(phi)
    shares, pi = _choice(phi, sets, onehot, cap)
    b = xp.einsum("rn,rnm->rm", probs, pi)
    grad = xp.where(live, c - b, 0 * c)
    # −Hessian of G = diag(b) − Σ_S Q(S) π π^T, kept on the free tokens (not pressed against a bound)
    hess = b[:, :, None] * eye - xp.einsum("rn,rni,rnj->rij", probs, pi, pi)
    free = live & ~((phi >= 0) & (grad > 0)) & ~((phi <= LUCE_FLOOR) & (grad < 0))
    hess = xp.where(free[:, :, None] & free[:, None, :], hess, 0 * hess) + eye * ~free[:, :, None]
    scale = 1 / xp.sqrt(xp.maximum(hess.diagonal(0, -2, -1), 1e-150 + 0 * c))     # ≤ 1e75: no overflow below
    scaled = hess * scale[:, :, None] * scale[:, None, :] + 1e-12 * eye
    step = scale * xp.linalg.solve(scaled, (xp.where(free, grad, 0 * grad) * scale)[..., None])[..., 0]
    # the Newton direction, and the scaled gradient (an ascent direction whatever the clipping at the bounds
    # does to Newton's), each at most ``cap`` long per coordinate, along the ladder of step lengths
    moves = xp.stack([step, grad * scale * scale], 1)                                   # [R, 2, m]
    longest = xp.amax(xp.abs(moves), -1)[..., None]
    moves = moves * xp.where(longest > cap, cap / xp.where(longest > cap, longest, 1), 1 + 0 * longest)
    trial = (phi[:, None, None, :] + steps[:, None] * moves[:, :, None, :]).reshape(phi.shape[0], -1, phi.shape[1])
    trial = xp.where(live[:, None, :], xp.minimum(xp.maximum(trial, floor[:, None, :]), 0 * trial),
                     floor[:, None, :])
    # G(trial) − G(φ), accurately for small moves: den'/den = 1 + Σ_j π_j (e^{Δ_j} − 1) (the reject's share
    # completes Σ π to 1), by log1p near 1 — G itself is a difference of terms ~T, too coarse to rank them
    move = (trial - phi[:, None, :])[..., sets]                       # [R, steps, n, k]
    excess = (shares[:, None] * xp.expm1(move)).sum(-1)
    ratio = xp.where(excess > -0.5, xp.log1p(xp.maximum(excess, -0.5 + 0 * excess)),
                     xp.log(xp.maximum(1 + excess, 1e-300 + 0 * excess)))
    gain = (c[:, None, :] * (trial - phi[:, None, :])).sum(-1) - (probs[:, None, :] * ratio).sum(-1)
    index = xp.arange(gain.shape[-1]) if xp is np else xp.arange(gain.shape[-1], device=gain.device)
    pick = index[None, :] == gain.argmax(-1)[:, None]                  # the best move, 0 included
    return (trial * pick[..., None]).sum(1)


def luce_fit(c, qs, k: int, sizes=None):
    """Fit ``φ`` (module docstring) for class rows ``qs [R, m]`` and caps ``c [R, m]`` — one member's q and ρp —
    of ``sizes [R, m]`` exchangeable tokens each (default 1: every class one token; float64, numpy or torch;
    padded positions have q = 0 or size 0).  Returns ``(phi [R, m], tau [R, m], a [R, m])``: the weights, the
    thinning and the plan's exact marginal ``a = τ·b`` of one member of each class."""
    xp = array_module(qs)
    m = qs.shape[-1]
    sizes = 1 + 0 * qs if sizes is None else sizes
    caps = tuple(min(k, int(n)) for n in (sizes.max(0) if xp is np else sizes.amax(0).tolist()))
    if xp is np:
        eye, steps = np.eye(m), np.array(LUCE_STEPS)
        sets, orders = class_sets(caps, k)
    else:
        eye = xp.eye(m, dtype=qs.dtype, device=qs.device)
        steps = xp.as_tensor(LUCE_STEPS, dtype=qs.dtype, device=qs.device)
        sets, orders = (xp.as_tensor(x, device=qs.device) for x in class_sets(caps, k))
    onehot = eye[sets]                                                 # [n, k, m]
    probs = set_probs(qs, sizes, sets, orders, onehot)
    live = (c > 0) & (qs > 0) & (sizes > 0)
    total = sizes * c                                                  # a class's cap
    floor = LUCE_FLOOR + 0 * c
    phi = xp.where(live, 0 * c, floor)
    cap = LUCE_START
    while True:
        for _ in range(LUCE_ITERS if cap < LUCE_CAP else LUCE_FINAL_ITERS):
            phi = _newton_step(phi, total, probs, sets, onehot, live, floor, eye, steps, cap)
        if cap >= LUCE_CAP:
            break
        cap = min(2 * cap, LUCE_CAP)
    b = xp.einsum("rn,rnm->rm", probs, _choice(phi, sets, onehot)[1]) / xp.where(live, sizes, 1 + 0 * sizes)
    over = live & (b > c)                                              # c/b < 1 only there (no overflow)
    tau = xp.where(over, c / xp.where(over, b, 1), live * 1.0)
    return phi, tau, tau * b


def luce_weights(phi_children, tau_children):
    """``w_j(S) = τ_{y_j} e^{φ_{y_j}} / (e^{−T} + Σ_l e^{φ_{y_l}})`` for the realised children's ``φ``, ``τ``
    ``[..., k]`` (numpy or torch): the plan on one tuple."""
    return tau_children * _member_choice(phi_children)[1]


def luce_plan(target_probs, draft_probs, rho, k, process) -> NodePlan | None:
    """The Luce plan (module docstring) for ``wor`` children whose exchangeable classes
    (:func:`token_classes`) are within :func:`luce_budget`; None otherwise.  ``info = {"phi", "tau"}`` over the
    vocabulary (``φ`` at the floor off the support)."""
    p, q, rho = check_node_inputs("luce_plan", target_probs, draft_probs, rho, k, process)
    first, sizes, members = token_classes(q, rho * p)
    if process != "wor" or not luce_budget(sizes, k):
        return None
    phi_s, tau_s, a_s = (x[0] for x in luce_fit(rho * p[first][None], q[first][None], k, sizes[None] * 1.0))
    support = np.flatnonzero(q > 0)
    phi = np.full(p.size, LUCE_FLOOR)
    tau, a = np.zeros(p.size), np.zeros(p.size)
    phi[support], tau[support], a[support] = phi_s[members], tau_s[members], a_s[members]

    def select(S) -> np.ndarray:
        S = list(S)
        return luce_weights(phi[S], tau[S])

    return NodePlan("luce", rho, p, a, select, {"phi": phi, "tau": tau})
