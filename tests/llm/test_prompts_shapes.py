"""Vendored prompts and tree-shape specs (no model needed)."""
from collections import Counter

import pytest

from gpu.llm.prompts import PROMPT_DIR, load_prompts
from gpu.llm.tree_draft import MAX_DECODE_NODES, check_decode_shape, tree_shape
from univer_theory import TreeShape, eagle_like_shape


def test_prompt_sets_and_licenses():
    mt = load_prompts("mtbench")
    assert len(mt) == 80 and len({p.id for p in mt}) == 80
    assert Counter(p.category for p in mt) == {c: 10 for c in
                                               ("writing", "roleplay", "reasoning", "math", "coding",
                                                "extraction", "stem", "humanities")}
    he = load_prompts("humaneval")
    assert len(he) == 164 and all(p.category == "humaneval" and "def " in p.text for p in he)
    assert len(load_prompts("all")) == 244
    assert "Apache License" in (PROMPT_DIR / "mt_bench" / "LICENSE").read_text()
    assert "MIT License" in (PROMPT_DIR / "humaneval" / "LICENSE").read_text()


def test_limit_is_round_robin_over_categories():
    first8 = load_prompts("mtbench", 8)
    assert len({p.category for p in first8}) == 8
    assert load_prompts("mtbench", 3) == first8[:3]
    assert {p.category for p in load_prompts("all", 9)} == {p.category for p in load_prompts("all")}
    with pytest.raises(ValueError, match="unknown prompt set"):
        load_prompts("gsm8k")
    with pytest.raises(ValueError, match="limit"):
        load_prompts("mtbench", 0)


def test_tree_shape_specs():
    assert tree_shape("binary:3") == TreeShape.uniform([2, 2, 2])
    assert tree_shape("chain:4").is_chain and tree_shape("chain:4").num_nodes == 5
    assert tree_shape("((..),.)") == TreeShape.parse("((..),.)")
    assert tree_shape("eagle") == eagle_like_shape(4)
    # at most MAX_DECODE_NODES nodes: the bound itself is a decoding tree, one node more is not
    assert tree_shape(f"chain:{MAX_DECODE_NODES - 1}").num_nodes == MAX_DECODE_NODES
    assert check_decode_shape(TreeShape.uniform([MAX_DECODE_NODES - 1]), "t").num_nodes == MAX_DECODE_NODES
    with pytest.raises(ValueError, match=f"beyond the {MAX_DECODE_NODES}"):
        tree_shape(f"chain:{MAX_DECODE_NODES}")
    for bad in ("binary:0", "chain:x", "eagle:-1", "ternary:2"):
        with pytest.raises(ValueError, match=f"^TreeShape.parse: .*'{bad}'"):
            tree_shape(bad)


@pytest.mark.parametrize("width", [1, 3, 4])
def test_eagle_like_shape_follows_its_rule(width):
    shape = eagle_like_shape(width)
    for u in range(shape.num_nodes):
        kids = shape.children[u]
        if u == 0:
            assert len(kids) == width
            continue
        rank = shape.children[shape.parent[u]].index(u)
        assert len(kids) == max(0, width - shape.depth[u] - rank)
    assert shape.max_depth == width
