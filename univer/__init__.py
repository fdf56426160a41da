"""univer — lossless verification for speculative decoding: the front door.

Re-exports the public API of the layers (``univer_theory``, ``solvers``, ``gpu``) and holds the ``univer`` CLI.
Layers that need optional extras are imported lazily, so ``import univer`` works with the core install.
"""
from univer_theory import *  # noqa: F401,F403
from univer_theory import __all__ as _theory_all

__all__ = list(_theory_all)
