"""The result object of every flat / node-level OT solver (in the spirit of POT's ``OTResult`` and scipy's
``OptimizeResult``): the value, the plan when the method builds one, and the solver's verdict after our own
recheck of the answer."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class OTResult:
    """Answer of a CondOT(ρ) / flat multi-draft OT solve (theory.md §4.1–§4.2).

    Attributes
    ----------
    value : float
        Σ of the plan (``Σ_{S,j} π(S, j)``; the acceptance rate α) or, for plan-free methods, α*(ρ).
    plan : ndarray ``[n_tuples, k]`` or None
        ``π(S, j)``: mass sent from drafted tuple ``tuples[i]`` through its position j.
    marginal : ndarray ``[V]`` or None
        Token marginal ``a(y) = Σ_{(S,j): S_j = y} π(S, j)`` recomputed from ``plan`` (never the solver's).
    tuples : tuple of ordered tuples or None
        The rows of ``plan``: every S with ``Q_k(S) > 0``.
    cut : ndarray bool ``[V]`` or None
        A minimising cut A* of ``min_A [ρ p(A) + Pr(S ⊄ A)]`` (min-cut and closed-form methods).
    status : str
        ``"optimal"``, the solver's own status text, or ``"recheck_failed"``.
    success : bool
        True iff the solver reports optimality and our recheck passed.
    message : str
        The solver's message, plus the violated rule and tolerance when the recheck failed.
    solver : str
        Which method produced the answer (``"highs"``, ``"cvxpy-HIGHS"``, ``"mincut"``, ``"closed-form"``).
    seconds : float
        Wall time of the solve (``time.perf_counter``).
    """

    value: float
    plan: np.ndarray | None
    marginal: np.ndarray | None
    tuples: tuple | None
    cut: np.ndarray | None
    status: str
    success: bool
    message: str
    solver: str
    seconds: float
