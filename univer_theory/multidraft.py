"""Flat multi-draft verifiers applied node by node: SpecHub and Global Resolution.

Both are depth-1 methods (one target distribution, k drafted tokens).  On a tree they recurse like RRS
(SpecInfer): at node u a flat plan ``w(S)`` (``Σ_j w_j(S) ≤ 1``, token marginal ``a(y) ≤ p(y)``, ρ is not used)
selects child j with probability ``w_j(S)``; the selected child is *accepted* (entered with scaling 1, so its
own node starts afresh); if none is selected, u emits ``Y ~ norm(p − a)``.  In the engine's terms child j is
entered w.p. ``w_j/(1 − Σ_{l<j} w_l)``, every scaling and the stop are 1.  Lossless for any feasible flat plan
(per token, ``a(y) + (p(y) − a(y)) = p(y)`` at every node).

* **SpecHub** (Sun et al., EMNLP 2024), ``spechub``: its own draft law, process ``hub`` (k = 2): with the hub
  ``a = argmax q``, ``Q(i, a) = q(i)``, ``Q(a, i) = q(a) q(i)/(1 − q(a))`` for i ≠ a (every pair contains a).
  Verification as in the authors' release: in pair (i, a) accept i w.p. ``min(1, p(i)/q(i))``; in pair (a, i)
  accept i w.p. ``min(1, p'(i)/Q(a, i))`` with ``p'(i) = [p(i) − q(i)]_+``; the unclaimed mass of the pairs
  (a, ·), ``A_1 = Σ_i [Q(a, i) − π((a,i), i)]``, then of the pairs (·, a), ``A_2 = Σ_i [q(i) − p(i)]_+``, goes
  to a, each pair's share scaled by ``min(1, p(a)/A_1)`` and then ``min(1, [p(a) − A_1]_+/A_2)``.  The
  marginal is ``a(i) = min(p(i), Q(i,a) + Q(a,i))``, ``a(a) = min(p(a), A_1 + A_2)``, so
  ``α = min(1, p(a) + Σ_{i≠a} min(p(i), q(i)/(1 − q(a))))`` — the flat OT optimum of the hub law (every pair
  contains a, so a absorbs whatever its partners leave).  Rational: exact in Fraction mode.
* **Global Resolution** (Thomas & Pal 2025, "Optimal multi-draft speculative sampling via convex
  minimization"), ``gr``: the α*-optimal i.i.d. multi-draft plan, any k; α* = 1 + min(0, min_j [P_j − Q_j^k])
  (theory.md §4.1; GR computes it and its plan by a convex program over at most V variables).  The plan used
  here is the private-position layout of theory.md §6.3 rule 2 at ρ = 1 (:func:`plans.layout.layout_plan`):
  the same optimum α*, O(V log V); which α*-optimal plan GR's own program returns (the joint law of the
  selected draft) is not reproduced.  Float only.
"""
from __future__ import annotations

import numpy as np

from .engine import NodeContext, NodeDecision
from .plans.base import NodePlan, sequential_shares
from .plans.choose import single_child_plan
from .plans.layout import layout_plan
from .processes import HUB, hub_token, tuple_law
from .univer import PlanCache
from .validation import Unsupported
from .verifiers import Verifier, register

def flat_plan_decision(plan: NodePlan, children) -> NodeDecision:
    """The RRS-style node decision of a flat plan (module docstring): enter child j w.p.
    ``w_j/(1 − Σ_{l<j} w_l)`` (0 when nothing is left), scaling 1, stop 1, ``Y ~ norm(p − a)``."""
    w = plan.select(tuple(children))
    one = 1 if np.asarray(w).dtype == object else 1.0
    return NodeDecision(sequential_shares(w), (one,) * len(w), one, plan.residual,
                        {"alpha": plan.alpha, "construction": plan.construction})


class FlatPlanRule:
    """Node rule from a flat-plan builder ``build(p, q, k) -> NodePlan``, cached by (p, q, k, process, exact rows?)
    in its own :class:`univer_theory.univer.PlanCache`, which keeps as many plans as UniVer's rule:
    :func:`univer_theory.univer.plan_cache_size` (a GR plan holds ~170 bytes a token, and 4 096 of them grew to
    ~11 GB at V = 16 384)."""

    def __init__(self, name: str, build, processes: tuple[str, ...]):
        self.name, self.build, self.processes = name, build, processes
        self._plans = PlanCache()

    def plan(self, target_probs, draft_probs, k: int, process: str) -> NodePlan:
        if process not in self.processes:
            raise Unsupported(f"{self.name}: defined for processes {self.processes}, got {process!r}")
        p, q = np.asarray(target_probs), np.asarray(draft_probs)
        key = tuple(p.tolist()), tuple(q.tolist()), k, process, p.dtype == object  # Fraction(1, 2) == 0.5
        return self._plans.get(key, p.size, lambda: self.build(target_probs, draft_probs, k))

    def __call__(self, ctx: NodeContext) -> NodeDecision:
        return flat_plan_decision(self.plan(ctx.target, ctx.draft, len(ctx.children), ctx.process), ctx.children)


def spechub_plan(target_probs, draft_probs, k: int) -> NodePlan:
    """SpecHub's flat plan on the ``hub`` pair law (module docstring); exact for Fraction rows."""
    if k != 2:
        raise Unsupported(f"spechub: defined for k = 2 drafts (process 'hub'), got k = {k}")
    p, q = np.asarray(target_probs), np.asarray(draft_probs)
    a = hub_token(q)
    law = dict(tuple_law(q, 2, HUB))
    zero = 0 * p[a]
    others = [x for x in range(q.size) if x != a and q[x] > 0]
    # pair (i, a): i takes min(p, q); pair (a, i): i takes what p still wants, up to Q(a, i)
    take_first = {i: min(p[i], q[i]) for i in others}
    take_second = {i: min(law[(a, i)], max(zero, p[i] - q[i])) for i in others}
    spare_a = {i: law[(a, i)] - take_second[i] for i in others}      # unclaimed mass of the pairs (a, i)
    spare_b = {i: q[i] - take_first[i] for i in others}              # unclaimed mass of the pairs (i, a)
    A1, A2 = sum(spare_a.values(), zero), sum(spare_b.values(), zero)
    f1 = min(1, p[a] / A1) if A1 > 0 else zero
    left = max(zero, p[a] - A1)
    f2 = min(1, left / A2) if A2 > 0 else zero
    weights = {}
    for i in others:
        weights[(i, a)] = np.array([take_first[i] / q[i], spare_b[i] * f2 / q[i]], dtype=p.dtype)
        weights[(a, i)] = np.array([spare_a[i] * f1 / law[(a, i)], take_second[i] / law[(a, i)]], dtype=p.dtype)
    marginal = 0 * p
    for i in others:
        marginal[i] = take_first[i] + take_second[i]
    marginal[a] = sum((spare_a[i] * f1 + spare_b[i] * f2 for i in others), zero)

    def select(S):
        w = weights.get(tuple(int(y) for y in S))
        return w.copy() if w is not None else np.zeros(2, dtype=p.dtype) * zero

    return NodePlan("spechub", 1 if p.dtype == object else 1.0, p, marginal, select)


def gr_plan(target_probs, draft_probs, k: int) -> NodePlan:
    """Global Resolution's optimum at one node: an α*-optimal i.i.d. flat plan (the layout at ρ = 1; for k = 1 the
    unique plan ``w = min(1, p/q)``, as the batched rule — the layout's interval arithmetic loses a token whose
    q is below an ulp of its position, ~1e-16)."""
    if np.asarray(target_probs).dtype == object:
        raise Unsupported("gr: the α*-optimal i.i.d. plan is computed in floats; pass float64 rows")
    if k == 1:
        return single_child_plan(target_probs, draft_probs, 1.0, "iid")
    return layout_plan(target_probs, draft_probs, 1.0, k, "iid")


SPECHUB = register(Verifier("spechub", FlatPlanRule("spechub", spechub_plan, (HUB,)), (HUB,),
                            "SpecHub: two drafts from its hub law, flat OT through the hub, per node", widths=(2,)))
GR = register(Verifier("gr", FlatPlanRule("gr", gr_plan, ("iid",)), ("iid",),
                       "Global Resolution: the α*-optimal i.i.d. multi-draft plan, per node", rational=False))
