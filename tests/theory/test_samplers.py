"""Each sampler agrees with its exact per-tree law (G-test), and the same test rejects a lossy sampler.

Statistic: G-test of (path tokens, Y) frequencies against ``Verifier.law``; cells with expected count < 5
pooled; any outcome outside the law's support fails.  Fixed seeds; false alarm ``TEST_FAILURE_RATE`` = 1e-3
per test.
"""
import numpy as np
import pytest

from univer_theory import BUG_ZOO, VERIFIERS, DirichletModel, DraftTree

from ..conftest import TEST_FAILURE_RATE
from ..stats import g_test

N_SAMPLES = 6000

TREES = {
    "iid": DraftTree(parent=(-1, 0, 0, 0, 1, 1, 2), token=(-1, 1, 1, 0, 2, 0, 1), vocab_size=3),
    "wor": DraftTree(parent=(-1, 0, 0, 1, 1, 2), token=(-1, 1, 0, 2, 0, 1), vocab_size=3),
}


def _tree(model, process):
    """A fixed tree per process; for topk the children must be the model's top-2 draft tokens."""
    if process != "topk":
        return TREES[process]
    top = lambda s: sorted(range(3), key=lambda x: (-model.draft(s)[x], x))[:2]
    a, b = top(())
    return DraftTree(parent=(-1, 0, 0, 1, 1), token=(-1, a, b, *top((a,))), vocab_size=3)


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
    model = DirichletModel(3, seed=21, similarity=0.3)
    tree = _tree(model, process)
    p, q = model.node_probs(tree)
    law = VERIFIERS[name].law(tree, p, q, process)
    pval = g_test(_samples(VERIFIERS[name], tree, p, q, process, seed=1), law)
    assert pval > TEST_FAILURE_RATE, f"{name}/{process}: p = {pval:.2e}"


@pytest.mark.parametrize("name", ["sps", "bv"])
def test_chain_sampler_matches_exact_law(name):
    model = DirichletModel(3, seed=21, similarity=0.3)
    tree = DraftTree.chain((1, 0, 2), vocab_size=3)
    p, q = model.node_probs(tree)
    law = VERIFIERS[name].law(tree, p, q, "iid")
    assert g_test(_samples(VERIFIERS[name], tree, p, q, "iid", seed=2), law) > TEST_FAILURE_RATE


#: (bug, lossless reference, process, tree tokens under parents (-1, 0, 0, 0, 1, 1)): trees on which the two
#: per-tree laws differ by > 0.01 somewhere (asserted below, so the power claim is checked, not assumed).
LOSSY = [("tv-wrong-update", "tv", "iid", (0, 1, 0, 2, 1)),
         ("tv-original-p", "tv", "wor", (0, 1, 2, 2, 1)),
         ("rrs-skip-duplicates", "rrs", "iid", (1, 1, 1, 0, 0))]


@pytest.mark.parametrize("bug,reference,process,tokens", LOSSY)
def test_g_test_rejects_lossy_sampler(bug, reference, process, tokens):
    """Power check: samples of a lossy variant are rejected against the lossless verifier's exact law."""
    model = DirichletModel(3, seed=21, similarity=0.3)
    tree = DraftTree(parent=(-1, 0, 0, 0, 1, 1), token=(-1, *tokens), vocab_size=3)
    p, q = model.node_probs(tree)
    law = VERIFIERS[reference].law(tree, p, q, process)
    bug_law = BUG_ZOO[bug].law(tree, p, q, process)
    assert max(abs(law.get(k, 0) - bug_law.get(k, 0)) for k in law.keys() | bug_law.keys()) > 0.01
    assert g_test(_samples(BUG_ZOO[bug], tree, p, q, process, seed=3), law) < TEST_FAILURE_RATE
