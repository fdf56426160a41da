"""UniVer: α*-optimal node plans realised in the conditional framework (theory.md §6.1–§6.3).

At every internal node X (scaling ρ, target p, draft q, realised children S, k = |S|):

1. build an α*(ρ)-optimal node plan ``w`` (cached by (ρ, p, q, process, children's subtrees) since the exact
   oracle asks once per realised tuple):

   * when the child positions carry different subtrees and the draft support is small, the **shape rule**
     (:mod:`univer_theory.plans.shape_lp`): the plan on the α*(ρ)-face with the most mass at positions with
     large subtrees (the slot rule's weights ω over the whole face);
   * otherwise the construction of :mod:`univer_theory.plans.choose` for ``(p, q, ρ, k, process)``;
2. evaluate ``w(S)``; if the positions' subtrees differ and the shape rule was not used, apply the slot rule
   (``solvers.slot_rule.slot_weights``: same token masses per multiset class, moved to positions with larger
   subtrees) — for k ≤ :data:`SLOT_RULE_MAX_K` only: it evaluates the plan on all k! orderings of S;
3. hand child j the scaling ``s_j = w_j / (1 − Σ_{l<j} w_l)`` (0 when the denominator is 0), enter = 1;
4. if every child fails, X succeeds w.p. ``f = (ρ − α)/(1 − α)`` and emits ``Y ~ norm(ρp − a)``.

Lossless for any feasible plan (§6.1 theorem); on chains it is Block Verification, at depth 1 the optimal
flat multi-draft OT.  ``NodeDecision.info`` records ``alpha``, ``construction`` (``"shape_lp"`` for the
shape rule) and ``slot_rule``.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from itertools import permutations

import numpy as np

from .engine import NodeContext, NodeDecision
from .plans import shape_lp
from .plans.base import sequential_shares
from .plans.choose import CONSTRUCTIONS, build_plan
from .plans.lp_plan import lp_plan
from .validation import check_choice
from .verifiers import Verifier, register

#: Plans kept per cached node rule (oldest evicted first): ``max(16, min(PLAN_CACHE_ENTRIES, PLAN_CACHE_TOKENS // V))``.
#: Measured, a plan with its key and slot entries holds ~8 MB at V = 49152 (~160 bytes a token) and ~3–13 KB of
#: fixed overhead on the exact oracle's small vocabularies, so a long-lived process keeps at most ~130 MB at
#: V = 49152 and ~50 MB on a few tokens (an exact evaluation needing more plans than that recomputes some: the
#: 5 583 plans of a V = 5 ``2,2,2,2`` i.i.d. evaluation cost ~10% more time under a cap of 1 000).
PLAN_CACHE_ENTRIES, PLAN_CACHE_TOKENS = 4096, 2**19
#: Widest node the slot rule re-positions (k! orderings per multiset class, each one plan evaluation); wider
#: nodes keep their plan's own positions (EAGLE-like trees branch at most 4-wide).
SLOT_RULE_MAX_K = 4


def plan_cache_size(V: int) -> int:
    """Plans a :class:`PlanCache` (UniVer's rule's, a flat-plan rule's) keeps on rows of ``V`` tokens
    (:data:`PLAN_CACHE_ENTRIES`)."""
    return max(16, min(PLAN_CACHE_ENTRIES, PLAN_CACHE_TOKENS // V))


def _key(arr: np.ndarray):
    return tuple(arr) if arr.dtype == object else arr.tobytes()


class PlanCache:
    """Node plans by key, oldest evicted first down to :func:`plan_cache_size` plans on rows of V tokens — the cache
    of every caching node rule (:class:`UniVerRule`, :class:`univer_theory.multidraft.FlatPlanRule`).  A rule's
    cache is shared by every thread calling it (``VERIFIERS``): its bookkeeping is serialised under :attr:`lock`, a
    plan is built outside it (two threads may both build a new key's plan, equal ones: the later is kept).
    ``evicted(key)`` runs under the lock for each plan evicted."""

    def __init__(self, evicted=None):
        self.lock = threading.Lock()
        self._plans: OrderedDict = OrderedDict()
        self._evicted = evicted

    def get(self, key, V: int, build):
        """The plan kept under ``key``, else ``build()``'s, kept."""
        with self.lock:
            plan = self._plans.get(key)
        if plan is None:
            plan = build()
            with self.lock:
                self._plans[key] = plan
                while len(self._plans) > plan_cache_size(V):    # (one eviction a plan kept 4 096 small plans
                    old, _ = self._plans.popitem(last=False)    # and then a wide one each: ~8 MB apiece)
                    if self._evicted is not None:
                        self._evicted(old)
        return plan

    def __contains__(self, key) -> bool:
        """Whether ``key`` is kept (hold :attr:`lock` for an answer that stays true while you act on it)."""
        return key in self._plans

    def __len__(self) -> int:
        return len(self._plans)

    def __iter__(self):
        return iter(list(self._plans))


class UniVerRule:
    """The node rule of UniVer with a forced or automatic construction (``"auto"``), optional slot rule and
    (automatic construction only) optional shape rule."""

    def __init__(self, construction: str = "auto", slot_rule: bool = True, shape_rule: bool = True):
        check_choice(construction, ("auto", *CONSTRUCTIONS), "UniVerRule", "construction")
        self.construction = construction
        self.slot_rule = slot_rule
        self.shape_rule = shape_rule and construction == "auto"
        self._plans = PlanCache(evicted=self._drop_slots)   # its lock also serialises the slot entries
        self._slots: dict = {}                               # plan key -> {(S, ω): w(S)}

    def _drop_slots(self, key) -> None:
        """Forget the slot entries of the evicted plan ``key`` (under the cache's lock; one lookup, so evicting
        thousands of plans at once is not thousands of passes over every entry)."""
        self._slots.pop(key, None)

    def plan(self, target_probs, draft_probs, rho, process: str, child_shapes: tuple[str, ...]):
        """The (cached) node plan for children with subtrees ``child_shapes`` and its cache key."""
        key = (rho, _key(target_probs), _key(draft_probs), process, child_shapes)

        def build():
            shaped = self.shape_rule and shape_lp.applies(draft_probs, child_shapes, process)
            plan = lp_plan(target_probs, draft_probs, rho, len(child_shapes), process,
                           shape_lp.position_weights(child_shapes)) if shaped else None
            return plan or build_plan(self.construction, target_probs, draft_probs, rho, len(child_shapes), process)
        return self._plans.get(key, np.asarray(target_probs).size, build), key

    def slotted(self, plan, key, S, draft_probs, process, omega):
        """``w(S)`` after the slot rule (:func:`solvers.slot_rule.slot_weights` on this one node), or None where it
        kept the plan's own weights (its LP did not finish or failed the recheck)."""
        from solvers.slot_rule import slot_weights

        skey = (tuple(int(y) for y in S), omega)
        with self._plans.lock:
            entries = self._slots.get(key, {})
            if skey in entries:
                return entries[skey]
        perms = list(permutations(range(len(S))))
        w_all = np.array([[np.asarray(plan.select(tuple(S[i] for i in perm)), dtype=np.float64)
                           for perm in perms]])
        w, applied = slot_weights(w_all, np.array([S], dtype=np.int64),
                                  np.asarray(draft_probs, dtype=np.float64)[None],
                                  np.array([omega], dtype=np.float64), process, perms)
        w = w[0] if applied[0] else None
        with self._plans.lock:
            if key in self._plans:          # not for a plan another thread evicted meanwhile (never pruned)
                self._slots.setdefault(key, {})[skey] = w
        return w

    def weights(self, target_probs, draft_probs, rho, children, process: str, child_shapes):
        """Steps 1–2 of the module docstring: ``(plan, w(S), slot rule applied?)`` for the realised children S
        (``child_shapes``: nested key of each child position's subtree)."""
        plan, key = self.plan(target_probs, draft_probs, rho, process, tuple(child_shapes))
        if (self.slot_rule and plan.construction != "shape_lp" and process in ("iid", "wor")
                and len(set(child_shapes)) > 1 and len(children) <= SLOT_RULE_MAX_K):
            omega = shape_lp.position_weights(child_shapes)
            w = self.slotted(plan, key, children, draft_probs, process, omega)
            if w is not None:
                return plan, w, True
        return plan, plan.select(children), False

    def __call__(self, ctx: NodeContext) -> NodeDecision:
        k = len(ctx.children)
        plan, w, slotted = self.weights(ctx.target, ctx.draft, ctx.rho, ctx.children, ctx.process,
                                        ctx.child_shapes)
        info = {"alpha": plan.alpha, "construction": plan.construction, "slot_rule": slotted}
        return NodeDecision((1,) * k, sequential_shares(w), plan.stop, plan.residual, info)


def make_univer_verifier(construction: str = "auto", slot_rule: bool = True, shape_rule: bool = True,
                         name: str | None = None) -> Verifier:
    """A UniVer verifier with a forced construction (a key of :data:`univer_theory.plans.CONSTRUCTIONS`: ``"layout"``,
    ``"lp"``, ``"tv"``, ``"wor_pair"``, ``"pts"``, ``"iid_coupling"``, ``"luce"``, ``"first_draw"``, ``"full"``,
    ``"fill"``, ``"greedy_fill"``) or the automatic choice (``"auto"``, which alone uses the shape rule unless
    ``shape_rule=False``), with or without the slot rule.

    Its processes are those of the construction (all four for ``"auto"``); it is rational (exact in Fraction
    mode) only for ``"tv"`` without the slot rule (the shape rule never runs on Fraction rows).  A forced
    construction that gives no plan at a node (``"wor_pair"`` where its families fail, ``"full"`` off a k-token
    support) raises NotImplementedError there, naming it.
    """
    rule = UniVerRule(construction, slot_rule, shape_rule)
    processes = ("iid", "wor", "topk", "greedy") if construction == "auto" else CONSTRUCTIONS[construction][1]
    default = (("univer" if construction == "auto" else f"univer-{construction}")
               + ("-noshape" if rule.shape_rule != (construction == "auto") else "") + ("" if slot_rule else "-noslot"))
    return Verifier(name or default, rule, processes,
                    f"UniVer, construction {construction!r}, shape rule {'on' if rule.shape_rule else 'off'}, "
                    f"slot rule {'on' if slot_rule else 'off'} (§6)",
                    rational=(construction == "tv" and not slot_rule))


UNIVER = register(make_univer_verifier())
