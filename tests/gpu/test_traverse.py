"""``gpu.engine.traverse``: a sample that plans only the internal nodes its depth-first pass 2 enters (TV's,
``gpu.verify.TRAVERSE``).  TV's law through it is checked by the G-tests of ``gpu.verify`` (``test_distribution``,
``test_support``); here what it plans, that its blocks change no draw, that another rule of the framework keeps its
law through it (UniVer's, whose nodes of ρ = 0 it leaves unplanned), and that the same G-test rejects the lossy TV
variants traversed."""
import pytest
import torch

from gpu import METHODS, engine, verify
from gpu.verify import TRAVERSE
from univer_theory import BUG_ZOO, VERIFIERS

from ..gof_instances import instance
from ..stats import assert_fits, assert_power, assert_rejects, g_test
from .helpers import TORCH_ZOO, cell_counts, repeated
from .test_distribution import N_SAMPLES, zoo_laws
from .test_walk import ragged, slot_major

CASES = [(m, pr) for m in ("tv", "univer") for pr in ("iid", "wor")]


@pytest.mark.parametrize("method, process", CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_traverse_plans_the_nodes_it_enters(method, process):
    """Every planned node is planned once, after its parent (ρ known), and the accepted path's internal nodes are
    among them — but not every reached internal node is (``engine.sample`` plans them all)."""
    batch, p, q = ragged(process, seed=1)
    order = []

    def spy(ctx):
        order.append(ctx.rho.clone())
        return METHODS[method](ctx)
    got = engine.traverse(batch, p, q, process, spy, torch.Generator().manual_seed(3))
    planned = sum(x.shape[0] for x in order)
    alloc = engine.allocate(batch, p, q, process, METHODS[method])
    reached = int(((batch.num_children > 0) & batch.valid & (alloc.rho > 0)).sum())
    on_path = ((got.accepted_nodes >= 0) & (batch.num_children.gather(1, got.accepted_nodes.clamp(min=0)) > 0))
    assert int(on_path.sum()) <= planned < reached
    assert all(bool((x > 0).all()) for x in order)           # a node of ρ = 0 is never planned


@pytest.mark.parametrize("layout", ["batch", "slot-major"])
@pytest.mark.parametrize("method, process", CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_traverse_blocks_change_no_draw(method, process, layout):
    """Blocks of one row give the draws of one block a round (the coins drawn first, the candidates in row order), its
    rows copied or read in place; and ``gpu.verify`` gives the traversal's draws for the methods of ``TRAVERSE``."""
    batch, p, q = ragged(process, seed=2)
    row_index = None
    if layout == "slot-major":
        p, q, row_index = slot_major(p, q)
    draws = [engine.traverse(batch, p, q, process, METHODS[method], torch.Generator().manual_seed(5), row_index,
                             block_bytes=n) for n in (1, 1 << 30)]
    if method in TRAVERSE:
        draws.append(verify(batch, p, q, process, method, torch.Generator().manual_seed(5), row_index=row_index))
    for name in ("accepted_nodes", "num_accepted", "next_token"):
        assert all(torch.equal(getattr(draws[0], name), getattr(d, name)) for d in draws[1:]), name


@pytest.mark.parametrize("process", ["iid", "wor"])
def test_univer_keeps_its_law_traversed(process):
    """UniVer's level rule sampled by the traversal follows UniVer's exact per-tree law (G-test, with power against
    every bug-zoo variant of the process, as ``test_distribution``): the traversal is a sampler of any rule of the
    conditional framework, not of TV's alone."""
    model, tree = instance(process)
    pn, qn = model.node_probs(tree)
    batch, p, q = repeated(tree, pn, qn, N_SAMPLES)
    got = engine.traverse(batch, p, q, process, METHODS["univer"], torch.Generator().manual_seed(7))
    law = VERIFIERS["univer"].law(tree, pn, qn, process)
    assert_fits(cell_counts(got, tree), law, zoo_laws(model, tree, process), f"univer-{process} traversed")


@pytest.mark.parametrize("name", ["tv-original-p", "tv-wrong-update"])
def test_same_test_rejects_a_lossy_rule_traversed(name):
    """The G-test of ``test_distribution`` rejects the TV bug-zoo variants sampled by the traversal, against TV's law,
    and accepts each against its own exact law."""
    process = "iid"
    model, tree = instance(process)
    pn, qn = model.node_probs(tree)
    correct, lossy = (v.law(tree, pn, qn, process) for v in (VERIFIERS["tv"], BUG_ZOO[name]))
    assert_power(correct, {name: lossy}, N_SAMPLES)
    batch, p, q = repeated(tree, pn, qn, N_SAMPLES)
    counts = cell_counts(engine.traverse(batch, p, q, process, TORCH_ZOO[name], torch.Generator().manual_seed(8)),
                         tree)
    assert_rejects(g_test(counts, correct), name)
    assert_fits(counts, lossy, {"tv": correct}, f"{name} traversed vs its own exact law")


@pytest.mark.parametrize("method, process", CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_traverse_follows_pass_2_on_its_coins(monkeypatch, method, process):
    """Every tree ends where pass 2, replayed recursively on the traversal's own coins (``E_c``, ``F_u``) and on
    :func:`gpu.engine.allocate`'s decisions, ends: a leaf succeeds on ``F`` w.p. ρ, a node whose children all fail on
    ``F`` w.p. its stop, the root always — here also where the root's plan stops short of 1 (p = q at the root: TV's
    ``r`` drops to 0 after its first child)."""
    batch, p, q = ragged(process, seed=4, count=60)
    p = p.clone()
    p[::2, 0] = q[::2, 0]                                    # p = q at every other root
    coins = []
    real = engine.uniform
    monkeypatch.setattr(engine, "uniform", lambda *a: coins.append(real(*a)) or coins[-1])
    got = engine.traverse(batch, p, q, process, METHODS[method], torch.Generator().manual_seed(9))
    coin_e, coin_f = (x.numpy() for x in coins[:2])
    alloc = engine.allocate(batch, p, q, process, METHODS[method])
    enter, stop, rho = (x.numpy() for x in (alloc.enter, alloc.stop, alloc.rho))
    kids, branching = batch.children.numpy(), batch.num_children.numpy()

    def pass_2(b, u):                                        # (succeeds, endpoint) of u's subtree
        for c in kids[b, u, :branching[b, u]]:
            if coin_e[b, c] < enter[b, c]:
                ok, end = (coin_f[b, c] < rho[b, c], c) if branching[b, c] == 0 else pass_2(b, c)
                if ok:
                    return True, end
        return u == 0 or coin_f[b, u] < stop[b, u], u
    want = [pass_2(b, 0)[1] for b in range(batch.parent.shape[0])]
    assert got.accepted_nodes.gather(1, got.num_accepted[:, None]).squeeze(1).tolist() == want
