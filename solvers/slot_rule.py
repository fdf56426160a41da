"""The slot rule of UniVer (theory.md §6.3, layer ii): move a multiset class's token mass to deeper positions.

For the realised tuple S let ``C(S)`` be the distinct orderings S' of its multiset with ``Q_k(S') > 0``.
A node plan ``w`` gives each token x the class mass ``m_x = Σ_{S'∈C} Q_k(S') Σ_{j: S'_j = x} w_j(S')``.
The slot rule keeps every ``m_x`` (hence the marginal a, α and losslessness) and re-distributes it across
positions, favouring positions with larger subtrees:

.. math::

    \\max_{z ≥ 0} \\sum_{S' ∈ C,\\, j} ω_j\\, z(S', j) \\quad\\text{s.t.}\\quad
    \\sum_j z(S', j) ≤ Q_k(S'),\\qquad \\sum_{(S', j):\\, S'_j = x} z(S', j) = m_x,

``ω_j = 1 + |subtree at position j|``; then ``w(S') = z(S', ·)/Q_k(S')``.

**k = 2 in closed form** (:func:`slot_rule_pair`, no LP): with ``ω_1 > ω_2`` every ordering's first position
takes as much of its token's class mass as the ordering holds, ``z(S', 1) = min(m_{S'_1}, Q_k(S'))``, and the
second position the rest of its token's mass, ``z(S', 2) = m_{S'_2} − z(S'', 1)`` (S'' the reversed
ordering); mirrored for ``ω_2 > ω_1``.  The objective is ``ω_2 Σm + (ω_1 − ω_2) Σ_{S'} z(S', 1)`` and each
``z(S', 1)`` is capped separately, so this optimum is the LP's unique one (feasible because
``m_a + m_b ≤ Q(a, b) + Q(b, a)``).  A repeated token (i.i.d. ``(a, a)``) moves all its mass to the better
position; with ``ω_1 = ω_2`` nothing can be gained and the plan's own weights are kept.

**k ≥ 3: one LP per class, with one optimum.**  ω is constant across orderings, so the LP's optimum is a
face, and which of its points is used moves E[τ] a lot on single trees.  The slot rule uses the point that
changes the plan least: among the ω-optima, ``min Σ |z − z_0|`` (``z_0 = Q_k·w`` the plan's own), then the
tie-break of :mod:`solvers.tie_break` for a single point — lexicographically, one LP in ``z = z_0 + u − v``,
``u, v ≥ 0``:

.. math::

    \\max\\ ω·(u − v) − ε\\,\\mathbf 1·(u + v) + ε^2\\, r·(u − v)

subject to ``Σ_j (u − v)(S', j) ≤ Q_k(S') − Σ_j z_0(S', j)``, the class masses ``Σ (u − v) = 0`` and ``z ≥ 0``
(``v − u ≤ z_0``), with ``r(S', j) = frac(√P_{code(S')·k + j})``, ``code(S') = Σ_i d_i k^{k−1−i}`` (``d_i`` the
rank of ``S'_i`` among the class's distinct tokens, :func:`tie_break`) and ``ε = 1/(2(m + 1))``.  Its matrix
``[R, −R; −I, I]`` (R the network matrix of the class LP) is totally unimodular and ω is integer (UniVer's
``1 + |subtree|``), so every level's reduced costs are integers up to the next level's ε-share: the LP's
optimum is the lexicographic one, and it is unique (:mod:`solvers.tie_break`).  On 24 real EAGLE-like trees
this point was never below the plain tie-break's (mean E[τ] 2.73 vs 2.61; HiGHS' own vertex, used before, 2.74).
Both layers run :func:`slot_weights` (the closed form for k = 2, the class LP by the lexicographic simplex of
:mod:`solvers.lex_simplex` for k ≥ 3, on a batch of realised tuples: one in the exact core, a level's in
:mod:`gpu`).  :func:`slot_rule_lp` is the independent oracle the tests check it against: HiGHS on one class, on
the class's own scale ``Q/ΣQ`` (on a real vocabulary ΣQ ~ 1e-11, below HiGHS' absolute tolerances), the plan
recomputed from its optimal basis (``solve_lp(vertex=True)``).  Either answer is rechecked (z ≥ 0, row capacity,
class masses, :func:`slot_violations`); where the recheck fails the plan's own weights are kept.  The class must get
one answer whichever of its orderings was realised (else its token masses drift and the law with them), so
:func:`slot_lp` lists the class's orderings from its sorted tuple, one LP per class, and reads the realised
ordering's row off it.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations

import numpy as np

from univer_theory.nx import array_module, get_backend
from univer_theory.plans.lp_plan import capped_rows, plan_weights
from univer_theory.processes import tuple_probs
from univer_theory.tolerance import exceeds
from univer_theory.validation import check_choice, check_simplex

from .highs_lp import solve_lp
from .lex_simplex import lex_simplex
from .tie_break import prime_roots, tie_eps

#: Recheck tolerance of the slot plan, relative to the class probability Σ Q_k(S').
SLOT_TOL = 1e-13


@dataclass(frozen=True)
class SlotResult:
    """Answer of :func:`slot_rule_lp`.

    ``weights [n, k]``: the new ``w(S')`` for ``orderings[i]`` (the input weights when ``success`` is False);
    ``objective``: ``Σ ω_j z(S', j)`` before / after (``gain`` = after − before ≥ 0 when successful).
    """

    orderings: tuple
    weights: np.ndarray
    gain: float
    status: str
    success: bool
    message: str


def tuple_probability(S, draft_probs, process: str) -> float:
    """``Q_k(S)`` of one ordered tuple (theory.md §1) for ``iid`` / ``wor``
    (:func:`univer_theory.processes.tuple_probs`)."""
    q = _check_row("tuple_probability", draft_probs, process)
    return float(tuple_probs(q, np.asarray([_check_tuple("tuple_probability", S, q, process)], dtype=np.int64),
                             process)[0])


def _check_row(where: str, draft_probs, process: str) -> np.ndarray:
    """The draft row q as one float64 probability vector ``[V]`` of an ``iid`` / ``wor`` node; else a ValueError
    naming ``where`` (a NaN or negative row gave a NaN or negative Q_k(S), an unnormalised one a wrong one)."""
    check_choice(process, ("iid", "wor"), where, "process")
    q = check_simplex(draft_probs, where, "draft_probs")
    if q.ndim != 1:
        raise ValueError(f"{where}: draft_probs must be one row [V], got shape {q.shape}")
    return q.astype(np.float64)


def _check_tuple(where: str, S, q: np.ndarray, process: str) -> tuple:
    """S as a tuple of token ids in ``[0, V)``, distinct under ``wor``; else a ValueError naming ``where``."""
    S = tuple(S)
    if not S or not all(isinstance(y, (int, np.integer)) and not isinstance(y, bool) and 0 <= y < q.shape[-1]
                        for y in S):
        raise ValueError(f"{where}: S must be a non-empty tuple of token ids in [0, {q.shape[-1]}), got {S!r}")
    if process == "wor" and len(set(S)) != len(S):
        raise ValueError(f"{where}: a wor tuple draws distinct tokens, got {S!r}")
    return tuple(int(y) for y in S)


def multiset_class(S, draft_probs, process: str) -> tuple[tuple, np.ndarray]:
    """Distinct orderings S' of S's multiset with ``Q_k(S') > 0`` (sorted) and their probabilities."""
    q = _check_row("multiset_class", draft_probs, process)
    orderings = tuple(sorted(set(permutations(_check_tuple("multiset_class", S, q, process)))))
    probs = tuple_probs(q, np.asarray(orderings, dtype=np.int64), process)
    keep = probs > 0
    return tuple(o for o, k in zip(orderings, keep) if k), probs[keep]


def slot_rule_lp(orderings, probs, weights, omega) -> SlotResult:
    """Solve the slot-rule LP of the module docstring for one class.

    Parameters
    ----------
    orderings : n ordered tuples (one multiset class)
    probs : ``Q_k(S')`` [n]
    weights : ``w(S')`` [n, k] of the plan (``Σ_j w_j ≤ 1``)
    omega : position weights ``ω_j`` [k]
    """
    probs = np.asarray(probs, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    omega = np.asarray(omega, dtype=np.float64)
    n, k = w.shape
    if not (np.all(probs >= 0) and np.all(w >= 0) and np.isfinite(probs).all() and np.isfinite(w).all()):
        raise ValueError("slot_rule_lp: probs and weights must be finite and ≥ 0 (a NaN class probability read as 0: "
                         "'nothing to move')")
    if k == 2:
        return slot_rule_pair(orderings, probs, w, omega)
    if not np.array_equal(omega, np.round(omega)):
        raise ValueError(f"slot_rule_lp: position weights ω must be integers (1 + subtree size) for the unique "
                         f"tie-break of the module docstring, got {omega.tolist()}")
    unit = probs.sum()
    if not unit > 0:
        return SlotResult(tuple(orderings), w, 0.0, "optimal", True, "class probability 0: nothing to move")
    probs = probs / unit                 # the LP on the class's own scale: HiGHS' tolerances are absolute
    toks = np.asarray(orderings, dtype=np.int64)
    labels = sorted(set(toks.ravel().tolist()))
    ranks = np.searchsorted(labels, toks)                    # d_i of every ordering's tokens
    col_tok = ranks.ravel()                                  # variable i·k + j carries token toks[i, j]
    z0 = (w * probs[:, None]).ravel()
    N = n * k
    rows = np.zeros((n + len(labels), N))
    rows[np.repeat(np.arange(n), k), np.arange(N)] = 1.0
    rows[n + col_tok, np.arange(N)] = 1.0
    # z = z0 + u − v: capacity Σ_j (u − v) ≤ Q − Σ_j z0, masses Σ (u − v) = 0, z ≥ 0 as v − u ≤ z0
    A = np.block([[rows, -rows], [-np.eye(N), np.eye(N)]])
    spare = np.maximum(probs - z0.reshape(n, k).sum(1), 0.0)
    lower = np.concatenate([np.full(n, -np.inf), np.zeros(len(labels)), np.full(N, -np.inf)])
    upper = np.concatenate([spare, np.zeros(len(labels)), z0])
    eps, om, r = tie_eps(A.shape[0]), np.tile(omega, n), tie_break(ordering_code(ranks), k).ravel()
    cost = np.concatenate([om - eps + eps ** 2 * r, -om - eps - eps ** 2 * r])    # on u, v: ω, −|z − z0|, then r
    sol = solve_lp(cost, A, lower, upper, 0.0, np.inf, method="simplex", vertex=True)
    if not sol.success:
        return SlotResult(tuple(orderings), w, 0.0, "solver_failed", False, f"HiGHS: {sol.message}")
    z = z0 + sol.x[:N] - sol.x[N:]
    neg, over, drift = slot_violations(z.reshape(n, k), z0.reshape(n, k), probs, ranks)
    problems = [text for v, text in ((neg, f"an entry {-neg:.3g}·ΣQ below zero"),
                                     (over, f"Σ_j z(S', j) exceeds Q_k(S') by {over:.3g}·ΣQ"),
                                     (drift, f"class mass m_x moved by {drift:.3g}·ΣQ")) if exceeds(v, SLOT_TOL)]
    if problems:
        return SlotResult(tuple(orderings), w, 0.0, "recheck_failed", False,
                          "; ".join(problems) + f" (tolerance {SLOT_TOL:g}·ΣQ)")
    z = np.maximum(z, 0.0)
    zz = z.reshape(n, k)
    gain = unit * float(np.tile(omega, n) @ (z - z0))
    return SlotResult(tuple(orderings), capped_rows(plan_weights(zz, probs)), gain,
                      "optimal", True, sol.message)


def slot_violations(z, z0, probs, ranks):
    """The recheck of a slot plan (module docstring) on the class's own scale (``probs [..., n]`` the orderings'
    ``Q_k/ΣQ``, 0 off the class; ``z``, ``z0 [..., n, k]`` the plan after and before, on that scale; ``ranks
    [..., n, k]`` each entry's token rank, < k): ``(neg, over, drift) [...]`` — how far ``z`` dips below zero, how
    far ``max(z, 0)`` exceeds an ordering's capacity, and how far it moves a class mass ``m_x`` — each at most
    :data:`SLOT_TOL` for a plan that keeps them up to round-off.  numpy or torch (the exact core on one class,
    :func:`slot_lp` on a batch of tuples)."""
    nx = get_backend(z, z0)
    k = z.shape[-1]
    pos = nx.maximum(z, 0.0)
    neg = nx.amax(nx.amax(pos - z))
    over = nx.maximum(nx.amax(pos.sum(-1) - probs), 0.0)
    of = ranks[..., None] == nx.arange(k, ranks)                            # [..., n, k, x]
    drift = nx.amax(abs(nx.where(of, (pos - z0)[..., None], 0.0).sum(-2).sum(-2)))
    return neg, over, drift


def ordering_code(ranks):
    """``code(S') = Σ_i d_i k^{k−1−i}`` ``[...]`` (module docstring) from orderings' token ranks ``d [..., k]``
    (each token's rank among its class's distinct tokens, ``0 ≤ d < k``) — numpy or torch integers."""
    k = ranks.shape[-1]
    return sum(ranks[..., i] * k ** (k - 1 - i) for i in range(k))


def tie_break(code, k: int):
    """``r(S', j) = frac(√P_{code(S')·k + j})`` ``[..., k]`` (module docstring) for orderings of k tokens with codes
    ``code [...]`` (:func:`ordering_code`) — numpy, or torch (float64 on the codes' device)."""
    table = prime_roots(k ** k * k).reshape(k ** k, k).copy()        # (a writable copy: torch warns on read-only)
    return get_backend(code).asarray(table, code)[code]


def slot_pair(w_s, w_r, Q_s, Q_r, omega, same):
    """The k = 2 slot rule in closed form (module docstring) on a batch ``[...]`` of realised pairs S: the plan's
    weights on S and on its reversal R ``w_s, w_r [..., 2]``, their probabilities ``Q_s, Q_r [...]``, the position
    weights ``ω [..., 2]`` and whether S repeats a token (``same``: (a, a), R = S).  Returns ``(w(S), z(S, ·))
    [..., 2]`` — the new weights and masses; where nothing can move (``ω_1 = ω_2``, ``Q(R)`` not positive and
    finite, or ``Q(S)`` not positive: its float probability underflowed, S carries no mass and ``z/Q(S)`` is 0/0)
    the plan's own ``w_s`` and ``z_0``.  numpy (the exact core, :func:`slot_rule_pair`) or torch
    (:func:`slot_weights`, a batch of tuples)."""
    nx = get_backend(w_s, omega)
    z_s, z_r = w_s * Q_s[..., None], w_r * Q_r[..., None]
    first = omega[..., :1] > omega[..., 1:]                                # which position is the better one

    def better(z):
        return nx.where(first, z[..., :1], z[..., 1:])

    def worse(z):
        return nx.where(first, z[..., 1:], z[..., :1])

    mass_s, mass_r = better(z_s) + worse(z_r), better(z_r) + worse(z_s)
    top = nx.minimum(mass_s, Q_s[..., None])
    low = mass_r - nx.minimum(mass_r, Q_r[..., None])
    z = nx.where(first, nx.concat([top, low]), nx.concat([low, top]))
    total = nx.sum(z_s, keepdims=True)                                     # (a, a): all of it to the better one
    z = nx.where(same[..., None], nx.where(first, nx.concat([total, 0 * total]), nx.concat([0 * total, total])), z)
    keep = ((omega[..., 0] == omega[..., 1]) | ~(Q_r > 0) | ~(Q_r < nx.inf) | ~(Q_s > 0))[..., None]
    den = nx.where(keep[..., 0], 1.0 + 0 * Q_s, Q_s)[..., None]          # a kept row's Q_s may be 0: not read
    return nx.where(keep, w_s, capped_rows(z / den)), nx.where(keep, z_s, z)


def slot_rule_pair(orderings, probs, weights, omega) -> SlotResult:
    """The k = 2 slot rule in closed form (module docstring; :func:`slot_pair` on the class's orderings); same
    contract as :func:`slot_rule_lp`."""
    probs = np.asarray(probs, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    omega = np.asarray(omega, dtype=np.float64)
    if omega[0] == omega[1]:
        return SlotResult(tuple(orderings), w, 0.0, "optimal", True, "equal position weights: nothing to move")
    same = np.array([S[0] == S[1] for S in orderings])
    if len(orderings) == 2:                          # each ordering's reversal is the other one
        w_r, Q_r = w[::-1], probs[::-1]
    else:                                            # (a, a) is its own reversal; else the reversal has Q = 0
        w_r, Q_r = w, np.where(same, probs, 0.0)
    new_w, z = slot_pair(w, w_r, probs, Q_r, omega, same)
    return SlotResult(tuple(orderings), new_w, float(omega @ (z - w * probs[:, None]).sum(axis=0)), "optimal", True,
                      "closed form (k = 2)")


def slot_weights(w_all, children, q, omega, process: str, perms: list):
    """The slot rule at a batch of nodes — the one float implementation both layers run (the exact core on one
    node, :class:`univer_theory.univer.UniVerRule`; a level's nodes in :mod:`gpu.univer_rule`): ``(w(S) [R, k],
    applied [R])`` from ``w_all [R, P, k]``, the plan on the orderings ``children[:, perms[p]]`` of the realised
    tuples ``children [R, k]`` (``perms[0]`` the identity, P = k!), the draft rows ``q [R, V]`` and the position
    weights ``ω [R, k]`` (integers ``1 + |subtree|``).  k = 2: the closed form (:func:`slot_pair`); k ≥ 3
    (:func:`slot_lp`) the class LP of the module docstring.  Where ``applied`` is False (the simplex did not
    finish, or its answer fails the recheck) the plan's own weights.  numpy or torch."""
    if w_all.shape[2] == 2:
        nx = get_backend(w_all)
        probs = tuple_probs(q, children[:, [[0, 1], [1, 0]]], process)        # S and its reversal [R, 2]
        w = slot_pair(w_all[:, 0], w_all[:, 1], probs[:, 0], probs[:, 1], omega, children[:, 0] == children[:, 1])[0]
        return w, nx.zeros_like(probs[:, 0]) == 0
    return slot_lp(w_all, children, q, omega, process, perms)


def slot_lp(w_all, children, q, omega, process: str, perms: list):
    """:func:`slot_weights` for k ≥ 3: the class LP ``max ω·z``, then ``min Σ|z − z_0|``, then the tie-break, in
    ``z = z_0 + u − v``, every row's LP solved at once by :func:`solvers.lex_simplex.lex_simplex` with its four levels
    exactly (phase 1, ``ω·z``, ``−Σ(u + v)``, ``r·z``; :func:`slot_rule_lp` folds them into one objective with ε for
    HiGHS — the tests' oracle — the same optimum by total unimodularity).  Each LP has a capacity row per ordering, a
    mass row per token rank and a ``z ≥ 0`` row per variable; orderings that repeat an earlier one (i.i.d. repeated
    tokens) or have ``Q_k = 0`` get capacity 0 and no columns, so the LP is the class LP.  A row whose LP is not
    solved, or whose answer fails the recheck (:func:`slot_violations`: below zero, over a capacity or a class mass
    moved by more than ``SLOT_TOL·ΣQ``), keeps the plan's own weights.  ``(w(S) [R, k], applied [R])``."""
    nx, xp = get_backend(w_all), array_module(w_all)
    R, P, k = w_all.shape
    perm = nx.index(perms, w_all)
    # one LP per class, whichever of its orderings was realised: the orderings listed from the sorted tuple
    # (the realised tuple's own listing gave each ordering a differently pivoted LP, and the recheck, near its
    # tolerance, passed for some orderings of a class and not others: the class masses drifted, ~2e-6 of the law)
    w_all, children, realised = _canonical_listing(w_all, children, perm, k)
    # d_i: rank of S_i among S's distinct tokens; an ordering's code Σ d_i k^{k−1−i} names it within the class
    first = ~xp.tril(children[:, :, None] == children[:, None, :], -1).any(2)            # [R, k] first occurrences
    rank = ((children[:, None, :] < children[:, :, None]) & first[:, None, :]).sum(2)    # [R, k]
    ranks = rank[:, perm]                                                                  # [R, P, k]
    code = ordering_code(ranks)                                                            # [R, P]
    repeat = xp.tril(code[:, :, None] == code[:, None, :], -1).any(2)                      # an earlier ordering
    probs = tuple_probs(q, children[:, perm], process)
    keep = ~repeat & (probs > 0)                                                           # the class C(S)
    z0 = nx.where(keep[..., None], w_all * probs[..., None], 0.0).reshape(R, P * k)        # [R, P·k]
    # z = z0 + u − v; columns u, v (P·k each), capacity slacks (P), z ≥ 0 slacks (P·k), mass artificials (k)
    n_z = P * k
    cols, rows = nx.arange(n_z, w_all), nx.arange(R, w_all)[:, None]
    on = nx.asarray(xp.broadcast_to(keep[..., None], (R, P, k)).reshape(R, n_z), w_all)       # [R, P·k]
    A = nx.full((R, P + k + n_z, 3 * n_z + P + k), 0.0, w_all)
    for sign, at in ((1, cols), (-1, n_z + cols)):
        A[:, cols // k, at] = sign * on                                                    # Σ_j (u − v) ≤ spare
        A[rows, P + ranks.reshape(R, n_z), at] = sign * on                                 # Σ (u − v) = 0 per token
        A[:, P + k + cols, at] = -sign * on                                                # v − u ≤ z0
    slack = nx.concat([nx.arange(P, w_all), P + k + cols, P + nx.arange(k, w_all)])
    A[:, slack, 2 * n_z + nx.arange(P + k + n_z, w_all)] = 1.0
    spare = nx.maximum(nx.where(keep, probs, 0.0) - z0.reshape(R, P, k).sum(2), 0.0)
    b = nx.concat([spare, nx.full((R, k), 0.0, w_all), z0])
    tie = tie_break(code, k).reshape(R, n_z)                                               # r [R, P·k]
    om = xp.broadcast_to(omega[:, None, :], (R, P, k)).reshape(R, n_z)
    costs = nx.full((R, 4, A.shape[2]), 0.0, w_all)
    costs[:, 0, :n_z] = costs[:, 0, n_z:2 * n_z] = on - 1                                  # columns not in the class
    costs[:, 0, 2 * n_z + P + n_z:] = -1                                                   # phase 1
    for sign, at in ((1, slice(0, n_z)), (-1, slice(n_z, 2 * n_z))):
        costs[:, 1, at] = sign * om * on                                                   # ω·z
        costs[:, 2, at] = -on                                                              # −|z − z0|
        costs[:, 3, at] = sign * tie * on                                                  # the tie-break
    basis = nx.arange(P + k + n_z, w_all)
    basis[slack] = 2 * n_z + nx.arange(P + k + n_z, w_all)
    x, optimal = lex_simplex(A, b, costs, xp.broadcast_to(basis[None], (R, P + k + n_z)), check_basis=False)
    z = (z0 + x[:, :n_z] - x[:, n_z:2 * n_z]).reshape(R, P, k)
    unit = nx.sum(nx.where(keep, probs, 0.0))                                             # ΣQ of the class
    unit = nx.where(unit > 0, unit, 1.0)[:, None]
    checks = slot_violations(z / unit[..., None], z0.reshape(R, P, k) / unit[..., None],
                             nx.where(keep, probs, 0.0) / unit, ranks)
    ok = optimal & (checks[0] <= SLOT_TOL) & (checks[1] <= SLOT_TOL) & (checks[2] <= SLOT_TOL)
    at = nx.argmax(code == nx.take(code, realised[:, None]))                              # S's first listing
    s_cols = at * k + nx.arange(k, w_all)[None, :]                                          # its k columns
    new = capped_rows(plan_weights(nx.maximum(nx.take(z.reshape(R, n_z), s_cols), 0.0), nx.take(probs, at)[:, 0]))
    return nx.where(ok[:, None], new, nx.take(w_all.reshape(R, n_z), s_cols)), ok


def _canonical_listing(w_all, children, perm, k: int):
    """The slot LP's input in one listing per class: ``(w [R, P, k], tuples [R, k], realised [R])`` — the tuple
    sorted, the plan's weights on its orderings ``sorted[perm[p]]`` (taken from ``w_all``'s listing
    ``children[perm[p]]``, the same orderings in another order) and the index p whose ordering is the realised
    tuple.  Permutations are named by their codes base k, looked up in a table of ``k^k`` entries (no host read)."""
    nx = get_backend(w_all)
    P = perm.shape[0]
    digits = nx.index([k ** (k - 1 - i) for i in range(k)], perm)
    lookup = nx.index([0] * k ** k, perm)
    lookup[(perm * digits).sum(-1)] = nx.arange(P, perm)
    sort = nx.argsort(children)                                                            # [R, k], stable
    listing = lookup[(sort[:, perm] * digits).sum(-1)]                                     # [R, P]
    realised = lookup[(nx.argsort(sort) * digits).sum(-1)]                                # S = sorted[inverse]
    w = nx.take(w_all.reshape(w_all.shape[0], -1), (listing[..., None] * k + nx.arange(k, w_all)).reshape(-1, P * k))
    return w.reshape(w_all.shape), nx.take(children, sort), realised
