"""Rule 3 of theory.md §6.3 / §6.5: closed-form α*-optimal plans for ``wor`` with k = 2 children, any V.

Max-flow/min-cut structure of CondOT(ρ) (§4.2): with the optimal cut ``A*`` (lowest p/q ratios) and
``H = V∖A*``, c = ρp, a plan is α*-optimal iff (i) every pair meeting both sides selects its H child with
weight 1, (ii) pairs inside H select an H child with total weight 1 and ``a ≤ c`` on H, (iii) pairs inside
A* give ``a = c`` on A*.  Within a side s (H or A*), a pair ``(y_1, y_2)`` takes child 2 with probability
``(1 − β(y_1))·γ(y_2)`` and child 1 otherwise; the base marginal of x ∈ s is

.. math::  b(x) = q_x\\Big[X_x + \\frac{q(s) − q_x − (1−β_x)G}{1 − q_x} + γ_x E\\Big],
           \\quad G = \\sum_{s} qγ,\\quad E = \\sum_{s} \\frac{q(1−β)}{1−q},

with ``X_x = q(A*)/(1 − q_x) + Σ_{y∈A*} q_y/(1 − q_y)`` on H (pairs meeting A*) and ``X_x = 0`` on A*
(``1 − q_x`` is evaluated as the rest mass ``Σ_{y≠x} q_y``, as in the wor tuple law).  H needs ``b ≤ c``,
A* needs ``b ≥ c``; then every token is thinned by ``t = min(1, c/b)`` (``a = c`` on A*; on H this only
absorbs round-off).  Two families, each settled by a monotone 1-D search per side:

* **β-family** (γ ≡ 1, §6.5): for a trial ``E`` every β_x is ``clip((c_x − lo_x(E))/(hi_x(E) − lo_x(E)))``
  where ``lo/hi`` are b at β_x = 0/1; ``Σ_x clip(c_x, lo_x(E), hi_x(E))`` increases in E and equals the
  side's fixed total P exactly when E is self-consistent.  Feasible iff the clip was not forced.
* **yield/accept** (§6.5): from β ≡ 1 (child 1 always), tokens on the wrong side of their bound
  ("givers", γ = 0) yield to child 2, tokens on the right side ("takers", β = 1) accept it
  (``b_x = b_x(β≡1, γ≡0) − G·q_x(1−β_x)/(1−q_x) + E·q_xγ_x``): on H givers shed exactly their excess and
  E is the root of ``Σ_takers min(q_x E, room_x) = D``; on A* takers receive exactly their deficit at the
  smallest E with γ ≤ 1.

Whenever both sides are feasible the plan attains α*_wor(ρ) (to float round-off); otherwise the rule
returns ``None`` and the caller falls through to another construction.  "Feasible" is also checked on the
result: a plan whose exact α (after the thinning) is below α*(ρ) by more than :data:`OPTIMALITY_TOL` is
declared infeasible — on confident rows (one token holding all but ~1e-14 of q) the side sums cancel and the
families' parameters are round-off, which the thinning turns into a lossless but useless plan.  Measured
(Dirichlet p, q): feasible in 87–99% of instances for V ≤ 6, but only ~40% for flat rows with V = 200.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..alpha_star import alpha_star_and_cut
from .base import NodePlan
from .node_inputs import check_node_inputs

#: Slack allowed on ``b ≤ c`` (H) / ``b ≥ c`` (A*) before a family is declared infeasible, relative to the
#: side's scale ``max(1, max c, max q·q(s)/R)`` (:func:`side_tolerance`): float round-off of O(V) sums whose
#: terms reach that scale — ~1e5 when one token holds all but 1e-5 of q, where b is known to ~1e-11 only.
#: Violations within it are removed by the thinning ``t = min(1, c/b)``, which keeps the plan exactly lossless
#: and costs α at most this much.  Also the (absolute) tolerance of the 1-D searches (:func:`_bisect_increasing`).
FEASIBILITY_TOL = 1e-13
#: A plan counts as α*-optimal (so the rule returns it) when ``α ≥ α*(ρ) − OPTIMALITY_TOL``.
OPTIMALITY_TOL = 1e-9
#: Bisection steps of the 1-D searches (each stops earlier once the midpoint leaves the open bracket).
BISECTION_STEPS = 200


def _bisect_increasing(f, lo: float, hi: float, start_tol: float = FEASIBILITY_TOL) -> float:
    """Smallest E (to float resolution) with ``f(E) ≥ −FEASIBILITY_TOL`` for a non-decreasing ``f`` with
    ``f(lo) ≤ 0 ≤ f(hi)``; ``lo`` itself when ``f(lo) ≥ −start_tol``.

    The tolerances make the answer independent of the summation order where ``f`` has a plateau at 0 (the
    β-family when p = q and ρ = 1: every plateau point solves it, and the float sign of ``f`` is round-off
    noise): the bisection takes the plateau's start.  The plateau starts at ``lo``, and the β-family passes its
    side's scaled tolerance (:func:`side_tolerance`) as ``start_tol``, since its sums' round-off grows with
    their terms (~1e-11 when one token holds all but 1e-5 of q)."""
    if f(lo) >= -start_tol:
        return lo
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        if f(mid) < -FEASIBILITY_TOL:
            lo = mid
        else:
            hi = mid
    return hi


def _leave_one_out(v: np.ndarray) -> np.ndarray:
    """``Σ_{y≠x} v_y`` for every x, from prefix and suffix sums (no cancellation for v ≥ 0)."""
    zero = np.zeros(1)
    return np.concatenate((zero, np.cumsum(v)[:-1])) + np.concatenate((np.cumsum(v[::-1])[::-1][1:], zero))


@dataclass(frozen=True)
class _Side:
    """One side of the cut: its drafted tokens' q, rest mass ``R_x = Σ_{y≠x} q_y`` (all of V), caps c,
    cross term X and the bound's direction (``upper``: b ≤ c on H; else b ≥ c on A*)."""

    q: np.ndarray
    rest: np.ndarray
    c: np.ndarray
    cross: object
    upper: bool


def side_tolerance(side: _Side) -> float:
    """``FEASIBILITY_TOL · max(1, max c, max q·q(s)/R)`` for a non-empty side."""
    return FEASIBILITY_TOL * max(1.0, float(side.c.max()), float((side.q * side.q.sum() / side.rest).max()))


def side_marginal(side: _Side, beta, gamma) -> np.ndarray:
    """Base marginal ``b`` of a side's drafted tokens (module docstring), from the plan's parameters.

    ``1 − q_x`` is the rest mass ``R_x`` (as in the wor tuple law), and the bracket is evaluated as
    ``X_x + (Σ_{y≠x} q_y(1−γ_y) + β_x Σ_{y≠x} q_yγ_y)/R_x + γ_x Σ_{y≠x} q_y(1−β_y)/R_y``
    with leave-one-out sums of non-negative terms: the closed form's ``q(s) − q_x − (1−β_x)G`` cancels
    catastrophically when one token holds almost all of q (errors ~1e-11 seen at 1 − q_x ≈ 3e-6).
    """
    q, rest = side.q, side.rest
    kept = _leave_one_out(q * (1 - gamma)) + beta * _leave_one_out(q * gamma)
    return q * (side.cross + kept / rest + gamma * _leave_one_out(q * (1 - beta) / rest))


def _beta_family(side: _Side):
    """β-family (γ ≡ 1); one clip serves both bound directions (module docstring)."""
    q, rest, c = side.q, side.rest, side.c
    lo0 = q * (side.cross - q / rest)                      # b at β_x = 0, E = 0
    span = q * q.sum() / rest                             # hi − lo
    total = (lo0 + span).sum()                            # the side's total P (β ≡ 1 ⇒ E = 0)

    def beta_at(E):
        return np.clip((c - lo0 - q * E) / span, 0.0, 1.0)

    E = _bisect_increasing(lambda E: (lo0 + q * E + span * beta_at(E)).sum() - total, 0.0, (q / rest).sum(),
                           side_tolerance(side))
    return beta_at(E), np.ones_like(q)


def _yield_accept(side: _Side):
    """Yield/accept family: givers (γ = 0) yield child 2, takers (β = 1) accept it."""
    q, rest, c = side.q, side.rest, side.c
    base = q * (side.cross + _leave_one_out(q) / rest)    # β ≡ 1: child 1 always
    over, under = np.maximum(base - c, 0.0), np.maximum(c - base, 0.0)
    beta, gamma = np.ones_like(q), np.zeros_like(q)
    takers, givers = under > 0, over > 0
    if side.upper:                                        # shed the givers' excess into the takers' room
        D = over.sum()
        if D <= 0:
            return beta, gamma
        if under.sum() < D:
            return None
        E = _bisect_increasing(lambda E: np.minimum(q[takers] * E, under[takers]).sum() - D,
                               0.0, float((under[takers] / q[takers]).max()))
        G = D / E
        beta[givers] = 1 - over[givers] * rest[givers] / (q[givers] * G)
        gamma[takers] = np.minimum(1.0, under[takers] / (q[takers] * E))
    else:                                                 # cover the takers' deficit from the givers' surplus
        D = under.sum()
        if D <= 0:
            return beta, gamma
        E = float((under[takers] / q[takers]).max())       # smallest E with γ ≤ 1, i.e. the largest G = D/E
        cap = np.minimum(q[givers] / rest[givers], over[givers] * E / D)
        if cap.sum() < E:
            return None
        beta[givers] = 1 - cap * (E / cap.sum()) * rest[givers] / q[givers]
        gamma[takers] = under[takers] / (q[takers] * E)
    return np.clip(beta, 0.0, 1.0), np.clip(gamma, 0.0, 1.0)


#: Families tried in order on each side.
FAMILIES = {"beta": _beta_family, "yield_accept": _yield_accept}


def _solve_side(side: _Side):
    """First family whose exact base marginal meets the side's bound: ``(β, γ, b, name)`` or None."""
    if side.q.size == 0:
        return np.ones(0), np.ones(0), np.zeros(0), "empty"
    slack = side_tolerance(side)
    for name, family in FAMILIES.items():
        sol = family(side)
        if sol is None:
            continue
        beta, gamma = sol
        b = side_marginal(side, beta, gamma)
        if (b <= side.c + slack).all() if side.upper else (b >= side.c - slack).all():
            return beta, gamma, b, name
    return None


def wor_pair_plan(target_probs, draft_probs, rho, k, process) -> NodePlan | None:
    """α*-optimal closed-form plan for ``wor``, k = 2 (None for other k / process, or if both families fail).

    Parameters
    ----------
    target_probs, draft_probs : p, q [V].
    rho : scaling ρ ∈ [0, 1].
    k : number of children (the rule applies to k = 2).
    process : draft process (the rule applies to ``"wor"``).

    Returns
    -------
    NodePlan whose ``info`` holds the cut (``in_cut``: mask of A*), the per-side family used, β, γ and the
    thinning t.
    """
    p, q, rho = check_node_inputs("wor_pair_plan", target_probs, draft_probs, rho, k, process)
    if process != "wor" or k != 2:
        return None
    c = rho * p
    alpha_star, in_cut = alpha_star_and_cut(p, q, 2, "wor", rho)
    in_cut = np.asarray(in_cut, dtype=bool)
    drafted = q > 0
    rest = _leave_one_out(q)                              # R_x = Σ_{y≠x} q_y, the wor law's "1 − q_x"
    masks = {"H": drafted & ~in_cut, "A": drafted & in_cut}
    qA, rA = q[masks["A"]], rest[masks["A"]]
    cross = {"H": qA.sum() / rest[masks["H"]] + (qA / rA).sum(), "A": 0.0}
    beta, gamma, b = np.ones(q.size), np.ones(q.size), np.zeros(q.size)
    families = {}
    for name, mask in masks.items():
        sol = _solve_side(_Side(q[mask], rest[mask], c[mask], cross[name], upper=(name == "H")))
        if sol is None:
            return None
        beta[mask], gamma[mask], b[mask], families[name] = sol
    thin = np.ones(q.size)
    over = b > c
    thin[over] = c[over] / b[over]
    if (thin * b).sum() < alpha_star - OPTIMALITY_TOL:
        return None
    on_h = masks["H"]

    def select(S) -> np.ndarray:
        y1, y2 = S
        if on_h[y1] != on_h[y2]:
            w = np.array([1.0, 0.0]) if on_h[y1] else np.array([0.0, 1.0])
        else:
            second = (1 - beta[y1]) * gamma[y2]
            w = np.array([1 - second, second])
        return w * thin[[y1, y2]]

    return NodePlan("wor_pair", rho, p, thin * b, select,
                    {"in_cut": in_cut, "families": families, "beta": beta, "gamma": gamma, "thin": thin})
