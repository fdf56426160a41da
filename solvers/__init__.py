"""solvers — ground truth by LP / convex programming (HiGHS, cvxpy) for the exact core's claims.

HiGHS is imported on the first LP solve (:func:`solvers.highs_lp.bindings`) and cvxpy on the first
:func:`flat_ot_cvxpy` (``solve_flat(method="cvxpy")``), so ``import solvers`` — the exact core's plans that use it,
and every other method of :func:`solve_flat` — need neither ``highspy`` nor ``cvxpy``.
"""
from univer_theory.verifiers import kseq_acceptance_mass, kseq_rho_star

from .condot import PLAN_TOL, check_plan, condot_lp, condot_value, flat_ot_lp
from .mincut import condot_mincut
from .result import OTResult
from .highs_lp import LPSolution, solve_lp
from .global_lp import GlobalLPResult, TreeArrays, enumerate_tree_arrays, global_tree_lp, trie_classes
from .cf_bound import CFResult, ValueFunction, cf_bound
from .value_aware import ValueAwareVerifier, value_aware_verifier
from .flat_ot import METHODS, alpha_star_fast, flat_ot_cvxpy, solve_flat

