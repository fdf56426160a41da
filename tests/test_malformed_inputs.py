"""Malformed trees and rows reach the public entry points only as ValueError (issue: inputs that slipped through
returned a result or crashed with IndexError / RuntimeError): ``gpu.verify``, ``gpu.expected_accepted_length``
(raw ``TreeBatch(...)`` included) and ``univer_theory.evaluate``, fed by hypothesis with one corruption each."""
import numpy as np
import pytest
import torch
from hypothesis import assume, given, strategies as st

from gpu import TreeBatch, expected_accepted_length, verify
from univer_theory import VERIFIERS, Model, TreeShape, evaluate

torch.set_num_threads(1)

V = 3
PARENT = [[-1, 0, 0, 1], [-1, 0, 1, -1]]          # tree 0: root → {1, 2}, 1 → 3; tree 1: a chain of 3 (+1 pad)
TOKEN = [[-1, 0, 1, 2], [-1, 2, 0, -1]]           # distinct siblings, so valid for iid and wor
NUM_NODES = [4, 3]
#: (method, process) pairs the batched verifiers support on this batch (no NotImplementedError expected).
PAIRS = [(m, p) for m in ("tv", "rrs", "rrsw", "kseq", "univer") for p in ("iid", "wor")
         if p in VERIFIERS[m].processes]

#: Our ValueErrors name the function first ("verify: …", "TreeBatch.from_trees: …"); numpy's and torch's (a
#: broadcast error, an index error re-raised) do not — an input no check caught must not pass as validated.
OURS = r"^[A-Za-z_][\w.]*: "


def rows(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-support target / draft rows [2, 4, V] (every drafted token has q > 0)."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(V), size=(2, 4)) * 0.9 + 0.1 / V
    q = rng.dirichlet(np.ones(V), size=(2, 4)) * 0.9 + 0.1 / V
    return torch.tensor(p), torch.tensor(q)


CORRUPTIONS = ("parent_after_child", "parent_self", "parent_out_of_range", "second_root", "negative_token",
               "token_too_large", "num_nodes_too_large", "num_nodes_zero", "empty_batch", "float_parent",
               "pad_not_cleared", "nan_row", "inf_row", "negative_entry", "unnormalised", "q_zero_drafted",
               "vocab_mismatch", "rows_wrong_nodes")


@st.composite
def malformed(draw):
    """``(parent, token, num_nodes, p, q, what)``: the valid batch above with exactly one rule broken."""
    parent, token, num_nodes = (torch.tensor(x) for x in (PARENT, TOKEN, NUM_NODES))
    p, q = rows(draw(st.integers(0, 2 ** 16)))
    what = draw(st.sampled_from(CORRUPTIONS))
    b = draw(st.integers(0, 1))
    v = draw(st.integers(1, NUM_NODES[b] - 1))                 # a drafted node of tree b
    u = draw(st.integers(0, NUM_NODES[b] - 1))                 # any node of tree b
    if what == "parent_after_child":
        parent[b, v] = draw(st.integers(v + 1, 3)) if v < 3 else 3
    elif what == "parent_self":
        parent[b, v] = v
    elif what == "parent_out_of_range":
        parent[b, v] = draw(st.sampled_from([4, 7, 100, -2, -9]))
    elif what == "second_root":
        parent[b, v] = -1
    elif what == "negative_token":
        token[b, v] = draw(st.integers(-50, -1))
    elif what == "token_too_large":
        token[b, v] = draw(st.integers(V, V + 50))
    elif what == "num_nodes_too_large":
        num_nodes[b] = draw(st.integers(5, 9))
    elif what == "num_nodes_zero":
        num_nodes[b] = draw(st.integers(-3, 0))
    elif what == "empty_batch":
        parent, token, num_nodes, p, q = parent[:0], token[:0], num_nodes[:0], p[:0], q[:0]
    elif what == "float_parent":
        parent = parent.double()
    elif what == "pad_not_cleared":
        parent[1, 3] = 0
    elif what in ("nan_row", "inf_row", "negative_entry", "unnormalised"):
        x = draw(st.sampled_from([p, q]))
        y = draw(st.integers(0, V - 1))
        if what == "nan_row":
            x[b, u, y] = float("nan")
        elif what == "inf_row":
            x[b, u, y] = float(draw(st.sampled_from(["inf", "-inf"])))
        elif what == "negative_entry":
            x[b, u, y] = -draw(st.floats(1e-6, 1.0))
        else:
            x[b, u] *= 1 + draw(st.floats(1e-6, 10.0)) * draw(st.sampled_from([1, -0.09]))
    elif what == "q_zero_drafted":
        par, tok = int(parent[b, v]), int(token[b, v])
        q[b, par, tok] = 0
        q[b, par] /= q[b, par].sum()
    elif what == "vocab_mismatch":
        q = q[..., :V - 1] / q[..., :V - 1].sum(-1, keepdim=True)
    elif what == "rows_wrong_nodes":
        p = p[:, :3]
    return parent, token, num_nodes, p, q, what


@given(malformed(), st.sampled_from(PAIRS), st.booleans())
def test_gpu_entry_points_raise_only_value_error(case, pair, sample):
    parent, token, num_nodes, p, q, what = case
    method, process = pair
    with pytest.raises(ValueError, match=OURS):
        batch = TreeBatch(parent, token, num_nodes)          # the raw constructor checks the layout itself
        if sample:
            verify(batch, p, q, process, method, torch.Generator().manual_seed(0))
        else:
            expected_accepted_length(batch, p, q, process, method)


class RowsModel(Model):
    """A user's own model: the same (possibly malformed) rows at every prefix."""

    def __init__(self, p, q, vocab_size):
        self.p, self.q, self.vocab_size = p, q, vocab_size

    def target(self, prefix):
        return self.p

    def draft(self, prefix):
        return self.q


@st.composite
def malformed_model(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    p, q = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
    what = draw(st.sampled_from(["nan", "inf", "negative", "unnormalised", "short", "two_d", "vocab_bool",
                                 "vocab_zero", "strings"]))
    y = draw(st.integers(0, V - 1))
    vocab = V
    bad = draw(st.sampled_from(["p", "q"]))
    row = (p if bad == "p" else q).copy()
    if what == "nan":
        row[y] = np.nan
    elif what == "inf":
        row[y] = np.inf
    elif what == "negative":
        row[y] = -draw(st.floats(1e-6, 1.0))
    elif what == "unnormalised":
        row = row * (1 + draw(st.floats(1e-6, 10.0)) * draw(st.sampled_from([1, -0.09])))
    elif what == "short":
        row = row[:-1] / row[:-1].sum()
    elif what == "two_d":
        row = row[None, :]
    elif what == "vocab_bool":
        vocab = True
    elif what == "vocab_zero":
        vocab = 0
    else:
        row = np.array([str(x) for x in row])
    p, q = (row, q) if bad == "p" else (p, row)
    return RowsModel(p, q, vocab)


@given(malformed_model(), st.sampled_from(["2", "1,1", "((..),.)"]),
       st.sampled_from([(m, p) for m, p in PAIRS] + [("bv", "iid"), ("sps", "iid")]))
def test_evaluate_raises_only_value_error_on_bad_rows(model, shape, pair):
    method, process = pair
    shape = TreeShape.parse(shape)
    assume(VERIFIERS[method].supports(shape, process))
    with pytest.raises(ValueError, match=OURS):
        evaluate(model, shape, process, VERIFIERS[method])


def test_a_model_with_exact_targets_and_float_drafts_is_refused():
    """Fraction target rows with float draft rows: the per-tree API refused the pair, ``evaluate`` ran the rule-based
    verifiers on it in floats (TV, RRS: E[τ] as a float, the exact mode left silently)."""
    from fractions import Fraction as F
    exact = np.array([F(1, 2), F(1, 4), F(1, 4)], dtype=object)
    for p, q in ((exact, np.array([0.25, 0.25, 0.5])), (np.array([0.5, 0.25, 0.25]), exact)):
        for name in ("tv", "rrs"):
            with pytest.raises(ValueError, match="one mode for every row"):
                evaluate(RowsModel(p, q, 3), TreeShape.parse("2"), "iid", VERIFIERS[name])


@given(st.text(alphabet="().,0123-x ", min_size=0, max_size=9))
def test_evaluate_raises_only_value_error_on_bad_shapes(text):
    try:
        TreeShape.parse(text)
    except ValueError:
        pass
    else:
        assume(False)                                        # a valid shape: nothing malformed to test
    good = RowsModel(np.full(V, 1 / V), np.full(V, 1 / V), V)
    with pytest.raises(ValueError, match=OURS):
        evaluate(good, text, "iid", VERIFIERS["tv"])


@pytest.mark.parametrize("args, rule", [
    (("not a model", "2", "iid", "tv"), "model must be a univer_theory Model"),
    ((None, None, "iid", "tv"), "model must be"),
    (("model", None, "iid", "tv"), "shape must be a TreeShape"),
    (("model", "2", "bogus", "tv"), "unknown process 'bogus'"),
    (("model", "2", "iid", "tv-as-string"), "verifier must be a Verifier"),
])
def test_evaluate_names_the_bad_argument(args, rule):
    model = RowsModel(np.full(V, 1 / V), np.full(V, 1 / V), V)
    m, shape, process, verifier = args
    m = model if m == "model" else m
    verifier = VERIFIERS["tv"] if verifier == "tv" else verifier
    with pytest.raises(ValueError, match=rule):
        evaluate(m, shape, process, verifier)


@pytest.mark.parametrize("parent, token, num_nodes, rule", [
    ([[-1, 2, 0]], [[-1, 0, 1]], [3], "tree 0 slot 1 .* parents must precede their children"),   # parent after child
    ([[-1, 0, 0]], [[-1, -4, 1]], [3], "tree 0 slot 1 .* drafted tokens must be ≥ 0"),
    ([[-1, 0, 0]], [[-1, 0, 1]], [5], "tree 0 has num_nodes 5, outside \\[1, N = 3\\]"),
    ([[-1, 2, 1]], [[-1, 0, 1]], [3], "slot 1 .* excludes cycles"),                            # 1 → 2 → 1
    ([[-1, 9, 0]], [[-1, 0, 1]], [3], "slot 1 .* parents out of range"),
    (torch.zeros(0, 3, dtype=torch.long), torch.zeros(0, 3, dtype=torch.long), torch.zeros(0, dtype=torch.long),
     "the batch is empty"),
    ([[-1, 0, 0]], [[-1, 0, 1]], [[3]], "num_nodes must be \\[B\\] = \\[1\\]"),
    ([[-1.0, 0.0]], [[-1, 0]], [2], "parent must be a torch.long tensor"),
])
def test_raw_tree_batch_constructor_checks_the_layout(parent, token, num_nodes, rule):
    as_long = lambda x: x if torch.is_tensor(x) else torch.tensor(x)   # noqa: E731
    with pytest.raises(ValueError, match=rule):
        TreeBatch(as_long(parent), as_long(token), as_long(num_nodes))


def test_probs_from_logits_rejects_rows_without_a_law():
    from gpu import probs_from_logits

    inf = float("inf")
    with pytest.raises(ValueError, match=r"row \[0\] contains \+inf"):
        probs_from_logits(torch.tensor([[inf, 0.0, 0.0]]))
    with pytest.raises(ValueError, match=r"row \[1\] is −inf everywhere"):
        probs_from_logits(torch.tensor([[0.0, 1.0, 2.0], [-inf, -inf, -inf]]), temperature=0.0)
    with pytest.raises(ValueError, match="contains NaN"):
        probs_from_logits(torch.tensor([[float("nan"), 0.0]]))
    # −inf entries with a finite maximum are a valid (masked) row
    assert probs_from_logits(torch.tensor([[0.0, -inf]])).tolist() == [[1.0, 0.0]]


def test_an_exact_row_off_the_simplex_says_by_how_much():
    """The exact-mode message printed the row's sum as what it was 'off by' (and its float, 1)."""
    from fractions import Fraction as F

    from univer_theory import context_free
    row = np.array([F(1, 3), F(1, 3), F(1, 3) + F(1, 10**20)], dtype=object)
    with pytest.raises(ValueError, match=r"off by \+1e-20, exact mode: the sum must be 1 exactly\)"):
        context_free(row, row)


def test_table_model_keys_are_comma_joined_token_ids():
    from univer_theory import TableModel

    row, other = [0.5, 0.5], [0.25, 0.75]
    with pytest.raises(ValueError, match=r"prefix key '10' has token 10, outside \[0, 2\)"):
        TableModel(2, {"": row, "10": other}, {(): row})          # once read as tokens (1, 0)
    with pytest.raises(ValueError, match=r"prefix key \(7,\) has token 7"):
        TableModel(2, {(): row, (7,): other}, {(): row})
    with pytest.raises(ValueError, match="two keys for prefix \\(1, 0\\)"):
        TableModel(2, {(): row, "1,0": other, (1, 0): row}, {(): row})
    with pytest.raises(ValueError, match="must be an integer, got True"):
        TableModel(2, {(): row, (True,): other}, {(): row})
    with pytest.raises(ValueError, match="vocab_size must be an integer ≥ 1, got True"):
        TableModel(True, {(): row}, {(): row})
    m = TableModel(11, {"": np.full(11, 1 / 11), "10": np.eye(11)[10], "1,0": np.eye(11)[3]}, {(): np.full(11, 1 / 11)})
    assert m.target((10,))[10] == 1 and m.target((1, 0))[3] == 1 and m.target((0, 1))[0] == 1 / 11


def test_build_plan_checks_its_node_inputs():
    from univer_theory.plans.choose import build_plan

    for construction, process in (("greedy_fill", "greedy"), ("tv", "iid"), ("auto", "wor")):
        with pytest.raises(ValueError, match=r"build_plan: target_probs sums to 1.2"):
            build_plan(construction, np.array([0.5, 0.7]), np.array([0.5, 0.5]), 1.0, 2, process)
        with pytest.raises(ValueError, match="NaN"):
            build_plan(construction, np.array([np.nan, 1.0]), np.array([0.5, 0.5]), 1.0, 2, process)


def test_complex_rows_are_rejected():
    """Complex rows were cast to float with a ComplexWarning, dropping the imaginary part."""
    from univer_theory import alpha_star

    with pytest.raises(ValueError, match="alpha_star: target_probs must be real numbers, got dtype complex128"):
        alpha_star(np.array([0.5 + 0.3j, 0.5 - 0.3j]), np.array([0.25, 0.75]), 2, "iid")


def test_shapes_models_and_model_files_past_their_range():
    """A shape spec of ~10⁹ nodes was built node by node until the memory ran out (`univer exact` exited 1 with a
    MemoryError); a model-file entry "1e999999999" never loaded (Fraction built a 10⁹-digit integer); model
    arguments that make no law (concentration = inf, a NaN temperature, exact rows with denominator 0) gave NaN or
    float rows; context_free on scalars raised IndexError.  All ValueErrors now."""
    from gpu.llm.tree_draft import tree_shape
    from univer_theory import ConfidentModel, DirichletModel, TemperedModel, apply_temperature, context_free

    for spec in ("1000,1000,1000", "binary:64", "eagle:60"):
        with pytest.raises(ValueError, match="beyond the 1048576 a shape may have"):
            tree_shape(spec)
    assert tree_shape("binary:4").num_nodes == 31
    with pytest.raises(ValueError, match="'binary:²' needs a positive depth"):        # int("²") raised bare
        tree_shape("binary:²")
    with pytest.raises(ValueError, match="branching must be a non-empty list of positive ints"):   # was 2
        TreeShape.uniform([2.5])
    for bad, match in ((lambda: DirichletModel(3, concentration=float("inf")), "concentration must be finite"),
                       (lambda: ConfidentModel(3, concentration=float("inf")), "concentration must be finite"),
                       (lambda: apply_temperature(np.array([0.5, 0.5]), float("nan")), "temperature must be finite"),
                       (lambda: TemperedModel(DirichletModel(3), float("nan")), "temperature must be finite"),
                       (lambda: DirichletModel(3, exact=True, denominator=0),
                        r"denominator \(exact=True\) must be an integer ≥ 1"),
                       (lambda: context_free(0.5, 0.5), "must be rows \\[V\\]")):
        with pytest.raises(ValueError, match=match):
            bad()


def test_a_model_file_entry_past_the_float_range_is_refused(tmp_path, capsys):
    import json

    from univer.cli import main

    path = tmp_path / "model.json"
    for entry in ("1e999999999", "1e-999999999", "1e309", "1e400"):  # 1e309: a Fraction, a float OverflowError
        path.write_text(json.dumps({"vocab": 2, "target": {"": [entry, 0]}, "draft": {"": [0.5, 0.5]}}))
        assert main(["exact", "--model-file", str(path), "--shape", "1"]) == 2
        assert "beyond 1e±400, or a float's range" in capsys.readouterr().err


def test_probs_from_logits_past_the_float_range():
    """Finite logits whose ``logits / T`` overflows (T = 1e-40 in float32, 1e308 at T = 0.5) gave NaN rows: they are
    shifted by the row's largest logit first; T = inf (NaN rows with any −inf logit) and a bad ``top`` at T = 0 (then
    ignored) are ValueErrors."""
    import math

    from gpu.probs import probs_from_logits

    for logits, T in ((torch.tensor([[1.0, 2.0, 3.0]]), 1e-40), (torch.tensor([[3e38, 0.0]]), 0.5),
                      (torch.tensor([[1e308, 0.0]], dtype=torch.float64), 0.5), (torch.tensor([[-3e38, 3e38]]), 1.0)):
        out = probs_from_logits(logits, T)
        assert torch.equal(out, torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(out.dtype))
    mild = torch.tensor([[0.5, -1.0, 2.0]])
    wide = mild.double()         # rows in range: float64 as before; float32 within its rounding of (z − max z)/T
    assert torch.equal(probs_from_logits(wide, 0.7), torch.softmax(wide / 0.7, -1))
    assert torch.allclose(probs_from_logits(mild, 0.7).double(), torch.softmax(wide / 0.7, -1), rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="temperature must be finite"):
        probs_from_logits(torch.tensor([[0.0, -math.inf, 1.0]]), math.inf)
    for top in (0, -3, "x"):
        with pytest.raises(ValueError, match="top must be a positive int"):
            probs_from_logits(mild, 0.0, top)


def test_public_helpers_check_their_arguments():
    """A fuzzing campaign's finds: ``tuple_law`` gave an empty law for a NaN row and a law of mass 4 for an
    unnormalised one, ``sample_children`` drew from a NaN row; a float ``vocab_size`` / ``seed`` / ``k`` was
    truncated without a word, a string one was a TypeError, ``rng=0`` an AttributeError, and
    ``DraftTree(vocab_size=0)`` said ``outside [0, ∞)``."""
    from univer_theory import DirichletModel, DraftTree, sample_children, sample_tree, tuple_law
    from univer_theory.alpha_star import alpha_star

    rng = np.random.default_rng(0)
    model = DirichletModel(3, seed=0)
    half = np.array([0.5, 0.5])
    for bad, match in (
            (lambda: tuple_law(np.array([np.nan, 0.5]), 2, "wor"), "tuple_law: the draft row q contains NaN"),
            (lambda: tuple_law(np.array([2.0, 2.0]), 1, "iid"), "tuple_law: the draft row q sums to 4"),
            (lambda: tuple_law(np.array([1.5, -0.5]), 1, "iid"), "tuple_law: the draft row q has a negative"),
            (lambda: tuple_law(np.full((2, 2), 0.5), 1, "iid"), r"must be one row \[V\], got shape \(2, 2\)"),
            (lambda: tuple_law(half, 2.0, "iid"), "tuple_law: number of children k must be an integer ≥ 1, got 2.0"),
            (lambda: sample_children(np.array([np.nan, 0.5, 0.5]), 2, "wor", rng), "sample_children: the draft row"),
            (lambda: sample_children(half, 1, "iid", 0), "sample_children: rng must be a numpy Generator"),
            (lambda: sample_tree(model, "2", "wor", 0), r"sample_tree: rng must be a numpy Generator \(.*\), got int"),
            (lambda: sample_tree(half, "2", "wor", rng), "sample_tree: model must be a univer_theory Model"),
            (lambda: DirichletModel("3"), "DirichletModel: vocab_size must be an integer ≥ 2, got '3'"),
            (lambda: DirichletModel(2.5), "vocab_size must be an integer ≥ 2, got 2.5"),
            (lambda: DirichletModel(3, seed=1.5), "DirichletModel: seed must be an integer ≥ 0, got 1.5"),
            (lambda: DirichletModel(3, seed=-1), "seed must be an integer ≥ 0, got -1"),
            (lambda: alpha_star(half, half, 2.0, "iid"), "k must be an integer ≥ 1, got 2.0"),
            (lambda: DraftTree((-1, 0), (-1, 0), vocab_size=0), r"vocab_size must be ≥ 1, got 0"),
            (lambda: TreeBatch.from_tensors([[-1, 0]], [[-1, 1]], vocab_size="3"), "vocab_size must be an integer"),
            (lambda: TreeBatch.from_tensors([[-1, 0]], [[-1, 1]], vocab_size=2.5), "got 2.5"),
            (lambda: TreeBatch.from_tensors([[-1, 0]], [[-1, 1]], vocab_size=True), "got True")):
        with pytest.raises(ValueError, match=match):
            bad()
    assert sum(pr for _, pr in tuple_law(np.array([0.25, 0.75]), 2, "iid")) == 1.0
    assert len(sample_tree(model, "2,1", "wor", rng).token) == 5
    assert sample_tree(model, "2", "topk", None).token[1:] == tuple(int(i) for i in np.argsort(-model.draft(()))[:2])
