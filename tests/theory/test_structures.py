"""Trees, shapes, draft processes and model families."""
from fractions import Fraction as F

import numpy as np
import pytest

from univer_theory import (DirichletModel, DraftTree, TreeShape, apply_temperature, context_free, count_trees,
                           eagle_like_shape, enumerate_trees, sample_children, sample_tree, to_fractions, tuple_law)
from univer_theory.proofs import verify_all
from univer_theory.tree import canonical_key, key_size, split_key

from ..stats import assert_accepts, assert_power, assert_rejects, g_test


def test_shape_forms_agree():
    assert TreeShape.parse("2,2") == TreeShape.parse("((..),(..))")
    s = TreeShape.parse("((..),.)")
    assert s.children[0] == (1, 2) and s.subtree_size[1] == 3 and s.max_depth == 2 and not s.is_chain
    assert TreeShape.parse(str(s)) == s
    assert TreeShape.parse("1,1,1").is_chain


def test_named_shapes_are_their_forms():
    """binary:D, chain:D and eagle[:W] — the LLM commands' names — are shapes everywhere a shape is read."""
    assert TreeShape.parse("binary:3") == TreeShape.parse("2,2,2")
    assert TreeShape.parse("chain:4") == TreeShape.parse("1,1,1,1")
    assert TreeShape.parse("eagle") == TreeShape.parse("eagle:4") == eagle_like_shape(4)
    assert TreeShape.parse("eagle:2") == TreeShape.parse("((.),.)")
    assert TreeShape.parse("eagle").num_nodes == 24 and TreeShape.parse(" binary:1 ") == TreeShape.parse("2")
    for bad, match in (("binary:0", "needs a positive depth, e.g. binary:4"), ("chain:x", "positive depth"),
                       ("chain:", "positive depth"), ("eagle:0", "needs a positive width, e.g. eagle:4"),
                       ("eagle:-1", "positive width"), ("eagle:", "positive width"),
                       ("ternary:2", "unknown shape kind 'ternary'"),
                       ("eagle:1000000000", "has 1000000001 nodes or more"),    # its root alone: 10⁹ children
                       ("2:2", "unknown shape kind '2'"),
                       # refused before the levels are listed: chain:10⁹ built a list of 10⁹ first
                       ("chain:1000000000", "has 1000000001 nodes or more, beyond the 1048576"),
                       ("binary:20", "has 2097151 nodes or more"), ("binary:5000", "beyond the 1048576")):
        with pytest.raises(ValueError, match=f"^(TreeShape.parse|eagle_like_shape): (?=.*'{bad}').*{match}"):
            TreeShape.parse(bad)
    assert TreeShape.parse("binary:19").num_nodes == 2 ** 20 - 1
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="eagle_like_shape: width must be an integer ≥ 1"):
            eagle_like_shape(bad)


def test_subtree_keys_split_and_canonical_form():
    s = TreeShape.parse("((..),(.(..)),.)")
    assert s.subtree_keys[0] == str(s) == "((.,.),(.,(.,.)),.)"
    assert split_key(s.subtree_keys[0]) == tuple(s.subtree_keys[c] for c in s.children[0])
    assert split_key(".") == () and split_key("((..),.)") == ("(..)", ".")
    assert canonical_key("((..),(.(..)),.)") == s.subtree_keys[0]
    assert all(key_size(s.subtree_keys[u]) == s.subtree_size[u] for u in range(s.num_nodes))
    for bad in ("", "()", "(.x)", "(.))", "((.)"):
        with pytest.raises(ValueError, match="split_key"):
            split_key(bad)


def test_tree_paths_and_children():
    t = DraftTree(parent=(-1, 0, 0, 1, 1), token=(-1, 2, 2, 0, 1), vocab_size=3)
    assert t.children[0] == (1, 2) and t.child_tokens(0) == (2, 2)
    assert t.path(4) == (2, 1) and t.depth == (0, 1, 1, 2, 2)


@pytest.mark.parametrize("process", ["iid", "wor", "topk", "greedy"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_tuple_law_is_exact_distribution(process, k):
    q = to_fractions(np.array([0.1, 0.2, 0.3, 0.4]))
    law = tuple_law(q, k, process)
    assert sum(pr for _, pr in law) == 1
    assert all(len(S) == k for S, _ in law)
    if process != "iid":
        assert all(len(set(S)) == k for S, _ in law)


def test_wor_tuple_law_formula():
    q = np.array([F(1, 10), F(2, 10), F(3, 10), F(4, 10)], dtype=object)
    law = dict(tuple_law(q, 2, "wor"))
    assert law[(3, 0)] == F(4, 10) * F(1, 10) / (1 - F(4, 10))


@pytest.mark.parametrize("process", ["iid", "wor", "greedy"])
def test_sampler_matches_tuple_law(process):
    """G-test (level ``tests.stats.LEVEL``) of 20 000 sampled tuples against the exact tuple law (Gumbel-top-k
    for wor), with power ≥ ``tests.stats.POWER`` against the other processes' tuple laws."""
    q = np.array([0.05, 0.15, 0.3, 0.5])
    rng = np.random.default_rng(0)
    n = 20000
    samples = [sample_children(q, 2, process, rng) for _ in range(n)]
    law = dict(tuple_law(q, 2, process))
    assert_power(law, {pr: dict(tuple_law(q, 2, pr)) for pr in ("iid", "wor", "greedy") if pr != process}, n)
    assert_accepts(g_test(samples, law), f"sample_children {process}")


def test_g_test_rejects_iid_samples_as_wor():
    """The tuple test has power: i.i.d. tuples fail against the wor law."""
    q = np.array([0.05, 0.15, 0.3, 0.5])
    rng = np.random.default_rng(0)
    samples = [sample_children(q, 2, "iid", rng) for _ in range(20000)]
    assert_rejects(g_test(samples, dict(tuple_law(q, 2, "wor"))), "iid tuples as wor")


def test_wor_draws_subnormal_tokens_before_a_zero_one():
    """Gumbel-top-k in logs: a subnormal q's race key q/E rounded to 0 for E > 1 and tied a q = 0 token's, which
    the stable sort then drafted (24% of these draws) — a tuple of probability 0 under Q_k."""
    q = np.array([1.0, 0.0, 5e-324, 5e-324])
    rng = np.random.default_rng(0)
    assert all(sorted(sample_children(q, 3, "wor", rng)) == [0, 2, 3] for _ in range(300))


def test_topk_ties_lowest_id():
    assert sample_children(np.array([0.3, 0.3, 0.4]), 2, "topk", None) == (2, 0)


@pytest.mark.parametrize("shape,process", [("2,2", "wor"), ("3,1", "iid"), ("((..),.)", "greedy")])
def test_enumerate_trees_sums_to_one(shape, process):
    model = DirichletModel(3, seed=1, exact=True)
    shape = TreeShape.parse(shape)
    trees = list(enumerate_trees(model, shape, process))
    assert sum(pr for _, pr in trees) == 1
    assert len(trees) == count_trees(model, shape, process)
    assert len({t.token for t, _ in trees}) == len(trees)


def test_sample_tree_is_valid():
    model = DirichletModel(5, seed=2)
    t = sample_tree(model, TreeShape.parse("2,2"), "wor", np.random.default_rng(0))
    assert t.num_nodes == 7 and all(len(set(t.child_tokens(u))) == len(t.children[u]) for u in range(7))


def test_models():
    m = DirichletModel(4, seed=3, similarity=1.0)
    assert np.allclose(m.target((1, 2)), m.draft((1, 2)))
    assert not np.allclose(m.target((1,)), m.target((2,)))
    e = DirichletModel(4, seed=3, exact=True)
    assert sum(e.target((0,))) == 1 and e.exact
    cf = context_free([0.5, 0.5], [0.9, 0.1])
    assert np.array_equal(cf.target((1, 1, 0)), cf.target(()))
    assert list(apply_temperature(np.array([0.2, 0.5, 0.3]), 0)) == [0, 1, 0]
    hot = apply_temperature(np.array([0.2, 0.5, 0.3]), 0.5)
    assert np.isclose(hot.sum(), 1) and hot[1] > 0.5


def test_symbolic_identities():
    """The sympy proofs behind losslessness all reduce to 0 (one-stage identity, TV update, BV step, lemma)."""
    assert verify_all() == {name: True for name in verify_all()}
    assert len(verify_all()) == 4


def test_children_are_drafted_at_their_own_prefix():
    """``sample_tree`` draws each node's children from ``q(·|s(u))`` at that node's own prefix: on a model whose
    depth-1 rows put all draft mass on token 2 (the root's gives it none), every depth-2 child is 2."""
    from univer_theory import TableModel
    root, below = np.array([.5, .5, 0.]), np.array([0., 0., 1.])
    model = TableModel(3, {(): np.full(3, 1 / 3)}, {(): root, (0,): below, (1,): below})
    rng = np.random.default_rng(0)
    for _ in range(50):
        t = sample_tree(model, TreeShape.parse("1,1"), "iid", rng)
        assert t.token[1] in (0, 1) and t.token[2] == 2 and t.paths[2] == (t.token[1], 2), t.token


def test_every_sign_pattern_is_a_case_and_a_broken_identity_is_reported(monkeypatch):
    """The symbolic proofs enumerate every sign pattern of ``p − q`` but the two one-sided ones (a single pattern
    would leave most identities unchecked), and ``verify_all`` reports a proof with a non-zero residual."""
    from univer_theory import proofs
    assert len(proofs.prove_one_stage_identity()) == 2
    assert len(proofs.prove_residual_update(3)) == (2 ** 3 - 2) * 3                # one residual per token
    assert len(proofs.prove_mass_balance_one_node(3)) == (2 ** 3 - 2) * 3
    monkeypatch.setitem(proofs.PROOFS, "broken", lambda: [0, proofs.sp.Integer(1)])
    got = proofs.verify_all()
    assert got["broken"] is False and all(v for k, v in got.items() if k != "broken")


def test_small_concentrations_keep_full_support_and_zero_temperature_is_the_first_argmax():
    """``DirichletModel`` floors its rows at 1e-12 (a concentration of 1e-3 underflows draws to 0), and
    ``apply_temperature(row, 0)`` is the one-hot of the first maximum, wherever it sits, in both modes."""
    m = DirichletModel(8, seed=0, concentration=0.001)
    for prefix in [(), (0,), (1, 2), (3,), (4, 5)]:
        for row in (m.target(prefix), m.draft(prefix)):
            assert np.all(row > 0) and abs(row.sum() - 1) < 1e-12, row
    assert list(apply_temperature(np.array([.5, .3, .2]), 0)) == [1, 0, 0]
    assert list(apply_temperature(np.array([.1, .2, .3, .4]), 0)) == [0, 0, 0, 1]
    assert list(apply_temperature(np.array([.2, .4, .4]), 0)) == [0, 1, 0]            # the lower id on a tie
    exact = apply_temperature(np.array([F(3, 5), F(1, 5), F(1, 5)], dtype=object), 0)
    assert list(exact) == [1, 0, 0] and isinstance(exact[0], F)
