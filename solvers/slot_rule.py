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
face.  The LP solved adds the tie-break of :mod:`solvers.tie_break` (ω is integer: UniVer's ``1 + |subtree|``):
``r(S', j) = frac(√P_{code(S')·k + j})``, ``code(S') = Σ_i d_i k^{k−1−i}`` with ``d_i`` the rank of ``S'_i``
among the class's distinct tokens (:func:`tie_break`), so it is an ω-optimum and every exact solver finds the
same one (:mod:`gpu.slot_rule` too).  HiGHS solves it on the class's own scale ``Q/ΣQ`` (on a real
vocabulary ΣQ ~ 1e-11, below HiGHS' absolute tolerances), then the answer is *polished*: the equalities of
the solver's active set (support of z, tight rows) are re-solved by least squares, so the class masses hold
to round-off, not to HiGHS' 1e-10 (which would leak 1:1 into the output law).  The polished answer is
rechecked (z ≥ 0, row capacity, class masses); if the recheck fails the result says so and the caller keeps
the plan's own weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations

import numpy as np

from univer_theory.validation import check_choice

from .highs_lp import solve_lp
from .tie_break import prime_roots, tie_eps

#: Recheck tolerance of the polished slot plan, relative to the class probability Σ Q_k(S').
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
    """``Q_k(S)`` of one ordered tuple (theory.md §1) for ``iid`` / ``wor``."""
    check_choice(process, ("iid", "wor"), "tuple_probability", "process")
    q = np.asarray(draft_probs, dtype=np.float64)
    pr, used = 1.0, 0.0
    for y in S:
        if process == "wor":
            if used >= 1.0:
                return 0.0
            pr *= q[y] / (1.0 - used)
            used += q[y]
        else:
            pr *= q[y]
    return pr


def multiset_class(S, draft_probs, process: str) -> tuple[tuple, np.ndarray]:
    """Distinct orderings S' of S's multiset with ``Q_k(S') > 0`` (sorted) and their probabilities."""
    orderings = tuple(sorted(set(permutations(tuple(int(y) for y in S)))))
    probs = np.array([tuple_probability(o, draft_probs, process) for o in orderings])
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
    z0 = w * probs[:, None]
    mass = np.bincount(col_tok, weights=z0.ravel(), minlength=len(labels))
    rows = np.zeros((n + len(labels), n * k))
    rows[np.repeat(np.arange(n), k), np.arange(n * k)] = 1.0
    rows[n + col_tok, np.arange(n * k)] = 1.0
    lower = np.concatenate([np.full(n, -np.inf), mass])
    upper = np.concatenate([probs, mass])
    c = np.tile(omega, n)
    before = float(c @ z0.ravel())
    c_tied = c + tie_eps(rows.shape[0]) * tie_break(ranks).ravel()
    sol = solve_lp(c_tied, rows, lower, upper, 0.0, np.inf, method="simplex")
    if not sol.success:
        return SlotResult(tuple(orderings), w, 0.0, "solver_failed", False, f"HiGHS: {sol.message}")
    z = _polish(np.maximum(sol.x, 0.0), rows, probs, mass, n)
    zz = z.reshape(n, k)
    problems = []
    if z.min(initial=0.0) < 0:
        problems.append(f"negative entry {z.min():.3g}")
    over = (zz.sum(axis=1) - probs).max(initial=0.0)
    if over > SLOT_TOL:
        problems.append(f"Σ_j z(S', j) exceeds Q_k(S') by {over:.3g}·ΣQ")
    drift = np.abs(np.bincount(col_tok, weights=z, minlength=len(labels)) - mass).max(initial=0.0)
    if drift > SLOT_TOL:
        problems.append(f"class mass m_x moved by {drift:.3g}·ΣQ")
    if problems:
        return SlotResult(tuple(orderings), w, 0.0, "recheck_failed", False,
                          "; ".join(problems) + f" (tolerance {SLOT_TOL:g}·ΣQ)")
    new_w = zz / probs[:, None]
    new_w = new_w / np.maximum(1.0, new_w.sum(axis=1, keepdims=True))
    return SlotResult(tuple(orderings), new_w, unit * (float(c @ z) - before), "optimal", True, sol.message)


def tie_break(ranks) -> np.ndarray:
    """``r(S', j) = frac(√P_{code(S')·k + j})`` ``[n, k]`` (module docstring) from the orderings' token ranks
    ``d [n, k]`` (each token's rank among the class's distinct tokens, ``0 ≤ d < k``)."""
    d = np.asarray(ranks, dtype=np.int64)
    k = d.shape[-1]
    code = d @ (k ** np.arange(k - 1, -1, -1))
    return prime_roots(k ** k * k).reshape(k ** k, k)[code]


def slot_rule_pair(orderings, probs, weights, omega) -> SlotResult:
    """The k = 2 slot rule in closed form (module docstring); same contract as :func:`slot_rule_lp`."""
    probs = np.asarray(probs, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    omega = np.asarray(omega, dtype=np.float64)
    z0 = w * probs[:, None]
    if omega[0] == omega[1]:
        return SlotResult(tuple(orderings), w, 0.0, "optimal", True, "equal position weights: nothing to move")
    first = 0 if omega[0] > omega[1] else 1          # the better position
    if len(orderings) == 1 and orderings[0][0] == orderings[0][1]:      # (a, a): one token, both positions
        z = np.zeros_like(z0)
        z[0, first] = z0.sum()
    elif len(orderings) == 1:                        # the reversed ordering has Q = 0: nothing can move
        z = z0
    else:
        # m of each ordering's token at the better position: its own mass there plus the reversed ordering's
        mass = z0[:, first] + z0[::-1, 1 - first]
        z = np.zeros_like(z0)
        z[:, first] = np.minimum(mass, probs)
        z[:, 1 - first] = (z0[::-1, first] + z0[:, 1 - first]) - z[::-1, first]
    new_w = z / probs[:, None]
    new_w = new_w / np.maximum(1.0, new_w.sum(axis=1, keepdims=True))
    return SlotResult(tuple(orderings), new_w, float(omega @ (z - z0).sum(axis=0)), "optimal", True, "closed form (k = 2)")


def _polish(z: np.ndarray, rows: np.ndarray, probs: np.ndarray, mass: np.ndarray, n: int) -> np.ndarray:
    """Re-solve the active equalities (support of z; class masses; tight capacity rows) by least squares
    (``ΣQ = 1``: the LP is on the class's scale)."""
    support = z > 1e-13
    if not support.any():
        return np.zeros_like(z)
    tight = np.flatnonzero(probs - rows[:n] @ z <= 1e-9)
    A = np.vstack([rows[n:], rows[tight]])[:, support]
    b = np.concatenate([mass, probs[tight]])
    out = np.zeros_like(z)
    out[support] = np.linalg.lstsq(A, b, rcond=None)[0]
    out[(out < 0) & (out > -1e-15)] = 0.0
    return out
