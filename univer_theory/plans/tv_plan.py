"""Rule 6: Traversal Verification's own node plan (theory.md §3.7, §6.3 item 6) — feasible, not α*-optimal.

TV hands child j the scaling ``s_j`` of :func:`~univer_theory.verifiers.traversal_rule`; child j succeeds w.p.
``s_j`` (TV's invariant), so the path continues through child j w.p. ``w_j(S) = s_j Π_{l<j} (1 − s_l)``.
Marginal ``a(y) = Σ_S Q_k(S) Σ_{j: y_j = y} w_j(S)``:

* ``iid``: TV's state ``(r, P)`` after j−1 failures does not depend on which tokens were drawn, so
  ``s_j(y) = min(1, r_j P_j(y)/q(y))`` and ``a(y) = Σ_j q(y) s_j(y) Π_{l<j} (1 − Σ_x q(x) s_l(x))`` (O(kV));
* ``wor``: Q is renormalised after every drawn token, so the state depends on S: exact enumeration of the
  tuple law (small V only).

Rational: in Fraction mode the plan and its marginal are exact.
"""
from __future__ import annotations

import numpy as np

from ..engine import NodeContext
from ..processes import tuple_law
from ..verifiers import traversal_rule, tv_prefix_update, tv_residual_step
from .base import NodePlan
from .node_inputs import check_node_inputs

#: Largest wor tuple law enumerated for the marginal (V = 30, k = 3 is 24 360 tuples).
MAX_WOR_TUPLES = 50_000


def tv_weights(target_probs, draft_probs, rho, S, process) -> list:
    """``w_j(S) = s_j Π_{l<j}(1 − s_l)`` from TV's scalings on the realised tuple S."""
    d = traversal_rule(NodeContext(rho, target_probs, draft_probs, tuple(S), process, (".",) * len(S)))
    w, fail = [], 1
    for s in d.scale:
        w.append(fail * s)
        fail = fail * (1 - s)
    return w


def _iid_marginal(p, q, rho, k):
    """Closed-form i.i.d. marginal (module docstring)."""
    r, P = rho, p
    a = q * 0
    fail = 1
    drafted = q != 0
    for _ in range(k):
        s = np.array([min(1, r * P[x] / q[x]) if drafted[x] else 0 * q[x] for x in range(q.size)], dtype=q.dtype)
        a = a + fail * q * s
        fail = fail * (1 - (q * s).sum())
        R, P = tv_residual_step(r, P, q)
        r = tv_prefix_update(R, r)
    return a


def tv_plan(target_probs, draft_probs, rho, k, process) -> NodePlan | None:
    """Rule 6 for ``iid`` / ``wor`` children (None for topk / greedy, where TV is not defined).

    Inputs are checked as every construction's are (:func:`~.node_inputs.check_node_inputs`: a clear ValueError);
    float rows are used as float64, ``object`` (Fraction) rows stay exact.
    """
    if process not in ("iid", "wor"):
        return None
    exact = np.asarray(target_probs).dtype == object
    checked = check_node_inputs("tv_plan", target_probs, draft_probs, rho, k, process)
    if exact:                                   # Fraction rows: checked on their float values, kept exact
        p, q = np.asarray(target_probs), np.asarray(draft_probs)
    else:
        p, q, rho = checked
    if process == "iid":
        a = _iid_marginal(p, q, rho, k)
    else:
        law = tuple_law(q, k, process)
        if len(law) > MAX_WOR_TUPLES:
            return None
        a = q * 0
        for S, pr in law:
            for y, wj in zip(S, tv_weights(p, q, rho, S, process)):
                a[y] = a[y] + pr * wj
    if not exact:
        a = np.minimum(a, rho * p)              # round-off only: TV's marginal is ≤ ρp exactly

    def select(S):
        return np.array(tv_weights(p, q, rho, S, process), dtype=p.dtype)

    return NodePlan("tv", rho, p, a, select)
