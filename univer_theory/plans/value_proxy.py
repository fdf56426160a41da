"""The shape rule: which α*-optimal plan an *asymmetric* node uses (theory.md §6.3 layers i–ii, §6.4).

At a node X whose child positions carry different subtrees (nested keys ``c_1..c_k``, ``tree.split_key``)
the α*(ρ)-optimal plans form a face of CondOT(ρ), and which of its plans is used moves E[τ] by several
percent: mass that enters a deep position is worth more than mass that enters a leaf.  The slot rule
(layer ii only) cannot trade *which token* a tuple selects, and on depth-3 asymmetric shapes it falls below
TV.  The shape rule picks the plan on the face that maximises an on-tree proxy of the node's value:

.. math::

    \\max_{π ∈ CondOT(ρ),\\ Σ π ≥ α^*(ρ)} \\ \\sum_S \\sum_j R_j(S)\\, Ĝ_{c_j}\\big(π(S,j)/R_j(S)\\big),
    \\qquad R_j(S) = Q_k(S) − \\sum_{l<j} π(S,l),

where ``Ĝ_c`` is the conditional-framework value function (§6.4) of the subtree shape ``c`` under the
*context-free* model that repeats X's own rows ``(p_X, q_X)`` at every descendant
(:func:`solvers.cf_bound.context_free_value`).  Everything it reads — ``p_X``, ``q_X``, ρ, the process and the
tree's shape — is on-tree, so this is an implementable verifier (``univer-va`` instead needs the true Ḡ at
undrafted prefixes).  The node still attains α*(ρ) (the floor row), so UniVer stays α*-optimal at every node.

The LP has a column pair per ordered tuple of the draft support, and so has every node problem of the
proxy's recursion: the rule applies only when each of them has at most :data:`MAX_TUPLES` tuples (small
vocabularies, truncated drafts); otherwise UniVer keeps its closed-form construction plus the slot rule.
Realisation and repair as rule 1 (:func:`~univer_theory.plans.lp_plan.repaired_plan`): ``a`` is the exact
marginal of the plan actually used.
"""
from __future__ import annotations

from math import perm

import numpy as np

from ..tree import canonical_key, split_key
from .base import NodePlan
from .lp_plan import tabulated_plan

#: Largest number of ordered child tuples of any node problem the shape rule will solve.
MAX_TUPLES = 512


def _tuples(support: int, k: int, process: str) -> int:
    return support ** k if process == "iid" else perm(support, k)


def applies(draft_probs, child_shapes: tuple[str, ...], process: str) -> bool:
    """True when the shape rule is used: ``iid`` / ``wor``, ≥ 2 children with different subtrees, float rows,
    and every node problem of the proxy's recursion within :data:`MAX_TUPLES` (``wor``: within the support)."""
    q = np.asarray(draft_probs)
    return q.dtype != object and within_limits(int(np.count_nonzero(q)), child_shapes, process)


def within_limits(support: int, child_shapes: tuple[str, ...], process: str) -> bool:
    """:func:`applies` for a draft support of ``support`` tokens (float rows): the batched verifier asks this
    once per distinct (support, children's subtrees) of a level."""
    child_shapes = tuple(canonical_key(c) for c in child_shapes)
    if process not in ("iid", "wor") or len(set(child_shapes)) < 2:
        return False
    stack = [f"({','.join(child_shapes)})"]
    while stack:
        kids = split_key(stack.pop())
        if kids:
            if (process == "wor" and len(kids) > support) or _tuples(support, len(kids), process) > MAX_TUPLES:
                return False
            stack += kids
    return True


def value_proxy_plan(target_probs, draft_probs, rho, child_shapes: tuple[str, ...], process: str) -> NodePlan | None:
    """The shape rule's plan (module docstring), or None when its LP fails (the caller falls back).

    ``info``: the proxy value of the plan (``proxy_value``) and the LP's α before repair.
    """
    from solvers.cf_bound import NodeProblem, context_free_value

    p = np.asarray(target_probs, dtype=np.float64)
    q = np.asarray(draft_probs, dtype=np.float64)
    child_shapes = tuple(canonical_key(c) for c in child_shapes)
    k, rho = len(child_shapes), float(rho)
    drafted = q > 0          # the proxy lives on the draft support: undrafted tokens never enter a node problem
    p_s, q_s = p[drafted], q[drafted]
    problem = NodeProblem(p, q, k, process, lambda j, y: context_free_value(child_shapes[j], p_s, q_s, process))
    try:
        value, _, pi, _ = problem.solve(rho, on_face=True)
    except RuntimeError:
        return None
    return tabulated_plan("value_proxy", pi / problem.probs[:, None], problem.tuples, problem.probs, p, rho,
                          {"proxy_value": value, "lp_alpha": float(pi.sum())})
