"""Tolerance tests and running worsts that a NaN cannot pass.

``nan > tol`` is False, and Python's ``max`` keeps a NaN only where it comes first, so a check written as
``if err > tol: fail`` or a grid's ``max(errors) <= tol`` passes a NaN it computed. Every layer that rechecks a result
(the solvers' rechecks, the exact core's lossless measure, the paper checks, the test grids) tests and accumulates its
errors here.
"""
from __future__ import annotations


def exceeds(value, tol) -> bool:
    """``value > tol``, and True for NaN."""
    return not value <= tol


def worst_of(*entries):
    """The entry with the largest error — an entry is a number or an ``(error, where)`` pair — a NaN error winning
    wherever it comes (over ``inf`` too); among equal errors the first."""
    def error(entry):
        e = entry[0] if isinstance(entry, tuple) else entry
        return (1, 0) if e != e else (0, e)
    return max(entries, key=error)
