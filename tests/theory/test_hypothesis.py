"""Property tests: random simplex points (with exact zeros and near-zeros) and random small trees."""
import numpy as np
from hypothesis import given, strategies as st

from univer_theory import (LOSSLESS_TOL, VERIFIERS, TableModel, TreeShape, evaluate,
                           sample_tree)


#: Tail masses of confident rows (one token holds all but d), down to a subnormal scale.
CONFIDENT_TAILS = (1e-8, 1e-12, 1e-16, 1e-300, 1e-308, 1e-310)


@st.composite
def simplex(draw, V, min_support=1):
    """A probability vector with some exact zeros and some tiny entries, at least ``min_support`` positive; or
    (one draw in four) a confident row: one token holds ``1 − d``, the others share d (``CONFIDENT_TAILS``)."""
    if draw(st.integers(0, 3)) == 0:
        top, d = draw(st.integers(0, V - 1)), draw(st.sampled_from(CONFIDENT_TAILS))
        shares = np.array([draw(st.floats(0.05, 1.0)) for _ in range(V - 1)])
        row = np.zeros(V)
        row[np.arange(V) != top] = d * shares / shares.sum()
        row[top] = 1.0 - row.sum()
        return row
    kinds = draw(st.lists(st.sampled_from(["zero", "tiny", "normal"]), min_size=V, max_size=V))
    raw = np.array([0.0 if k == "zero" else (1e-9 if k == "tiny" else draw(st.floats(0.05, 1.0)))
                    for k in kinds])
    positive = np.flatnonzero(raw > 0)
    for x in range(V):
        if positive.size >= min_support:
            break
        if raw[x] == 0:
            raw[x] = draw(st.floats(0.05, 1.0))
            positive = np.flatnonzero(raw > 0)
    return raw / raw.sum()


@st.composite
def small_shape(draw):
    """A random tree skeleton with ≤ 5 drafted nodes and ≤ 3 children per node."""
    parent, frontier = [-1], [0]
    while frontier and len(parent) < 6:
        u = frontier.pop(0)
        for _ in range(draw(st.integers(0 if u else 1, 3))):
            if len(parent) < 6:
                parent.append(u)
                frontier.append(len(parent) - 1)
    return TreeShape(tuple(parent))


@st.composite
def instance(draw):
    V = draw(st.integers(2, 4))
    shape = draw(small_shape())
    kmax = shape.max_children
    process = draw(st.sampled_from(["iid", "wor"] if kmax <= V else ["iid"]))
    prefixes = [()] + [(x,) for x in range(V)]
    target = {s: draw(simplex(V)) for s in prefixes}
    draft = {s: draw(simplex(V, min_support=kmax)) for s in prefixes}
    return TableModel(V, target, draft), shape, process


@given(instance())
def test_random_instances_are_lossless(inst):
    model, shape, process = inst
    for v in VERIFIERS.values():
        if v.supports(shape, process):
            r = evaluate(model, shape, process, v)
            assert r.distance <= LOSSLESS_TOL, (v.name, str(shape), process, r.distance)


@given(instance(), st.integers(0, 2**32 - 1))
def test_random_trees_expected_length_matches_law(inst, seed):
    """Per tree, the analytic E[τ | T] equals the mean path length of the exact law."""
    model, shape, process = inst
    tree = sample_tree(model, shape, process, np.random.default_rng(seed))
    p, q = model.node_probs(tree)
    for v in VERIFIERS.values():
        if v.supports(shape, process):
            law = v.law(tree, p, q, process)
            assert abs(sum(law.values()) - 1) < 1e-12
            mean = sum((len(k) - 1) * pr for k, pr in law.items())
            assert abs(v.expected_accepted_length(tree, p, q, process) - mean) < 1e-12
