"""Every bug-zoo variant is detected by the exact oracle on a named instance (theory.md §3.9)."""
import numpy as np
import pytest

from univer_theory import BUG_ZOO, VERIFIERS, DirichletModel, DraftTree, TreeShape, evaluate

#: (variant, process, shape, seed): instances on which the lossy variant must show distance > 1e-6.
CASES = [
    ("tv-deepest-first", "iid", "((..),(.(..)))", 0),   # subtrees of different depth interleave
    ("tv-deepest-first", "wor", "2,2", 0),
    ("rrs-skip-duplicates", "iid", "3,1", 0),           # duplicates only exist under iid
    ("tv-original-p", "wor", "2,2", 0),
    ("tv-wrong-update", "iid", "2,1", 0),
    ("typical", "iid", "2,2", 0),
]


@pytest.mark.parametrize("name,process,shape,seed", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_bug_is_detected(name, process, shape, seed):
    model = DirichletModel(3, seed=seed, similarity=0.3)
    r = evaluate(model, TreeShape.parse(shape), process, BUG_ZOO[name])
    assert r.distance > 1e-6 and not r.lossless


def test_deepest_first_with_post_order_is_tv():
    """Control: on a chain, depth order == post-order, so the 'bug' is TV itself and lossless."""
    model = DirichletModel(3, seed=0)
    shape = TreeShape.parse("1,1,1")
    bug = evaluate(model, shape, "iid", BUG_ZOO["tv-deepest-first"])
    tv = evaluate(model, shape, "iid", VERIFIERS["tv"])
    assert bug.lossless and abs(bug.expected_accepted - tv.expected_accepted) < 1e-14


def test_skip_duplicates_is_harmless_without_duplicates():
    """Control: under wor there are no duplicates, the skip rule equals RRSw's update... on iid trees whose
    children happen to be distinct it equals RRS per tree."""
    from univer_theory import DraftTree
    model = DirichletModel(3, seed=0)
    tree = DraftTree(parent=(-1, 0, 0), token=(-1, 0, 2), vocab_size=3)
    p, q = model.node_probs(tree)
    assert BUG_ZOO["rrs-skip-duplicates"].law(tree, p, q, "iid") == VERIFIERS["rrs"].law(tree, p, q, "iid")


def test_a_root_stop_below_one_is_forced_to_one_in_both_laws():
    """Both the per-tree engine and the prefix recursion force the root's stop to 1 (the path always reaches the
    root); every lossless rule returns 1 there already, the bug zoo's wrong-update TV does not — its two laws must
    still be one law of mass 1 (in Fractions)."""
    from univer_theory.oracle import enumerated_output_law, output_law
    model = DirichletModel(3, seed=0, similarity=0.3, exact=True)
    shape = TreeShape.parse("2,1")
    rec = output_law(model, shape, "iid", BUG_ZOO["tv-wrong-update"])
    enum = enumerated_output_law(model, shape, "iid", BUG_ZOO["tv-wrong-update"])
    assert sum(rec.values()) == 1 and sum(enum.values()) == 1
    assert all(rec.get(s, 0) == enum.get(s, 0) for s in set(rec) | set(enum))


def test_tv_whose_residual_forgets_r_is_flagged_where_it_changes_the_law(monkeypatch):
    """A subtle lossy TV: after a rejected child its residual is ``norm([P − Q]_+)`` instead of ``norm([rP − Q]_+)``
    (r forgotten below the root). It changes the law only where r < 1 meets two tokens with ``rP > Q``, so it is
    exactly lossless on many small Dirichlet instances; on a model built for it the oracle flags it in Fractions
    (an independent re-implementation of the oracle found the same distances)."""
    from fractions import Fraction as F

    import numpy as np

    import univer_theory.verifiers as verifiers
    from univer_theory import TableModel
    rows = lambda *xs: np.array([F(x) for x in xs], dtype=object)
    model = TableModel(3, {(): rows("1/2", "1/2", "0"), (0,): rows("5/10", "4/10", "1/10")},
                       {(): rows("9/10", "1/10", "0"), (0,): rows("5/100", "30/100", "65/100")})
    shapes = [("1,1", "iid"), ("2,1", "wor"), ("2,2", "iid")]
    assert all(evaluate(model, TreeShape.parse(s), p, VERIFIERS["tv"]).distance == 0 for s, p in shapes)
    real = verifiers.tv_residual_step
    monkeypatch.setattr(verifiers, "tv_residual_step", lambda r, P, Q: real(1, P, Q))
    for s, p in shapes:
        assert evaluate(model, TreeShape.parse(s), p, VERIFIERS["tv"]).distance > F(1, 10), (s, p)


def test_deepest_first_samples_through_duplicate_siblings():
    """An i.i.d. root with two copies of token 0 whose subtrees differ: a sampled output through the second copy
    was mapped back to nodes by its tokens (the first copy's children: StopIteration, or the wrong node).  Each
    sample is a root-to-node path of the tree now, an output of the law, and both copies' subtrees are sampled."""
    tree = DraftTree((-1, 0, 0, 1, 2), (-1, 0, 0, 1, 2))
    p, q = np.array([[0.6, 0.2, 0.2]] * 5), np.array([[0.5, 0.25, 0.25]] * 5)
    zoo = BUG_ZOO["tv-deepest-first"]
    law = zoo.law(tree, p, q, "iid")
    assert any(k[:2] == (0, 2) for k in law)                 # outputs through node 4 exist
    rng = np.random.default_rng(0)
    ends = set()
    for _ in range(400):
        nodes, y = zoo.sample(tree, p, q, "iid", rng)
        assert all(tree.parent[u] == (nodes[i - 1] if i else 0) for i, u in enumerate(nodes)), nodes
        assert tuple(tree.token[u] for u in nodes) + (y,) in law, (nodes, y)
        ends.add(nodes[-1] if nodes else 0)
    assert {3, 4} <= ends                                       # below either copy
