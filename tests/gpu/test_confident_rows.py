"""Confident without-replacement rows in the batched layer (gpu/wor_plans.py): the automatic choice's plan on
every ordered tuple realises the marginal it returns (losslessness by construction), equals the exact core's
choice, PTS's batched fixed point agrees with the walk, and ``draft_tree`` + ``verify`` emit the target law.

Monte Carlo statistic: the G-test (``tests.stats.g_test_counts``) of the first emitted token against p, fixed
seeds, level ``tests.stats.LEVEL``.  The known-lossy variant is the clock range of before (a fixed
log T ∈ [−30, 30]): the test's power against its exact first-token law on the same trees
(:func:`gpu.engine.first_token_law`) is asserted, and its samples are rejected.
"""
import itertools
from fractions import Fraction

import numpy as np
import pytest
import torch

import gpu.wor_plans as wor_plans
import univer_theory.plans.clocks as clocks
from gpu import METHODS, TreeBatch, draft_tree, expected_accepted_length, verify
from gpu.engine import first_token_law
from gpu.univer_rule import univer_rule
from gpu.wor_plans import pts_weights, wor_weights
from univer_theory import VERIFIERS, ConfidentModel, DraftTree, TreeShape, sample_tree
from univer_theory.models import CONFIDENT_TARGETS
from univer_theory.plans.choose import choose_plan, first_draw_plan
from univer_theory.tolerance import worst_of

from ..stats import assert_accepts, assert_power, assert_rejects, g_test_counts
from .helpers import padded_rows

TAILS = (1e-8, 1e-12, 1e-16, 1e-300, 1e-308, 1e-310)


def confident_rows(V, k):
    """Every target family × tail of ConfidentModel at the root, ρ ∈ {1, 0.37}: ``(p, q, ρ)`` lists."""
    for seed, (target, tail) in enumerate(itertools.product(CONFIDENT_TARGETS, TAILS)):
        model = ConfidentModel(V, seed=seed, tail=tail, target=target)
        for rho in (1.0, 0.37):
            yield model.target(()), model.draft(()), rho


def all_tuples(V, k, R):
    return torch.tensor(list(itertools.permutations(range(V), k)))[None].expand(R, -1, -1)


def tuple_probs(q, S):
    """wor ``Q_k(S)`` in the remaining-mass form."""
    pr, unseen = 1.0, np.ones(q.size, dtype=bool)
    for y in S:
        pr *= q[y] / q[unseen].sum()
        unseen[y] = False
    return pr


@pytest.mark.parametrize("V, k", [(6, 2), (6, 3), (9, 2), (9, 3), (6, 4)])
def test_choice_realises_its_marginal_and_matches_the_core(V, k):
    cases = list(confident_rows(V, k))
    p = torch.tensor(np.stack([c[0] for c in cases]))
    q = torch.tensor(np.stack([c[1] for c in cases]))
    rho = torch.tensor([c[2] for c in cases], dtype=torch.float64)
    tuples = all_tuples(V, k, len(cases))
    w, a = wor_weights(rho[:, None] * p, q, rho, p, tuples)
    assert torch.isfinite(w).all() and torch.isfinite(a).all()
    for i, (pi, qi, r) in enumerate(cases):
        probs = np.array([tuple_probs(qi, S) for S in tuples[0].tolist()])
        realised = np.zeros(V)
        np.add.at(realised, tuples[0].numpy().ravel(), (probs[:, None] * w[i].numpy()).ravel())
        np.testing.assert_allclose(realised, a[i].numpy(), rtol=0, atol=1e-12, err_msg=str(i))
        assert (a[i].numpy() <= r * pi + 1e-15).all(), i
        plan = choose_plan(pi, qi, r, k, "wor")
        np.testing.assert_allclose(a[i].numpy(), plan.marginal, rtol=0, atol=1e-10, err_msg=f"{i} {plan.construction}")


@pytest.mark.parametrize("k", [3, 4, 8])
def test_pts_fixed_point_equals_the_walk(k):
    """The batched clock integral (fixed point) and the exact core's walk give the same θ on confident rows,
    down to denormal tails (the grid's upper end follows the row in both)."""
    V = 9
    cases = list(confident_rows(V, k))
    p = torch.tensor(np.stack([c[0] for c in cases]))
    q = torch.tensor(np.stack([c[1] for c in cases]))
    rho = torch.tensor([c[2] for c in cases], dtype=torch.float64)
    kids = torch.tensor([list(range(k))] * len(cases))
    out = {walk: pts_weights(rho[:, None] * p, q, p, kids, walk) for walk in ("sequential", "fixed_point")}
    (w_walk, a_walk), (w_fixed, a_fixed) = out["sequential"], out["fixed_point"]
    assert torch.isfinite(w_fixed).all() and torch.isfinite(a_fixed).all()
    torch.testing.assert_close(a_walk, a_fixed, rtol=0, atol=1e-12)
    # w is pinned where the tuple carries mass: with a tail of 1e-300 a token's cap and availability are both
    # ~1e-300 and their ratio θ is round-off in either path — weight on a tuple of probability ~1e-300
    pinned = (q[:, :k] > 1e-200).all(1)
    torch.testing.assert_close(w_walk[pinned], w_fixed[pinned], rtol=0, atol=1e-12)


def drafted(p, q, k, n, seed):
    """n drafted depth-1 wor trees: ``(batch, target rows, draft rows, generator)``."""
    shape = TreeShape.parse(str(k))
    gen = torch.Generator().manual_seed(seed)
    batch, q_rows = draft_tree(shape, torch.tensor(q), "wor", n, gen)
    return batch, torch.tensor(p).expand(n, shape.num_nodes, p.size).contiguous(), q_rows, gen


def first_token_counts(batch, p_rows, q_rows, gen):
    """Counts of the first emitted token of UniVer's verification of every tree."""
    res = verify(batch, p_rows, q_rows, "wor", "univer", gen)
    first = torch.where(res.num_accepted > 0, batch.token.gather(1, res.accepted_nodes[:, 1:2].clamp(min=0))[:, 0],
                        res.next_token)
    return np.bincount(first.numpy(), minlength=p_rows.shape[-1])


def fixed_clock_range(monkeypatch):
    """The known-lossy variant: the clock grid's fixed upper end log T = 30 of before."""
    monkeypatch.setattr(clocks, "grid_panels", lambda rate: 1)
    monkeypatch.setattr(wor_plans, "grid_panels", lambda rate: 1 + 0 * rate)


def audit_row(V=12, e=1e-16):
    q = np.full(V, e)
    q[0] = 1 - (V - 1) * e
    p = np.full(V, (1 - 1e-6) / (V - 1))
    p[0] = 1e-6
    return p, q


def test_verify_emits_the_target_law_on_the_audit_row(monkeypatch):
    """V = 12, k = 3, e = 1e-16 (the audit: first-token distance 0.272 over 10⁵ trees): 2·10⁴ trees pass the
    G-test against p; the fixed range's exact law on the same trees is far enough for power ≥ POWER, and its
    samples are rejected.  Rules 7 (Luce) and 8 (first draw) are switched off, so the root takes PTS's clock
    integral as on a row beyond Luce's budget whose top token is not confident (their batched plans are checked
    exactly in tests/gpu/test_luce.py and test_choice_realises_its_marginal_and_matches_the_core)."""
    monkeypatch.setattr(wor_plans, "luce_rows", lambda c, q, k: q[:, 0] < 0)            # no row qualifies
    monkeypatch.setattr(wor_plans, "first_draw_gate", lambda q, alpha, tol: alpha < 0)  # no row qualifies
    p, q = audit_row()
    batch, p_rows, q_rows, gen = drafted(p, q, 3, 20_000, 0)
    with monkeypatch.context() as m:
        fixed_clock_range(m)
        lossy = first_token_law(batch, p_rows, q_rows, "wor", univer_rule).mean(0)
        assert_power(dict(enumerate(p)), {"fixed clock range": dict(enumerate(lossy.tolist()))}, batch.batch_size)
        assert_rejects(g_test_counts(first_token_counts(batch, p_rows, q_rows, gen), p), "fixed clock range")
    assert_accepts(g_test_counts(first_token_counts(batch, p_rows, q_rows, gen), p), "audit row: first token")


def near_flat_rows(V):
    """Confident rows with a near-flat tail (Dirichlet(100)), every tail, two target families, ρ ∈ {1, 0.37}: the
    rows where the choice takes rule 8 (tests/theory/test_first_draw.py)."""
    for seed, (target, tail) in enumerate(itertools.product(("dirichlet", "zero_top"), TAILS)):
        model = ConfidentModel(V, seed=seed, tail=tail, target=target, concentration=100.0)
        for rho in (1.0, 0.37):
            yield model.target(()), model.draft(()), rho


@pytest.mark.parametrize("V, k", [(10, 2), (10, 3), (9, 4)])
def test_first_draw_realises_its_marginal_and_matches_the_core(V, k):
    """Rule 8 batched (``gpu.wor_plans._first_draw``, whose inner plan is the batched choice itself) against the
    exact core's ``first_draw_plan`` on every ordered tuple: the same joint law ``Q_k(S)·w(S)`` (1e-12) and marginal
    (1e-10), and the realised marginal equals the returned one (1e-12).  The joint law, not ``w`` itself: on a tuple
    that does not start with t, ``w_1 = min(1, r_x/π_x)`` reads a room ``r`` formed by cancellation (``c − π a'``)
    over a probability ``π_x`` as small as the tail, so ``w`` there moves with the last bits of ``r`` while
    ``π_x·w_1`` does not."""
    cases = list(near_flat_rows(V))
    p = torch.tensor(np.stack([c[0] for c in cases]))
    q = torch.tensor(np.stack([c[1] for c in cases]))
    rho = torch.tensor([c[2] for c in cases], dtype=torch.float64)
    tuples = all_tuples(V, k, len(cases))
    w, a = wor_plans._first_draw(rho[:, None] * p, q, tuples, "auto")
    for i, (pi, qi, r) in enumerate(cases):
        plan = first_draw_plan(pi, qi, r, k)
        probs = np.array([tuple_probs(qi, S) for S in tuples[0].tolist()])
        realised = np.zeros(V)
        np.add.at(realised, tuples[0].numpy().ravel(), (probs[:, None] * w[i].numpy()).ravel())
        np.testing.assert_allclose(realised, a[i].numpy(), rtol=0, atol=1e-12, err_msg=str(i))
        np.testing.assert_allclose(a[i].numpy(), plan.marginal, rtol=0, atol=1e-10, err_msg=str(i))
        core_w = np.stack([plan.select(tuple(S)) for S in tuples[0].tolist()])
        np.testing.assert_allclose(probs[:, None] * w[i].numpy(), probs[:, None] * core_w, rtol=0, atol=1e-12,
                                   err_msg=str(i))


def test_the_batched_choice_takes_rule_8_as_the_core():
    """Near-flat confident rows of 17 tokens (beyond rule 7's budget), k = 3 on every ordered tuple: the batched
    choice's realised marginal equals the returned one (1e-12) and the core's choice (1e-10), rule 8 among them."""
    V, k = 17, 3
    cases = list(near_flat_rows(V))
    p = torch.tensor(np.stack([c[0] for c in cases]))
    q = torch.tensor(np.stack([c[1] for c in cases]))
    rho = torch.tensor([c[2] for c in cases], dtype=torch.float64)
    tuples = all_tuples(V, k, len(cases))
    w, a = wor_weights(rho[:, None] * p, q, rho, p, tuples)
    used = set()
    for i, (pi, qi, r) in enumerate(cases):
        probs = np.array([tuple_probs(qi, S) for S in tuples[0].tolist()])
        realised = np.zeros(V)
        np.add.at(realised, tuples[0].numpy().ravel(), (probs[:, None] * w[i].numpy()).ravel())
        np.testing.assert_allclose(realised, a[i].numpy(), rtol=0, atol=1e-12, err_msg=str(i))
        chosen = choose_plan(pi, qi, r, k, "wor")
        used.add(chosen.construction)
        np.testing.assert_allclose(a[i].numpy(), chosen.marginal, rtol=0, atol=1e-10,
                                   err_msg=f"{i} {chosen.construction}")
    assert "first_draw" in used, used


@pytest.mark.parametrize("process", ["iid", "wor"])
def test_every_method_matches_the_core_on_confident_trees(process):
    """E[τ | T] of every batched method on trees drafted from ``ConfidentModel`` rows (each target family, tails
    1e-16, 1e-300, 1e-308, 1e-310, 1e-320 — the last a mass below 2^-1054, which ``SUBNORMAL_LIFT`` must lift above
    the smallest normal: 2^32 would not) equals the exact core's to 1e-12, and RRSw's and TV's first-token law per tree
    equals the exact law's.  Once a wor draft's top token is removed the rest of its row holds a subnormal mass:
    the batched rules formed its scale as ``1/mass`` clamped at the smallest normal float, which made every later
    child certain there (E[τ | T] = 1 where the exact core, and its Fraction form, give 0.196)."""
    rng = np.random.default_rng(5)
    shapes = [TreeShape.parse(s) for s in ("(...(..))", "3,1", "2,2")]
    tails = (1e-16, 1e-300, 1e-308, 1e-310, 1e-320)
    for seed, (target, tail) in enumerate(itertools.product(CONFIDENT_TARGETS, tails)):
        model = ConfidentModel(6, seed=seed, tail=tail, target=target)
        trees = [sample_tree(model, shape, process, rng) for shape in shapes]
        batch, p, q = padded_rows(trees, model)
        for name in (m for m in METHODS if process in VERIFIERS[m].processes):
            want = [VERIFIERS[name].expected_accepted_length(t, *model.node_probs(t), process) for t in trees]
            got = expected_accepted_length(batch, p, q, process, name).numpy()
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12, err_msg=f"{name} {target} {tail}")
            if name in ("rrsw", "tv"):
                law = first_token_law(batch, p, q, process, METHODS[name]).numpy()
                for b, tree in enumerate(trees):
                    first = np.zeros(6)
                    for key, pr in VERIFIERS[name].law(tree, *model.node_probs(tree), process).items():
                        first[key[0]] += pr
                    np.testing.assert_allclose(law[b], first, rtol=0, atol=1e-12, err_msg=f"{name} {target} {tail}")


@pytest.mark.parametrize("tail", [1e-100, 1e-200, 1e-300])
def test_the_layout_on_a_confident_row_emits_its_target(tail):
    """UniVer's i.i.d. layout on a confident node (V = 50, q and p each ``1 − tail`` on token 0, the rest a
    Dirichlet draw of mass ``tail``) with k = 6 copies of the top token — a tree of probability ≥ 1 − 6·tail, so
    its first token's law is p's to far below 1e-12 — emits p there to 1e-12, with the exact core's E[τ | T].
    The block's groups of ~tail/50 made the Möbius maps' products underflow below ~1e-154: in torch (an
    accelerator's doubling scan) the pivots were 0 and NaN, w(S) = 0 while the marginal kept a(top) ≈ 1, and the
    top token was never emitted (a distance of ~1)."""
    V, k = 50, 6
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(2):
        x = tail * rng.dirichlet(np.ones(V))
        x[0] = 1.0 - x[1:].sum()
        rows.append(x)
    p, q = rows
    tree = DraftTree((-1,) + (0,) * k, (-1,) + (0,) * k)
    P, Q = np.vstack([p] + [np.full(V, 1 / V)] * k), np.vstack([q] + [np.full(V, 1 / V)] * k)
    batch, pt, qt = TreeBatch.from_trees([tree]), torch.tensor(P)[None], torch.tensor(Q)[None]
    law = first_token_law(batch, pt, qt, "iid", METHODS["univer"])[0].numpy()
    np.testing.assert_allclose(law, p, rtol=0, atol=1e-12)
    want = VERIFIERS["univer"].expected_accepted_length(tree, P, Q, "iid")
    np.testing.assert_allclose(expected_accepted_length(batch, pt, qt, "iid", "univer").numpy(), [want], rtol=0,
                               atol=1e-12)


def test_the_layout_with_subnormal_draft_tokens_matches_the_core():
    """Drafted tokens of subnormal q (8e-309) beside a certain one: the layout's share of such a token overflowed
    (its density 1/q > 1e307) and the batched E[τ | T] was NaN where the exact core raised; both now drop that
    share as a 0/0 one (the tuple's probability is below 1e-308) and agree."""
    p = np.array([0.47702019519763955, 1.335000126e-314, 1.335000126e-314, 0.5229798048023605])
    q = np.array([8.170660274580537e-309, 8.170660274580537e-309, 8.170660274580537e-309, 1.0])
    trees = [DraftTree((-1, 0, 0), (-1, a, b), 4) for a, b in ((0, 3), (3, 0), (3, 3), (1, 2))]
    P, Q = np.vstack([p, q, q]), np.vstack([q, q, q])                  # every tree's rows (the children's: unread)
    want = [VERIFIERS["univer"].expected_accepted_length(t, P, Q, "iid") for t in trees]
    got = expected_accepted_length(TreeBatch.from_trees(trees), *(torch.tensor(np.stack([x] * len(trees)))
                                                                   for x in (P, Q)), "iid", "univer").numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_rule_3_on_a_confident_row_is_its_own_beside_a_wider_row():
    """A wor "2,2" tree at V = 150 whose draft rows are confident (top 1 − 1e-8): rule 3 at node 2 is feasible
    alone, but laid out beside node 1's wider side numpy's pairwise sums grouped otherwise, the β-family's
    cancellation of ~1e8 terms moved α by 5e-9 past ``OPTIMALITY_TOL`` and the node took another plan — the
    batched E[τ | T] was 4.2e-6 off the exact core's and changed with the row blocks.  Each row's sides are its
    own now: the batched value is the core's, in one block a level and in one-row blocks."""
    from gpu import engine
    from gpu.verify import engine_options

    def rows(prefix, V=150, seed=718471904):
        rng = np.random.default_rng([seed, len(prefix), *prefix])
        top = int(rng.integers(V))
        q = 1e-8 * rng.dirichlet(np.ones(V))
        q[top] = 0
        q[top] = 1 - q.sum()
        return rng.dirichlet(np.ones(V)), q

    tree = DraftTree((-1, 0, 0, 1, 1, 2, 2), (-1, 20, 91, 116, 120, 88, 13))
    P, Q = (np.stack(x) for x in zip(*(rows(s) for s in tree.paths)))
    want = VERIFIERS["univer"].expected_accepted_length(tree, P, Q, "wor")
    batch, pt, qt = TreeBatch.from_trees([tree]), torch.tensor(P)[None], torch.tensor(Q)[None]
    options = engine_options("univer", "wor")
    for block_bytes in (None, 8 * P.shape[1]):
        got = engine.expected_accepted(batch, pt, qt, "wor", METHODS["univer"], None,
                                       **{**options, "block_bytes": block_bytes})
        assert float(got[0]) == want, block_bytes


def test_lp_thresholds_below_highs_accuracy_agree_with_the_core():
    """Two trees of a fresh-seed campaign where the exact core solved its node LPs with HiGHS (accurate to ~1e-10)
    and the batched layer with its simplex, and thresholds finer than HiGHS' accuracy made them take different
    (lossless) plans: (1) rule 1 at a k = 4 wor root on six tokens, α*(ρ) = 0.9999999999995 — HiGHS' optimum
    1.1e-10 short of it lost to the coupling at ``ALPHA_TIE = 1e-12`` (E[τ | T] 1.7991 against 1.5); (2) the slot
    rule's class LP at a confident root (q = 0.999999 on one token, class probabilities 5e-15 … 5e-3), whose HiGHS
    vertex failed the recheck by 9.3e-13·ΣQ (E[τ | T] 0.19362 against 0).  Both layers now solve them with the same
    simplex: the same plans and E[τ | T] to 1e-12."""

    same = np.full(6, 1 / 6)
    other_p, other_q = np.array([0.0, 0.2, 0.2, 0.2, 0.35, 0.05]), np.array([0.5, 0.1, 0.1, 0.1, 0.1, 0.1])
    q0 = np.array([3.441839286120271e-01, 8.633497192267554e-04, 8.465197721706910e-04, 6.534775539195037e-01,
                   5.765532974806207e-04, 5.209467959119717e-05])
    rule_1 = (DraftTree((-1, 0, 0, 0, 0, 1, 2, 3, 4), (-1, 3, 0, 2, 1, 5, 5, 5, 5)),
              np.vstack([[0.5, 0, 0, 0.5, 0, 0], same, other_p, other_p, other_p] + [same] * 4),
              np.vstack([q0 / q0.sum(), same, other_q, other_q, other_q] + [same] * 4))
    p0 = np.array([0., 0., 0.0241892511638492, 0.08604376071797072, 0., 0.4852403473112173, 0., 0.,
                   0.06415094314418612, 0., 0.34037569766277675, 0.])
    q0 = np.array([9.9999899999999997e-01, 2.3294083609525207e-07, 8.3543252578822277e-08, 8.5301093824943397e-09,
                   1.1204106457413913e-07, 5.5626796823493412e-08, 5.8906079687950386e-08, 4.4860695719087740e-08,
                   7.2250063965642036e-08, 3.6700201449441875e-08, 1.5339212795794046e-07, 1.4120877176573641e-07])
    u = np.full(12, 1 / 12)
    slot = (DraftTree((-1, 0, 1, 0, 0, 4, 4, 4, 4), (-1, 0, 3, 2, 6, 6, 2, 10, 11)),      # root children 0, 2, 6
            np.vstack([p0 / p0.sum()] + [u] * 8), np.vstack([q0 / q0.sum()] + [u] * 8))
    univer = VERIFIERS["univer"]
    for name, (tree, p, q) in (("rule 1", rule_1), ("slot rule", slot)):
        root = univer.trace(tree, p, q, "wor")[0]
        assert root["construction"] == ("lp" if name == "rule 1" else "pts") and root["slot_rule"] is (name != "rule 1")
        want = univer.expected_accepted_length(tree, p, q, "wor")
        got = expected_accepted_length(TreeBatch.from_trees([tree]), torch.tensor(p)[None], torch.tensor(q)[None],
                                       "wor", "univer")
        assert abs(float(got[0]) - want) <= 1e-12, (name, float(got[0]), want)


def test_a_correction_whose_residual_rounds_away_stays_in_the_targets_support():
    """A wor node with p = onehot(1) and a confident draft (tails 2e-13) whose realised children are the two tail
    tokens (a tuple of probability ~5e-26): the plan gives it weight 0, α rounds to ρ = 1, so f = 1 while the float
    residual ρp − a is all zero (the true one is ~5e-26·p).  Before, the exact law lost the tree's whole mass (and
    contradicted E[τ | T] below an accepted child) and ``gpu.verify`` drew token 0, where p = 0; the residual now
    falls back to ρp: the exact law has mass 1 and equals the batched first-token law, and every draw is token 1."""
    u3 = np.full(3, 1 / 3)
    p_node, q_node = np.array([0.0, 1.0, 0.0]), np.array([2.5789404393753699e-13, 9.9999999999953038e-01,
                                                           2.1173844670600807e-13])
    root = np.array([0.5, 0.5, 0.0])
    cases = ((DraftTree((-1, 0, 0), (-1, 2, 0)), np.vstack([p_node, u3, u3]), np.vstack([q_node, u3, u3])),
             (DraftTree((-1, 0, 1, 1), (-1, 1, 2, 0)), np.vstack([root, p_node, u3, u3]),
              np.vstack([root, q_node, u3, u3])))
    univer = VERIFIERS["univer"]
    for tree, p, q in cases:
        law = univer.law(tree, p, q, "wor")
        assert sum(float(v) for v in law.values()) == pytest.approx(1.0, abs=1e-12)
        first = np.zeros(3)
        for key, v in law.items():
            first[key[0]] += float(v)
        batch, pt, qt = TreeBatch.from_trees([tree]), torch.tensor(p)[None], torch.tensor(q)[None]
        np.testing.assert_allclose(first_token_law(batch, pt, qt, "wor", METHODS["univer"])[0].numpy(), first,
                                   rtol=0, atol=1e-12)
        for seed in range(4):
            out = verify(batch, pt, qt, "wor", "univer", torch.Generator().manual_seed(seed))
            assert int(out.next_token[0]) == 1


def test_rule_3_verdict_is_the_same_in_numpy_and_torch_on_confident_rows():
    """Rule 3's families cancel terms of the odds q_x/R_x (~1/(1 − q_top)), so on confident rows their α carries a
    round-off of ~ε·max odds: numpy's compiled pass and torch's array form summed in other orders and, on ~5% of
    rows with top 1 − 1e-7 … 1 − 1e-12, one found α within ``OPTIMALITY_TOL`` of α* and the other did not (other
    plans, E[τ | T] of a tree up to 0.15 apart between an accelerator and the exact core).  Rows whose odds exceed
    ``MAX_ODDS`` are infeasible in both now: on a seeded grid (V, tails, target families, ρ) the verdicts agree and
    the feasible plans' α agree to 1e-12."""
    from univer_theory.alpha_star import alpha_star_rows
    from univer_theory.plans.wor_pair import array_pair_rule, pair_rule

    worst = 0.0
    for V, tail, target, seed in itertools.product((8, 20, 50), (1e-7, 1e-8, 1e-10, 1e-12), CONFIDENT_TARGETS,
                                                   range(4)):
        model = ConfidentModel(V, seed=seed, tail=tail, target=target)
        p, q = model.target(())[None], model.draft(())[None]
        for rho in (1.0, 0.37, 0.0114):
            r = np.array([rho])
            star, cut = alpha_star_rows(p, q, 2, "wor", r)[:2]
            host = pair_rule(r[:, None] * p, q, star, cut, p)
            dev = array_pair_rule(*(torch.from_numpy(np.asarray(x)) for x in (r[:, None] * p, q, star, cut, p)))
            assert bool(host.feasible[0]) == bool(dev.feasible[0]), (V, tail, target, seed, rho)
            if host.feasible[0]:
                worst = worst_of(worst, abs(float(host.marginal.sum()) - float(dev.marginal.sum())))
    assert worst <= 1e-12, worst


def one_token_rows(seed: int):
    """``(p, q)``: two tokens holding all but ~1e-20 … 1e-300 of each row, the rest tails (the target's last one 0
    half the time), so that once the first token is removed both rows hold ~1 on the second — where RRSw's and TV's
    ``[rP − Q]_+`` is exactly 0 in the exact core.  Seed 0: the rows a sweep found (docs/deviations.md item 141)."""
    if seed == 0:
        p = np.array([0.5108352614786689, 0.4891647385213312, 1e-30, 0])
        q = np.array([0.5667411715543137, 0.4332588284456863, 1.5e-32, 1.2e-32])
    else:
        rng = np.random.default_rng(seed)
        a, b = rng.uniform(0.1, 0.9, 2)
        e = rng.uniform(20, 300)
        p = np.array([a, 1 - a, 10 ** -e, 0 if rng.random() < 0.5 else 10 ** -rng.uniform(20, 300)])
        q = np.array([b, 1 - b, 10 ** -(e + rng.uniform(-3, 3)), 10 ** -(e + rng.uniform(-3, 3))])
    return p / p.sum(), q / q.sum()


@pytest.mark.parametrize("process", ["iid", "wor"])
def test_rejection_steps_on_rows_of_one_token_match_the_core(process):
    """E[τ | T] of RRS(w) and TV on 400 trees whose root drafts a likely token and then a tail token of draft
    probability ~1e-20 … 1e-300 (:func:`one_token_rows`, the same rows at every node) equals the exact core's to
    1e-12, and on the sweep's rows the Fraction value (on others the float core parts from it too, where a row's
    ``1 − Q(y)`` lies below an ulp of 1: item 141).  The batched sibling step formed ``[rP − Q]_+`` with the
    reciprocals of the rows' masses, which rounded twice: where both rows hold ~1 on one token the exact core's 0 was
    1.1e-16 there, the residual moved to that token, and E[τ | T] moved by up to 0.85 on 71 of 3 001 such wor trees
    (:meth:`gpu.rules._Rows.step_scales`)."""
    worst = (0.0, None)
    for seed in range(400):
        p, q = one_token_rows(seed)
        tree = DraftTree((-1, 0, 0, 0), (-1, 0, 3, 1 + seed % 2), 4)
        rows = [torch.tensor(np.tile(x, (4, 1)))[None] for x in (p, q)]
        for name in ("tv", "rrsw" if process == "wor" else "rrs"):
            want = VERIFIERS[name].expected_accepted_length(tree, np.tile(p, (4, 1)), np.tile(q, (4, 1)), process)
            got = float(expected_accepted_length(TreeBatch.from_trees([tree]), *rows, process, name)[0])
            worst = max(worst, (abs(got - want), (name, seed)), key=lambda x: x[0])
            if seed == 0:                   # the rows' Fraction values, renormalised exactly
                exact = [(lambda a: np.tile(a / a.sum(), (4, 1)))(np.array([Fraction(float(v)) for v in x]))
                         for x in (p, q)]
                value = VERIFIERS[name].expected_accepted_length(tree, *exact, process)
                worst = max(worst, (abs(got - float(value)), (name, seed, "Fraction")), key=lambda x: x[0])
    assert worst[0] <= 1e-12, worst
