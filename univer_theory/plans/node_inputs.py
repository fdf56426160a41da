"""Input checks shared by the node-plan constructions (theory.md §6.1): one node's ``(p, q, ρ, k, process)``."""
from __future__ import annotations

import numbers

import numpy as np

from ..processes import PROCESSES
from ..validation import check_choice, check_simplex


def check_node_inputs(where: str, target_probs, draft_probs, rho, k, process):
    """Validate one node's inputs; return ``(p, q, ρ)`` as float64 arrays and a float.

    Raises ValueError (naming ``where``, the argument, the rule and the value) for rows that are not
    probability vectors, vocabularies that disagree, ``ρ ∉ [0, 1]``, ``k < 1``, an unknown process, and — for
    ``wor`` — ``k`` larger than the draft support (k distinct tokens cannot be drawn).
    """
    check_choice(process, PROCESSES, where, "process")
    p = check_simplex(target_probs, where, "target_probs")
    q = check_simplex(draft_probs, where, "draft_probs")
    if p.ndim != 1 or q.ndim != 1:
        raise ValueError(f"{where}: target_probs and draft_probs must be one row [V], got shapes "
                         f"{p.shape} and {q.shape}")
    if p.shape != q.shape:
        raise ValueError(f"{where}: target_probs has V = {p.size} but draft_probs has V = {q.size}")
    if isinstance(rho, bool) or not isinstance(rho, numbers.Real) or not 0 <= float(rho) <= 1:
        raise ValueError(f"{where}: rho must be a real number in [0, 1], got {rho!r}")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"{where}: number of children k must be an integer ≥ 1, got {k!r}")
    support = int(np.count_nonzero(q))
    if process == "wor" and k > support:
        raise ValueError(f"{where}: process 'wor' drafts k = {k} distinct tokens but draft_probs has only "
                         f"{support} tokens with positive probability")
    return p.astype(np.float64), q.astype(np.float64), float(rho)
