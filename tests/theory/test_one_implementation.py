"""The node rules written once over the array namespace (:mod:`univer_theory.nx`) against independent oracles:
the ratio order and top-m against Python sorts on exact Fraction keys, K-SEQ's ρ* against the sign of its
equation in exact arithmetic, the k = 1 plan and the topk fill against the Fraction computations kept apart in
:mod:`univer_theory.plans.choose`.  (The greedy and topk fills against the CondOT LP, and every plan's
losslessness by enumeration, are in test_univer.py / test_lossless.py.)"""
import math
from fractions import Fraction

import numpy as np
import pytest

from univer_theory.orders import descending_ratio_order, ratio_argsort, top_tokens
from univer_theory.plans.choose import single_child_plan, topk_fill_plan
from univer_theory.verifiers import kseq_acceptance_mass, kseq_rho_star


def rows(seed: int, V: int = 7):
    """Seeded ``(p, q)`` pairs: Dirichlet rows, rows on a 1/16 grid (exact ties of q and of p/q; some q = 0), rows with
    zeros in p and q, and peaky rows (one token holds all but 1e-12, the rest down to 1e-300)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(6):
        out.append((rng.dirichlet(np.full(V, 0.6)), rng.dirichlet(np.full(V, 0.6))))
        out.append(tuple(rng.multinomial(16, np.full(V, 1 / V)) / 16 for _ in range(2)))   # exact dyadic
        p, q = rng.dirichlet(np.full(V, 0.5)), rng.dirichlet(np.full(V, 0.5))
        p[rng.random(V) < 0.3] = 0
        q[rng.random(V) < 0.3] = 0
        q[rng.integers(V)] += 0.1
        out.append((p / p.sum(), q / q.sum()))
        tail = 10.0 ** -rng.uniform(12, 300, V)
        for x in (tail, tail[::-1].copy()):
            x[rng.integers(V)] = 0
            x[rng.integers(V)] = 1.0
        out.append((tail / tail.sum(), tail[::-1] / tail[::-1].sum()))
    return out


def node_grid(seeds, pairs, cap: int, vocab_sizes=(4, 7)):
    """``(where, p, q, process, k)`` over :func:`rows` of each seed and V — the finite ones (a sparse draw can zero a
    whole row) — for each ``(process, k)`` of ``pairs`` whose tuples over the draft support number at most ``cap``
    (without replacement: at least k drafted tokens)."""
    for seed in seeds:
        for V in vocab_sizes:
            for i, (p, q) in enumerate(rows(seed, V)):
                if not (np.isfinite(p).all() and np.isfinite(q).all()):
                    continue
                m = int(np.count_nonzero(q))
                for process, k in pairs:
                    if (m ** k if process == "iid" else math.perm(m, k)) > cap or (process != "iid" and m < k):
                        continue
                    yield f"seed {seed} V {V} row {i} {process} k {k}", p, q, process, k


def _exact_ratio(p, q, x):
    return Fraction(p[x]) / Fraction(q[x]) if q[x] > 0 else None


@pytest.mark.parametrize("seed", range(4))
def test_ratio_order_is_the_exact_ratio_sort_with_ties_by_id(seed):
    """Exact on every row whose ratios are 0 or above 2^-970 (below, the key 2^-51·p/q is subnormal and two
    ratios within its spacing may tie or swap: tokens with p/q < 1e-292, irrelevant to every α)."""
    for p, q in rows(seed):
        V = p.size
        if any(0 < p[x] / q[x] < 2.0 ** -970 for x in range(V) if q[x] > 0):
            continue
        drafted = [x for x in range(V) if q[x] > 0]
        undrafted = [x for x in range(V) if q[x] == 0]
        up = sorted(drafted, key=lambda x: (_exact_ratio(p, q, x), x)) + undrafted
        down = sorted(drafted, key=lambda x: (-_exact_ratio(p, q, x), x)) + undrafted
        assert ratio_argsort(p, q).tolist() == up
        assert ratio_argsort(p, q, descending=True).tolist() == down
        both = ratio_argsort(np.stack([p, p]), np.stack([q, q]), descending=True)     # batch axes lead
        assert both.tolist() == [down, down]


@pytest.mark.parametrize("seed", range(4))
def test_descending_order_from_the_ascending_one_is_the_descending_sort(seed):
    """:func:`descending_ratio_order` (O(V), no sort) equals ``ratio_argsort(…, descending=True)`` on every row of
    :func:`rows` — exact ties of p/q, q = 0, subnormal ratios — batched (rows with different numbers of drafted
    tokens in one batch), in numpy and in torch; reversing the ascending order instead fails on the tied rows."""
    torch = pytest.importorskip("torch")

    pairs = rows(seed)
    P, Q = np.stack([p for p, _ in pairs]), np.stack([q for _, q in pairs])
    want = ratio_argsort(P, Q, descending=True)
    for conv in (np.asarray, torch.tensor):
        got = descending_ratio_order(ratio_argsort(conv(P), conv(Q)), conv(P), conv(Q))
        assert np.array_equal(np.asarray(got), want)
    reversed_ = np.array([np.concatenate([a[:m][::-1], a[m:]]) for a, m in zip(ratio_argsort(P, Q), (Q > 0).sum(1))])
    assert not np.array_equal(reversed_, want)


@pytest.mark.parametrize("seed", range(4))
def test_top_tokens_are_the_most_likely_with_ties_to_the_lower_id(seed):
    for _, q in rows(seed):
        want = sorted(range(q.size), key=lambda x: (-Fraction(q[x]), x))
        for m in (1, 3, q.size):
            assert top_tokens(q, m).tolist() == want[:m]
            exact = np.array([Fraction(x) for x in q], dtype=object)
            assert top_tokens(exact, m).tolist() == want[:m]


def _kseq_f(p, q, k, rho: Fraction) -> Fraction:
    beta = sum(min(Fraction(qx), Fraction(px) / rho) for px, qx in zip(p, q))
    return 1 - (1 - beta) ** k - rho * beta


@pytest.mark.parametrize("k", [2, 3, 5])
def test_kseq_rho_star_brackets_the_exact_root(k):
    """Exact arithmetic: the equation's residual at the float root is at round-off, ``|f(ρ*)| ≤ 1e-15``; on the
    rows without a 1e-12 tail, where the root is well conditioned, ``f(ρ*(1 + 1e-12)) < 0 < f(ρ*(1 − 1e-12))``
    (a peaky row has ``f ≈ ε − δ²`` near ``ρ* = 1 + δ``, so its root moves by ~1e-9 per 1e-16 of f);
    ``ρ* = 1`` where the float ``f(1) ≤ 0`` (p = q, disjoint supports, β(1) below round-off); the accepted mass is the exact formula at ρ*."""
    for i, (p, q) in enumerate(rows(k)[:16]):
        rho = kseq_rho_star(p, q, k)
        assert isinstance(rho, float) and 1.0 <= rho <= k
        assert abs(_kseq_f(p, q, k, Fraction(rho))) <= Fraction(1, 10**15)
        lo, hi = Fraction(rho) * (1 - Fraction(1, 10**12)), Fraction(rho) * (1 + Fraction(1, 10**12))
        if rho > 1.0 and i % 4 != 3:
            assert _kseq_f(p, q, k, lo) > 0 > _kseq_f(p, q, k, min(hi, Fraction(k)))
        r = Fraction(rho)
        beta = sum(min(Fraction(qx), Fraction(px) / r) for px, qx in zip(p, q))
        scale = (1 - (1 - beta) ** k) / (r * beta) if beta else 0
        want = [float(min(r * Fraction(qx), Fraction(px)) * scale) for px, qx in zip(p, q)]
        np.testing.assert_allclose(kseq_acceptance_mass(p, q, k, rho), want, rtol=0, atol=1e-15)
    assert kseq_rho_star(q, q, k) == 1.0


@pytest.mark.parametrize("k", [2, 4, 5])
def test_kseq_rho_star_is_not_moved_by_a_rows_round_off(k):
    """At p = q every draft is accepted: ρ* = 1 and E[τ] is the tree's depth reached, for rows a few ulps, 9e-10
    (inside the simplex tolerance) or a float32 rounding short of 1.  ρ* moved by ``~ε^{1/k}`` there (1.011 on a
    float32 row 1.5e-8 short, E[τ] 1.989 for 2) while β was summed over the whole row."""
    torch = pytest.importorskip("torch")

    import gpu
    from gpu import TreeBatch
    from univer_theory import VERIFIERS, DraftTree

    tree = DraftTree((-1,) + (0,) * k + (1,), (-1,) + (1,) * (k + 1))      # the first child has a child
    short = np.array([0.3, 0.7])
    short[1] = np.nextafter(np.nextafter(short[1], 0), 0)
    rows32 = torch.tensor([1.3950316499642796e-03, 9.9860496835003576e-01], dtype=torch.float32)
    # as the level rules call it on float32 rows (checked where they enter, at float32's tolerance)
    assert kseq_rho_star(rows32.double().numpy(), rows32.double().numpy(), k, validate=False) == 1.0
    for r in (short, np.array([0.3, 0.7 - 9e-10])):
        assert kseq_rho_star(r, r, k) == 1.0
        P = np.tile(r, (k + 2, 1))
        assert VERIFIERS["kseq"].expected_accepted_length(tree, P, P, "iid") == 2.0
    p32 = rows32.expand(1, k + 2, 2).contiguous()
    assert float(gpu.expected_accepted_length(TreeBatch.from_trees([tree]), p32, p32, "iid", "kseq")[0]) == 2.0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("process", ["iid", "wor", "topk"])
def test_float_single_child_and_fill_match_the_fraction_checkers(seed, process):
    """The float path (the one implementation) against the exact Fraction computation on the same rows."""
    for p, q in rows(seed)[:12]:
        pe, qe = (np.array([Fraction(x) for x in r], dtype=object) for r in (p, q))
        for rho in (1.0, 0.375):
            exact, flt = single_child_plan(pe, qe, Fraction(rho), process), single_child_plan(p, q, rho, process)
            np.testing.assert_allclose(flt.marginal, exact.marginal.astype(float), rtol=0, atol=1e-15)
            for y in (top_tokens(q, 1) if process == "topk" else np.flatnonzero(q > 0)):
                assert abs(float(flt.select((y,))[0]) - float(exact.select((y,))[0])) <= 1e-15
            k = min(3, int(np.count_nonzero(q)))
            exact, flt = topk_fill_plan(pe, qe, Fraction(rho), k), topk_fill_plan(p, q, rho, k)
            np.testing.assert_allclose(flt.marginal, exact.marginal.astype(float), rtol=0, atol=1e-15)
