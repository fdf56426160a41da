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

from ..nx import get_backend


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
        """``f = (ρ − α)/(1 − α)``, 1 when ``α ≥ 1`` (module docstring): exact for Fraction entries, else
        :func:`stop_rows` (float, clamped to [0, 1])."""
        a = self.alpha
        if isinstance(a, Fraction):
            return (self.rho - a) / (1 - a) if a < 1 else 0 * a + 1
        return float(stop_rows(np.float64(self.rho), np.float64(a)))

    @property
    def residual(self) -> np.ndarray:
        """``norm(ρp − a)``: exact for Fraction entries, else :func:`residual_rows` normalised."""
        if self.marginal.dtype == object:
            d = np.maximum(self.rho * self.target - self.marginal, 0)
        else:
            d = residual_rows(self.rho * self.target, self.marginal, np.float64(self.stop))
        s = d.sum()
        return d / s if s != 0 else d


# ----------------------------------------------------------------------------------------- float rows
# One float formula each for the exact core (numpy, a batch of one) and gpu (torch rows, :mod:`univer_theory.nx`);
# the Fraction branches above and in :func:`sequential_shares` are the exact oracles that check them.
def stop_rows(rho, alpha):
    """``f = (ρ − α)/(1 − α)`` where ``α < 1``, else 1, clamped to [0, 1] against round-off (module docstring);
    numpy or torch, any shape."""
    nx = get_backend(rho, alpha)
    below = alpha < 1
    return nx.clip(nx.where(below, (rho - alpha) / nx.where(below, 1 - alpha, 1.0), 1.0), 0.0, 1.0)


def residual_rows(c, a, stop):
    """The unnormalised residual ``[c − a]_+`` (``c = ρp``; clipped at 0 against round-off) of rows whose stop
    probability is ``f = stop [...]``, numpy or torch.

    Where round-off cancels all of it although ``f > 0`` — α rounds to ρ = 1 while the realised tuple takes no
    child (a tuple of probability ~1e-25 under a confident draft, weight 0: the true residual is ~1e-25·p there),
    so ``f = 1`` — the row is ``c`` itself (Y ~ p): the correction stays in the target's support, off by at most
    that event's probability, where a zero row drew token 0 (p(0) = 0) and the exact law lost the event's mass.
    Elsewhere (``f = 0``, or ``c = 0``: never reached) the residual's mass is ``ρ − α`` as it stands."""
    nx = get_backend(c, a)
    d = nx.clip(c - a, 0.0)
    return nx.where((nx.sum(d, keepdims=True) > 0) | (stop <= 0)[..., None], d, c)


def shares_rows(w):
    """``w_j / (1 − Σ_{l<j} w_l)`` along the last axis (0 when nothing is left), clamped to [0, 1]: the
    probability that child j is taken once children ``1..j−1`` were not (theory.md §6.1); numpy or torch."""
    nx = get_backend(w)
    den = 1 - nx.exclusive_cumsum(w)
    return nx.clip(nx.where(den > 0, w / nx.where(den > 0, den, 1.0), 0.0), 0.0, 1.0)


def sequential_shares(w) -> tuple:
    """:func:`shares_rows` of one tuple's weights ``w`` as a tuple; exact for Fraction entries (the oracle)."""
    if np.asarray(w).dtype != object:
        return tuple(float(x) for x in shares_rows(np.asarray(w, dtype=np.float64)))
    out, used = [], Fraction(0)                        # Fraction: an int entry 1/1 must not become 1.0
    for wj in w:
        den = 1 - used
        out.append(wj / den if den > 0 else 0 * wj)
        used = used + wj
    return tuple(out)
