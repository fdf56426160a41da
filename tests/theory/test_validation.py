"""Bad input raises ValueError naming what is wrong."""
from fractions import Fraction as F

import numpy as np
import pytest

from univer_theory import VERIFIERS, DirichletModel, DraftTree, TableModel, TreeShape, tuple_law

TREE = DraftTree(parent=(-1, 0, 0), token=(-1, 0, 1), vocab_size=3)
GOOD = np.full((3, 3), 1 / 3)


@pytest.mark.parametrize("target,draft,match", [
    (np.where(np.eye(3, dtype=bool), np.nan, 0.5), GOOD, "NaN"),
    (np.array([[1.2, -0.2, 0.0]] * 3), GOOD, "negative"),
    (np.full((3, 3), 0.3), GOOD, "sums to 0.9"),
    (np.array([[0.5, 0.5 + 1e-8, 0.0]] * 3), GOOD, r"off by \+1e-08, tolerance 1e-09"),   # SIMPLEX_ATOL = 1e-9
    (np.array([[0.5, 0.5 + 1e-10, 0.0]] * 3), GOOD, None),                                # within it: fine
    (np.array([[True, F(0), F(0)]] * 3, dtype=object), np.full((3, 3), F(1, 3), dtype=object), "with bool"),
    (GOOD, np.array([[0.0, 0.5, 0.5]] + [[1 / 3] * 3] * 2), r"draft_probs\[0, 0\] = 0"),
    (np.full((3, 4), 0.25), np.full((3, 4), 0.25), None),   # V = 4 > tokens: fine
    (GOOD, np.full((3, 4), 0.25), "disagree"),
    (np.full((2, 3), 1 / 3), np.full((2, 3), 1 / 3), "3 nodes"),
])
def test_bad_rows(target, draft, match):
    if match is None:
        VERIFIERS["tv"].law(TREE, target, draft, "iid")
        return
    with pytest.raises(ValueError, match=match):
        VERIFIERS["tv"].law(TREE, target, draft, "iid")


def test_token_out_of_vocab():
    tree = DraftTree(parent=(-1, 0), token=(-1, 5))
    with pytest.raises(ValueError, match="token 5"):
        VERIFIERS["rrs"].law(tree, np.full((2, 3), 1 / 3), np.full((2, 3), 1 / 3), "iid")


@pytest.mark.parametrize("parent,token,match", [
    ((), (), "empty"),
    ((0, 0), (-1, 1), "root"),
    ((-1, 2, 0), (-1, 0, 1), "node 1 has parent 2"),
    ((-1, 0, -1), (-1, 0, 1), "node 2 has parent -1"),
    ((-1, 0), (-1,), "token has 1 entries"),
    ((-1, 0), (-1, 7), "outside"),
    ((-1, 0.5), (-1, 1), r"parent\[1\] must be an integer, got 0.5"),
    ((-1, 0), (-1, True), r"token\[1\] must be an integer, got True"),
    ((-1, 0), (-1, np.bool_(True)), r"token\[1\] must be an integer"),
    ((-1, 0), (-1, 1.0), r"token\[1\] must be an integer, got 1.0"),
])
def test_malformed_tree(parent, token, match):
    with pytest.raises(ValueError, match=match):
        DraftTree(parent=parent, token=token, vocab_size=3)


@pytest.mark.parametrize("text,match", [
    ("((.)", "balanced"), ("2,x", "cannot read"), ("0", "positive"), ("(,,.)", "comma at position 1"),
    ("(.,)", "does not separate two children"), ("(.,,.)", "comma at position 2"), ("((),.)", "empty '\\(\\)'")])
def test_bad_shape(text, match):
    with pytest.raises(ValueError, match=match):
        TreeShape.parse(text)


def test_process_mismatches():
    p = np.full((3, 3), 1 / 3)
    dup = DraftTree(parent=(-1, 0, 0), token=(-1, 1, 1), vocab_size=3)
    with pytest.raises(ValueError, match="duplicate children"):
        VERIFIERS["rrsw"].law(dup, p, p, "wor")
    with pytest.raises(NotImplementedError, match="processes"):
        VERIFIERS["rrs"].law(TREE, p, p, "wor")
    with pytest.raises(ValueError, match="unknown process"):
        VERIFIERS["tv"].law(TREE, p, p, "beam")
    with pytest.raises(ValueError, match="only 2 tokens"):
        tuple_law(np.array([0.5, 0.5, 0.0]), 3, "wor")
    q = np.array([[0.5, 0.3, 0.2]] * 3)
    not_top = DraftTree(parent=(-1, 0, 0), token=(-1, 0, 2), vocab_size=3)
    with pytest.raises(ValueError, match="top-2"):
        VERIFIERS["nss"].law(not_top, p, q, "topk")


def test_chain_only_and_rational_guards():
    p = np.full((3, 3), 1 / 3)
    with pytest.raises(NotImplementedError, match="chains only"):
        VERIFIERS["bv"].law(TREE, p, p, "iid")
    exact = np.array([[F(1, 3)] * 3] * 3, dtype=object)
    with pytest.raises(NotImplementedError, match="rational"):
        VERIFIERS["kseq"].law(TREE, exact, exact, "iid")


def test_mixed_exact_and_float_rejected():
    exact = np.array([[F(1, 3)] * 3] * 3, dtype=object)
    with pytest.raises(ValueError, match="both be exact"):
        VERIFIERS["tv"].law(TREE, exact, np.full((3, 3), 1 / 3), "iid")


def test_model_tables_validated(tmp_path):
    with pytest.raises(ValueError, match="root row"):
        TableModel(2, {(0,): [0.5, 0.5]}, {(): [0.5, 0.5]})
    with pytest.raises(ValueError, match="length 3, expected vocab 2"):
        TableModel(2, {(): [0.2, 0.3, 0.5]}, {(): [0.5, 0.5]})
    bad = tmp_path / "m.json"
    bad.write_text('{"vocab": 2, "target": {"": [0.5, 0.6]}, "draft": {"": [0.5, 0.5]}}')
    with pytest.raises(ValueError, match="sums to 1.1"):
        TableModel.from_json(bad)
    with pytest.raises(ValueError, match="similarity"):
        DirichletModel(3, similarity=1.5)
