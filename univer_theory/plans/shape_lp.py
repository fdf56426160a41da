"""The shape rule: which α*-optimal plan an *asymmetric* node uses (theory.md §6.3 layers i–ii, §6.4).

At a node X whose child positions carry different subtrees (nested keys ``c_1..c_k``, ``tree.split_key``)
the α*(ρ)-optimal plans form a face of CondOT(ρ), and which of its plans is used moves E[τ] by several
percent: mass that enters a deep position is worth more than mass that enters a leaf.  The slot rule
(layer ii only) cannot trade *which token* a tuple selects, and on depth-3 asymmetric shapes it falls below
TV.  The shape rule gives the slot rule's own objective the whole face (layers i and ii at once):

.. math::

    \\operatorname{lexmax}_{π ∈ CondOT(ρ)} \\Big(\\sum_{S, j} π(S, j),\\ \\sum_{S, j} ω_j\\, π(S, j)\\Big),
    \\qquad ω_j = 1 + |c_j|,

then the tie-break of :mod:`solvers.tie_break` for one optimum (:func:`solvers.condot_simplex.condot_table` with
``position_weights = ω``, HiGHS' :func:`solvers.condot.condot_plan` its test oracle;
:func:`~univer_theory.plans.lp_plan.lp_plan` realises and repairs it as rule 1).
Everything it reads — ``p_X``, ``q_X``, ρ, the process and the subtree sizes — is on-tree, so it is an
implementable verifier; the node attains α*(ρ) (the first level), so UniVer stays α*-optimal at every node.
The LP is a network LP (totally unimodular, integer ω), so its one optimum is what both the lexicographic simplex
both layers run (:mod:`solvers.condot_simplex`) and HiGHS (the tests' oracle) compute.

The LP has a column per (ordered tuple of the draft support, position): the rule applies only to nodes with
at most :data:`MAX_TUPLES` tuples (small vocabularies, truncated drafts); otherwise UniVer keeps its
closed-form construction plus the slot rule.
"""
from __future__ import annotations

from math import perm

import numpy as np

from ..tree import canonical_key, key_size

#: Largest number of ordered child tuples of a node the shape rule will solve.
MAX_TUPLES = 512


def position_weights(child_shapes) -> tuple[int, ...]:
    """``ω_j = 1 + |c_j|`` (the subtree at position j counted in nodes): the shape and slot rules' weights."""
    return tuple(1 + key_size(c) for c in child_shapes)


def within_limits(support: int, k: int, process: str) -> bool:
    """True when a node with ``support`` drafted tokens and k children is small enough for the shape rule:
    ``iid`` / ``wor`` with at most :data:`MAX_TUPLES` ordered tuples (``wor``: ``k ≤ support``)."""
    if process == "iid":
        return support ** k <= MAX_TUPLES
    return process == "wor" and k <= support and perm(support, k) <= MAX_TUPLES


def applies(draft_probs, child_shapes: tuple[str, ...], process: str) -> bool:
    """True when the shape rule plans the node: ≥ 2 children with different subtrees, float rows, and
    :func:`within_limits`."""
    q = np.asarray(draft_probs)
    return (q.dtype != object and len({canonical_key(c) for c in child_shapes}) > 1
            and within_limits(int(np.count_nonzero(q)), len(child_shapes), process))
