"""solvers — ground truth by LP / convex programming (HiGHS, cvxpy) for the exact core's claims.

HiGHS is imported on the first LP solve (:func:`solvers.highs_lp.bindings`) and cvxpy with the first of
:data:`_CVXPY` (``from solvers import solve_flat``), so ``import solvers`` — and the exact core's plans that
use it — need neither ``highspy`` nor ``cvxpy``.
"""
import importlib

from univer_theory.verifiers import kseq_acceptance_mass, kseq_rho_star

from .condot import PLAN_TOL, check_plan, condot_lp, condot_value, flat_ot_lp
from .mincut import condot_mincut
from .result import OTResult
from .highs_lp import LPSolution, solve_lp
from .global_lp import GlobalLPResult, TreeArrays, enumerate_tree_arrays, global_tree_lp, trie_classes
from .cf_bound import CFResult, ValueFunction, cf_bound
from .value_aware import ValueAwareVerifier, value_aware_verifier

#: Names of :mod:`solvers.flat_ot` (cvxpy), imported on first access.
_CVXPY = ("METHODS", "alpha_star_fast", "flat_ot_cvxpy", "solve_flat")


def __getattr__(name: str):
    if name not in _CVXPY:
        raise AttributeError(f"module 'solvers' has no attribute {name!r}")
    try:
        return getattr(importlib.import_module("solvers.flat_ot"), name)
    except ImportError as err:
        raise ImportError(f"solvers.{name} needs cvxpy: pip install 'univer[solvers]' ({err})") from err
