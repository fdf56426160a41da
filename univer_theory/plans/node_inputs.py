"""Input checks shared by the node-plan constructions (theory.md §6.1): one node's ``(p, q, ρ, k, process)``."""
from __future__ import annotations

import numbers
from fractions import Fraction

from ..alpha_star import check_node_inputs as _check_batched
from ..validation import check_one_mode


def check_node_inputs(where: str, target_probs, draft_probs, rho, k, process):
    """Validate one node's inputs; return ``(p, q, ρ)`` as float64 rows ``[V]`` and a float.

    The checks of :func:`univer_theory.alpha_star.check_node_inputs` (probability rows, equal vocabularies,
    ``k ≥ 1``, known process, k distinct tokens available when drafting without replacement, ``ρ ∈ [0, 1]``),
    restricted to a single row and a scalar ρ.  Raises ValueError naming ``where``, the argument, the rule and
    the value.
    """
    if isinstance(rho, bool) or not isinstance(rho, numbers.Real):
        raise ValueError(f"{where}: rho must be a real number in [0, 1], got {rho!r}")
    p, q, _, r = _check_batched(where, target_probs, draft_probs, k, process, rho)
    if check_one_mode(target_probs, draft_probs, where) and not isinstance(rho, (Fraction, numbers.Integral)):
        raise ValueError(f"{where}: rho must be exact (a Fraction or an int) with Fraction rows, got {rho!r}")
    if p.ndim != 1:
        raise ValueError(f"{where}: target_probs and draft_probs must be one row [V], got shape {p.shape}")
    return p, q, float(r)
