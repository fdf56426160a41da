"""UniVer node plans (theory.md §6.1, §6.3): one interface, several constructions.

A construction is a function ``(target_probs [V], draft_probs [V], rho, k, process) -> NodePlan | None``
(``None`` when it does not apply or is infeasible on this node).
"""
from .base import NodePlan
from .choose import CONSTRUCTIONS, build_plan, choose_plan, single_child_plan
from .layout import layout_plan
from .lp_plan import lp_plan
from .tv_plan import tv_plan

__all__ = ["CONSTRUCTIONS", "NodePlan", "build_plan", "choose_plan", "layout_plan", "lp_plan", "single_child_plan",
           "tv_plan"]
