"""α*(ρ) and its cut (``univer_theory.alpha_star``, the one implementation for numpy and torch) against the
exact oracles on seeded grids: the brute-force min-cut over all 2^V cuts (``solvers.condot_mincut``, the tuple
law summed), to 1e-12, and the CondOT LP's vertex (``solvers.condot.condot_plan``, HiGHS) where the draft support
has at most :data:`LP_TUPLES` tuples, to :data:`LP_TOL`; there rule 1's plan (``lp_plan``: the lexicographic simplex
both layers solve it with) attains the min-cut's α*(ρ) to 1e-12 (iid, wor; 1.4e-13 at worst on 7 668 instances of
seeds 2–11) — V = 4 and 7 (instances of at most :data:`MAX_TUPLES` tuples),
k = 2..5, every process, ρ ∈ {1, 0.55, 1e-3}, on Dirichlet, dyadic (exact ties), sparse and peaky rows (tails
down to 1e-300).  The worst deviation is part of the failure message."""
import math

import numpy as np
import pytest

from solvers import condot_mincut
from solvers.condot import condot_plan
from univer_theory.alpha_star import alpha_star_and_cut
from univer_theory.plans.lp_plan import lp_plan
from univer_theory.processes import tuple_law
from univer_theory.tolerance import worst_of

from ..theory.test_one_implementation import rows

TOL = 1e-12
RHOS = (1.0, 0.55, 1e-3)
#: The LP is solved where the support has at most this many ordered tuples (HiGHS: ~0.25 s on 210 tuples,
#: minutes on 7^5).
LP_TUPLES = 120
#: HiGHS' vertex carries round-off: on a peaky V = 4 row (tuple probabilities down to 1e-63, wor k = 3) its value
#: exceeds the bound α*(ρ) ≤ ρ by 1.9e-12, where the closed form and the min-cut agree exactly.
LP_TOL = 1e-11
#: Instances with more ordered tuples are left out (the min-cut sums the tuple law for every cut).
MAX_TUPLES = 5000


def _tuples(q, k, process):
    m = int(np.count_nonzero(q))
    return m ** k if process == "iid" else math.perm(m, k) if process == "wor" else m


def _cut_cost(p, q, k, process, rho, cut):
    """``ρ p(A) + Pr(S ⊄ A)`` from the tuple law (the definition)."""
    return rho * p[cut].sum() + sum(float(pr) for S, pr in tuple_law(q, k, process) if not all(cut[y] for y in S))


def _instances(seed, k, process):
    for i, (p, q) in enumerate(rows(seed, 4) + rows(seed)):
        if (process != "iid" and np.count_nonzero(q) < k) or _tuples(q, k, process) > MAX_TUPLES:
            continue
        for rho in RHOS:
            yield f"seed {seed} row {i} rho {rho}", p, q, rho


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("k", [2, 3, 4, 5])
@pytest.mark.parametrize("process", ["iid", "wor", "greedy", "topk"])
def test_alpha_star_matches_the_min_cut_and_the_lp(seed, k, process):
    worst = {"min-cut": (0.0, None), "LP": (0.0, None), "rule 1": (0.0, None)}

    def record(oracle, err, name):
        worst[oracle] = worst_of(worst[oracle], (err, name))

    for name, p, q, rho in _instances(seed, k, process):
        value, cut = alpha_star_and_cut(p, q, k, process, rho)
        brute = condot_mincut(p, q, k, process, rho).value
        record("min-cut", worst_of(abs(value - brute), abs(_cut_cost(p, q, k, process, rho, cut) - brute)), name)
        if _tuples(q, k, process) <= LP_TUPLES:
            record("LP", abs(value - condot_plan(p, q, rho, k, process).value), name)
            if process in ("iid", "wor"):                   # the product's plan: the lexicographic simplex
                record("rule 1", abs(lp_plan(p, q, rho, k, process).alpha - brute), name)
    message = "; ".join(f"worst |α* − {o}| = {e:.3g} at {n}" for o, (e, n) in worst.items())
    assert worst["min-cut"][0] <= TOL and worst["rule 1"][0] <= TOL and worst["LP"][0] <= LP_TOL, message
