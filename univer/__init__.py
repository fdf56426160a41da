"""univer — lossless verification for speculative decoding: the front door.

Everything of the exact core (:mod:`univer_theory`) is re-exported eagerly; the ground-truth solvers and the
batched torch layer are re-exported lazily (first attribute access), so ``import univer`` needs only the core
install and a missing extra fails with a clear ImportError naming it.

>>> import univer
>>> r = univer.evaluate(univer.DirichletModel(3, seed=0), univer.TreeShape.parse("2"), "wor", univer.VERIFIERS["univer"])
>>> r.lossless
True
"""
from __future__ import annotations

import importlib

from univer_theory import *  # noqa: F401,F403
from univer_theory import __all__ as _theory_all

#: Lazily re-exported names: ``{name: (module, extra needed)}``.
_LAZY = {
    **{n: ("solvers", "solvers") for n in ("condot_lp", "flat_ot_lp", "solve_flat", "global_tree_lp", "cf_bound",
                                          "value_aware_verifier", "OTResult")},
    **{n: ("gpu", "gpu") for n in ("TreeBatch", "verify", "expected_accepted_length", "draft_tree",
                                  "tree_attention_mask", "probs_from_logits", "METHODS")},
}

__all__ = list(_theory_all) + sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'univer' has no attribute {name!r}")
    module, extra = _LAZY[name]
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as err:
        raise ImportError(f"univer.{name} needs the '{extra}' extra: pip install 'univer[{extra}]' ({err})") from err
