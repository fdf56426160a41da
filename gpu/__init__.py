"""gpu — batched, device-agnostic torch verifiers with the exact core's semantics (theory.md §1–§3).

Everything runs on the device of its inputs (CPU or CUDA) and is checked against :mod:`univer_theory`:
``expected_accepted_length`` equals ``Verifier.expected_accepted_length`` per tree, and ``verify`` samples the
per-tree law ``Verifier.law`` (K-SEQ: up to its ρ*'s conditioning where p ≈ q,
:func:`univer_theory.verifiers.kseq_rho_star`; every method: up to round-off, which an ill-conditioned tree of
negligible probability amplifies — docs/deviations.md item 108).  ``torch.compile`` is the caller's choice.

Glossary (as :mod:`univer_theory`)
---------------------------------
target ``p``, draft ``q``
    ``target_probs`` / ``draft_probs`` ``[B, N, V]``: row u of tree b is ``p(·|s(u))`` / ``q(·|s(u))``.
accepted path
    Root → u; ``num_accepted`` τ = depth(u); ``accepted_nodes [B, D+1]`` lists the slots, root first.
correction / bonus token ``Y``
    ``next_token``: from a residual when u is internal, ``Y ~ p`` when u is a drafted leaf.
scaling ``ρ``
    Prefix acceptance (through-) probability handed down by TV.

Modules: :mod:`gpu.tree_batch` (padded trees, SGLang converters, attention mask), :mod:`gpu.probs` (logits →
probs, input check, row sampling), :mod:`gpu.drafting` (batched draft processes), :mod:`gpu.engine` (the
two-pass engine), :mod:`gpu.rules` (level rules), :mod:`gpu.verify` (public wrappers), :mod:`gpu.engines`
(SGLang's and vLLM's verification contracts); UniVer's node plans in
:mod:`gpu.univer_rule` with :mod:`gpu.layout`, :mod:`gpu.wor_plans`, :mod:`gpu.condot` (the node LPs: the exact
core's :mod:`solvers.condot_simplex`, :mod:`solvers.slot_rule` and :mod:`solvers.lex_simplex` on a level's rows).
The node formulas are written once against
:mod:`univer_theory.nx`; on the CPU a level's plan runs on numpy views of its tensors (:mod:`gpu.host`), on an
accelerator in torch.
"""
from .drafting import draft_tree, sample_children
from .engine import VerifyResult
from .probs import SIMPLEX_TOL, probs_from_logits
from .tree_batch import TreeBatch, tree_attention_mask
from .verify import METHODS, expected_accepted_length, validate_inputs, verify

__all__ = [
    "METHODS", "SIMPLEX_TOL", "TreeBatch", "VerifyResult", "draft_tree", "expected_accepted_length",
    "probs_from_logits", "sample_children", "tree_attention_mask", "validate_inputs", "verify",
]
