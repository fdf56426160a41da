"""The node-plan interface shared by every UniVer construction (theory.md §6.1).

A node plan at node X (scaling ``ρ``, target ``p``, draft ``q``, k children from ``process``) is a map
``w(S) ∈ [0,1]^k``, ``Σ_j w_j(S) ≤ 1``, on ordered child tuples S, whose token marginal
``a(y) = Σ_S Q_k(S) Σ_{j: y_j = y} w_j(S)`` satisfies ``a(y) ≤ ρ·p(y)`` (CondOT(ρ), §4.2).
``α = Σ_y a(y)``.  If every attempted child fails, X succeeds w.p. ``f = (ρ − α)/(1 − α)`` (1 if α ≥ 1: then
ρ = α = 1, every tuple's weights sum to 1 and no child fails; 1 is the limit as α → 1 at ρ = 1, so round-off
that lands α on either side of 1 gives the same f) and
emits ``Y ~ norm(ρp − a)``.  ``marginal`` must be the *exact* marginal of ``select`` (recomputed from the plan
actually used, never the solver's claimed value) — losslessness rests on it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class NodePlan:
    """A feasible CondOT(ρ) node plan.

    Attributes
    ----------
    construction : name of the construction that built it (recorded in traces).
    rho : scaling ρ of the node.
    target : ``p(·|s)`` [V].
    marginal : ``a(y)`` [V], the exact token marginal of ``select``; ``a ≤ ρp``.
    select : ``S -> w [k]``, the plan evaluated on a realised ordered tuple.
    info : free-form details (e.g. which sub-family was feasible).
    """

    construction: str
    rho: object
    target: np.ndarray
    marginal: np.ndarray
    select: Callable[[tuple], np.ndarray]
    info: dict = field(default_factory=dict, compare=False)

    @property
    def alpha(self):
        """Node acceptance rate ``α = Σ_y a(y)``."""
        return self.marginal.sum()

    @property
    def stop(self):
        """``f = (ρ − α)/(1 − α)``, 1 when ``α ≥ 1`` (module docstring)."""
        a = self.alpha
        return (self.rho - a) / (1 - a) if a < 1 else 0 * a + 1

    @property
    def residual(self) -> np.ndarray:
        """``norm(ρp − a)`` (clipped at 0 against float round-off; exact in Fraction mode)."""
        d = np.maximum(self.rho * self.target - self.marginal, 0)
        s = d.sum()
        return d / s if s != 0 else d


def sequential_shares(w) -> tuple:
    """``w_j / (1 − Σ_{l<j} w_l)`` for each j (0 when nothing is left): the probability that child j is taken once
    children ``1..j−1`` were not, for a tuple whose children are taken w.p. ``w_j`` (theory.md §6.1).  Exact for
    Fraction entries; floats are clamped to [0, 1] against round-off."""
    exact = np.asarray(w).dtype == object
    out, used = [], Fraction(0) if exact else 0.0      # Fraction: an int entry 1/1 must not become 1.0
    for wj in w:
        den = 1 - used
        s = wj / den if den > 0 else 0 * wj
        out.append(s if exact else min(1.0, max(0.0, float(s))))
        used = used + wj
    return tuple(out)
