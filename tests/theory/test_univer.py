"""UniVer (theory.md §6): lossless with every construction, α*-optimal per node, BV on chains, α* at depth 1,
above TV; the verifier's bookkeeping (info, registry, options)."""
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from paper_checks.base import law_distance
from solvers.condot import condot_value
from univer_theory import (LOSSLESS_TOL, VERIFIERS, DirichletModel, DraftTree, TreeShape, context_free,
                           distance_to_target, enumerate_trees, evaluate, make_univer_verifier, output_law,
                           sample_tree, to_fractions)
from univer_theory import univer
from univer_theory.alpha_star import alpha_star
from univer_theory.plans import shape_lp
from univer_theory.plans.choose import build_plan
from univer_theory.validation import Unsupported

from ..threads import in_threads

SHAPES = ["1,1,1", "2,2", "3,1", "2,1,2", "((..),.)"]
CONSTRUCTIONS = {"layout": ("iid",), "lp": ("iid", "wor"), "tv": ("iid", "wor"), "auto": ("iid", "wor")}
VERIFIER = {c: make_univer_verifier(c) for c in CONSTRUCTIONS}

CASES = [(V, shape, process, c) for V in (3, 4) for shape in SHAPES for c, procs in CONSTRUCTIONS.items()
         for process in procs if not (V == 4 and shape == "2,1,2" and c != "auto")]
CASES += [(V, "(((..),.),.)", process, "auto") for V in (3, 4) for process in ("iid", "wor")]   # shape rule twice


@pytest.mark.parametrize("V,shape,process,construction", CASES,
                         ids=[f"V{v}-{s}-{p}-{c}" for v, s, p, c in CASES])
def test_lossless_every_construction(V, shape, process, construction):
    model = DirichletModel(V, seed=V, similarity=0.4, concentration=0.8)
    r = evaluate(model, TreeShape.parse(shape), process, VERIFIER[construction])
    assert r.distance <= LOSSLESS_TOL, f"{construction} {shape} {process}: distance {r.distance}"


@st.composite
def pair(draw):
    """Context-free (p, q) on V = 3: zeros in p with a full-support q, or q = p (α = 1 nodes)."""
    raw = st.lists(st.integers(0, 6), min_size=3, max_size=3)
    p = np.array(draw(raw), dtype=float) + np.array([1.0, 0.0, 0.0])
    if draw(st.booleans()):
        p = p + 1.0
        q = p.copy()
    else:
        q = np.array(draw(raw), dtype=float) + 1.0
    return p / p.sum(), q / q.sum()


@given(pair(), st.sampled_from(["2,2", "3,1", "((..),.)"]), st.sampled_from(["iid", "wor"]))
def test_lossless_drawn_distributions(pq, shape, process):
    """Zeros in p make ρ = 0 paths below rejected tokens; q = p gives α = 1 nodes; iid gives duplicates."""
    model = context_free(*pq)
    r = evaluate(model, TreeShape.parse(shape), process, VERIFIER["auto"])
    assert r.distance <= LOSSLESS_TOL


def test_alpha_one_and_rho_zero_nodes_are_met():
    """The drawn-distribution test's corner cases occur: q = p gives α = 1 at the root; a token with p = 0
    drafted under q > 0 hands its child ρ = 0."""
    p = np.array([0.5, 0.5, 0.0])
    q = np.array([0.4, 0.3, 0.3])
    tree = DraftTree.from_shape(TreeShape.parse("2,2"), (2, 0, 1, 0, 1, 1), vocab_size=3)
    pp, qq = np.tile(p, (tree.num_nodes, 1)), np.tile(q, (tree.num_nodes, 1))
    trace = VERIFIER["auto"].trace(tree, pp, qq, "iid")
    assert trace[1]["rho"] == 0
    same = VERIFIER["auto"].trace(tree, np.tile(q, (tree.num_nodes, 1)), qq, "iid")
    assert abs(same[0]["alpha"] - 1) <= 1e-15


@pytest.mark.parametrize("construction,process,shape", [("layout", "iid", "((..),.)"), ("lp", "iid", "2,2"),
                                                        ("lp", "wor", "((..),.)"), ("auto", "wor", "3,1"),
                                                        ("auto", "iid", "(((..),.),.)"), ("auto", "wor", "((..),.)")])
def test_every_node_attains_alpha_star(construction, process, shape):
    """At every internal node of sampled trees, α == α*(ρ) (CondOT LP, 1e-9) for rules 1 and 2 and the shape
    rule (``auto`` on asymmetric shapes at V = 4)."""
    model = DirichletModel(4, seed=7, similarity=0.4, concentration=0.8)
    rng = np.random.default_rng(0)
    v = VERIFIER[construction]
    checked = shaped = 0
    for _ in range(6):
        tree = sample_tree(model, TreeShape.parse(shape), process, rng)
        p, q = model.node_probs(tree)
        for row in v.trace(tree, p, q, process):
            u = row["node"]
            if tree.children[u]:
                lp = condot_value(p[u], q[u], float(row["rho"]), len(tree.children[u]), process)
                assert abs(row["alpha"] - lp) <= 1e-9, (row, lp)
                checked += 1
                shaped += row["construction"] == "shape_lp"
    assert checked >= 6
    assert shaped or construction != "auto" or shape.startswith("3")


@pytest.mark.parametrize("process", ["iid", "wor"])
def test_chain_equals_block_verification(process):
    """k = 1 everywhere: UniVer's per-tree law == BV's (1e-12) on every chain of length 3."""
    model = DirichletModel(3, seed=5, similarity=0.3)
    for tree, _ in enumerate_trees(model, TreeShape.parse("1,1,1"), process):
        p, q = model.node_probs(tree)
        a = VERIFIER["auto"].law(tree, p, q, process)
        b = VERIFIERS["bv"].law(tree, p, q, process)
        assert law_distance(a, b) <= 1e-12


@pytest.mark.parametrize("process,construction,k", [("iid", "layout", 3), ("iid", "auto", 2), ("wor", "lp", 3),
                                                    ("wor", "auto", 2), ("topk", "auto", 2), ("greedy", "auto", 3)])
def test_depth_one_acceptance_is_alpha_star(process, construction, k):
    model = DirichletModel(5, seed=2, similarity=0.4)
    r = evaluate(model, TreeShape.parse(str(k)), process, VERIFIER.get(construction) or make_univer_verifier())
    assert r.distance <= LOSSLESS_TOL
    assert abs(r.expected_accepted - alpha_star(model.target(()), model.draft(()), k, process)) <= 1e-9


def test_mean_ordering_rrs_tv_univer():
    """Mean E[τ] over a small grid: RRS(w) ≤ TV ≤ UniVer."""
    rows = []
    for seed in range(3):
        model = DirichletModel(3, seed=seed, similarity=0.4, concentration=0.8)
        for shape in ("2,2", "3,1"):
            for process, base in (("iid", "rrs"), ("wor", "rrsw")):
                sh = TreeShape.parse(shape)
                rows.append([evaluate(model, sh, process, VERIFIERS[n]).expected_accepted
                             for n in (base, "tv", "univer")])
    rrs, tv, uni = np.mean(rows, axis=0)
    assert rrs <= tv + 1e-12 and tv <= uni + 1e-12, (rrs, tv, uni)


@pytest.mark.parametrize("shape", ["((..),.)", "((.,(..)),.)", "(((..),.),.)"])
@pytest.mark.parametrize("process", ["iid", "wor"])
def test_univer_beats_tv_per_instance(shape, process):
    for seed in range(3):
        model = DirichletModel(3, seed=seed, similarity=0.4, concentration=0.8)
        sh = TreeShape.parse(shape)
        u = evaluate(model, sh, process, VERIFIERS["univer"])
        tv = evaluate(model, sh, process, VERIFIERS["tv"])
        assert u.lossless
        assert u.expected_accepted >= tv.expected_accepted - 1e-12, (seed, u, tv)


@pytest.mark.parametrize("V,shape", [(5, "((..),.)"), (3, "(((..),.),.)")])
def test_shape_rule_lifts_univer_above_tv_where_the_slot_rule_falls_below(V, shape):
    """Peaky instances of the optimality grid where the slot rule alone ends below TV; the shape rule (same
    α*(ρ) at every node, another plan on the α*-face) ends above it."""
    model = DirichletModel(V, seed=0, similarity=0.5, concentration=0.2)
    sh = TreeShape.parse(shape)
    tv = evaluate(model, sh, "iid", VERIFIERS["tv"]).expected_accepted
    slot_only = evaluate(model, sh, "iid", make_univer_verifier(shape_rule=False)).expected_accepted
    shaped = evaluate(model, sh, "iid", VERIFIERS["univer"])
    assert slot_only < tv - 1e-3 < shaped.expected_accepted - 1e-3
    assert shaped.lossless and shaped.plans.get("shape_lp", 0) > 0


def test_trace_records_construction_shape_rule_and_slot_rule():
    """Root of ((..),.) has different subtrees at its positions: the shape rule on a small support, the slot
    rule when the shape rule is off; node 1's children are two leaves (equal subtrees): neither."""
    model = DirichletModel(4, seed=1)
    tree = sample_tree(model, TreeShape.parse("((..),.)"), "wor", np.random.default_rng(3))
    p, q = model.node_probs(tree)
    trace = VERIFIERS["univer"].trace(tree, p, q, "wor")
    assert trace[0]["construction"] == "shape_lp" and trace[0]["slot_rule"] is False
    assert trace[1]["construction"] in ("wor_pair", "pts", "iid_coupling", "lp", "unreached")
    assert trace[1]["slot_rule"] is False
    trace = make_univer_verifier(shape_rule=False).trace(tree, p, q, "wor")
    assert trace[0]["construction"] in ("wor_pair", "pts", "iid_coupling", "lp") and trace[0]["slot_rule"] is True
    assert trace[1]["slot_rule"] is False
    assert all(0 <= row["alpha"] <= row["rho"] + 1e-12 for row in trace if "alpha" in row)


@pytest.mark.parametrize("process, shape", [("wor", "2,1"), ("iid", "2,2")])
def test_tv_construction_is_exact_in_fractions(process, shape):
    """Rule 6 without the slot rule is rational: the output law is exactly the target law — i.i.d. too, whose
    closed-form marginal runs TV's state (r, P) at ρ < 1 below the root (derived by hand at ρ = 1/2:
    p = (1/2, 1/3, 1/6), q = (1/6, 1/3, 1/2), k = 2: child 1 takes min(q, ρp) = (1/6, 1/6, 1/12), TV's residual
    after it is [ρp − q]_+ = (1/12, 0, 0) with r = (1/12)/(1/12 + 1/2) = 1/7, so child 2 adds (1 − 5/12)·q·min(1,
    r·P/q) = (7/12)(1/7, 0, 0) = (1/12, 0, 0): a = (1/4, 1/6, 1/12) = ρp)."""
    from univer_theory.plans.tv_plan import tv_plan
    model = DirichletModel(3, seed=2 if process == "wor" else 1, similarity=0.3, exact=True)
    v = make_univer_verifier("tv", slot_rule=False)
    law = output_law(model, TreeShape.parse(shape), process, v)
    assert sum(law.values()) == 1
    assert distance_to_target(model, law, TreeShape.parse(shape).max_depth + 1) == 0
    assert isinstance(next(iter(law.values())), Fraction)
    F = Fraction
    plan = tv_plan(np.array([F(1, 2), F(1, 3), F(1, 6)], dtype=object),
                   np.array([F(1, 6), F(1, 3), F(1, 2)], dtype=object), F(1, 2), 2, "iid")
    assert list(plan.marginal) == [F(1, 4), F(1, 6), F(1, 12)]


def test_options_and_bad_input():
    with pytest.raises(ValueError, match="construction"):
        make_univer_verifier("simplex")
    tree = DraftTree.from_shape(TreeShape.parse("2"), (0, 1), vocab_size=3)
    p = np.full((3, 3), 1 / 3)
    with pytest.raises(Unsupported):
        VERIFIER["layout"].law(tree, p, p, "wor")
    with pytest.raises(Unsupported, match="construction 'wor_pair' gives no plan for process 'iid', k = 2"):
        build_plan("wor_pair", p[0], p[0], 1.0, 2, "iid")
    q = np.tile([0.5, 0.5, 0.0], (3, 1))
    with pytest.raises(ValueError, match="draft_probs"):
        VERIFIERS["univer"].law(DraftTree.from_shape(TreeShape.parse("2"), (0, 2), vocab_size=3), p, q, "iid")
    with pytest.raises(Unsupported, match="rational"):
        exact = np.array([to_fractions(row) for row in p])
        VERIFIERS["univer"].law(tree, exact, exact, "iid")


def test_tv_plan_checks_its_inputs():
    """Rule 6 called directly took ρ = 1.5 (α = 1), ρ = −0.5 (a negative marginal), p summing to 2 and k = 0
    silently; it checks its inputs as every construction does, and Fraction rows stay exact."""
    from fractions import Fraction

    from univer_theory.plans.tv_plan import tv_plan

    p, q = np.array([0.2, 0.3, 0.5]), np.array([0.5, 0.3, 0.2])
    for args, match in (((p, q, 1.5, 2, "wor"), "rho"), ((p, q, -0.5, 2, "iid"), "rho"),
                        ((2 * p, q, 1.0, 2, "iid"), "target_probs"), ((p, q, 1.0, 0, "iid"), "k"),
                        ((p, q, 1.0, 2.5, "iid"), "k"), ((np.r_[p, 0.0], q, 1.0, 2, "iid"), "")):
        with pytest.raises(ValueError, match=f"^tv_plan: .*{match}"):
            tv_plan(*args)
    exact = tv_plan(to_fractions(p), to_fractions(q), Fraction(1), 2, "wor")
    assert isinstance(exact.alpha, Fraction)


def test_the_slot_rule_keeps_a_pair_whose_probability_underflows():
    """A drafted token of q = 4e-323: the pair (1, 0) has float probability 0 where (0, 1) has 5e-324, and the k = 2
    slot rule divided 0/0 — the exact core and the batched path raised "scale nan" on a valid tree; the pair
    carries no mass, so the plan's own weights stand and E[τ | T] is the same with and without the slot rule."""
    import torch

    from gpu import TreeBatch, expected_accepted_length

    V = 30
    q = np.full(V, 0.94 / (V - 2))
    q[0], q[1] = 0.06, 4e-323
    P = np.random.default_rng(0).dirichlet(np.ones(V), 4)
    P[0] = np.r_[0.3, 0.3, np.full(V - 2, 0.4 / (V - 2))]
    Q = np.tile(q, (4, 1))
    tree = DraftTree(parent=(-1, 0, 0, 1), token=(-1, 1, 0, 3))       # root children (1, 0), unequal subtrees
    plain = make_univer_verifier(slot_rule=False).expected_accepted_length(tree, P, Q, "wor")
    assert VERIFIERS["univer"].expected_accepted_length(tree, P, Q, "wor") == pytest.approx(plain, abs=1e-15)
    got = expected_accepted_length(TreeBatch.from_trees([tree]), torch.tensor(P)[None], torch.tensor(Q)[None], "wor",
                                   "univer")
    assert float(got) == pytest.approx(plain, abs=1e-15)


def test_shape_rule_applies_only_to_small_asymmetric_float_nodes():
    q = np.full(4, 0.25)
    assert shape_lp.applies(q, ("(..)", "."), "iid") and shape_lp.applies(q, ("(..)", "."), "wor")
    assert not shape_lp.applies(q, (".", "."), "iid")                    # symmetric: any α*-plan position
    assert not shape_lp.applies(q, ("(..)", "."), "topk")                # not an iid / wor tuple law
    assert not shape_lp.applies(to_fractions(q), ("(..)", "."), "iid")   # rational mode stays exact
    assert not shape_lp.applies(q, ("(..)", ".", ".", ".", "."), "wor")    # 5 distinct children from 4 tokens
    big = np.full(30, 1 / 30)                                               # 30² tuples > MAX_TUPLES
    assert 30 ** 2 > shape_lp.MAX_TUPLES and not shape_lp.applies(big, ("(..)", "."), "iid")
    assert shape_lp.within_limits(22, 2, "iid") and not shape_lp.within_limits(23, 2, "iid")   # 484 vs 529
    assert shape_lp.within_limits(9, 3, "wor") and not shape_lp.within_limits(10, 3, "wor")    # 504 vs 720
    assert shape_lp.position_weights(["((..),.)", ".", "(.)"]) == (6, 2, 3)                # 1 + subtree size


def test_stop_is_one_when_the_node_accepts_everything():
    """f = (ρ − α)/(1 − α) tends to 1 as α → 1 at ρ = 1; α ≥ 1 (exactly, or by round-off) gives 1 as well, so
    the exact core and the torch rule agree whichever side of 1 their sums land."""
    from univer_theory.plans.base import NodePlan

    p = np.array([0.5, 0.5])
    plan = lambda a, rho=1.0: NodePlan("test", rho, p, np.asarray(a), lambda S: None)
    assert plan([0.5, 0.5 + 2e-16]).stop == 1 and plan([0.5, 0.5]).stop == 1
    assert plan([0.5, 0.5 - 1e-9]).stop == pytest.approx(1.0)
    assert plan([Fraction(1, 2), Fraction(1, 2)], Fraction(1)).stop == 1
    assert plan([0.1, 0.2], 0.5).stop == pytest.approx((0.5 - 0.3) / 0.7)


@pytest.mark.parametrize("process", ["topk", "greedy"])
def test_closed_form_fill_plans_attain_alpha_star(process):
    """topk / greedy plans (closed forms) against the CondOT LP on random rows with zeros and several ρ."""
    from univer_theory.plans.choose import choose_plan

    rng = np.random.default_rng(3)
    for _ in range(40):
        V = int(rng.integers(3, 8))
        k = int(rng.integers(2, V + 1))
        p, q = rng.dirichlet(np.ones(V) * rng.choice([0.3, 1, 4])), rng.dirichlet(np.ones(V) * rng.choice([0.3, 1, 4]))
        p[rng.integers(V)] = 0
        p /= p.sum()
        rho = float(rng.choice([1.0, 0.6, 0.1, 0.0]))
        plan = choose_plan(p, q, rho, k, process)
        assert plan.construction == ("fill" if process == "topk" else "greedy_fill")
        assert abs(float(plan.alpha) - condot_value(p, q, rho, k, process)) <= 1e-9
        assert (plan.marginal <= rho * p + 1e-15).all()


@pytest.mark.parametrize("shape", ["2,2", "3,1", "((..),.)", "(.,(..,.))"])
@pytest.mark.parametrize("V", [3, 4])
def test_greedy_trees_are_lossless(shape, V):
    """The greedy process is outside the shared exact grid: UniVer's closed-form greedy plans are checked here by
    exact enumeration of every tree."""
    model = DirichletModel(V, seed=V + 2, similarity=0.4, concentration=0.8)
    r = evaluate(model, TreeShape.parse(shape), "greedy", VERIFIERS["univer"])
    assert r.distance <= LOSSLESS_TOL and r.plans.get("greedy_fill", 0) > 0, (r.distance, r.plans)


def test_exact_mode_plans_do_not_keep_the_callers_buffer():
    """A Fraction row set reused by the caller (written in place between calls): the plan cache is keyed on the
    rows' values, and the cached plan kept a view of the caller's array, so a later call with the first values got
    the law of the overwritten rows (3/5 of its mass on a correction from them).  Validated rows are now copies."""
    F = Fraction
    tree = DraftTree((-1, 0, 0), (-1, 0, 1))
    third = [F(1, 3)] * 3
    rows = lambda top: np.array([top, third, third], dtype=object)               # noqa: E731
    p1, p2, q = [F(1, 2), F(1, 4), F(1, 4)], [F(1, 10), F(1, 10), F(4, 5)], rows([F(1, 4), F(1, 4), F(1, 2)])
    want = make_univer_verifier("tv", slot_rule=False).law(tree, rows(p1), q, "wor")
    ver = make_univer_verifier("tv", slot_rule=False)
    buf = rows(p1)
    ver.law(tree, buf, q, "wor")
    buf[0, :] = p2
    ver.law(tree, buf, q, "wor")
    assert ver.law(tree, rows(p1), q, "wor") == want


def test_plan_cache_is_bounded_on_small_vocabularies(monkeypatch):
    """The cap was ``2**21 // V`` plans: ~500 000 at V = 4, where a plan holds ~13 KB of fixed overhead, so a
    process evaluating new models grew ~100 KB a call towards ~6.6 GB.  It is now at most PLAN_CACHE_ENTRIES at
    any V (16 at V = 49152), and evicting a plan drops its slot entries (checked under a cap of 20)."""
    assert univer.plan_cache_size(4) == univer.plan_cache_size(128) == univer.PLAN_CACHE_ENTRIES <= 4096
    assert univer.plan_cache_size(49152) == 16
    monkeypatch.setattr(univer, "PLAN_CACHE_ENTRIES", 20)
    monkeypatch.setattr(univer, "PLAN_CACHE_TOKENS", 20 * 4)
    ver, shape, sizes = make_univer_verifier(shape_rule=False), TreeShape.parse("((..),.)"), []
    for seed in range(12):
        evaluate(DirichletModel(4, seed=seed, similarity=0.5), shape, "wor", ver)
        sizes.append(len(ver.rule._plans))
        assert set(ver.rule._slots) <= set(ver.rule._plans)
    assert max(sizes) == 20 and sizes[-1] == 20, sizes
    assert ver.rule._slots, "the slot rule never ran: the eviction of slot entries went unchecked"
    ver.rule._plans.get("wide", 49152, lambda: None)        # a plan on a wide row evicts four at once, their slots
    assert len(ver.rule._plans) == 16 and set(ver.rule._slots) <= set(ver.rule._plans)


def test_plan_cache_evicts_the_oldest_under_its_lock(monkeypatch):
    """:class:`univer.PlanCache` (UniVer's rule's and the flat-plan rules'): a kept plan is not rebuilt, a new one
    beyond ``plan_cache_size`` evicts the oldest inserted (not the last read), and ``evicted`` sees that key while the
    cache's lock is held (UniVer's rule prunes its slot entries there)."""
    monkeypatch.setattr(univer, "PLAN_CACHE_ENTRIES", 16)
    seen, builds = [], []
    cache = univer.PlanCache(evicted=lambda key: seen.append((key, cache.lock.locked())))
    for key in range(16):
        assert cache.get(key, 4, lambda: builds.append(key) or -key) == -key
    assert cache.get(0, 4, lambda: 1 / 0) == 0 and builds == list(range(16)) and not seen
    assert cache.get(16, 4, lambda: "new") == "new"
    assert seen == [(0, True)] and len(cache) == 16 and 0 not in cache and 16 in cache
    assert list(cache) == list(range(1, 17))
    wide = univer.PlanCache()                    # V = 49152: 16 plans, whatever PLAN_CACHE_ENTRIES
    monkeypatch.setattr(univer, "PLAN_CACHE_ENTRIES", 4096)
    for key in range(20):
        wide.get(key, 49152, lambda: key)
    assert list(wide) == list(range(4, 20))
    for key in range(20, 100):                   # small plans fill it, and a wide plan evicts down to 16 at once
        wide.get(key, 4, lambda: key)
    wide.get("wide", 49152, lambda: 0)
    assert list(wide) == list(range(85, 100)) + ["wide"]


def test_slot_entries_are_read_and_written_under_the_caches_lock():
    """Every read and write of UniVer's slot entries holds its plan cache's lock (single-threaded, so a missing
    lock is seen without a race): the four-thread test below catches that only now and then."""
    class Guarded(dict):
        def _check(self):
            assert ver.rule._plans.lock.locked(), "slot entries touched without the cache's lock"

        def get(self, *a):
            self._check()
            return super().get(*a)

        def setdefault(self, *a):
            self._check()
            return super().setdefault(*a)

        def pop(self, *a):
            self._check()
            return super().pop(*a)

    ver = make_univer_verifier()
    ver.rule._slots = Guarded()
    tree = DraftTree((-1, 0, 0, 0, 1), (-1, 0, 1, 2, 3))               # three children with unlike subtrees: slots
    p, q = (np.random.default_rng(s).dirichlet(np.ones(9), size=5) for s in (0, 1))
    for _ in range(2):                                                   # a write, then a hit
        ver.expected_accepted_length(tree, p, q, "iid")
    assert ver.rule._slots


def test_a_full_plan_cache_is_shared_by_threads(monkeypatch):
    """One rule called from four threads with a full cache (a long-lived process's state; capped at 16 here, so
    nearly every new plan evicts one): the eviction rebuilt the slot entries while other threads inserted into them
    ("dictionary changed size during iteration"), and a thread could store slot weights for a plan another had
    just evicted, never pruned.  Each thread's E[τ] is the sequential one; no slot entry outlives its plan."""
    monkeypatch.setattr(univer, "PLAN_CACHE_ENTRIES", 16)
    tree = DraftTree((-1, 0, 0, 0, 1), (-1, 0, 1, 2, 3))               # three children with unlike subtrees: slots
    rows = [[np.random.default_rng(s).dirichlet(np.ones(9), size=5) for _ in range(2)] for s in range(160)]
    alone = make_univer_verifier()
    want = [alone.expected_accepted_length(tree, p, q, "iid") for p, q in rows]
    shared, got = make_univer_verifier(), {}

    def work(part):
        for i in range(part, len(rows), 4):
            got[i] = shared.expected_accepted_length(tree, *rows[i], "iid")
    errors = in_threads(work)
    assert not errors, errors
    assert [got[i] for i in range(len(rows))] == want
    assert len(shared.rule._plans) == 16 and shared.rule._slots
    assert set(shared.rule._slots) <= set(shared.rule._plans)
