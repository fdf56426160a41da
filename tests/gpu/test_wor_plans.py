"""The batched without-replacement plans (gpu/wor_plans.py) on tensors: rule 3 and PTS (k = 2) — one
implementation with the exact core's (univer_theory.plans.wor_pair / pts) — against the tuple-law enumeration and
the brute-force α*(ρ), and on a batch as on the exact core's batch of one; the coupling, PTS (k ≥ 3) and the
choice against the exact core's constructions (iid_coupling / pts / choose): w(S) on the realised tuple, the
marginal a and, for rule 3, feasibility — to 1e-12 — and UniVer's E[τ | T] on binary wor trees."""
import numpy as np
import pytest
import torch

from gpu import expected_accepted_length
from gpu.wor_plans import coupling_weights, pts_weights, wor_weights, wor_pair_weights
from univer_theory import VERIFIERS, DirichletModel, TreeShape, sample_tree
from univer_theory.alpha_star import alpha_star
from univer_theory.plans.choose import choose_plan
from univer_theory.plans.iid_coupling import growth_strings, iid_coupling_plan, virtual_draws
from univer_theory.plans.pts import pts_plan
from univer_theory.plans.wor_pair import wor_pair_plan
from univer_theory.processes import tuple_law

from ..theory.test_wor_plans import brute_alpha_star
from .helpers import padded_rows


def rows(V, n, rng, k=2):
    """LLM-like and Dirichlet rows (draft zeros, ρ = 0 and p = q among them) and a wor tuple per row."""
    out = []
    for i in range(n):
        if i % 3 == 0:
            p = np.exp(3.0 * rng.normal(size=V))
            q = p * np.exp(rng.normal(size=V))
            q[rng.choice(V, size=V // 6, replace=False)] = 0.0
        else:
            p, q = rng.dirichlet(np.full(V, (0.3, 2.0)[i % 2])), rng.dirichlet(np.full(V, 0.5))
        if i % 7 == 6:
            q = p.copy()
        p, q = p / p.sum(), q / q.sum()
        rho = (1.0, 0.7, 0.25, 0.0)[i % 4]
        out.append((p, q, rho, tuple(int(y) for y in rng.choice(V, size=k, replace=False, p=q))))
    return out


def ill_conditioned(rng, i, v_max, tiny=False):
    """Row i of a family of hard rows ``(p, q)``, V ∈ [9, v_max): every other q has one token holding all but
    1e-5; with ``tiny`` three draft entries are 1e-15, 1e-12, 1e-9; every third p equals q; every fourth
    (from i = 1) p has a zero entry."""
    V = int(rng.integers(9, v_max))
    q = rng.dirichlet(np.full(V, 0.3))
    if i % 2 == 0:
        q = q * 1e-5
        q[rng.integers(V)] += 1 - q.sum()
    if tiny:
        q[rng.choice(V, 3, replace=False)] = [1e-15, 1e-12, 1e-9]
        q /= q.sum()
    p = rng.dirichlet(np.full(V, 0.3)) if i % 3 else q.copy()
    if i % 4 == 1:
        p[rng.integers(V)] = 0
        p /= p.sum()
    return p, q


def tensors(cases):
    p = torch.tensor(np.stack([c[0] for c in cases]))
    q = torch.tensor(np.stack([c[1] for c in cases]))
    rho = torch.tensor([c[2] for c in cases], dtype=torch.float64)
    return p, q, rho, rho[:, None] * p, torch.tensor([c[3] for c in cases])


@pytest.mark.parametrize("V", [6, 9])
def test_wor_pair_and_pts_against_enumeration(V):
    """Rule 3 and PTS (k = 2) on tensors, a batch of rows at once, every ordered pair as a tuple of its row: a is
    the marginal of w(S) enumerated over the wor tuple law (1e-12), ``0 ≤ w``, ``Σ_j w_j ≤ 1``, ``a ≤ ρp`` (PTS
    on every row, rule 3 where it reports feasible: most rows at this V); there α equals α*(ρ) by the brute-force
    min-cut over all 2^V cuts (1e-12); where it does not, the exact core's batch of one does not either."""
    cases = rows(V, 24, np.random.default_rng(100 + V))
    p, q, rho, c, _ = tensors(cases)
    pairs = torch.tensor([(y1, y2) for y1 in range(V) for y2 in range(V) if y1 != y2])
    tuples = pairs.expand(len(cases), *pairs.shape)
    w, a, ok = wor_pair_weights(c, q, rho, p, tuples)
    w_pts, a_pts = pts_weights(c, q, p, tuples)
    index = {tuple(int(y) for y in S): t for t, S in enumerate(pairs)}
    for i, (pi, qi, r, _) in enumerate(cases):
        for name, wi, ai in (("wor_pair", w[i], a[i]), ("pts", w_pts[i], a_pts[i]))[0 if ok[i] else 1:]:
            assert wi.min() >= 0 and (wi.sum(-1) <= 1 + 1e-15).all(), (name, i)
            enumerated = np.zeros(V)
            for S, pr in tuple_law(qi, 2, "wor"):
                enumerated[list(S)] += pr * wi[index[S]].numpy()
            np.testing.assert_allclose(ai.numpy(), enumerated, rtol=0, atol=1e-12, err_msg=f"{name} {i}")
            assert (ai.numpy() <= r * pi + 1e-15).all(), (name, i)
        alpha_star = brute_alpha_star(pi, qi, 2, r)
        if ok[i]:
            assert float(a[i].sum()) == pytest.approx(alpha_star, abs=1e-12), i
        else:
            assert wor_pair_plan(pi, qi, r, 2, "wor") is None, i
    assert ok.sum() >= 0.8 * len(cases)


@pytest.mark.parametrize("V", [10, 500, 4000])
def test_wor_pair_and_pts_batch_as_a_batch_of_one(V):
    """Rule 3 (with its feasibility) and PTS (k = 2) on a torch batch give, per row, what the exact core's numpy
    batch of one gives (the same functions; summation order aside): w(S) and a to 1e-12; both outcomes of rule
    3's feasibility occur (at V = 40 every row is feasible since the claim family, which rows at V = 500 and 4000
    take)."""
    cases = rows(V, 24, np.random.default_rng(V))
    p, q, rho, c, kids = tensors(cases)
    w, a, ok = wor_pair_weights(c, q, rho, p, kids)
    w_pts, a_pts = pts_weights(c, q, p, kids)
    for i, (pi, qi, r, S) in enumerate(cases):
        plan = wor_pair_plan(pi, qi, r, 2, "wor")
        assert (plan is not None) == bool(ok[i]), i
        if plan is not None:
            np.testing.assert_allclose(w[i].numpy(), plan.select(S), rtol=0, atol=1e-12)
            np.testing.assert_allclose(a[i].numpy(), plan.marginal, rtol=0, atol=1e-12)
        pts = pts_plan(pi, qi, r, 2, "wor")
        np.testing.assert_allclose(w_pts[i].numpy(), pts.select(S), rtol=0, atol=1e-12)
        np.testing.assert_allclose(a_pts[i].numpy(), pts.marginal, rtol=0, atol=1e-12)
    assert ok.any() and not ok.all()


@pytest.mark.parametrize("walk", ["fixed_point", "sequential"])
@pytest.mark.parametrize("k", [3, 4, 5])
def test_pts_matches_the_exact_plan_for_any_k(k, walk):
    """PTS with k ≥ 3 children, θ by the batched fixed point of clock integrals or by the walk: w(S) and a as
    pts_plan (1e-12) on LLM-like, Dirichlet and ill-conditioned rows (one token holding all but 1e-5 of q;
    draft probabilities down to 1e-15; p = q; zero targets; ρ ∈ {1, 0.3, 0})."""
    rng = np.random.default_rng(k)
    cases = rows(120, 9, rng, k)
    for i in range(9):
        p, q = ill_conditioned(rng, i, 60, tiny=i % 3 == 0)
        cases.append((p, q, float(rng.choice([1.0, 0.3, 0.0])),
                      tuple(int(y) for y in rng.choice(q.size, k, replace=False, p=q))))
    for pi, qi, r, S in cases:
        pt, qt = torch.tensor(pi)[None], torch.tensor(qi)[None]
        w, a = pts_weights(r * pt, qt, pt, torch.tensor([S]), walk)
        plan = pts_plan(pi, qi, r, k, "wor")
        np.testing.assert_allclose(w[0].numpy(), plan.select(S), rtol=0, atol=1e-12)
        np.testing.assert_allclose(a[0].numpy(), plan.marginal, rtol=0, atol=1e-12)
    kids = torch.tensor([c[3] for c in cases[:9]])                   # and the V = 120 rows as one batch
    p, q, _, c, _ = tensors(cases[:9])
    w, a = pts_weights(c, q, p, kids)
    for i, (pi, qi, r, S) in enumerate(cases[:9]):
        np.testing.assert_allclose(w[i].numpy(), pts_plan(pi, qi, r, k, "wor").select(S), rtol=0, atol=1e-12)


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("V", [8, 300])
def test_coupling_matches_the_exact_plan(V, k):
    """Rule 5: the layout on every virtual i.i.d. sequence, mixed — w(S) and a as iid_coupling_plan (1e-12);
    the sequences are those of virtual_draws, whose conditional probabilities sum to 1."""
    cases = rows(V, 12, np.random.default_rng(k * V), k)
    p, q, rho, c, kids = tensors(cases)
    w, a = coupling_weights(c, q, kids)
    for i, (pi, qi, r, S) in enumerate(cases):
        plan = iid_coupling_plan(pi, qi, r, k, "wor")
        np.testing.assert_allclose(w[i].numpy(), plan.select(S), rtol=0, atol=1e-12)
        np.testing.assert_allclose(a[i].numpy(), plan.marginal, rtol=0, atol=1e-12)
        draws = virtual_draws(S, qi)
        assert [tuple(S[j] for j in s) for s in growth_strings(k)] == [x for x, _ in draws]
        assert abs(sum(pr for _, pr in draws) - 1) < 1e-12


@pytest.mark.parametrize("V,k", [(4, 2), (5, 3), (5, 4), (6, 5)])
def test_coupling_on_tensors_is_exact_by_enumeration(V, k):
    """Rule 5 on torch rows, every wor tuple of the row at once (``children [R, T, k]``): the enumerated marginal
    ``Σ_S Q_k(S) Σ_j w_j(S) 1[y_j = y]`` (Q_k from the exact ``tuple_law``) equals the returned ``a`` (1e-12),
    ``Σ w ≤ 1``, and ``Σ a = α*_iid(ρ)`` (the closed form, 1e-12) — the coupling keeps the i.i.d. marginal."""
    cases = rows(V, 4, np.random.default_rng(V + k), k)
    p, q, rho, c, _ = tensors(cases)
    law = [tuple_law(qi, k, "wor") for _, qi, _, _ in cases]
    T = max(len(x) for x in law)
    kids = torch.tensor([[S for S, _ in x] + [x[0][0]] * (T - len(x)) for x in law])     # pad with a repeat
    w, a = coupling_weights(c, q, kids)
    assert (w >= 0).all() and (w.sum(-1) <= 1 + 1e-12).all()
    for i, (pi, qi, r, _) in enumerate(cases):
        n = len(law[i])
        pr = torch.tensor([x for _, x in law[i]])
        enum = torch.zeros(V, dtype=torch.float64).index_add_(0, kids[i, :n].reshape(-1),
                                                               (pr[:, None] * w[i, :n]).reshape(-1))
        np.testing.assert_allclose(enum.numpy(), a[i].numpy(), rtol=0, atol=1e-12)
        assert abs(a[i].sum().item() - alpha_star(pi, qi, k, "iid", r)) <= 1e-12


@pytest.mark.parametrize("case", ["free", "capped", "padded"])
def test_the_k2_choice_matches_choose_plan(case, monkeypatch):
    """wor_weights follows choose_plan beyond small supports (w(S), a to 1e-12): on Dirichlet rows of growing
    flatness (V = 200) rule 3, PTS and the coupling all occur — and with the coupling's cost cap below every
    node (``capped``: as a wide node sees it), neither path builds it.  ``padded``: the rows padded with V tokens
    of p = q = 0, the cap between their support (V) and their width (2V): rule 5's cost gate reads a row's drafted
    tokens, as choose_plan's (``np.count_nonzero(q)``), not its width (with the width the coupling was not built:
    α 0.08 off)."""
    import univer_theory.plans.choose as choose
    V, rng, cases = 200, np.random.default_rng(0), []
    cap = {"free": None, "capped": 1, "padded": 2 * 2 ** 2 * (3 * V // 2)}[case]   # 2^(k−1)·k² · 1.5 V at k = 2
    if cap is not None:
        monkeypatch.setattr(choose, "COUPLING_MAX_COST", cap)
    pad = (lambda x: np.r_[x, np.zeros(V)]) if case == "padded" else (lambda x: x)    # noqa: E731
    for conc in (1.0, 5.0, 50.0):
        for i in range(12):
            p, q = rng.dirichlet(np.full(V, conc)), rng.dirichlet(np.full(V, conc))
            kids = tuple(int(y) for y in rng.choice(V, 2, replace=False, p=q))
            cases.append((pad(p), pad(q), (1.0, 0.5)[i % 2], kids))
    p, q, rho, c, kids = tensors(cases)
    w, a = wor_weights(c, q, rho, p, kids)
    used = set()
    for i, (pi, qi, r, S) in enumerate(cases):
        plan = choose_plan(pi, qi, r, 2, "wor")
        used.add(plan.construction)
        np.testing.assert_allclose(w[i].numpy(), plan.select(S), rtol=0, atol=1e-12)
        np.testing.assert_allclose(a[i].numpy(), plan.marginal, rtol=0, atol=1e-12)
    assert used == ({"wor_pair", "pts"} if case == "capped" else {"wor_pair", "pts", "iid_coupling"}), used


def test_unreached_rows_get_no_plan():
    """ρ = 0 rows (never reached) select nothing, in the core (``unreached``) and the batch, and the other rows of
    the same call get exactly the plans they get without them."""
    V, rng = 60, np.random.default_rng(5)
    cases = []
    for i in range(6):
        p, q = rng.dirichlet(np.full(V, 0.5)), rng.dirichlet(np.full(V, 0.5))
        cases.append((p, q, (0.0, 0.8, 0.0, 1.0, 0.3, 0.0)[i], tuple(int(y) for y in rng.choice(V, 3, replace=False, p=q))))
    p, q, rho, c, kids = tensors(cases)
    w, a = wor_weights(c, q, rho, p, kids)
    live = rho > 0
    w_live, a_live = wor_weights(c[live], q[live], rho[live], p[live], kids[live])
    assert torch.equal(w[live], w_live) and torch.equal(a[live], a_live)
    assert not w[~live].any() and not a[~live].any()
    for pi, qi, r, S in cases:
        plan = choose_plan(pi, qi, r, 3, "wor")
        assert (plan.construction == "unreached") == (r == 0)
        if r == 0:
            assert not plan.marginal.any() and not plan.select(S).any()


def test_full_support_rows_follow_the_closed_form_beside_other_rows():
    """Rows whose draft support is exactly their k tokens take ``w_j(S) = ρp(S_j)`` (``choose.full_support_weights``)
    — exactly the exact core's plan and α = ρ·p(supp q) bit for bit — and the other rows of the same call get exactly
    the plans they get without them; k = 2 and 3, one tuple or several per row."""
    from univer_theory.plans.choose import full_support_weights
    rng = np.random.default_rng(11)
    for k in (2, 3):
        cases = []
        for i in range(6):
            p, q = rng.dirichlet(np.full(9, 0.7)), rng.dirichlet(np.full(9, 0.7))
            if i % 2 == 0:                  # support exactly k
                q[rng.choice(9, 9 - k, replace=False)] = 0.0
                q /= q.sum()
            cases.append((p, q, (1.0, 0.6, 0.3)[i % 3], tuple(int(y) for y in rng.choice(9, k, replace=False, p=q))))
        p, q, rho, c, kids = tensors(cases)
        w, a = wor_weights(c, q, rho, p, kids)
        full = (q > 0).sum(-1) == k
        w_rest, a_rest = wor_weights(c[~full], q[~full], rho[~full], p[~full], kids[~full])
        assert torch.equal(w[~full], w_rest) and torch.equal(a[~full], a_rest)
        assert torch.equal(w[full], full_support_weights(c[full], kids[full]))
        assert torch.equal(a[full].sum(-1), torch.where(q[full] > 0, c[full], 0.0).sum(-1))
        for i, (pi, qi, r, S) in enumerate(cases):
            plan = choose_plan(pi, qi, r, k, "wor")
            assert (plan.construction == "full") == bool(full[i])
            np.testing.assert_allclose(w[i].numpy(), plan.select(S), rtol=0, atol=1e-15)
        tuples = kids[:, None, :].expand(-1, 3, -1)
        assert torch.equal(wor_weights(c, q, rho, p, tuples)[0][full], full_support_weights(c[full], tuples[full]))


def test_trees_drafted_from_their_top_k_tokens_match_the_exact_core():
    """Draft rows truncated to their k most likely tokens (``--draft-top k``: every wor node of k children drafts its
    whole support, the closed form at every node): UniVer's E[τ | T] as the exact core's, 1e-12, on the drafted
    support (``gpu.support``) and beside nodes of other widths."""
    from univer_theory.models import Model

    class TopK(Model):
        def __init__(self, base, k):
            self.base, self.vocab_size, self.k = base, base.vocab_size, k

        def target(self, prefix):
            return self.base.target(prefix)

        def draft(self, prefix):
            q = self.base.draft(prefix).copy()
            q[np.argsort(-q, kind="stable")[self.k:]] = 0.0
            return q / q.sum()

    rng = np.random.default_rng(4)
    for shape, k in (("2,2", 2), ("3,1", 3), ("3,2", 3)):          # 3,2: support 3 at k = 2 nodes too
        model = TopK(DirichletModel(7, seed=k, similarity=0.4, concentration=0.6), k)
        trees = [sample_tree(model, TreeShape.parse(shape), "wor", rng) for _ in range(4)]
        ref = [VERIFIERS["univer"].expected_accepted_length(t, *model.node_probs(t), "wor") for t in trees]
        batch, p, q = padded_rows(trees, model, torch.float64)
        got = expected_accepted_length(batch, p, q, "wor", "univer")
        np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=1e-12, err_msg=shape)


def test_binary_wor_trees_match_the_exact_core():
    """UniVer's E[τ | T] on binary and chain-ended wor trees (V = 12: supports above the LP's) equals the exact
    core's (1e-12 float64, 1e-6 float32)."""
    model = DirichletModel(12, seed=3, similarity=0.5, concentration=0.6)
    rng = np.random.default_rng(7)
    trees = [sample_tree(model, TreeShape.parse(s), "wor", rng) for s in ("2,2,2", "2,1,2", "1,2") for _ in range(4)]
    ref = [VERIFIERS["univer"].expected_accepted_length(t, *model.node_probs(t), "wor") for t in trees]
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        batch, p, q = padded_rows(trees, model, dtype)
        got = expected_accepted_length(batch, p, q, "wor", "univer")
        np.testing.assert_allclose(got.double().numpy(), ref, rtol=0, atol=tol, err_msg=str(dtype))


def test_ill_conditioned_rows_match_the_exact_choice():
    """One token holding all but 1e-5 of q, p = q, zero target entries, ρ ∈ {1, 0.3, 0}: the k = 2 choice as
    choose_plan's, w(S) and a to 1e-12 — 1e-10 on the dominant-token rows, where rule 3's self-consistency sums
    have terms up to 1e5 and numpy's and torch's summation orders solve it to ~1e-11 (both plans exact: a is
    each one's own marginal)."""
    rng = np.random.default_rng(0)
    for i in range(40):
        p, q = ill_conditioned(rng, i, 40)
        rho = float(rng.choice([1.0, 0.3, 0.0]))
        S = tuple(int(y) for y in rng.choice(q.size, 2, replace=False, p=q))
        pt, qt, rt = torch.tensor(p)[None], torch.tensor(q)[None], torch.tensor([rho], dtype=torch.float64)
        w, a = wor_weights(rt[:, None] * pt, qt, rt, pt, torch.tensor([S]))
        plan = choose_plan(p, q, rho, 2, "wor")
        tol = 1e-10 if q.max() > 1 - 1e-4 else 1e-12
        np.testing.assert_allclose(w[0].numpy(), plan.select(S), rtol=0, atol=tol, err_msg=str(i))
        np.testing.assert_allclose(a[0].numpy(), plan.marginal, rtol=0, atol=tol, err_msg=str(i))


def test_several_tuples_per_row_share_one_plan():
    """``children [R, T, k]`` (the slot rule reads the plan on S and on its reversal) gives, per tuple, exactly
    what one call per tuple gives: the layout (targets built once per row), the coupling and the k = 2 choice."""
    from gpu.layout import layout_weights

    cases = rows(300, 12, np.random.default_rng(9))
    p, q, rho, c, kids = tensors(cases)
    both = torch.stack([kids, kids.flip(1)], 1)                                 # S and its reversal
    mask = torch.ones(kids.shape, dtype=torch.bool)
    for name, fn in (("layout", lambda ch: layout_weights(c, q, ch, mask)), ("coupling", lambda ch: coupling_weights(c, q, ch)),
                     ("choice", lambda ch: wor_weights(c, q, rho, p, ch))):
        w, a = fn(both)
        assert w.shape == both.shape, name
        for t in range(2):
            w1, a1 = fn(both[:, t])
            torch.testing.assert_close(w[:, t], w1, rtol=0, atol=0, msg=name)
            torch.testing.assert_close(a, a1, rtol=0, atol=0, msg=name)


def test_an_unknown_walk_is_rejected_by_name():
    """``walk`` (how PTS finds θ for k ≥ 3) is checked where it enters: the level rule, the wor choice and PTS."""
    import functools

    from gpu.univer_rule import univer_rule

    p = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
    kids, rho = torch.tensor([[0, 1]]), torch.ones(1, dtype=torch.float64)
    for call in (lambda: wor_weights(p, p, rho, p, kids, "bogus"), lambda: pts_weights(p, p, p, kids, "bogus"),
                 functools.partial(univer_rule, None, "bogus")):
        with pytest.raises(ValueError, match="walk must be one of"):
            call()


@pytest.mark.parametrize("k, want", [(2, "fixed_point"), (3, "walk"), (5, "walk")])
def test_auto_walk_on_an_accelerator(monkeypatch, k, want):
    """``walk="auto"`` on an accelerator's rows (the device kind switched here, the torch path on CPU tensors): the
    host walk for k ≥ 3 (the batched fixed point's ``[R, V, 400]`` passes cost an H200 12× the time and ~200× the
    rows' memory, docs/deviations.md item 69), the fixed point of cumulative sums for k = 2 — with the plan of
    ``pts_plan`` either way (1e-12)."""
    import gpu.host
    import gpu.wor_plans as wp
    seen = []
    monkeypatch.setattr(gpu.host, "_numpy_call", lambda fn, args: fn(*args))
    monkeypatch.setattr(wp, "device_kind", lambda x: "accelerator")
    for name, tag in (("_walk", "walk"), ("thinning_fixed_point", "fixed_point")):
        real = getattr(wp, name)
        monkeypatch.setattr(wp, name, lambda *a, _real=real, _tag=tag: seen.append(_tag) or _real(*a))
    rng = np.random.default_rng(k)
    pi, qi = rng.dirichlet(np.full(40, 0.5)), rng.dirichlet(np.full(40, 0.5))
    S = tuple(int(y) for y in rng.choice(40, k, replace=False, p=qi))
    pt, qt = torch.tensor(pi)[None], torch.tensor(qi)[None]
    w, a = pts_weights(0.7 * pt, qt, pt, torch.tensor([S]))
    assert set(seen) == {want}, seen
    plan = pts_plan(pi, qi, 0.7, k, "wor")
    np.testing.assert_allclose(w[0].numpy(), plan.select(S), rtol=0, atol=1e-12)
    np.testing.assert_allclose(a[0].numpy(), plan.marginal, rtol=0, atol=1e-12)


def test_rule_1_only_where_its_lp_is_small():
    """Rule 1's LP is tried on supports of at most ``SMALL_SUPPORT`` tokens whose ordered k-tuples number at most
    ``MAX_LP_TUPLES`` (``choose.small_lp``, numpy ints and torch tensors alike): five children on eight tokens
    (6 720 tuples) are planned by the other rules on both sides — the batched layer's dense tableau of that LP
    took 77 s and 4.7 GB on this tree, HiGHS 5.8 s — with the same E[τ | T]."""
    from univer_theory import DraftTree
    from univer_theory.plans.choose import small_lp
    assert [bool(small_lp(s, k)) for s, k in ((8, 4), (6, 5), (8, 5), (7, 5), (9, 2))] == [True, True, False, False,
                                                                                             False]
    assert small_lp(torch.tensor([8, 6, 7]), 5).tolist() == [False, True, False]
    model = DirichletModel(8, seed=6025, concentration=0.05, similarity=0.4)
    tree = DraftTree((-1, 0, 0, 0, 0, 0, 5), (-1, 7, 5, 3, 1, 6, 1), 8)
    p, q = model.node_probs(tree)
    assert np.count_nonzero(q[0]) == 8 and choose_plan(p[0], q[0], 1.0, 5, "wor").construction != "lp"
    batch, pt, qt = padded_rows([tree], model)
    want = VERIFIERS["univer"].expected_accepted_length(tree, p, q, "wor")
    assert abs(float(expected_accepted_length(batch, pt, qt, "wor", "univer")[0]) - want) < 1e-12


@pytest.mark.parametrize("k,V", [(9, 13), (12, 16), (16, 300), (24, 2000)])
def test_wide_nodes_are_planned_alike_and_in_bounded_time(k, V):
    """A wide-node campaign: rule 7 enumerated every composition's k! orders (k = 12 on 16 tokens asked for ~46 GB;
    now k ≤ LUCE_MAX_K), and rules 7 and 8 asked for α*(ρ) where its clock integral is beyond float64 (k = 16 on
    300 tokens: a ValueError, the node unplanned; now not tried there).  One dominant draft token (PTS short of
    α*); the exact core and the batched path give one plan, within α*'s bounds where α* is computable."""
    from univer_theory.alpha_star import wor_clocks_in_range
    from univer_theory.plans.luce import LUCE_MAX_K, luce_budget
    rng = np.random.default_rng(k + V)
    q = rng.dirichlet(np.full(V, 0.5))
    q *= 0.05 / q.sum()
    q[0] += 0.95
    p = rng.dirichlet(np.full(V, 0.5))
    S = tuple(int(y) for y in rng.choice(V, k, replace=False, p=q))
    plan = choose_plan(p, q, 1.0, k, "wor")
    w, a = wor_weights(torch.tensor(p)[None], torch.tensor(q)[None], torch.ones(1, dtype=torch.float64),
                       torch.tensor(p)[None], torch.tensor([S]))
    np.testing.assert_allclose(w[0].numpy(), plan.select(S), rtol=0, atol=1e-12)
    np.testing.assert_allclose(a[0].numpy(), plan.marginal, rtol=0, atol=1e-12)
    assert (plan.marginal <= p + 1e-12).all() and not luce_budget([1] * V, k) and k > LUCE_MAX_K
    if wor_clocks_in_range(V, k):
        assert float(plan.alpha) <= alpha_star(p, q, k, "wor", 1.0) + 1e-9


def test_rules_7_and_8_are_gated_on_the_drafted_tokens(monkeypatch):
    """α*(ρ)'s clock integral runs over a row's drafted tokens, so whether rules 7 and 8 may ask for it depends on
    how many the row drafts, not on its length: a node of k = 13 children drafted from the top 64 of 49 152 tokens
    skipped them (k = 13 is computable up to ~4e4 tokens) — in the exact core and, row by row, in the batched path
    (a row drafting all 49 152 tokens beside it still skips them).  Both ask the rules' gate now and agree."""
    import gpu.wor_plans as batched
    import univer_theory.plans.choose as core
    from univer_theory.plans.choose import alpha_star_computable
    k, V, m = 13, 49152, 64
    assert alpha_star_computable(m, k) and not alpha_star_computable(V, k) and alpha_star_computable(V, 2)
    assert alpha_star_computable(torch.tensor([m, V]), k).tolist() == [True, False]
    rng = np.random.default_rng(0)
    q = np.zeros(V)
    q[:m] = rng.dirichlet(np.full(m, 0.5))
    q[:m] *= 0.05 / q[:m].sum()
    q[0] += 0.95
    p = np.zeros(V)
    p[:m] = rng.dirichlet(np.full(m, 0.5))
    p = 0.9 * p + 0.1 / V
    S = tuple(int(y) for y in rng.choice(V, k, replace=False, p=q))
    asked = []
    for module in (core, batched):
        real = module.first_draw_gate
        monkeypatch.setattr(module, "first_draw_gate", lambda q, *a, real=real: asked.append(q.shape[0]) or real(q, *a))
    plan = choose_plan(p, q, 1.0, k, "wor")
    whole = rng.dirichlet(np.full(V, 1.0))
    rows = torch.tensor(np.stack([p, p])), torch.tensor(np.stack([q, whole]))
    w, a = wor_weights(rows[0], rows[1], torch.ones(2, dtype=torch.float64), rows[0],
                       torch.tensor([S, tuple(range(k))]))
    assert asked == [V, 1]                      # the exact core's row, then the batched path's first row only
    np.testing.assert_allclose(w[0].numpy(), plan.select(S), rtol=0, atol=1e-12)
    np.testing.assert_allclose(a[0].numpy(), plan.marginal, rtol=0, atol=1e-12)
