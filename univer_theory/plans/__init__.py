"""UniVer node plans (theory.md §6.1, §6.3): one interface, several constructions.

A construction is a function ``(target_probs [V], draft_probs [V], rho, k, process) -> NodePlan | None``
(``None`` when it does not apply or is infeasible on this node).
"""
from .base import NodePlan

__all__ = ["NodePlan"]
