"""``univer-va``: the value-aware UniVer variant (theory.md §6.4, "beyond the paper").

At node X (prefix s, scaling ρ) the plan maximises the node's *value* instead of its acceptance rate α:
it solves the CF node LP

.. math::  \\max_{π ∈ CondOT(ρ)} \\sum_S \\sum_j R_j(S)\\,Ḡ_{c_j}\\big(π(S,j)/R_j(S)\\big)

with the children's true value functions ``Ḡ`` (from :func:`solvers.cf_bound.cf_bound`), and realises
``π`` as in §6.1: ``w_j(S) = π(S,j)/Q_k(S)``, child scaling ``s_j = w_j/(1 − Σ_{l<j} w_l)`` (0 when the
denominator is 0), marginal ``a(y) = Σ_S Q_k(S) Σ_{j: y_j = y} w_j(S)``, stop ``f = (ρ − α)/(1 − α)`` and
residual ``norm(ρp − a)``.  Its E[τ] is the CF value up to LP tolerance.

**It is an oracle, not an implementable verifier:** ``Ḡ`` needs the model at *undrafted* prefixes (every
token a child could have been), so it exists only for small vocabularies and a fixed (model, shape,
process).  Losslessness does not depend on ``Ḡ``: the plan actually used is repaired to be exactly
CondOT(ρ)-feasible and ``a`` is recomputed from it, so HiGHS' tolerance never reaches the output law.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from univer_theory.engine import NodeContext, NodeDecision
from univer_theory.models import Model, check_model_type
from univer_theory.plans.base import NodePlan, sequential_shares
from univer_theory.plans.lp_plan import plan_weights, tabulated_plan
from univer_theory.tree import DraftTree, TreeShape, as_shape
from univer_theory.verifiers import VALUE_AWARE, Verifier

from .cf_bound import LEAF, CFResult, NodeProblem, cf_bound, check_cf_setting
from .global_lp import model_rows

_PROCESSES = ("iid", "wor", "topk", "greedy")
#: How far (per entry) rows passed to a ``univer-va`` verifier may sit from its model's: round-off, e.g. the
#: caller's own renormalisation of them.
ROW_ATOL = 1e-12


@dataclass(frozen=True)
class ValueAwareVerifier(Verifier):
    """A :class:`Verifier` bound to one (model, shape, process): it supports exactly that shape and process, and
    only that model's rows."""

    shape: TreeShape | None = None
    cf: CFResult | None = None

    def unsupported(self, shape, process: str, exact: bool = False) -> str | None:
        """:meth:`Verifier.unsupported`, and any shape (or tree's shape) but the one it was built for."""
        got = shape.shape if isinstance(shape, DraftTree) else shape
        why = super().unsupported(shape, process, exact)
        return why or (f"{self.name} was built for shape {self.shape}, got {got}" if got != self.shape else None)


def value_aware_verifier(model: Model, shape, process: str, cf: CFResult | None = None) -> ValueAwareVerifier:
    """The ``univer-va`` oracle verifier for (model, shape, process); ``cf`` reuses a computed CF.

    Needs off-tree model access (values at undrafted prefixes): small V only.  The node rule reads its
    children's subtrees from ``NodeContext.child_shapes``; rows farther than :data:`ROW_ATOL` from the model's at a
    node's prefix are a ValueError (its plans, cached per (prefix, ρ, subtrees, rows), would use another model's
    values).
    """
    where = "value_aware_verifier"
    check_model_type(model, where)
    shape = as_shape(shape, where)
    if process not in _PROCESSES:
        raise ValueError(f"{where}: unknown process {process!r}; choose one of {sorted(_PROCESSES)}")
    if cf is None:
        cf = cf_bound(model, shape, process)
    else:
        check_cf_setting(cf, model, shape, process, where)
    cache: dict = {}

    def child_value(keys, prefix):
        def value(j, y):
            if keys[j] == ".":
                return LEAF
            try:
                return cf.functions[keys[j], prefix + (int(y),)]
            except KeyError:
                raise ValueError(f"univer-va: no value function at prefix {prefix + (int(y),)}; the verifier only "
                                 f"serves trees drafted from the model it was built for") from None
        return value

    def node_plan(ctx: NodeContext, keys) -> tuple[NodePlan, float]:
        rho = float(ctx.rho)
        p, q = np.asarray(ctx.target, dtype=np.float64), np.asarray(ctx.draft, dtype=np.float64)
        key = (ctx.prefix, rho, keys, p.tobytes(), q.tobytes())
        if key not in cache:
            if not all(np.allclose(x, y, rtol=0, atol=ROW_ATOL) for x, y in zip(
                    (p, q), model_rows(model, ctx.prefix, VALUE_AWARE))):
                raise ValueError(f"univer-va: the rows at prefix {ctx.prefix} are not those of the model it was built "
                                 f"for (its value functions are that model's); pass the model's own rows")
            problem = NodeProblem(p, q, len(keys), ctx.process, child_value(keys, ctx.prefix))
            g, _, pi, _ = problem.solve(rho)
            w = plan_weights(pi, problem.probs)     # min(1, π/Q_k), formed below 1 (a subnormal Q_k: no inf/inf)
            plan = tabulated_plan("value-aware", w, problem.tuples, problem.probs, p, rho)
            cache[key] = (plan, g)
        return cache[key]

    def rule(ctx: NodeContext) -> NodeDecision:
        plan, g = node_plan(ctx, ctx.child_shapes)
        w = plan.select(ctx.children)
        return NodeDecision((1.0,) * len(w), sequential_shares(w), float(plan.stop), plan.residual,
                            {"construction": plan.construction, "alpha": float(plan.alpha), "value": g})

    return ValueAwareVerifier(VALUE_AWARE, rule, (process,),
                              "value-aware UniVer: CF node LPs with the true child values (oracle, small V)",
                              rational=False, shape=shape, cf=cf)
