"""One runnable check per claim of the paper (and of theory.md), each failing if its claim is false.

Run them all with ``univer check`` (``--fast`` for the CI-sized grid); results go to
``results/paper_checks.md`` with PNG figures beside it.
"""
from .base import CheckResult
from .runner import CHECKS, run_checks

__all__ = ["CHECKS", "CheckResult", "run_checks"]
