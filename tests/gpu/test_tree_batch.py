"""TreeBatch: padding, derived structure, SGLang round trip, attention mask, validation of raw tensors."""
import numpy as np
import pytest
import torch

from gpu import TreeBatch, tree_attention_mask
from univer_theory import DraftTree, TreeShape

TREES = [
    DraftTree((-1, 0, 0, 1, 1, 2), (-1, 2, 0, 1, 1, 3)),
    DraftTree.chain([3, 1, 2]),
    DraftTree((-1,), (-1,)),
    DraftTree.from_shape(TreeShape.parse("((..),(.),.)"), [0, 1, 2, 3, 0, 1]),
]


def test_structure_matches_draft_tree():
    b = TreeBatch.from_trees(TREES)
    assert b.to_trees() == TREES
    for i, t in enumerate(TREES):
        n = t.num_nodes
        assert b.depth[i, :n].tolist() == list(t.depth)
        assert (b.depth[i, n:] == -1).all()
        assert b.num_children[i, :n].tolist() == [len(c) for c in t.children]
        for u in range(n):
            kids = [c for c in b.children[i, u].tolist() if c < b.max_nodes]
            assert tuple(kids) == t.children[u]
    assert b.max_depth == max(t.max_depth for t in TREES)
    assert b.positions(torch.tensor([10, 20, 30, 40]))[1, :4].tolist() == [20, 21, 22, 23]
    assert torch.equal(b.positions(7), b.positions(torch.full((4,), 7)))
    for bad in (torch.tensor([10, 20]), torch.tensor([1.5] * 4), [True] * 4, torch.ones(2, 2, dtype=torch.long)):
        with pytest.raises(ValueError, match="TreeBatch.positions: offset must be an integer scalar or 4 integers"):
            b.positions(bad)


def test_subtree_shapes_spell_the_draft_trees_subtree_keys():
    """Shape ids name the same ordered subtree in every tree (one id per distinct key), −1 on padding."""
    trees = TREES + [DraftTree.from_shape(TreeShape.parse("(((..),.),.)"), [0] * 6),
                     DraftTree.from_shape(TreeShape.parse("(.,(..))"), [1, 2, 3, 0])]
    b = TreeBatch.from_trees(trees)
    ids, keys = b.subtree_shapes
    assert len(set(keys)) == len(keys)
    for i, t in enumerate(trees):
        assert [keys[x] for x in ids[i, :t.num_nodes].tolist()] == list(t.subtree_keys)
        assert (ids[i, t.num_nodes:] == -1).all()
        assert b.height[i, :t.num_nodes].tolist() == [nesting(k) for k in t.subtree_keys]



def test_only_methods_reading_subtree_shapes_build_them(monkeypatch):
    """``gpu.verify`` builds ``TreeBatch.subtree_shapes`` only for the methods of ``SHAPE_METHODS`` (UniVer's
    shape and slot rules); the others never touch it (a fresh batch's would be built)."""
    from gpu import expected_accepted_length, verify
    from gpu.verify import METHODS, SHAPE_METHODS
    from univer_theory import VERIFIERS
    built = []
    real = TreeBatch.subtree_shapes.func

    def spy(self):
        built.append(True)
        return real(self)
    monkeypatch.setattr(TreeBatch, "subtree_shapes", property(spy))
    tree = DraftTree.from_shape(TreeShape.parse("((..),.)"), [0, 1, 2, 1])
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(1, 5, 4, generator=gen, dtype=torch.float64), -1)
    for method in METHODS:
        if "wor" not in VERIFIERS[method].processes:
            continue
        built.clear()
        verify(TreeBatch.from_trees([tree]), p, p, "wor", method, gen)
        expected_accepted_length(TreeBatch.from_trees([tree]), p, p, "wor", method)
        assert bool(built) == (method in SHAPE_METHODS), method

@pytest.mark.parametrize("M,K,high", [(1, 1, 2), (0, 3, 2), (60, 3, 3), (500, 4, 5), (7, 10, 2), (1000, 2, 40)])
def test_unique_rows_is_torch_unique_by_rows(M, K, high):
    """The grouping of shapes, layouts and tuples returns what ``torch.unique(dim=0, return_inverse=True)`` does:
    the distinct rows in lexicographic order and each row's index among them — on the CPU (numpy's lexsort) and
    on torch itself (an accelerator's stable column sorts)."""
    from gpu.unique import _unique_rows, unique_rows

    rows = torch.randint(-1, high, (M, K), generator=torch.Generator().manual_seed(M + K))
    want = torch.unique(rows, dim=0, return_inverse=True)
    for got in (unique_rows(rows), _unique_rows(rows)):
        assert torch.is_tensor(got[0]) and torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_distinct_rows_groups_equal_rows_and_never_merges_different_ones(backend):
    """``distinct_rows`` (the de-duplication of a level's probability rows before rule 1's LPs and rule 7's fit):
    equal rows share a group whose first row is the lowest index, different rows never do — also when their
    fingerprints (sum, index-weighted sum) collide, where every row is its own group."""
    from gpu.unique import distinct_rows

    to = (lambda x: x) if backend == "numpy" else torch.from_numpy
    rng = np.random.default_rng(0)
    base = rng.dirichlet(np.ones(9), size=4)
    x = base[[2, 0, 2, 3, 1, 0, 0]]
    first, inverse = (np.asarray(v) for v in distinct_rows(to(x)))
    assert sorted(first.tolist()) == [0, 1, 3, 4]                  # the lowest index of each of the 4 rows
    assert np.array_equal(x[first][inverse], x)
    collide = np.array([[0.0, 0.5, 0.5, 0.0], [0.5, 0.0, 0.0, 0.5], [0.0, 0.5, 0.5, 0.0]])   # same sum, same Σ i·x_i
    first, inverse = (np.asarray(v) for v in distinct_rows(to(collide)))
    assert first.tolist() == [0, 1, 2] and inverse.tolist() == [0, 1, 2]


def nesting(key):
    """Height of a subtree from its nested key: the deepest parenthesis level."""
    level = deepest = 0
    for ch in key:
        level += (ch == "(") - (ch == ")")
        deepest = max(deepest, level)
    return deepest


def test_level_nodes_pack_internal_nodes_by_depth():
    """Per depth: every internal node of every tree exactly once, largest branching first, its children in
    drafting order (padded with N), and ``active[j]`` = the number of rows with a j-th child."""
    b = TreeBatch.from_trees(TREES)
    N = b.max_nodes
    for d, (tree, slot, kids, active) in enumerate(b.level_nodes):
        want = {(i, u) for i, t in enumerate(TREES) for u in range(t.num_nodes) if t.depth[u] == d and t.children[u]}
        got = list(zip(tree.tolist(), slot.tolist()))
        assert sorted(got) == sorted(want) and len(got) == len(want)
        branching = [len(TREES[i].children[u]) for i, u in got]
        assert branching == sorted(branching, reverse=True)
        assert list(active) == [sum(k > j for k in branching) for j in range(max(branching))]
        for (i, u), row in zip(got, kids.tolist()):
            assert tuple(c for c in row if c < N) == TREES[i].children[u]


def test_sglang_round_trip_and_semantics():
    b = TreeBatch.from_trees(TREES)
    nxt_tok, nxt_sib = b.to_sglang()
    for i, t in enumerate(TREES):
        for u in range(t.num_nodes):
            assert nxt_tok[i, u] == (t.children[u][0] if t.children[u] else -1)
            if u:
                sibs = t.children[t.parent[u]]
                j = sibs.index(u)
                assert nxt_sib[i, u] == (sibs[j + 1] if j + 1 < len(sibs) else -1)
    back = TreeBatch.from_sglang(nxt_tok, nxt_sib, b.token, b.num_nodes)
    assert torch.equal(back.parent, b.parent) and torch.equal(back.token, b.token)


def test_sglang_lists_in_any_slot_order_are_laid_out_topologically():
    """Storage order need not be topological (a child or next sibling in an earlier slot): the batch is the
    same tree in topological slots, and ``order`` maps each slot back to its storage slot."""
    first = torch.tensor([[2, -1, -1]])
    sib = torch.tensor([[-1, -1, 1]])       # root's children: 2 then 1
    batch, order = TreeBatch.from_sglang(first, sib, torch.tensor([[-1, 7, 5]]), return_order=True)
    assert order.tolist() == [[0, 2, 1]]
    assert batch.to_trees() == [DraftTree((-1, 0, 0), (-1, 5, 7))]


def test_tree_attention_mask_is_ancestor_or_self():
    b = TreeBatch.from_trees(TREES)
    mask = tree_attention_mask(b)
    N = b.max_nodes
    for i, t in enumerate(TREES):
        for u in range(N):
            if u >= t.num_nodes:
                assert mask[i, u].tolist() == [v == u for v in range(N)]
                continue
            anc, v = {u}, u
            while v > 0:
                v = t.parent[v]
                anc.add(v)
            assert mask[i, u].tolist() == [v in anc for v in range(N)]


@pytest.mark.parametrize("parent, token, num_nodes, rule", [
    ([[0, 0, 1]], [[-1, 1, 2]], None, "slot 0 must be the root"),
    ([[-1, 2, 0]], [[-1, 1, 2]], None, "parents must precede"),
    ([[-1, 0, -1]], [[-1, 1, -1]], None, "only slot 0 may be a root"),
    ([[-1, 0, 0]], [[-1, 1, 5]], None, r"token ids must lie in \[0, 4\)"),
    ([[-1, 0, 0]], [[-1, 1, -3]], None, "drafted tokens must be ≥ 0"),
    ([[-1, 0, 0]], [[-1, 1, 2]], [2], "padded slots"),
    ([[-1, 0, 0]], [[-1, 1, 2]], [4], "num_nodes 4, outside"),
    ([[-1, 0, 0]], [[-1, 1, 2]], [0], r"tree 0 has num_nodes 0, outside \[1, N = 3\]"),
    ([[-1, 0, 0]], [[-1, 1, 2]], [-1], r"tree 0 has num_nodes -1, outside"),
    ([[-1, 0, 0]] * 2, [[-1, 1, 2]] * 2, [3, 9], r"tree 1 has num_nodes 9, outside"),     # the tree, not tree 0
    ([[-1, 0, 0]] * 2, [[-1, 1, 2], [-1, 1, 7]], None, r"tree 1 slot 2 \(parent 0, token 7\) .* \[0, 4\)"),
    ([[-1.0, 0, 0]], [[-1, 1, 2]], None, "must hold integers"),
])
def test_from_tensors_rejects_malformed_trees(parent, token, num_nodes, rule):
    with pytest.raises(ValueError, match=rule):
        TreeBatch.from_tensors(torch.tensor(parent), torch.tensor(token), num_nodes, vocab_size=4)


def test_a_valid_batch_is_checked_in_one_host_read(monkeypatch):
    """The constructor's rules (sizes, root, parents, tokens, padding, vocabulary) are reduced on the device and read
    back in one ``tolist`` — each rule's own ``bool(mask.any())`` was a device-to-host sync per rule."""
    import collections

    reads = collections.Counter()
    for name in ("tolist", "item", "__bool__", "__int__", "__index__", "__float__", "nonzero", "numpy"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=original, _n=name, **k:
                            (reads.update([_n]), _o(self, *a, **k))[1])
    parent, token = torch.tensor([[-1, 0, 0, 1], [-1, 0, -1, -1]]), torch.tensor([[-1, 1, 2, 3], [-1, 2, -1, -1]])
    num_nodes = torch.tensor([4, 2])
    for vocab_size in (None, 4):
        reads.clear()
        TreeBatch(parent, token, num_nodes, vocab_size)
        assert dict(reads) == {"tolist": 1}, (vocab_size, dict(reads))


def test_with_tokens_shares_the_structure_and_gives_a_fresh_batchs_results():
    """A batch of one skeleton with other tokens (a static tree's decode step) holds the skeleton's derived
    structure itself — the same objects, none derived again — equal to what a fresh batch of those trees derives,
    and verifies as that fresh batch does, draw for draw."""
    from gpu import expected_accepted_length, verify
    from gpu.tree_batch import STRUCTURE

    skeleton = TreeBatch.from_trees(TREES)
    other = [DraftTree(t.parent, tuple(-1 if u == 0 else (7 * u + i) % 5 for u in range(t.num_nodes)))
             for i, t in enumerate(TREES)]
    fresh = TreeBatch.from_trees(other)
    shared = skeleton.with_tokens(fresh.token)
    assert torch.equal(shared.token, fresh.token) and shared.to_trees() == other
    for name in STRUCTURE:
        mine, want = getattr(shared, name), getattr(fresh, name)
        assert mine is getattr(skeleton, name), name
        assert repr(mine) == repr(want), name        # tensors, tuples of tensors and key tuples alike
    gen = torch.Generator().manual_seed(3)
    p = torch.softmax(3 * torch.randn(len(TREES), skeleton.max_nodes, 5, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(3 * torch.randn(len(TREES), skeleton.max_nodes, 5, generator=gen, dtype=torch.float64), -1)
    for method in ("univer", "rrs", "tv"):
        a, b = (verify(x, p, q, "iid", method, torch.Generator().manual_seed(1)) for x in (shared, fresh))
        for field in ("accepted_nodes", "num_accepted", "next_token"):
            assert torch.equal(getattr(a, field), getattr(b, field)), (method, field)
        assert torch.equal(expected_accepted_length(shared, p, q, "iid", method),
                           expected_accepted_length(fresh, p, q, "iid", method)), method


@pytest.mark.parametrize("token, rule", [
    ([[-1, 1, 2]], r"token must be \[B, N\] = \[4, 7\]"),
    ("root", "slot 0 must be the root"),
    ("negative", "drafted tokens must be ≥ 0"),
    ("padding", "padded slots"),
    ("float", "must hold integers"),
])
def test_with_tokens_checks_the_tokens(token, rule):
    skeleton = TreeBatch.from_trees(TREES)
    bad = skeleton.token.clone()
    if token == "root":
        bad[0, 0] = 3
    elif token == "negative":
        bad[1, 2] = -2
    elif token == "padding":
        bad[2, 4] = 1                                    # tree 2 is a lone root: slot 4 is padding
    elif token == "float":
        bad = bad.double()
    else:
        bad = torch.tensor(token)
    with pytest.raises(ValueError, match=rule):
        skeleton.with_tokens(bad)


def test_draft_tree_batches_of_one_skeleton_share_its_structure():
    """Every batch ``draft_tree`` drafts with one (shape, size, device) carries the same derived structure: a
    decode loop derives it once."""
    from gpu.drafting import draft_tree

    shape = TreeShape.parse("((..),.)")
    q = torch.softmax(torch.randn(6, generator=torch.Generator().manual_seed(0), dtype=torch.float64), -1)
    one, two, wide = (draft_tree(shape, q, "wor", B, torch.Generator().manual_seed(s))[0]
                      for B, s in ((3, 1), (3, 2), (4, 1)))
    assert not torch.equal(one.token, two.token)
    assert one.level_nodes is two.level_nodes and one.subtree_shapes is two.subtree_shapes
    assert wide.level_nodes is not one.level_nodes and wide.batch_size == 4


def test_from_tensors_accepts_ragged_valid_batch():
    b = TreeBatch.from_tensors([[-1, 0, 0], [-1, 0, -1]], [[-1, 1, 2], [-1, 3, -1]], [3, 2], vocab_size=4)
    assert b.to_trees() == [DraftTree((-1, 0, 0), (-1, 1, 2), 4), DraftTree((-1, 0), (-1, 3), 4)]   # its vocab


@pytest.mark.parametrize("n", [3, 6, 7])
def test_depths_of_one_long_chain(n):
    """A single chain whose length is no power of two (a batch of one tree: no padding to round it up): every
    node's depth, by pointer jumping, is its index."""
    batch = TreeBatch.from_trees([DraftTree.chain([0] * n)])
    assert batch.depth[0].tolist() == list(range(n + 1)) and batch.max_depth == n


def test_sibling_ranks_of_root_and_padding_and_the_vocabulary_bound():
    """``sibling_rank`` is −1 on roots and padded slots (documented), and a token equal to ``vocab_size`` is refused
    by both constructors, without waiting for ``validate_inputs`` (skipped with ``validate=False``)."""
    b = TreeBatch.from_trees([DraftTree.chain([1]), DraftTree((-1, 0, 0, 1), (-1, 2, 0, 1))])
    assert b.sibling_rank.tolist() == [[-1, 0, -1, -1], [-1, 0, 1, 0]]
    TreeBatch.from_tensors([[-1, 0]], [[-1, 3]], vocab_size=4)
    with pytest.raises(ValueError, match=r"must lie in \[0, 4\)"):
        TreeBatch.from_tensors([[-1, 0]], [[-1, 4]], vocab_size=4)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        TreeBatch.from_sglang([[1, -1]], [[-1, -1]], [[-1, 4]], vocab_size=4)
