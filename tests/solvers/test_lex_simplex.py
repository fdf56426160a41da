"""The lexicographic simplex both layers solve their node LPs with (solvers/lex_simplex.py: the compiled CPU loop,
and the lockstep torch run an accelerator uses, side by side) against scipy's HiGHS, and the slot rule it solves
(:func:`solvers.slot_rule.slot_weights`) against HiGHS' oracle :func:`solvers.slot_rule.slot_rule_lp` — the same
w(S) to 1e-13, which needs the LP's unique-optimum tie-break (without it the two solvers pick different optimal
vertices)."""
import itertools

import numpy as np
import pytest
from scipy.optimize import linprog

from solvers.lex_simplex import _lex_simplex, lex_simplex
from solvers.slot_rule import multiset_class, slot_rule_lp, slot_weights, tuple_probability
from univer_theory.processes import tuple_probs
from univer_theory import ConfidentModel
from univer_theory.plans.choose import choose_plan

torch = pytest.importorskip("torch")        # the torch side of the comparison


def lockstep(A, b, costs, basis):
    """The accelerator's run of :func:`lex_simplex` (torch, every LP in lockstep) on the same tensors."""
    return _lex_simplex(A, b, costs, basis, 20 * sum(A.shape[1:]))


def slack_lps(rng, B, m, n, integer):
    """B LPs ``max c·x, A x ≤ b, x ≥ 0`` as ``[A | I] (x, s) = b`` with the slack basis; A in {0, 1} (``integer``:
    c in {0..3} too, so optima are often not unique) or uniform."""
    A = (rng.random((B, m, n)) < 0.4).astype(float) if integer else rng.random((B, m, n))
    b = rng.random((B, m)) * (rng.random((B, m)) < 0.8)            # some zero rows: degenerate vertices
    c = rng.integers(0, 4, (B, n)).astype(float) if integer else rng.normal(size=(B, n))
    full = np.concatenate([A, np.broadcast_to(np.eye(m), (B, m, m))], 2)
    costs = np.concatenate([c, np.zeros((B, m))], 1)
    return A, b, c, full, costs


@pytest.mark.parametrize("integer", [True, False])
def test_simplex_reaches_highs_optimum(integer):
    rng = np.random.default_rng(3)
    A, b, c, full, costs = slack_lps(rng, 40, 7, 12, integer)
    # bounded: every column has an entry (integer A might leave one empty); give those a row-0 entry
    full[:, 0, :12] = np.where(A.sum(1) == 0, 1.0, full[:, 0, :12])
    basis = torch.arange(12, 19).expand(40, -1)
    inputs = (torch.tensor(full), torch.tensor(b), torch.tensor(costs)[:, None, :], basis)
    x, ok = lex_simplex(*inputs)                 # CPU tensors: the compiled loop
    assert ok.all()
    x_torch, ok_torch = lockstep(*inputs)        # the same pivots in torch, as on an accelerator
    assert torch.equal(x_torch, x) and torch.equal(ok_torch, ok)
    x = x.numpy()
    for i in range(40):
        ref = linprog(-c[i], A_ub=full[i, :, :12], b_ub=b[i], bounds=(0, None), method="highs")
        assert np.abs(full[i] @ x[i] - b[i]).max() <= 1e-12 and x[i].min() >= 0
        assert c[i] @ x[i, :12] == pytest.approx(-ref.fun, abs=1e-10)


def test_simplex_second_level_optimises_on_the_first_levels_face():
    """``lexmax (c1·x, c2·x)`` equals HiGHS on ``max c2·x s.t. c1·x ≥ c1*`` (integer c1: wide optimal faces)."""
    rng = np.random.default_rng(8)
    A, b, c1, full, costs = slack_lps(rng, 30, 6, 10, True)
    full[:, 0, :10] = np.where(A.sum(1) == 0, 1.0, full[:, 0, :10])
    c2 = rng.normal(size=(30, 10))
    costs2 = np.concatenate([c2, np.zeros((30, 6))], 1)
    x, ok = lex_simplex(torch.tensor(full), torch.tensor(b), torch.tensor(np.stack([costs, costs2], 1)),
                        torch.arange(10, 16).expand(30, -1))
    assert ok.all()
    for i in range(30):
        top = -linprog(-c1[i], A_ub=full[i, :, :10], b_ub=b[i], bounds=(0, None), method="highs").fun
        ref = linprog(-c2[i], A_ub=np.vstack([full[i, :, :10], -c1[i]]), b_ub=np.append(b[i], -top + 1e-12),
                      bounds=(0, None), method="highs")
        assert c1[i] @ x[i, :10].numpy() == pytest.approx(top, abs=1e-10)
        assert c2[i] @ x[i, :10].numpy() == pytest.approx(-ref.fun, abs=1e-9)


def test_three_levels_keep_a_column_closed_by_the_first():
    """A column closed at level 0 (reduced cost −1) stays closed at level 2 even where level 1 is silent on it and
    level 2 would gain: ``lexmax (x1 − x2, 0, x2)`` s.t. ``x1 + x2 + s = 1`` is x = (1, 0, 0), on both runs (a
    pricing that looked only at the previous level opened x2 there: (0, 1, 0)); then a random grid of
    three-level LPs, both runs against HiGHS level by level."""
    A, b = torch.tensor([[[1.0, 1.0, 1.0]]], dtype=torch.float64), torch.tensor([[1.0]], dtype=torch.float64)
    costs = torch.tensor([[[1.0, -1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]]], dtype=torch.float64)
    for run in (lex_simplex, lockstep):
        x, ok = run(A.clone(), b, costs, torch.tensor([[2]]))
        assert ok.all() and x[0].tolist() == [1.0, 0.0, 0.0], run
    rng = np.random.default_rng(11)
    A, b, c1, full, c1_full = slack_lps(rng, 20, 5, 8, True)
    full[:, 0, :8] = np.where(A.sum(1) == 0, 1.0, full[:, 0, :8])
    c2, c3 = rng.integers(-1, 2, (20, 8)).astype(float), rng.normal(size=(20, 8))
    levels = np.stack([c1_full] + [np.concatenate([c, np.zeros((20, 5))], 1) for c in (c2, c3)], 1)
    runs = [run(torch.tensor(full), torch.tensor(b), torch.tensor(levels), torch.arange(8, 13).expand(20, -1))
            for run in (lex_simplex, lockstep)]
    for i in range(20):
        rows, rhs = full[i, :, :8], b[i]
        for c in (c1[i], c2[i], c3[i]):            # each level's optimum on the face of the levels before it
            best = -linprog(-c, A_ub=rows, b_ub=rhs, bounds=(0, None), method="highs").fun
            for x, ok in runs:
                assert ok[i] and c @ x[i, :8].numpy() == pytest.approx(best, abs=1e-9)
            rows, rhs = np.vstack([rows, -c]), np.append(rhs, -best + 1e-12)


def test_simplex_reports_unbounded_and_capped_lps_and_rejects_bad_input():
    """Unbounded and capped LPs report False; a b that is negative, NaN or inf, a basis index outside A's columns,
    basis columns that are not the identity and a cap that is not an integer ≥ 0 are ValueErrors."""
    A = torch.tensor([[[1.0, -1.0, 1.0]], [[1.0, 1.0, 1.0]]])         # LP 0: x_1 grows without bound
    b = torch.tensor([[1.0], [1.0]])
    costs = torch.tensor([[[0.0, 1.0, 0.0]], [[2.0, 1.0, 0.0]]])
    basis = torch.tensor([[2], [2]])
    x, ok = lex_simplex(A, b, costs, basis)
    assert ok.tolist() == [False, True] and x[1].tolist() == [1.0, 0.0, 0.0]
    x_torch, ok_torch = lockstep(A, b, costs, basis)
    assert torch.equal(x_torch, x) and torch.equal(ok_torch, ok)
    _, ok = lex_simplex(A[1:], b[1:], costs[1:], basis[1:], max_pivots=0)
    assert ok.tolist() == [False]
    for bad in (-b, b * float("nan"), b * float("inf")):
        with pytest.raises(ValueError, match="b must be finite and ≥ 0"):
            lex_simplex(A, bad, costs, basis)
    with pytest.raises(ValueError, match="shapes disagree"):
        lex_simplex(A, b[:1], costs, basis)
    for bad in (basis + 1, basis - 3):              # the compiled loop would read A outside its columns
        with pytest.raises(ValueError, match=r"basis must hold column indices in \[0, 3\)"):
            lex_simplex(A, b, costs, bad)
    _, _, _, full, slack_costs = slack_lps(np.random.default_rng(3), 2, 3, 2, False)
    slack = np.arange(2, 5)[None].repeat(2, 0)
    assert lex_simplex(full, np.ones((2, 3)), slack_costs[:, None], slack)[1].all()
    # the tableau starts on the basis as given: columns not the identity were read as if they were
    for A_, b_, c_, bad in ((A * 2, b, costs, basis), (full, np.ones((2, 3)), slack_costs[:, None], slack[:, ::-1]),
                            (torch.tensor(full), torch.ones(2, 3, dtype=torch.float64),
                             torch.tensor(slack_costs[:, None]), torch.tensor(slack[:, [0, 1, 0]]))):
        with pytest.raises(ValueError, match=r"basis columns of A must be the identity"):
            lex_simplex(A_, b_, c_, np.ascontiguousarray(bad) if isinstance(bad, np.ndarray) else bad)
    off = np.array([[[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]])           # column 0 is (1, 1): its diagonal entry alone is 1
    with pytest.raises(ValueError, match=r"basis columns of A must be the identity"):
        lex_simplex(off, np.ones((1, 2)), np.zeros((1, 1, 3)), np.array([[0, 1]]))
    assert lex_simplex(off, np.ones((1, 2)), np.zeros((1, 1, 3)), np.array([[0, 1]]), check_basis=False)[1].all()
    for none in (np.zeros((1, 1, 0)), torch.zeros(1, 1, 0, dtype=torch.float64)):     # no columns at all: the range
        kind = torch.tensor if torch.is_tensor(none) else np.array
        with pytest.raises(ValueError, match=r"basis must hold column indices in \[0, 0\)"):
            lex_simplex(none, kind([[1.0]]), 0 * none, kind([[0]]))
    for cap in (-1, 2.0, True):
        with pytest.raises(ValueError, match="max_pivots must be an integer ≥ 0"):
            lex_simplex(A, b, costs, basis, max_pivots=cap)
    # a NaN cost never priced in: max x_1 s.t. x_1 + s = 1 stopped at its starting basis x = (0, 1), "optimal"
    one, start = np.array([[[1.0, 1.0]]]), np.array([[1]])
    for A_, c in ((one, [[[1.0, float("nan")]]]), (one, [[[float("nan"), 0.0]]]), (one * float("nan"), [[[1.0, 0.0]]]),
                  (one, [[[float("inf"), 0.0]]])):
        with pytest.raises(ValueError, match="A and costs must be finite"):
            lex_simplex(A_, np.array([[1.0]]), np.array(c), start)
    assert lex_simplex(one, np.array([[1.0]]), np.array([[[1.0, 0.0]]]), start)[0].tolist() == [[1.0, 0.0]]


def classes(rng, process, k, count):
    """Random (q, S, plan weights on every ordering of S, integer ω) with tokens repeated under iid."""
    V = 6
    for i in range(count):
        q = rng.dirichlet(np.full(V, 0.6))
        S = tuple(int(y) for y in rng.choice(V, k, replace=(process == "iid"), p=q))
        if process == "iid" and i % 3 == 0:
            S = (S[0],) + S[:-1]                                       # a repeated token
        perms = list(itertools.permutations(range(k)))
        w = rng.dirichlet(np.ones(k + 1), size=len(perms))[:, :k] * rng.random((len(perms), 1))
        table = {}
        for perm, wp in zip(perms, w):                                 # one plan: a repeated ordering, one w
            table.setdefault(tuple(S[j] for j in perm), wp)
        w = np.array([table[tuple(S[j] for j in perm)] for perm in perms])
        omega = rng.permutation([1 + 3 * (i % 2), 1, 2, 5][:k]).astype(float)
        yield q, S, perms, w, omega


@pytest.mark.parametrize("process,k", [("iid", 3), ("iid", 4), ("wor", 3), ("wor", 4)])
def test_batched_slot_rule_is_the_exact_cores(process, k):
    rng = np.random.default_rng(17 + k)
    cases = list(classes(rng, process, k, 24))
    perms = cases[0][2]
    got, applied = slot_weights(torch.tensor(np.stack([c[3] for c in cases])), torch.tensor([c[1] for c in cases]),
                                torch.tensor(np.stack([c[0] for c in cases])),
                                torch.tensor(np.stack([c[4] for c in cases])), process, perms)
    assert applied.all()
    got = got.numpy()
    moved = 0
    for (q, S, _, w, omega), row in zip(cases, got):
        orderings, probs = multiset_class(S, q, process)
        res = slot_rule_lp(orderings, probs, np.array([w[perms.index(p)] for p in (
            next(p for p in perms if tuple(S[j] for j in p) == o) for o in orderings)]), omega)
        assert res.success, res.message
        want = res.weights[orderings.index(S)]
        np.testing.assert_allclose(row, want, rtol=0, atol=1e-13)
        moved += not np.allclose(want, w[0], atol=1e-9)
    assert moved >= 12                      # the rule did move mass on most classes


def test_slot_oracle_refuses_nan_and_negative_inputs():
    """The oracle read a NaN class probability as "class probability 0: nothing to move" and reported success, and
    its recheck passed a NaN violation."""
    orderings, w, omega = [(0, 1, 2), (1, 0, 2), (2, 1, 0)], np.full((3, 3), 0.2), [4, 2, 1]
    for probs, weights in (([np.nan, .1, .1], w), ([-.1, .1, .1], w), ([.1, .1, .1], w * np.nan),
                           ([.1, .1, np.inf], w), ([.1, .1], np.full((2, 2), np.nan))):       # k = 2 too
        with pytest.raises(ValueError, match="slot_rule_lp: probs and weights must be finite and ≥ 0"):
            slot_rule_lp(orderings[:len(probs)], probs, weights, omega[:weights.shape[1]])
    assert slot_rule_lp(orderings, [.1, .1, .1], w, omega).success
    from solvers import slot_rule                     # a NaN in its recheck is a failed recheck, not a pass
    for bad in ((np.nan, 0.0, 0.0), (0.0, np.nan, 0.0), (0.0, 0.0, np.nan)):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(slot_rule, "slot_violations", lambda *_, bad=bad: bad)
            res = slot_rule_lp(orderings, [.1, .1, .1], w, omega)
        assert res.status == "recheck_failed" and not res.success and "nan" in res.message, res.message


@pytest.mark.parametrize("process", ["iid", "wor"])
def test_tuple_probs_batched_on_torch_match_the_exact_cores_rows(process):
    """The one Q_k function, batched on torch, against the exact core's per-row numpy calls of it."""
    rng = np.random.default_rng(2)
    q = rng.dirichlet(np.full(5, 0.4), size=8)
    q[0] = [0.5, 0.5, 0, 0, 0]                                         # wor: the third draw has nothing left
    tuples = rng.integers(0, 5, (8, 6, 3)) if process == "iid" else np.stack(
        [[rng.permutation(5)[:3] for _ in range(6)] for _ in range(8)])
    tuples[0, 0] = (0, 1, 2)
    got = tuple_probs(torch.tensor(q), torch.tensor(tuples), process).numpy()
    want = np.array([[tuple_probability(S, q[r], process) for S in tuples[r]] for r in range(8)])
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=0)
    assert got[0, 0] == 0 and (got[1:] > 0).all()

def test_confident_classes_are_slotted_on_both_sides():
    """Classes of a confident wor draft (``ConfidentModel``, p = q, tail 1e-16: the class's probabilities span
    ~1e-46 to 1): HiGHS' optimal vertex carries round-off of ~1e-14·ΣQ below zero, which the exact core's recheck
    must accept as it accepts the capacity and mass round-off (``SLOT_TOL``; with −1e-15 it rejected every one of
    these classes and kept the plan's own weights, where the batched slot rule solved them: on a confident
    zero-top row that moved E[τ | T] by 0.5) — and both sides then give the same w(S)."""
    k, perms = 4, list(itertools.permutations(range(4)))
    omega = np.array([2.0, 2.0, 2.0, 4.0])              # three leaves, then a child with two children
    for seed in range(6):
        V = 8 + seed % 5
        model = ConfidentModel(V, seed=seed, tail=1e-16, target="same")
        p, q = model.target(()), model.draft(())
        top = int(np.argmax(q))
        rest = np.random.default_rng(seed).choice([y for y in range(V) if y != top], k - 1, replace=False)
        S = (top, *map(int, rest))
        plan = choose_plan(p, q, 1.0, k, "wor")
        orderings, probs = multiset_class(S, q, "wor")
        res = slot_rule_lp(orderings, probs, np.array([plan.select(o) for o in orderings]), omega)
        assert res.success, f"seed {seed}: {res.message}"
        w_all = torch.tensor(np.array([plan.select(tuple(S[j] for j in perm)) for perm in perms]))[None]
        got, applied = slot_weights(w_all, torch.tensor([S]), torch.tensor(q)[None], torch.tensor(omega)[None], "wor",
                                    perms)
        assert applied.all()
        want = res.weights[orderings.index(S)]
        np.testing.assert_allclose(got[0].numpy(), want, rtol=0, atol=1e-13, err_msg=f"seed {seed}")


def test_slot_rule_keeps_the_plans_weights_where_the_simplex_fails_or_its_answer_moves_mass(monkeypatch):
    """The fallback of ``slot_lp``: a row whose simplex did not finish, or whose answer fails the recheck (a token's
    class mass moved), keeps the plan's own weights — neither branch was reached by a test."""
    import solvers.slot_rule as slot_rule

    real = slot_rule.lex_simplex
    rng = np.random.default_rng(21)
    cases = list(classes(rng, "wor", 3, 8))
    args = (torch.tensor(np.stack([c[3] for c in cases])), torch.tensor([c[1] for c in cases]),
            torch.tensor(np.stack([c[0] for c in cases])), torch.tensor(np.stack([c[4] for c in cases])), "wor",
            cases[0][2])
    _, applied = slot_weights(*args)
    assert applied.all()                             # the unpatched LP is applied on every row of this batch

    def not_finished(A, b, costs, basis, **kw):
        x, ok = real(A, b, costs, basis, **kw)
        return x, ok & False

    def moves_class_mass(A, b, costs, basis, **kw):  # u of (ordering 0, position 0) up: a token's mass moved
        x, ok = real(A, b, costs, basis, **kw)
        x = x.clone()
        x[:, 0] += 1e-3
        return x, ok

    for patch in (not_finished, moves_class_mass):
        monkeypatch.setattr(slot_rule, "lex_simplex", patch)
        got, applied = slot_weights(*args)
        assert not applied.any(), patch.__name__
        assert torch.equal(got, args[0][:, 0]), patch.__name__


@pytest.mark.parametrize("run", ["host", "lockstep"])
def test_the_ratio_test_steps_to_the_least_ratio_exactly(run, monkeypatch):
    """Rows within a tolerance of the least ratio counted as tied, and the first was taken: the step went past the
    least ratio, another row's basic variable went below 0 (clipped, a point off ``A x = b`` by 1.1e-12) and rule 1
    ended 1.1e-12 short of α*(ρ) on this confident i.i.d. row (k = 3).  Ties are exact now: the basic solution
    satisfies its rows to round-off and rule 1 reaches α*(ρ) — in the compiled loop (numpy rows) and in the
    accelerator's lockstep run (torch rows)."""
    import solvers.condot_simplex as cs
    from univer_theory.alpha_star import alpha_star

    p = np.array([0.9999999999992426, 7.5747637788248e-13])
    q = np.array([0.9999990416911908, 9.58308809282637e-07])
    seen = {}

    def spy(A, b, costs, basis, *rest, **kw):
        x, ok = lex_simplex(A, b, costs, basis, *rest, **kw)
        seen.update(A=np.asarray(A), b=np.asarray(b), x=np.asarray(x))
        return x, ok

    rows = (p[None], q[None])
    if run == "lockstep":           # CPU tensors through the torch run an accelerator takes
        import solvers.lex_simplex
        monkeypatch.setattr(solvers.lex_simplex, "_simplex_host", _lex_simplex)
        rows = tuple(torch.tensor(r) for r in rows)
    orig, cs.lex_simplex = cs.lex_simplex, spy
    try:
        a, solved = cs.condot_table(*rows, 3, "iid")[3:]
    finally:
        cs.lex_simplex = orig
    assert bool(solved[0])
    assert np.abs(seen["A"][0] @ seen["x"][0] - seen["b"][0]).max() <= 1e-15
    assert abs(float(a.sum()) - alpha_star(p, q, 3, "iid", 1.0)) <= 1e-15
