"""Rule 2, the i.i.d. private-position layout (theory.md §6.3 item 2): exact marginal, α*(ρ), sampling."""
from itertools import product

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from solvers.condot import condot_value
from univer_theory.alpha_star import alpha_star
from univer_theory.plans.layout import PrivateLayout, layout_plan, layout_targets, mu_k, mu_k_width

from ..stats import assert_accepts, assert_power, assert_rejects, g_test


@st.composite
def node(draw):
    """(p, q, ρ, k) with zeros in p, q = p, and ρ ∈ {0, 1, random} all reachable."""
    V = draw(st.integers(2, 5))
    k = draw(st.integers(1, 4))
    raw = st.lists(st.floats(0.0, 1.0), min_size=V, max_size=V)
    p = np.array(draw(raw)) + np.array([1e-3 * (i == 0) for i in range(V)])
    q = np.array(draw(raw)) + 1e-3
    if draw(st.booleans()):
        q = p + 1e-3
    rho = draw(st.sampled_from([0.0, 1.0, 0.37, draw(st.floats(0.0, 1.0))]))
    return p / p.sum(), q / q.sum(), rho, k


def enumerated_marginal(plan, q, k):
    """``Σ_S Q(S) Σ_j w_j(S) 1[y_j = y]`` over all i.i.d. tuples (the definition)."""
    a = np.zeros(q.size)
    for S in product(range(q.size), repeat=k):
        w = plan.select(S)
        assert w.min() >= 0 and w.sum() <= 1 + 1e-12, (S, w)
        for y, wj in zip(S, w):
            a[y] += np.prod(q[list(S)]) * wj
    return a


@given(node())
def test_marginal_is_exact_and_alpha_star(args):
    p, q, rho, k = args
    plan = layout_plan(p, q, rho, k, "iid")
    a = enumerated_marginal(plan, q, k)
    np.testing.assert_allclose(a, plan.marginal, atol=1e-12, rtol=0)
    assert np.all(plan.marginal <= rho * p + 1e-16)
    assert abs(plan.alpha - alpha_star(p, q, k, "iid", rho)) <= 1e-12
    layout = plan.info["layout"]
    for S in [(0,) * k, tuple(range(k)) if k <= p.size else (0,) * k]:
        assert abs(layout.min_probs(S).sum() - 1) <= 1e-12


@pytest.mark.parametrize("seed,k,rho", [(0, 2, 1.0), (1, 3, 0.6), (2, 4, 0.25)])
def test_alpha_equals_condot_lp(seed, k, rho):
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.full(5, 0.6)), rng.dirichlet(np.full(5, 0.6))
    assert abs(layout_plan(p, q, rho, k, "iid").alpha - condot_value(p, q, rho, k, "iid")) <= 1e-9


def synthetic(kind: str, V: int, rng):
    """Pairs at large V: Dirichlet (q a mixture with p), Zipf (q a perturbed, shifted Zipf), and LLM-like rows
    (target softmax of ``scale``·N(0, 1) logits, draft = softmax(log p + ``noise``·N(0, 1))): ``flat`` (1, 0.5),
    ``peaky`` (3, 1)."""
    if kind == "dirichlet":
        p = rng.dirichlet(np.full(V, 0.1))
        return p, 0.5 * p + 0.5 * rng.dirichlet(np.full(V, 0.1))
    if kind == "zipf":
        z = 1.0 / np.arange(1, V + 1) ** 1.1
        q = np.roll(z, 3) * np.exp(rng.normal(0.0, 1.0, V))
        return z / z.sum(), q / q.sum()
    scale, noise = {"flat": (1.0, 0.5), "peaky": (3.0, 1.0)}[kind]
    p = np.exp(scale * rng.normal(size=V))
    q = p * np.exp(noise * rng.normal(size=V))
    return p / p.sum(), q / q.sum()


@pytest.mark.parametrize("k,rho", [(2, 0.6), (3, 1.0), (4, 0.3)])
def test_tied_densities_share_one_group(k, rho):
    """q = p: every ratio ties, so blocks hold groups of equal density b/q; the marginal is still exact."""
    p = np.array([0.1, 0.2, 0.3, 0.4])
    plan = layout_plan(p, p, rho, k, "iid")
    np.testing.assert_allclose(enumerated_marginal(plan, p, k), plan.marginal, atol=1e-12, rtol=0)
    assert abs(plan.alpha - alpha_star(p, p, k, "iid", rho)) <= 1e-12


@pytest.mark.parametrize("kind,k,rho", [("dirichlet", 2, 1.0), ("zipf", 3, 0.5), ("zipf", 2, 1.0),
                                        ("dirichlet", 4, 0.3)])
def test_large_vocabulary(kind, k, rho):
    """V = 10⁴: marginal == min(b, ρp), Σ == α*(ρ) (1e-10); realised densities have ∫θ = q, ∫θg = b; w(S) ≤ 1."""
    rng = np.random.default_rng(11)
    p, q = synthetic(kind, 10_000, rng)
    plan = layout_plan(p, q, rho, k, "iid")
    targets = plan.info["layout"].targets
    np.testing.assert_array_equal(plan.marginal, np.minimum(targets.b, rho * p))
    assert abs(plan.alpha - alpha_star(p, q, k, "iid", rho)) <= 1e-10
    assert abs(targets.b.sum() - 1) <= 1e-12
    layout: PrivateLayout = plan.info["layout"]
    for _ in range(20):
        S = tuple(int(y) for y in rng.choice(p.size, size=k, p=q))
        w = plan.select(S)
        assert w.min() >= 0 and w.sum() <= 1 + 1e-12
        for y in S:
            length, mass = layout.moments(y)
            assert abs(length - q[y]) <= 1e-12 * q[y]
            assert abs(mass - targets.b[y]) <= 1e-12 * targets.b[y] + 1e-15     # b: abs. round-off of D ~ ε


@pytest.mark.parametrize("family,V,k,rho", [("flat", 10_000, 2, 0.5), ("flat", 10_000, 3, 0.5),
                                            ("peaky", 10_000, 4, 0.5), ("peaky", 10_000, 2, 1.0),
                                            ("peaky", 2_000, 3, 1.0), ("dirichlet", 10_000, 3, 1.0),
                                            ("zipf", 10_000, 4, 1.0), ("zipf", 300, 3, 1.0)])
def test_block_densities_partition_and_moments(family, V, k, rho):
    """The largest block (up to thousands of tokens): every token's θ ≥ 0, Σ_y θ_y = 1 on every piece (1e-12),
    ∫θ_y = q(y) and ∫θ_y g = b(y) (relative 1e-12; b itself carries absolute round-off ~1e-17 from the
    closed form (D = F(X) − C is O(1)), hence + 1e-15), and no majorisation clamp beyond round-off."""
    rng = np.random.default_rng(V + k)
    p, q = synthetic(family, V, rng)
    layout: PrivateLayout = layout_plan(p, q, rho, k, "iid").info["layout"]
    t = layout.targets
    i = int(np.argmax(np.diff(t.bounds)))
    tokens = t.order[t.bounds[i]:t.bounds[i + 1]]
    assert tokens.size >= (300 if V >= 10_000 else 10), tokens.size      # the instance exercises a big block
    block = layout.block(i)
    assert block.clamp <= 1e-16
    edges = block.edges
    assert edges[0] == t.X[t.bounds[i]] and edges[-1] == t.X[t.bounds[i + 1]]
    total = np.zeros(edges.size - 1)
    widths = np.diff(edges)
    for y in tokens.tolist():
        e, theta = layout.density(y)
        np.testing.assert_array_equal(e, edges)
        assert theta.min() >= 0
        total += theta
        length, mass = layout.moments(y)
        assert abs(length - q[y]) <= 1e-12 * q[y]
        assert abs(mass - t.b[y]) <= 1e-12 * t.b[y] + 1e-15
        assert abs(theta @ widths - q[y]) <= 1e-12 * q[y] + 1e-15          # against the absolute edges too
    np.testing.assert_allclose(total, 1.0, rtol=0, atol=1e-12)
    assert abs(block.masses.sum() - mu_k(edges[0], edges[-1], k)) <= 1e-15
    np.testing.assert_allclose(block.masses, mu_k_width(edges[:-1], block.widths, k), rtol=1e-15)


def test_blocks_tile_the_unit_interval():
    """Every block's targets sum to its interval's μ_k (the identity the block-wise placement rests on)."""
    rng = np.random.default_rng(3)
    p, q = synthetic("zipf", 2000, rng)
    t = layout_targets(p, q, 0.9, 3)
    for l1, l2 in zip(t.bounds[:-1], t.bounds[1:]):
        assert abs(t.b[t.order[l1:l2]].sum() - mu_k(t.X[l1], t.X[l2], 3)) <= 1e-15


def test_monte_carlo_selection_rule():
    """Draw U_j ~ θ_{y_j}/q(y_j), select the smallest, thin by t(y): the frequencies of
    (selected position | none) match w(S).  G-test, fixed seed, level ``tests.stats.LEVEL``; power ≥
    ``tests.stats.POWER`` against the untinned selection (t ≡ 1), whose law is exact: the thinning coin is
    independent of the race, so ``Pr(first = j) = w_j / t(y_j)``."""
    rng = np.random.default_rng(2024)
    p, q = synthetic("zipf", 40, rng)
    k, rho = 3, 0.8
    plan = layout_plan(p, q, rho, k, "iid")
    layout, accept = plan.info["layout"], plan.info["accept"]
    t = layout.targets
    widest = int(np.argmax(np.diff(t.bounds)))                 # a block whose densities mix several groups
    block = t.order[t.bounds[widest]:t.bounds[widest + 1]]
    assert block.size >= 3
    S = (int(block[0]), int(block[1]), int(block[-1]))
    w = plan.select(S)
    law = {j: w[j] for j in range(k)} | {"none": 1 - w.sum()}
    untinned = {j: w[j] / accept[S[j]] for j in range(k)}
    assert abs(sum(untinned.values()) - 1) < 1e-12
    n = 20_000
    assert_power(law, {"untinned": untinned}, n)
    U = np.empty((n, k))
    for j, y in enumerate(S):                                    # U_j ~ θ_{y_j}/q(y_j): piece, then uniform in it
        e, theta = layout.density(y)
        mass = theta * np.diff(e)
        piece = rng.choice(mass.size, size=n, p=mass / mass.sum())
        U[:, j] = e[piece] + rng.random(n) * np.diff(e)[piece]
    first = U.argmin(axis=1)
    keep = rng.random(n) < accept[np.array(S)[first]]
    samples = [int(j) if ok else "none" for j, ok in zip(first, keep)]
    assert_accepts(g_test(samples, law), "selection rule")
    # the same test sees a wrong law: the untinned selection (t ≡ 1) is rejected
    assert_rejects(g_test([int(j) for j in first], law), "untinned selection")


def test_wrong_process_and_bad_input():
    p = q = np.full(3, 1 / 3)
    assert layout_plan(p, q, 1.0, 2, "wor") is None
    with pytest.raises(ValueError, match="layout_plan"):
        layout_plan(np.array([0.5, 0.6, -0.1]), q, 1.0, 2, "iid")
    with pytest.raises(ValueError, match="never drafted"):
        layout_plan(p, np.array([0.5, 0.5, 0.0]), 1.0, 2, "iid").info["layout"].density(2)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("span", [(-12, 3), (-300, 0), (-200, -100), (-320, 300)])
def test_mobius_scan_is_its_recurrence(backend, span):
    """``mobius_scan`` (the doubling scan of Möbius maps, on numpy and torch rows) and ``end_pivots`` (numpy: both
    recurrences in one compiled loop; torch: the doubling scans, the second over the groups reversed) give
    ``s_0 = Q_0``, ``s_g = Q_g + ℓ_{g−1}s_{g−1}/(ℓ_{g−1} + s_{g−1})`` on each row's valid prefix of G groups, held
    after it, and ``s''_{G−1} = Q_{G−1}``, ``s''_g = Q_g + ℓ_g s''_{g+1}/(ℓ_g + s''_{g+1})``, held at ``s''_0``
    after it, to 1e-13 relative of the Fraction recurrences — on seeded rows whose Q and ℓ (a fifth of them 0)
    span ``10^span``: 1e-12…1e3, and a confident row's tails (1e-300…1, 1e-200…1e-100, subnormal 1e-320…1e300:
    there ``ℓ·s`` underflowed in both, to a relative error of 1, and the float64 doubling scan's pivots were 0 and
    NaN), with prefixes from empty to whole."""
    from fractions import Fraction

    from univer_theory.plans.layout import end_pivots, mobius_scan
    rng = np.random.default_rng(5)
    R, G = 60, 70
    Q = 10.0 ** rng.uniform(*span, (R, G))
    ell = np.where(rng.random((R, G - 1)) < 0.2, 0.0, 10.0 ** rng.uniform(*span, (R, G - 1)))
    length = rng.integers(0, G + 1, R)
    length[:3] = [0, 1, G]
    valid = np.arange(G)[None, :] < length[:, None]
    if backend == "numpy":
        scan, (fwd, bwd) = mobius_scan(Q, ell, valid), end_pivots(Q, ell, length, valid)
    else:
        torch = pytest.importorskip("torch")
        args = [torch.from_numpy(x) for x in (Q, ell, length, valid)]
        scan, (fwd, bwd) = mobius_scan(args[0], args[1], args[3]).numpy(), (x.numpy() for x in end_pivots(*args))

    def step(Q_g, lg, s):
        return Fraction(Q_g) + (Fraction(lg) * s / (Fraction(lg) + s) if lg > 0 else 0)

    for r in range(R):
        n = int(length[r])
        want = [Fraction(0)] * G
        for g in range(n):
            want[g] = step(Q[r, g], ell[r, g - 1] if g else 0.0, want[g - 1] if g else Fraction(0))
        want[n:] = [want[n - 1] if n else Fraction(0)] * (G - n)
        back = [Fraction(0)] * G
        for g in range(n - 1, -1, -1):
            back[g] = step(Q[r, g], ell[r, g] if g < n - 1 else 0.0, back[g + 1] if g < n - 1 else Fraction(0))
        back[n:] = [back[0]] * (G - n)
        for got, exact in ((scan, want), (fwd, want), (bwd, back)):
            for g in range(G):
                w = float(exact[g])
                assert got[r, g] == w == 0.0 or abs(got[r, g] - w) <= 1e-13 * w, (r, g, got[r, g], w)


def test_mu_k_width_against_fractions():
    """``μ_k([lo, lo + width)) = (1 − lo)^k − (1 − lo − width)^k`` to 1e-14 relative against Fractions, on pieces
    anywhere in [0, 1) with widths down to 1e-17 of what remains (where the difference form cancels entirely),
    k = 1…11; one k per row gives the scalar-k floats exactly; k = 0 gives 0."""
    from fractions import Fraction
    rng = np.random.default_rng(5)
    lo = rng.random(600) * rng.choice([1.0, 1e-3, 1 - 1e-9], 600)
    width = rng.random(600) * (1 - lo) * rng.choice([1.0, 1e-8, 1e-17], 600)
    k = rng.integers(1, 12, 600)
    rows = mu_k_width(lo[:, None], width[:, None], k[:, None], 11)[:, 0]
    for x, w, kk, row in zip(lo, width, k, rows):
        got = mu_k_width(np.array(x), np.array(w), int(kk))
        want = (1 - Fraction(x)) ** int(kk) - (1 - Fraction(x) - Fraction(w)) ** int(kk)
        assert row == got
        assert abs(Fraction(float(got)) - want) <= Fraction(1, 10**14) * want, (x, w, kk)
    assert mu_k_width(np.array(0.3), np.array(0.2), 0) == 0.0


def test_mu_k_width_numpy_pass_is_the_array_form_bit_for_bit():
    """numpy's compiled pass of ``mu_k_width`` (``_mu_k_rows``) against its array form (run on torch float64 CPU
    tensors, one rounded operation each), bit for bit: one k per row (``[R, 1]``, k = −1…7, ``k_max`` below and
    above the largest k), a scalar k (0…7), operands broadcast against each other, 0-d, 1-D and 3-D shapes, NaN,
    ±∞, negative and subnormal widths; it fails when the Horner step is fused (``A·s + B^j`` as one FMA)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(68)
    R, G = 40, 300
    lo = rng.random((R, G)) * rng.choice([1.0, 1e-3, 1 - 1e-9], (R, G))
    width = rng.random((R, G)) * (1 - lo) * rng.choice([1.0, 1e-8, 1e-17, -1.0], (R, G))
    lo[0, :4], width[1, :4] = [np.nan, np.inf, -np.inf, 5e-324], [np.nan, np.inf, -np.inf, 5e-324]
    as_torch = lambda x: x if isinstance(x, (int, np.integer)) else torch.from_numpy(np.asarray(x))

    def same(lo, width, k, k_max=None):
        got = mu_k_width(lo, width, k, k_max)
        want = mu_k_width(as_torch(lo), as_torch(width), as_torch(k), k_max).numpy()
        assert np.shape(got) == want.shape and np.asarray(got).tobytes() == want.tobytes()

    k = rng.integers(-1, 8, (R, 1))
    for k_max in (None, 5, 9):
        same(lo, width, k, k_max)
    for kk in range(8):
        same(lo, width, kk)
        same(lo[:, :1], width, kk)                      # broadcast operands
        same(lo.reshape(4, 10, G), width.reshape(4, 10, G), kk)
        same(np.float64(lo[3, 3]), np.float64(width[3, 3]), kk)
        same(lo[5], width[5], kk)
    assert isinstance(mu_k_width(np.array(0.3), np.array(0.2), 3), np.float64)


def test_tuple_shares_compiled_are_the_array_form_bit_for_bit(monkeypatch):
    """The tuple integrals' shares (``layout._tuple_shares``: the group sum of ``Σ_nodes w·f_j·Π_{l≠j}(1 − F_l)``
    times half the group's width) — numpy's compiled pass (``share_rows``: the children's columns on layout rows
    ``entry``, the widths from their edges) against the array form on the same numpy inputs (each column's
    own edges), bit for bit (NaN lanes included): K = 1…5 copies, duplicated children, absent copies (survival 1)
    whose columns are NaN, densities and CDFs from 1e-300 to 1, widths with subnormals, 1 to 1 500 groups (the group
    sum's leaves hold 128: ``univer_theory.nx.padded_sum``); and rows whose densities, rises and widths are all of
    order 1 at 129 … 1 500 groups, where every term of the group sum counts, so a leaf of the compiled pass cut one
    group off (starts 0, 129, 257, …) changes bits.  A survival reassociated in the array form
    (``1 − lo − rise·x``: one rounding moved) changes bits too, so the comparison is sharp."""
    from univer_theory.plans import layout
    from univer_theory.plans.layout import _tuple_shares, gauss_legendre, share_rows

    rng = np.random.default_rng(50)
    cases = []
    for K in range(1, 6):
        for D, G, N in ((1, 1, 1), (4, 33, 35), (7, 120, 20), (3, 1500, 4)):
            f = 10.0 ** rng.uniform(-300, 0, (D, G))
            rise = rng.random((D, G)) * 10.0 ** rng.uniform(-300, 0, (D, G))
            cdf = np.concatenate([np.zeros((D, 1)), np.cumsum(rise, 1)], 1)
            cdf /= np.maximum(cdf[:, -1:], 1e-300)
            U = int(rng.integers(1, 4))
            edges = np.cumsum(np.concatenate([np.zeros((U, 1)), 10.0 ** rng.uniform(-320, 0, (U, G + 5))], 1), 1)
            entry = rng.integers(0, U, D)
            column = rng.integers(0, D, (N, K))
            mask = rng.random((N, K)) < 0.8
            if D > 1:                                          # an absent child's columns may be NaN
                f[D - 1], cdf[D - 1] = np.nan, np.nan
                mask[column == D - 1] = False
            cases.append((f, cdf, edges, entry, column, mask, *gauss_legendre(-(-K // 2))))
    for K in (1, 2, 3):
        for G in (129, 200, 257, 1500):                # terms of one order: the group sum's grouping shows
            f, rise = rng.uniform(0.5, 1, (3, G)), rng.uniform(0.5, 1, (3, G))
            cdf = np.concatenate([np.zeros((3, 1)), np.cumsum(rise, 1)], 1)
            cdf /= cdf[:, -1:]
            edges = np.cumsum(np.concatenate([np.zeros((1, 1)), rng.uniform(0.5, 1, (1, G))], 1), 1)
            cases.append((f, cdf, edges, np.zeros(3, np.int64), rng.integers(0, 3, (6, K)), np.ones((6, K), bool),
                          *gauss_legendre(-(-K // 2))))

    def both(f, cdf, edges, entry, column, mask, nodes, weights):
        return (share_rows(f, cdf, edges, entry, column, np.where(mask, column, f.shape[0]), nodes, weights),
                _tuple_shares(f, cdf, edges[entry][:, :f.shape[1] + 1], column, mask, nodes, weights))
    for args in cases:
        assert _same_bits(*both(*args))
    assert sum(np.isnan(both(*a)[1]).any() for a in cases) >= 5                   # NaN lanes were compared
    monkeypatch.setattr(layout, "survival", lambda lo, rise, node: 1.0 - lo - rise * ((1 + node) / 2))
    assert any(not _same_bits(*both(*a)) for a in cases)


def _layout_batch(rng, kind: str, R: int, V: int):
    """``(c, q, k)`` of R seeded rows of one kind — flat, LLM-like (``p = q·e^{0.8z}``), Zipf, near-equal ratios,
    confident (a tail of 1e-300), ties (runs of equal q and p: exact density ties) — with dropped tokens."""
    if kind == "flat":
        q, p = rng.dirichlet(np.full(V, 0.3), R), rng.dirichlet(np.full(V, 0.3), R)
    elif kind in ("llm", "confident"):
        q = np.exp(3 * rng.standard_normal((R, V)))
        if kind == "confident":
            q[:, 1:] *= 1e-300
        p = q * np.exp(0.8 * rng.standard_normal((R, V)))
    elif kind == "zipf":
        p = rng.permuted(np.tile(np.arange(1.0, V + 1), (R, 1)), axis=1) ** -1.1
        q = p * np.exp(0.8 * rng.standard_normal((R, V)))
    elif kind == "near":
        q = rng.dirichlet(np.full(V, 2.0), R)
        p = q * rng.uniform(0.5, 1.5, (R, V))
    else:
        q, p = rng.integers(1, 4, (R, V)).astype(float), rng.integers(1, 4, (R, V)).astype(float)
    q[rng.random((R, V)) < 0.1] = 0.0
    q[:, 0] += q.max(-1) + 1e-3
    q, p = q / q.sum(-1, keepdims=True), p / p.sum(-1, keepdims=True)
    return rng.uniform(0.2, 1.0, R)[:, None] * p, q, rng.integers(1, 7, R)


def _layout_grid(seed: int, trials: int):
    """Seeded ``(q, k, rows, first, k_max, lay)`` of ragged batches of 1–4 rows of :func:`_layout_batch`'s kinds
    at V = 2…600, each row's first block its largest (hundreds of groups on LLM-like rows) or a random one."""
    from univer_theory.plans.layout import block_layout, layout_rows
    rng = np.random.default_rng(seed)
    kinds = ("flat", "llm", "zipf", "near", "confident", "ties")
    for trial in range(trials):
        c, q, k = _layout_batch(rng, kinds[trial % len(kinds)], int(rng.integers(1, 5)),
                                int(rng.choice([2, 3, 7, 40, 200, 600])))
        rows = layout_rows(c, q, k)
        sizes = [np.bincount(b[b >= 0]) for b in rows.block]
        first = np.array([int(np.argmax(s)) if rng.random() < 0.7 else int(rng.integers(0, s.size)) for s in sizes])
        k_max = int(k.max()) + int(rng.integers(0, 2))
        yield trial, q, k, rows, first, k_max, block_layout(q, k, rows, first, k_max)


def _same_bits(x, y) -> bool:
    """Equal shapes, dtypes and bytes (signed zeros and NaN payloads included)."""
    x, y = np.ascontiguousarray(x), np.ascontiguousarray(y)
    return x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes()


def test_layout_rows_compiled_is_the_array_form_bit_for_bit():
    """``layout_rows`` on numpy rows (after the sort, the compiled passes of ``layout_blocks``) against the array
    form (``array_layout_rows``, torch's), every field bit for bit, on batches of 1–4 rows of
    :func:`_layout_batch`'s kinds at V = 1…1 025, k = 1…6, ρ < 1 and ρ = 1; the grid reaches cuts at 0, inside and
    at the whole support, and rows of one block and of many."""
    from univer_theory.plans.layout import array_layout_rows, layout_rows
    rng = np.random.default_rng(63)
    kinds = ("flat", "llm", "zipf", "near", "confident", "ties")
    cuts, blocks = set(), set()
    for trial in range(180):
        c, q, k = _layout_batch(rng, kinds[trial % len(kinds)], int(rng.integers(1, 5)),
                                int(rng.choice([1, 2, 3, 7, 40, 200, 1025])))
        if trial % 3 == 0:
            c = c / c.sum(-1, keepdims=True)
        got, want = layout_rows(c, q, k), array_layout_rows(c, q, k)
        for name in want._fields:
            assert _same_bits(getattr(got, name), getattr(want, name)), (trial, name)
        m = (q > 0).sum(-1)
        cuts |= {"0" if n == 0 else "all" if n == s else "inside" for n, s in zip(got.cut, m)}
        blocks |= {"one" if b.max() == 0 else "many" for b in got.block}
    assert cuts == {"0", "inside", "all"} and blocks == {"one", "many"}, (cuts, blocks)


def test_block_layout_compiled_is_the_array_form_bit_for_bit():
    """``block_layout`` on numpy rows (the compiled pass of ``layout_blocks``) against the array form on the same
    rows (``array_block_layout``, torch's), every entry bit for bit, on :func:`_layout_grid` — ragged batches (the
    padded block width n and group count gmax), density ties, single-group blocks and blocks of hundreds of
    groups, k above and at ``k_max``; the grid reaches both kinds of block."""
    from univer_theory.plans.layout import array_block_layout
    groups = []
    for trial, q, k, rows, first, k_max, lay in _layout_grid(64, 150):
        want = array_block_layout(q, k, rows, first, k_max)
        assert lay.keys() == want.keys()
        for name in want:
            assert _same_bits(lay[name], want[name]), (trial, name)
        groups += lay["G"].tolist()
    assert min(groups) == 1 and max(groups) > 300, (min(groups), max(groups))


def test_child_columns_compiled_is_the_array_form_bit_for_bit():
    """The children's densities and CDFs of ``tuple_weights`` — on numpy rows the compiled pass of
    ``layout_blocks`` (``child_columns_rows``: the layout rows ``entry`` read in place, cut to g groups) — against
    the array form (``array_child_columns``, with ``inverse_columns``, on those rows gathered and cut) bit for bit:
    up to 8 columns a batch, each on a seeded row of :func:`_layout_grid`'s layouts, tokens in and out of the
    block, the layout cut to a group count at or below its own, as ``tuple_weights`` cuts its runs."""
    from univer_theory.plans.layout import _SHARE_KEYS, array_child_columns
    from univer_theory.plans.layout_blocks import child_columns_rows
    rng = np.random.default_rng(65)
    for trial, q, k, rows, first, k_max, lay in _layout_grid(66, 150):
        entry = rng.integers(0, q.shape[0], int(rng.integers(1, 9)))
        token = np.array([rng.choice(np.flatnonzero(q[e] > 0)) for e in entry])
        g = int(lay["G"].max()) if rng.random() < 0.7 else int(rng.integers(1, lay["G"].max() + 1))
        cut = {"edges": g + 1, "right": g - 1, "left": g - 1}
        lays = {name: (lay[name][:, :cut.get(name, g)] if lay[name].ndim == 2 else lay[name])[entry]
                for name in _SHARE_KEYS}
        group = lay["slot"][entry, token]
        inside = (group >= 0) & (group < g)
        group = np.where(inside, group, 0)
        got, want = child_columns_rows(lay, entry, g, group, q[entry, token], inside), array_child_columns(
            lays, group, q[entry, token], inside)
        assert all(_same_bits(x, y) for x, y in zip(got, want)), trial


def test_subnormal_draft_tokens_give_finite_weights():
    """A drafted token of subnormal q has the density 1/q > 1e307 on its window, and the share's node sum overflowed
    to ∞ (t = 0 then made the tuple's weights NaN, and the exact engine refused UniVer's decision): such a share is
    dropped as a 0/0 one is — the tuple's probability is below ~2e-308 — and no 0·∞ is formed on the way (a
    RuntimeWarning on numpy rows, here an error)."""
    import warnings

    from univer_theory import LOSSLESS_TOL, VERIFIERS, ConfidentModel, TreeShape, evaluate
    p = np.array([0.47702019519763955, 1.335000126e-314, 1.335000126e-314, 0.5229798048023605])
    q = np.array([8.170660274580537e-309, 8.170660274580537e-309, 8.170660274580537e-309, 1.0])
    for k in (2, 3):
        plan = layout_plan(p, q, 1.0, k, "iid")
        for S in product(range(p.size), repeat=k):
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                w = plan.select(S)
            assert np.isfinite(w).all() and w.min() >= 0 and w.sum() <= 1, (S, w)
    r = evaluate(ConfidentModel(3, seed=0, tail=1e-308), TreeShape.parse("2"), "iid", VERIFIERS["univer"])
    assert r.distance <= LOSSLESS_TOL
