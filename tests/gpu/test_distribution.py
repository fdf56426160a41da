"""Monte Carlo: batched samplers follow the exact per-tree laws, and the same test rejects the bug zoo.

Statistic: G-test (``tests.stats.g_test``) of (path tokens, Y) counts from ``N_SAMPLES`` = 2·10⁵ verifications
of one fixed tree per process (``tests.gof_instances``, shared with the exact-core sampler tests; the tree
repeated B = 2·10⁵ times in one batch) against ``Verifier.law``; cells with
expected count < 20 pooled.  Level ``tests.stats.LEVEL`` (the suite's false-alarm budget split over its
accepting tests), fixed seeds.  Zero-probability cells are checked separately: any count there fails.  Every
accepting test first computes, from the exact laws, the power of this very G-test at its sample size against
its lossy alternatives and requires ≥ ``tests.stats.POWER`` (it refuses an underpowered instance): for the
verifiers, every bug-zoo variant of the process (each differs on ``tests.gof_instances``); for a variant checked
against its own law, its lossless original; for the draft processes, the other processes' laws.  Each torch
zoo variant must be rejected against the correct law and accepted against its own exact law (the torch zoo is
the intended bug).
"""
import numpy as np
import pytest
import torch

from gpu import draft_tree, sample_children, verify
from gpu.engine import sample
from univer_theory import BUG_ZOO, VERIFIERS, TableModel, TreeShape
from univer_theory.processes import enumerate_trees, tuple_law

from ..gof_instances import instance
from ..stats import assert_fits, assert_power, assert_rejects, g_test
from .helpers import TORCH_ZOO, cell_counts, repeated

N_SAMPLES = 200_000


def zoo_laws(model, tree, process) -> dict:
    """Exact laws on ``tree`` of the bug-zoo variants that apply to ``process``."""
    pn, qn = model.node_probs(tree)
    return {z: v.law(tree, pn, qn, process) for z, v in BUG_ZOO.items() if process in v.processes}


def other_processes(law_of, process, processes=("iid", "wor", "greedy")) -> dict:
    """``{other process: law_of(other)}``: the alternatives of a draft-process test."""
    return {pr: law_of(pr) for pr in processes if pr != process}


CASES = [("nss", "iid"), ("nss", "topk"), ("nss", "greedy"), ("rrs", "iid"), ("rrsw", "wor"), ("kseq", "iid"),
         ("gr", "iid"), ("tv", "iid"), ("tv", "wor"), ("univer", "iid"), ("univer", "wor")]


@pytest.mark.parametrize("method, process", CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_sampler_follows_exact_per_tree_law(method, process):
    model, tree = instance(process)
    batch, p, q = repeated(tree, *model.node_probs(tree), N_SAMPLES)
    result = verify(batch, p, q, process, method, torch.Generator().manual_seed(1))
    law = VERIFIERS[method].law(tree, *model.node_probs(tree), process)
    assert_fits(cell_counts(result, tree), law, zoo_laws(model, tree, process), f"{method}-{process}")


@pytest.mark.parametrize("name", sorted(TORCH_ZOO))
def test_same_test_rejects_bug_zoo(name):
    process = "iid"
    model, tree = instance(process)
    pn, qn = model.node_probs(tree)
    reference = "rrs" if name.startswith("rrs") else "tv"
    correct = VERIFIERS[reference].law(tree, pn, qn, process)
    lossy = BUG_ZOO[name].law(tree, pn, qn, process)
    assert_power(correct, {name: lossy}, N_SAMPLES)
    batch, p, q = repeated(tree, *model.node_probs(tree), N_SAMPLES)
    counts = cell_counts(sample(batch, p, q, process, TORCH_ZOO[name], torch.Generator().manual_seed(2)), tree)
    assert_rejects(g_test(counts, correct), name)
    assert_fits(counts, lossy, {reference: correct}, f"{name} vs its own exact law")


#: Draft rows of the children tests: a plain one, and a confident one whose tail sits at the bottom of float64.
CHILD_ROWS = {"plain": [0.1, 0.45, 0.05, 0.4], "subnormal": [1.0, 5e-324, 1e-323, 1.5e-323]}
CHILD_CASES = [("plain", "iid"), ("plain", "wor"), ("plain", "greedy"), ("subnormal", "wor"), ("subnormal", "greedy")]


def _tuple_counts(children: torch.Tensor) -> dict:
    counts: dict = {}
    for row in children.tolist():
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    return counts


@pytest.mark.parametrize("row, process", CHILD_CASES, ids=[f"{r}-{p}" for r, p in CHILD_CASES])
def test_sample_children_follows_tuple_law(row, process):
    """Ordered children against the exact tuple law (G-test; the other processes' laws as the alternatives).  On
    the subnormal row (5e-324·(1, 2, 3) after its top token) the wor keys were ``q/E``, which round onto the
    subnormal grid, and greedy's last draw ``U·Σ`` a grid of six steps: the second child came out 0.35 : 0.37 :
    0.27 (wor, tail (1, 1, 1)) and 1/6 : 1/3 : 1/2 (greedy, tail (1, 1, 1)); that quantised wor sampler is run
    here too and rejected."""
    q = torch.tensor(CHILD_ROWS[row], dtype=torch.float64)
    n, k = 100_000, 3
    got = sample_children(q.expand(n, 4).contiguous(), k, process, torch.Generator().manual_seed(3))
    law_of = lambda pr: dict(tuple_law(q.numpy(), k, pr))
    assert_fits(_tuple_counts(got), law_of(process), other_processes(law_of, process), f"sample_children {process}")
    if (row, process) == ("subnormal", "wor"):
        e = torch.empty(n, 4, dtype=torch.float64).exponential_(generator=torch.Generator().manual_seed(3))
        quantised = torch.where(q > 0, q / e, -1.0).topk(k, dim=-1).indices
        assert_rejects(g_test(_tuple_counts(quantised), law_of(process)), "wor keys q/E on subnormal rows")


def test_scaled_rows_scale_by_exact_powers_of_two():
    """Maxima brought into [0.5, 1) without rounding, from the smallest subnormal on (one factor 2^1072 would
    be fine, 2^1073 overflows); a zero row stays zero."""
    from gpu.drafting import scaled_rows
    rows = torch.tensor([[5e-324, 1e-323], [0.0, 0.0], [3.0, 1.0], [5e-324, 0.0]], dtype=torch.float64)
    assert scaled_rows(rows).tolist() == [[0.25, 0.5], [0.0, 0.0], [0.75, 0.25], [0.5, 0.0]]
    assert scaled_rows(torch.tensor([[1.0, 3.0]]) * 2.0 ** -149).tolist() == [[0.25, 0.75]]    # float32 subnormals


def test_sample_children_topk_is_deterministic_with_low_id_ties():
    q = torch.tensor([[0.3, 0.1, 0.3, 0.3], [0.0, 0.5, 0.25, 0.25]])
    assert sample_children(q, 3, "topk").tolist() == [[0, 2, 3], [1, 2, 3]]


def test_wor_children_never_draw_an_undrafted_token():
    """A subnormal q's Gumbel key q/E underflows to 0 once E > 1; q = 0 tokens had key 0 too, and topk took one
    in its place (token 0 in ~1/3 of 2 000 draws here)."""
    q = torch.tensor([[0.0, 5e-324, 1.0]], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    kids = torch.cat([sample_children(q, 2, "wor", gen) for _ in range(2000)])
    assert set(kids.flatten().tolist()) == {1, 2}


@pytest.mark.parametrize("process", ["iid", "wor"])
def test_draft_tree_follows_tree_law(process):
    """Whole drafted trees of shape ((.),.) against enumerate_trees, with rows that depend on the last token
    (a callable source), so wiring a child to the wrong parent's row would show."""
    V = 3
    rng = np.random.default_rng(5)
    last = rng.dirichlet(np.ones(V), size=V + 1)                 # row V: the root
    shape = TreeShape.parse("((.),.)")
    prefixes = [()] + [(a,) for a in range(V)] + [(a, b) for a in range(V) for b in range(V)]
    table = {s: last[s[-1] if s else V] for s in prefixes}
    model = TableModel(V, table, table)
    rows = torch.tensor(last)

    def source(token, nodes):
        return rows[torch.where(token[:, nodes] >= 0, token[:, nodes], V)]

    n = 40_000
    batch, q_nodes = draft_tree(shape, source, process, n, torch.Generator().manual_seed(4))
    counts: dict = {}
    for row in batch.token.tolist():
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    law_of = lambda pr: {t.token: p for t, p in enumerate_trees(model, shape, pr)}
    assert_fits(counts, law_of(process), other_processes(law_of, process, ("iid", "wor")), f"draft_tree {process}")
    b0 = batch.to_trees()[0]
    inner = [u for u in range(b0.num_nodes) if b0.children[u]]       # leaves: uniform rows, no call
    torch.testing.assert_close(q_nodes[0, inner], torch.tensor(np.stack([model.draft(b0.paths[u]) for u in inner])))
    torch.testing.assert_close(q_nodes[0, [u for u in range(b0.num_nodes) if u not in inner]],
                               torch.full((b0.num_nodes - len(inner), V), 1 / V, dtype=torch.float64))


def test_draft_tree_checks_its_batch_and_rows():
    """A batch size that is not an int ≥ 1, rows of the wrong rank, a callable returning the wrong shape and a NaN
    leaf row are ValueErrors (they were RuntimeErrors, a TypeError, truncations or silently returned); no rows
    draw no children."""
    from univer_theory import TreeShape

    shape, q = TreeShape.parse("2,2"), torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    for bad, match in ((lambda: draft_tree(shape, q, "wor", 0), "batch_size must be an integer ≥ 1"),
                       (lambda: draft_tree(shape, q, "wor", 2.5), "batch_size must be an integer ≥ 1"),
                       (lambda: draft_tree(shape, q.expand(2, 7, 3, 4), "wor", 2), "must be \\[V\\], \\[N, V\\]"),
                       (lambda: draft_tree(shape, lambda t, n: q.expand(2, len(n) + 1, 4), "wor", 2),
                        "callable must return a \\[B, len\\(nodes\\), V\\]"),
                       (lambda: draft_tree(shape, lambda t, n: np.full((2, len(n), 4), 0.25), "wor", 2),
                        "got ndarray"),
                       (lambda: draft_tree(TreeShape.parse("1"), torch.tensor([[1.0, 0.0], [float("nan"), 0.0]]),
                                           "iid", 1), "row \\[0, 1\\] contains NaN")):
        with pytest.raises(ValueError, match=match):
            bad()
    assert sample_children(torch.zeros(0, 4, dtype=torch.float64), 2, "wor").shape == (0, 2)
