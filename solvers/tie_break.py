"""One optimum for the node LPs whose *plan* UniVer uses: the slot rule's LP and rule 1's CondOT(ρ) LP.

Both LPs maximise an integer objective ``c·z`` (all ones for CondOT; for the slot rule ω, then the least
change of the plan, :mod:`solvers.slot_rule`) over a totally unimodular constraint matrix: each variable
``z(S, j)`` sits in exactly one row of its tuple S and one row of its token ``S_j`` (plus slacks), the
incidence matrix of a bipartite graph (the slot rule's ``[R, −R; −I, I]`` in ``z = z_0 + u − v`` stays
totally unimodular).  Their optimum is usually a
face, and which point of it is used changes the output law.  Solving instead

.. math::

    \\max\\ (c + ε r)·z, \\qquad r_i = \\operatorname{frac}(\\sqrt{P_i}), \\qquad ε = \\frac{1}{2(m + 1)}

(``P_i`` the i-th prime, one per variable; m rows)

picks one point of that face, the same for every exact solver:

* it is a c-optimum: at any basis B the simplex column ``B⁻¹A_j`` lies in ``{−1, 0, 1}^m`` (total
  unimodularity), so the c-reduced costs are integers, and the perturbation moves them by
  ``ε|r_j − r_B·B⁻¹A_j| < ε(m + 1) = ½``: a perturbed optimum has no c-improving column;
* its z is unique: a tie needs an integer combination of distinct ``frac(√P_i)`` to vanish, and 1 and the
  square roots of distinct primes are linearly independent over ℚ (a slack column's perturbed reduced cost is
  0 only when its pivot moves no z).

So HiGHS (the tests' oracle) and :mod:`solvers.lex_simplex` (both layers' solver) return the same z.
"""
from __future__ import annotations

import threading

import numpy as np

_roots = np.zeros(0)
_roots_lock = threading.Lock()


def tie_eps(rows):
    """``ε = 1/(2(m + 1))`` for an LP with m rows (a number, or an array / tensor of row counts)."""
    return 0.5 / (rows + 1)


def prime_roots(count: int) -> np.ndarray:
    """``frac(√P_i)`` for the first ``count`` primes (read-only; the table is kept and grown as needed, under a lock:
    two threads growing it at once could each return the other's table, one too short for its ``count``)."""
    global _roots
    table = _roots
    if table.size < count:
        with _roots_lock:
            table = _roots
            if table.size < count:
                n = max(count, 2 * table.size, 64)
                limit = int(n * (np.log(n) + np.log(np.log(n)))) + 16          # above the n-th prime (Rosser)
                sieve = np.ones(limit + 1, dtype=bool)
                sieve[:2] = False
                for i in range(2, int(limit ** 0.5) + 1):
                    if sieve[i]:
                        sieve[i * i::i] = False
                roots = np.sqrt(np.flatnonzero(sieve)[:n].astype(np.float64))
                table = roots - np.floor(roots)
                table.setflags(write=False)
                _roots = table
    return table[:count]
