"""univer_theory — the exact core of the univer toolkit (theory.md §0–§3, §6).

Pure math on small vocabularies: the draft-tree data model, draft processes, synthetic target/draft
families, every verifier as an exact-law function, the losslessness oracle and exact E[τ]; float64 or exact
``Fraction`` arithmetic throughout.

Glossary
--------
target ``p``, draft ``q``
    Next-token laws after temperature processing; in code ``target_probs`` / ``draft_probs`` ``[N, V]``.
accepted path
    Root → u; τ = depth(u) tokens are accepted.
correction / bonus token ``Y``
    The one extra token emitted after the path: from a residual when u is internal, ``Y ~ p`` at a leaf.
through-probability ``ρ``
    Prefix acceptance probability of a node; verifiers hand it down as a *scaling*.
lossless
    Path, Y, then fresh target sampling has exactly the target's law (oracle distance 0).
"""
from .models import ConfidentModel, DirichletModel, Model, TableModel, TemperedModel, apply_temperature, context_free, to_fractions
from .oracle import (LOSSLESS_TOL, MethodResult, distance_to_target, enumerated_output_law, evaluate,
                     expected_accepted, mass_balance_violation, output_law)
from .processes import PROCESSES, count_trees, enumerate_trees, sample_children, sample_tree, tuple_law
from .tree import DraftTree, TreeShape, eagle_like_shape
from .verifiers import VERIFIERS, Verifier, get_verifier, kseq_rho_star, register
from .zoo import BUG_ZOO

__all__ = [
    "BUG_ZOO", "ConfidentModel", "DirichletModel", "DraftTree", "LOSSLESS_TOL", "MethodResult", "Model", "PROCESSES",
    "TableModel", "TemperedModel", "TreeShape", "VERIFIERS", "Verifier", "apply_temperature", "context_free",
    "count_trees", "distance_to_target", "eagle_like_shape", "enumerate_trees", "enumerated_output_law", "evaluate",
    "expected_accepted", "get_verifier", "kseq_rho_star", "mass_balance_violation", "output_law", "register",
    "sample_children", "sample_tree", "to_fractions", "tuple_law",
]
from .univer import UNIVER, UniVerRule, make_univer_verifier  # noqa: E402  (registers "univer")
from .alpha_star import alpha_star, optimal_cut  # noqa: E402
from .multidraft import GR, SPECHUB  # noqa: E402  (registers "spechub" and "gr")
__all__ += ["GR", "SPECHUB", "UNIVER", "UniVerRule", "alpha_star", "make_univer_verifier", "optimal_cut"]
