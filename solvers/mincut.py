"""Brute-force min-cut of CondOT(ρ) over every token subset (tiny V only; the reference for the closed forms).

.. math::  α^*(ρ) = \\min_{A ⊆ V} \\big[ ρ\\,p(A) + \\Pr(S ⊄ A) \\big]

with ``Pr(S ⊄ A) = Σ_S Q_k(S)·1[S ⊄ A]`` summed from ``univer_theory.processes.tuple_law`` (theory.md §4.1–§4.2).
"""
from __future__ import annotations

import time

import numpy as np

from univer_theory.alpha_star import check_node_inputs
from univer_theory.processes import tuple_law
from univer_theory.validation import count_text

from .condot import MAX_NODE_LP_TUPLES, node_lp_tuples
from .result import OTResult

#: Largest vocabulary the enumeration of all 2^V cuts accepts.
MAX_MINCUT_VOCAB = 12


def condot_mincut(target_probs, draft_probs, k: int, process: str, rho=1.0) -> OTResult:
    """α*(ρ) and a minimising cut A* (smallest bitmask among ties) by enumerating all ``2^V`` subsets A.

    Returns an :class:`OTResult` with ``value``, ``cut [V]`` and no plan; refuses ``V > 12`` and tuple laws of more
    than :data:`~solvers.condot.MAX_NODE_LP_TUPLES` tuples (counted before they are enumerated).  The tuples' mass is
    summed per token set first (at most ``2^V`` of them), so the cut table is ``2^V × 2^V`` at most.
    """
    where = "condot_mincut"
    p, q, k, rho_arr = check_node_inputs(where, target_probs, draft_probs, k, process, rho)
    if p.ndim != 1:
        raise ValueError(f"{where}: target_probs must be one row [V], got shape {p.shape}")
    if p.size > MAX_MINCUT_VOCAB:
        raise ValueError(f"{where}: brute force enumerates 2^V cuts; V = {p.size} exceeds {MAX_MINCUT_VOCAB}")
    count = node_lp_tuples(q, k, process)
    if count > MAX_NODE_LP_TUPLES:
        raise ValueError(f"{where}: the tuple law holds {count_text(count)} tuples (k = {k}, {process}), beyond "
                         f"MAX_NODE_LP_TUPLES = {MAX_NODE_LP_TUPLES:.0e}; α*(ρ) comes from solve_flat(..., "
                         f"method='fast')")
    start = time.perf_counter()
    law = tuple_law(q, k, process)
    cuts = np.arange(2 ** p.size)
    member = (cuts[:, None] >> np.arange(p.size)) & 1                      # [2^V, V]
    tuple_bits = np.array([sum(1 << y for y in set(S)) for S, _ in law])
    tuple_probs = np.array([float(pr) for _, pr in law])
    sets, of = np.unique(tuple_bits, return_inverse=True)                  # the token sets S of the tuples
    set_probs = np.bincount(of, weights=tuple_probs, minlength=sets.size)
    inside = (sets[None, :] & ~cuts[:, None]) == 0                         # S ⊆ A
    cost = float(rho_arr) * (member @ p) + (set_probs * ~inside).sum(axis=1)
    best = int(np.argmin(cost))
    cut = member[best].astype(bool)
    cut.setflags(write=False)
    return OTResult(float(cost[best]), None, None, None, cut, "optimal", True,
                    f"minimum over {cuts.size} cuts", "mincut", time.perf_counter() - start)
