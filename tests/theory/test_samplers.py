"""Each sampler agrees with its exact per-tree law (G-test), and the same test rejects a lossy sampler.

Statistic: G-test of (path tokens, Y) frequencies against ``Verifier.law``; cells with expected count < 20
pooled; any outcome outside the law's support fails.  Fixed seeds; level ``tests.stats.LEVEL`` (the suite's
false-alarm budget split over its accepting tests).  Power: each accepting test first requires power ≥
``tests.stats.POWER`` at ``N_SAMPLES`` against the exact law of every bug-zoo variant of its process on its tree
(``tests.gof_instances``, where every variant's law differs from every lossless method's; on the chain,
deepest-first and skip-duplicates cannot differ and are exempt).
"""
import numpy as np
import pytest

from univer_theory import BUG_ZOO, VERIFIERS

from ..gof_instances import CHAIN, MODELS, instance
from ..stats import assert_accepts, assert_power, assert_rejects, g_test

N_SAMPLES = 6000


def _zoo_laws(tree, p, q, process) -> dict:
    """Exact per-tree laws of the bug-zoo variants that apply to ``process`` (the alternatives of the power)."""
    return {z: v.law(tree, p, q, process) for z, v in BUG_ZOO.items() if process in v.processes}


def _samples(verifier, tree, p, q, process, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(N_SAMPLES):
        nodes, y = verifier.sample(tree, p, q, process, rng)
        out.append(tuple(tree.token[u] for u in nodes) + (y,))
    return out


CASES = [(n, pr) for n, v in VERIFIERS.items() for pr in ("iid", "wor", "topk")
         if pr in v.processes and not v.chain_only]


@pytest.mark.parametrize("name,process", CASES)
def test_sampler_matches_exact_law(name, process):
    model, tree = instance(process)
    p, q = model.node_probs(tree)
    law = VERIFIERS[name].law(tree, p, q, process)
    assert_power(law, _zoo_laws(tree, p, q, process), N_SAMPLES)
    assert_accepts(g_test(_samples(VERIFIERS[name], tree, p, q, process, seed=1), law), f"{name}/{process}")


@pytest.mark.parametrize("name", ["sps", "bv"])
def test_chain_sampler_matches_exact_law(name):
    p, q = MODELS["wor"].node_probs(CHAIN)
    law = VERIFIERS[name].law(CHAIN, p, q, "iid")
    # on a chain the deepest-first order is post-order, and there are no duplicate children to skip
    assert_power(law, _zoo_laws(CHAIN, p, q, "iid"), N_SAMPLES,
                 may_coincide=("tv-deepest-first", "rrs-skip-duplicates"))
    assert_accepts(g_test(_samples(VERIFIERS[name], CHAIN, p, q, "iid", seed=2), law), name)


#: (bug, its lossless original, process): each variant of the bug zoo, sampled on the accepting tests' instance.
LOSSY = [("tv-deepest-first", "tv", "iid"), ("tv-original-p", "tv", "wor"), ("tv-wrong-update", "tv", "iid"),
         ("rrs-skip-duplicates", "rrs", "iid"), ("typical", "nss", "topk")]


@pytest.mark.parametrize("bug,reference,process", LOSSY)
def test_g_test_rejects_lossy_sampler(bug, reference, process):
    """Power check: samples of a lossy variant are rejected against the lossless verifier's exact law."""
    model, tree = instance(process)
    p, q = model.node_probs(tree)
    law = VERIFIERS[reference].law(tree, p, q, process)
    assert_power(law, {bug: BUG_ZOO[bug].law(tree, p, q, process)}, N_SAMPLES)
    assert_rejects(g_test(_samples(BUG_ZOO[bug], tree, p, q, process, seed=3), law), bug)
