"""``gpu.engine.walk``: a sample that plans only the nodes on its path, for the rules whose every reached node
succeeds (``gpu.verify.WALK``).  Its law is checked by the G-tests of ``gpu.verify`` (``test_distribution``,
``test_support``: NSS, RRS, RRSw, K-SEQ and GR sample through it); here what it plans, what it refuses, that
its blocks change no draw, and that the same G-test rejects a lossy rule walked."""
import numpy as np
import pytest
import torch

from gpu import METHODS, engine, verify
from gpu.verify import WALK
from univer_theory import BUG_ZOO, VERIFIERS, DirichletModel, TreeShape, sample_tree

from ..gof_instances import instance
from ..stats import assert_fits, assert_power, assert_rejects, g_test
from .helpers import TORCH_ZOO, cell_counts, padded_rows, repeated

SHAPES = ["3,2", "2,2,2", "((..),.)", "(.,(.),(..))", "4", "1,1,1"]


def ragged(process, V=6, seed=0, count=30):
    """``(batch, p, q)``: ``count`` trees of mixed shapes drafted from one context-dependent model."""
    rng = np.random.default_rng(seed)
    model = DirichletModel(V, seed=seed, similarity=0.4, concentration=0.7)
    trees = [sample_tree(model, TreeShape.parse(SHAPES[i % len(SHAPES)]), process, rng) for i in range(count)]
    return padded_rows(trees, model)


CASES = [(m, pr) for m in WALK for pr in ("iid", "wor") if pr in VERIFIERS[m].processes]


def test_walk_is_every_rule_whose_nodes_always_succeed():
    """``WALK`` is exactly the methods whose rule decides stop 1 and scalings 1 at every node (on these trees), and
    only those: TV and UniVer stop short of 1."""
    batch, p, q = ragged("iid")
    for method in METHODS:
        if "iid" not in VERIFIERS[method].processes:
            continue
        alloc = engine.allocate(batch, p, q, "iid", METHODS[method])
        internal = (batch.num_children > 0) & batch.valid
        always = bool((alloc.stop[internal] == 1).all() & (alloc.rho[batch.valid] == 1).all())
        assert always == (method in WALK), method


@pytest.mark.parametrize("method, process", CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_walk_plans_only_the_nodes_on_the_path(method, process):
    """Each tree's rule sees its root and the accepted internal nodes, once each: ``τ + 1`` rows, one fewer where
    the path ends at a drafted leaf (whose ``Y ~ p`` needs no plan) — far fewer than the internal nodes."""
    batch, p, q = ragged(process, seed=1)
    rows = []

    def spy(ctx):
        rows.append(ctx.children.shape[0])
        return METHODS[method](ctx)
    got = engine.walk(batch, p, q, process, spy, torch.Generator().manual_seed(3))
    end = got.accepted_nodes.gather(1, got.num_accepted[:, None]).squeeze(1)
    at_leaf = batch.num_children.gather(1, end[:, None]).squeeze(1) == 0
    assert sum(rows) == int((got.num_accepted + 1 - at_leaf.long()).sum())
    assert sum(rows) < int(((batch.num_children > 0) & batch.valid).sum())


def test_walk_refuses_a_rule_whose_nodes_can_fail():
    """TV's stop is below 1 at its internal nodes: walked, its law would not be TV's, so the walk refuses it."""
    batch, p, q = ragged("iid")
    with pytest.raises(ValueError, match="tv_rule: a stop or child scaling other than 1"):
        engine.walk(batch, p, q, "iid", METHODS["tv"], torch.Generator().manual_seed(0))


@pytest.mark.parametrize("method, process", CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_walk_blocks_change_no_draw(method, process):
    """Blocks of one row give the draws of one block a depth (the coins drawn before the blocks, the candidates in
    row order), on depths of up to 30 walking trees; and ``gpu.verify`` gives the walk's draws."""
    batch, p, q = ragged(process, seed=2)
    draws = [engine.walk(batch, p, q, process, METHODS[method], torch.Generator().manual_seed(5), block_bytes=n)
             for n in (1, 1 << 30)]
    draws.append(verify(batch, p, q, process, method, torch.Generator().manual_seed(5)))
    for name in ("accepted_nodes", "num_accepted", "next_token"):
        assert torch.equal(getattr(draws[0], name), getattr(draws[1], name)), name
        assert torch.equal(getattr(draws[0], name), getattr(draws[2], name)), name


def test_same_test_rejects_a_lossy_rule_walked():
    """The G-test of ``test_distribution`` rejects the RRS bug-zoo variant (a duplicate child skipped) sampled by
    the walk, against RRS's law, and accepts it against its own exact law."""
    name, process = "rrs-skip-duplicates", "iid"
    model, tree = instance(process)
    pn, qn = model.node_probs(tree)
    correct, lossy = (v.law(tree, pn, qn, process) for v in (VERIFIERS["rrs"], BUG_ZOO[name]))
    assert_power(correct, {name: lossy}, 200_000)
    batch, p, q = repeated(tree, pn, qn, 200_000)
    counts = cell_counts(engine.walk(batch, p, q, process, TORCH_ZOO[name], torch.Generator().manual_seed(6)), tree)
    assert_rejects(g_test(counts, correct), name)
    assert_fits(counts, lossy, {"rrs": correct}, f"{name} walked vs its own exact law")
