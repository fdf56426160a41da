"""``gpu.engine.walk``: a sample that plans only the nodes on its path, for the rules whose every reached node
succeeds (``gpu.verify.WALK``).  Its law is checked by the G-tests of ``gpu.verify`` (``test_distribution``,
``test_support``: NSS, RRS, RRSw, K-SEQ and GR sample through it); here what it plans, what it refuses, that
its blocks change no draw, that RRS(w) decide on the walk's coins as without them, and that the same G-test
rejects a lossy rule walked."""
import dataclasses

import numpy as np
import pytest
import torch

from gpu import METHODS, TreeBatch, engine, verify
from gpu.verify import COINS, WALK
from univer_theory import BUG_ZOO, VERIFIERS, DirichletModel, DraftTree, TreeShape, sample_tree
from univer_theory.verifiers import normalise_rows

from ..gof_instances import instance
from ..stats import assert_fits, assert_power, assert_rejects, g_test
from .helpers import TORCH_ZOO, cell_counts, padded_rows, repeated
from .test_support import SAMPLED, undrafted_from_p

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


def slot_major(p, q):
    """``(p_flat, q_flat, row_index)``: ``[B, N, V]`` rows laid out flat slot by slot (``row_index[b, v] = v·B + b``,
    as a serving engine may hold them), so that a depth's walking rows are often consecutive input rows, read in
    place on the CPU (``gpu.engine._run_start``)."""
    B, N, V = p.shape
    row_index = (torch.arange(N)[None, :] * B + torch.arange(B)[:, None]).contiguous()
    return (*(x.transpose(0, 1).reshape(B * N, V).contiguous() for x in (p, q)), row_index)


@pytest.mark.parametrize("layout", ["batch", "slot-major"])
@pytest.mark.parametrize("method, process", CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_walk_blocks_change_no_draw(method, process, layout):
    """Blocks of one row give the draws of one block a depth (the coins drawn before the blocks, the candidates in
    row order), on depths of up to 30 walking trees, their rows copied ([B, N, V]) or read in place (slot-major
    flat rows: every depth's first rows consecutive; each root a row of its own, the root row perturbed per tree, so
    a block reading another block's rows shows); and ``gpu.verify`` gives the walk's draws (RRS(w) there on the walk's
    coins, ``gpu.verify.COINS``: their rule's decisions up to each node's first entered child, and its residuals,
    the same floats)."""
    batch, p, q = ragged(process, seed=2)
    p = p.clone()
    p[:, 0] *= torch.linspace(1, 2, p.shape[0], dtype=p.dtype)[:, None] ** torch.arange(p.shape[-1], dtype=p.dtype)
    p[:, 0] /= p[:, 0].sum(-1, keepdim=True)
    row_index = None
    if layout == "slot-major":
        p, q, row_index = slot_major(p, q)
    draws = [engine.walk(batch, p, q, process, METHODS[method], torch.Generator().manual_seed(5), row_index,
                         block_bytes=n) for n in (1, 1 << 30)]
    draws.append(verify(batch, p, q, process, method, torch.Generator().manual_seed(5), row_index=row_index))
    for name in ("accepted_nodes", "num_accepted", "next_token"):
        assert torch.equal(getattr(draws[0], name), getattr(draws[1], name)), name
        assert torch.equal(getattr(draws[0], name), getattr(draws[2], name)), name


def two_trees_on_their_drafted_support(n: int, V: int = 300, seed: int = 11):
    """``(trees, rows, laws, batch, p, q, row_index)``: the wor tree of ``test_support.SAMPLED`` with draft rows on three
    tokens ({0, 1, 3} at the root, {0, 2, 4} at its first child, {0, 1, 2} at the leaves; targets holding ~0.6 on
    them), and the same tree relabelled ``x → V − 1 − x`` — its nodes draft other tokens, in another block of
    ``support.SCAN_BLOCK`` — interleaved (n of each) in one batch, flat rows read through ``row_index``."""
    rng = np.random.default_rng(seed)
    tree = DraftTree(SAMPLED["wor"].parent, SAMPLED["wor"].token, V)
    drafted = [[0, 1, 3], [0, 2, 4]] + [[0, 1, 2]] * (tree.num_nodes - 2)
    pn, qn = np.zeros((tree.num_nodes, V)), np.zeros((tree.num_nodes, V))
    for u, d in enumerate(drafted):
        pn[u] = 0.4 * rng.dirichlet(np.ones(V))
        pn[u, d] += 0.6 * rng.dirichlet(np.ones(3))
        qn[u, d] = rng.dirichlet(np.ones(3))
    flip = np.arange(V)[::-1].copy()
    other = DraftTree(tree.parent, tuple(-1 if t < 0 else int(flip[t]) for t in tree.token), V)
    rows = [(pn, qn), (pn[:, flip], qn[:, flip])]
    trees = [tree, other]
    laws = [VERIFIERS["rrsw"].law(t, a, b, "wor") for t, (a, b) in zip(trees, rows)]
    N = tree.num_nodes
    batch = TreeBatch.from_trees([trees[i % 2] for i in range(2 * n)])
    row_index = (torch.arange(N)[None, :] + N * (torch.arange(2 * n) % 2)[:, None]).contiguous()
    p, q = (torch.tensor(np.concatenate([r[i] for r in rows])) for i in (0, 1))
    return trees, rows, laws, batch, p, q, row_index


def test_walk_on_the_drafted_support_reads_each_trees_own_row():
    """Two trees whose nodes draft different tokens, interleaved in one batch on their drafted support: a stopped
    tree's correction token is read from its own row's drafted columns, an undrafted one drawn from its own target
    row and its own drafted set (G-test on the joint law of (tree, path, Y), with power against the variant that
    draws undrafted tokens from all of p).  The single-tree G-tests cannot see another row of the same depth: all
    their walking rows of a depth stand on the same node."""
    n = 100_000
    trees, rows, laws, batch, p, q, row_index = two_trees_on_their_drafted_support(n)
    got = verify(batch, p, q, "wor", "rrsw", torch.Generator().manual_seed(4), row_index=row_index)
    end = got.accepted_nodes.gather(1, got.num_accepted[:, None]).squeeze(1).tolist()
    counts: dict = {}
    for i, (u, y) in enumerate(zip(end, got.next_token.tolist())):
        cell = (i % 2,) + trees[i % 2].path(u) + (y,)
        counts[cell] = counts.get(cell, 0) + 1
    joint = lambda each: {(w,) + k: v / 2 for w, law in enumerate(each) for k, v in law.items()}   # noqa: E731
    lossy = joint([undrafted_from_p(law, t, *r) for law, t, r in zip(laws, trees, rows)])
    assert_fits(counts, joint(laws), {"undrafted from p": lossy}, "rrsw-wor, two trees on their drafted support")


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


def rejection_nodes(process: str, dtype, seed: int = 0, R: int = 90, V: int = 7, K: int = 4):
    """``(ctx, coins)``: R nodes of 1–K children drafted from q (i.i.d. ones with duplicates), some with a missing
    child between others (a composed rule's mask), some rows with p = q (every residual vanishes: Y ~ p) and,
    without replacement, confident drafts whose rest is subnormal once their top token is removed; coins uniform,
    0 (the first child entered unless its enter is 0) or 1 (every child rejected)."""
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.full(V, 0.6), R), rng.dirichlet(np.full(V, 0.6), R)
    q[::9] = p[::9]
    q[4::9] = np.r_[1 - 6e-310 * (V - 1), np.full(V - 1, 6e-310)][rng.permutation(V)]
    k = rng.integers(1, K + 1, R)
    children = np.zeros((R, K), dtype=np.int64)
    for r in range(R):
        children[r, :k[r]] = rng.choice(V, k[r], replace=process == "iid", p=q[r])
    mask = np.arange(K)[None, :] < k[:, None]
    mask[5::11, 0] = k[5::11] == 1                  # the first child masked where another follows
    mask[6::13] = False                             # no child at all (a composed rule's mask): Y ~ its own row
    coins = rng.random((R, K))
    coins[1::7], coins[2::7] = 0.0, 1.0
    ctx = engine.LevelContext(torch.ones(R, dtype=dtype), torch.tensor(p, dtype=dtype), torch.tensor(q, dtype=dtype),
                              torch.tensor(children), torch.tensor(mask), process)
    return ctx, torch.tensor(coins)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("method, process", [("rrs", "iid"), ("rrsw", "wor")])
def test_coins_decide_as_the_whole_rule(method, process, dtype):
    """RRS(w)'s rule on a walk's coins (``gpu.verify.COINS``) decides every child up to the first entered one with
    the whole rule's floats (float32 rows: its float64 enter, which the whole rule rounds), the later ones 0, and
    holds the whole rule's residual for exactly the nodes that enter no child — its rows given, or read by row
    number from rows holding others between them."""
    assert method in COINS
    ctx, coins = rejection_nodes(process, dtype, seed=3)
    rule = METHODS[method]
    whole = rule(ctx)
    R, V = ctx.target.shape
    spread = torch.randperm(3 * R, generator=torch.Generator().manual_seed(1))[:R]
    big = [torch.rand(3 * R, V, dtype=dtype).index_copy_(0, spread, x) for x in (ctx.target, ctx.draft)]
    for given in (dataclasses.replace(ctx, coins=coins),
                  dataclasses.replace(ctx, coins=coins, target=big[0], draft=big[1], rows=spread)):
        walked = rule(given)
        assert walked.enter.dtype == torch.float64
        entered = (coins < walked.enter) & ctx.child_mask
        first = torch.where(entered.any(1), entered.to(torch.int8).argmax(1), ctx.children.shape[1])
        upto = torch.arange(ctx.children.shape[1])[None, :] <= first[:, None]
        assert torch.equal(torch.where(upto, walked.enter.to(dtype), 0), torch.where(upto, whole.enter, 0))
        assert not walked.enter[~upto].any()
        stopped = (~entered.any(1)).nonzero().squeeze(1)
        assert 0 < stopped.shape[0] < R
        assert torch.equal(walked.residual_at, stopped)
        assert torch.equal(walked.residual, whole.residual[stopped])


def test_walk_refuses_residuals_of_other_nodes():
    """A rule given the coins whose residuals are not those of the nodes that entered no child is refused (its
    draws would be another node's)."""
    batch, p, q = ragged("iid")

    def wrong(ctx):
        dec = METHODS["rrs"](ctx)
        return dataclasses.replace(dec, residual_at=dec.residual_at + 1)
    with pytest.raises(ValueError, match="held the residuals of nodes"):
        engine.walk(batch, p, q, "iid", wrong, torch.Generator().manual_seed(0), coins=True)


@pytest.mark.parametrize("layout", ["batch", "slot-major"])
@pytest.mark.parametrize("method, process", [("rrs", "iid"), ("rrsw", "wor")])
def test_coins_on_float32_blocks_change_no_draw(method, process, layout):
    """On float32 rows the walk on coins goes in blocks (each block's coins, rows and row numbers its own): blocks
    of one row give the draws of one block a depth, and ``gpu.verify``'s."""
    batch, p, q = ragged(process, seed=2)
    p = p.clone()
    p[:, 0] *= torch.linspace(1, 2, p.shape[0], dtype=p.dtype)[:, None] ** torch.arange(p.shape[-1], dtype=p.dtype)
    p[:, 0] /= p[:, 0].sum(-1, keepdim=True)
    p, q = p.float(), q.float()
    row_index = None
    if layout == "slot-major":
        p, q, row_index = slot_major(p, q)
    draws = [engine.walk(batch, p, q, process, METHODS[method], torch.Generator().manual_seed(5), row_index,
                         block_bytes=n, coins=True) for n in (1, 1 << 30)]
    draws.append(verify(batch, p, q, process, method, torch.Generator().manual_seed(5), row_index=row_index))
    for name in ("accepted_nodes", "num_accepted", "next_token"):
        assert torch.equal(getattr(draws[0], name), getattr(draws[1], name)), name
        assert torch.equal(getattr(draws[0], name), getattr(draws[2], name)), name


def test_coins_compared_with_the_float64_enter(monkeypatch):
    """On float32 rows the walk compares its coins with the float64 ``enter`` RRS's rule decided on (its rows'
    float64 copies on the simplex), not with it rounded to float32: a coin between the two is a rejection."""
    p = torch.tensor([[[0.3, 0.7], [0.5, 0.5]]], dtype=torch.float32)
    q = torch.tensor([[[0.7, 0.3], [0.5, 0.5]]], dtype=torch.float32)
    batch = TreeBatch.from_trees([DraftTree((-1, 0), (-1, 0), 2)])
    pn, qn = (normalise_rows(x[0, :1].double())[0, 0] for x in (p, q))
    e = float(pn / qn)
    assert float(torch.tensor(e, dtype=torch.float32)) > e           # the coin e: a rejection in float64 alone
    monkeypatch.setattr(engine, "uniform", lambda shape, dev, gen: torch.full(shape, e, dtype=torch.float64))
    got = engine.walk(batch, p, q, "iid", METHODS["rrs"], torch.Generator().manual_seed(0), coins=True)
    assert got.num_accepted.tolist() == [0]
