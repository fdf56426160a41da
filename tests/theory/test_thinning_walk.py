"""PTS's priority walk (``plans.clocks.thinning_walk``: compiled, checkpointed suffix states, each position's
availability as the product of its prefix and suffix polynomials) against the formula it implements, written plainly: for each
token y in priority order, the polynomial ``Π_{z≠y} f_z`` and ``D_{−y}`` rebuilt from scratch over every other
token (no prefix/suffix split), ``avail(y) = Σ w·[u^{k−1}]{q_y T e_y Π f + (1 − e_y)·u·D}`` on the same grid,
then ``θ_y = min(1, c(y)/avail(y))`` — on Zipf, Dirichlet and confident rows (tails down to 1e-310), k = 1..5,
ρ = 1 and 0.5, to 1e-13 relative.  On a subnormal tail a sum of subnormal terms is only known to ``2^-1074``
absolute, and the two orders of summation differ there: the tolerance grows by 100 × ``2^-1074/min q`` (as
``test_confident_rows.tolerance``; ~1e-10 at a 1e-310 tail, nothing above ~1e-294).  And ``g_z = 1 − θ_z`` is
ill-conditioned where θ_z ≈ 1 (an ulp of θ_z is a relative ``ε·θ_z/g_z`` of g_z); avail(y) is multilinear in
the g's with non-negative coefficients, so its relative sensitivity to each ``g_z`` is at most 1, and the
tolerance at y grows by ``1e-15·Σ_{z≺y} θ_z/g_z`` (θ, g of the reference; g = 0, θ = 1 from c ≥ avail, is
stable and adds nothing)."""
import numpy as np
import pytest

from univer_theory import ConfidentModel
from univer_theory.models import CONFIDENT_TARGETS
from univer_theory.plans import clocks
from univer_theory.plans.clocks import (LOG_T_NODES, early_nodes, log_time_grid, log_time_upper, rate_times,
                                        row_weights, thinning_walk, walk_states)
from univer_theory.plans.pts import pair_avail, pair_thinning_walk, priority_order, thinning_fixed_point
from univer_theory.tolerance import worst_of

RTOL = 1e-13


def plain_walk(qs, cs, k, s, weights, head=0.0):
    """The reference: one row ``qs, cs [m]``, weights ``[t]``; O(m²·k·t), every product rebuilt per token."""
    x = rate_times(qs[:, None], s)
    e, ring = np.exp(-x), -np.expm1(-x)
    qe = x * e
    g = np.ones(qs.size)
    theta, avail = np.zeros(qs.size), np.zeros(qs.size)
    for y in range(qs.size):
        P, D = np.zeros((k, s.size)), np.zeros((k, s.size))
        P[0] = 1.0
        for z in range(qs.size):
            if z == y:
                continue
            lin = g[z] * ring[z]
            newP, newD = P * e[z], D * e[z] + g[z] * qe[z] * P
            newP[1:] += P[:-1] * lin
            newD[1:] += D[:-1] * lin
            P, D = newP, newD
        integrand = qe[y] * P[k - 1] + (ring[y] * D[k - 2] if k >= 2 else 0.0)
        avail[y] = max(float(weights @ integrand), 0.0) + head * qs[y]
        c = cs[y]
        theta[y] = 0.0 if c <= 0 else (1.0 if c >= avail[y] else c / avail[y])
        g[y] = 1.0 - theta[y]
    return theta, avail


def zipf_row(V, seed):
    rng = np.random.default_rng(seed)
    p = np.arange(1, V + 1, dtype=float) ** -1.1
    p = p[rng.permutation(V)] / p.sum()
    q = p * np.exp(0.8 * rng.standard_normal(V))
    return p, q / q.sum()


def rows(V, k):
    """(name, p, q): Zipf, Dirichlet with undrafted tokens, and confident rows (every target family, tails to
    1e-310)."""
    for seed in range(2):
        yield ("zipf", *zipf_row(V, seed))
    rng = np.random.default_rng(V + k)
    q = rng.dirichlet(np.ones(V))
    q[rng.choice(V, V // 4, replace=False)] = 0.0
    yield "dirichlet", rng.dirichlet(np.ones(V)), q
    for seed, tail in enumerate((1e-12, 1e-300, 1e-310)):
        model = ConfidentModel(V, seed=seed, tail=tail, target=CONFIDENT_TARGETS[(seed + k) % len(CONFIDENT_TARGETS)])
        yield f"confident {tail:g}", model.target(()), model.draft(())


def walk_inputs(p, q, k, rho):
    """A row in priority order, undrafted tokens last (q = 0: identity steps), and its grid."""
    order = priority_order(p, q)
    order = order + [y for y in range(q.size) if q[y] == 0]
    qs, cs = q[order], rho * p[order]
    s, w = log_time_grid(LOG_T_NODES, log_time_upper(np.sort(qs)[-k]))
    return qs, cs, s, w


def own_end(qs, k, s, w):
    """The row's weights ``[1, t]`` up to its own end, as PTS walks it (:func:`row_weights`)."""
    return row_weights(w, s, qs[None], np.sort(qs)[::-1][None, :k])


def assert_close(got, want, what, qs=None, theta=None, rtol=RTOL):
    """Relative error ≤ ``rtol``, plus the subnormal slack of the row ``qs`` and the conditioning of ``1 − θ``
    before each position (module docstring)."""
    tol = rtol if qs is None else rtol + 100 * 2.0 ** -1074 / qs[qs > 0].min()
    if theta is not None:
        g = 1.0 - theta                     # θ = 1 exactly (c ≥ avail, g = 0) is stable: no slack
        ratio = np.divide(theta, g, out=np.zeros_like(g), where=g > 0)
        tol = tol + 1e-15 * np.concatenate([[0.0], np.cumsum(ratio)[:-1]])
    err = np.abs(got - want) / np.maximum(np.abs(want), np.finfo(float).tiny)
    assert np.all((err <= tol) | (got == want)), f"{what}: max relative error {err.max():.2e}"


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("V", [7, 23, 40])
def test_walk_matches_the_plain_formula(V, k):
    """One row at a time and all rows of a case at once (rows share the widest grid; weights 0 beyond a row's
    own panels), on numpy; k = 1 with the grid's head term."""
    head = 1e-13 if k == 1 else 0.0
    cases = [(name, rho, *walk_inputs(p, q, k, rho)) for name, p, q in rows(V, k) for rho in (1.0, 0.5)]
    for name, rho, qs, cs, s, w in cases:
        want = plain_walk(qs, cs, k, s, w, head)
        got = thinning_walk(qs[None], cs[None], k, s, w[None], head)
        assert_close(got[0][0], want[0], f"θ, {name}, ρ = {rho}", qs, want[0])
        assert_close(got[1][0], want[1], f"avail, {name}, ρ = {rho}", qs, want[0])
    s = max((c[4] for c in cases), key=len)
    W = np.stack([np.concatenate([c[5], np.zeros(s.size - c[5].size)]) for c in cases])
    batch = thinning_walk(np.stack([c[2] for c in cases]), np.stack([c[3] for c in cases]), k, s, W, head)
    for i, (name, rho, qs, cs, s_own, w) in enumerate(cases):
        one = thinning_walk(qs[None], cs[None], k, s_own, w[None], head)
        assert_close(batch[0][i], one[0][0], f"batched θ, {name}", qs, one[0][0])
        assert_close(batch[1][i], one[1][0], f"batched avail, {name}", qs, one[0][0])


def test_walk_memory_model():
    """The states held grow as ~(2 + 3/(2k))·√m (the checkpoints and one block, plus its clock factors), far
    below m; a row walked as one block (every state kept) stays within half of ``WALK_BYTES``, and a whole
    vocabulary's row is walked in blocks."""
    for k in (1, 3, 8):
        for m in (1, 2, 5, 100, 49_152):
            assert walk_states(m, k) <= (2 + 1.5 / k) * np.sqrt(m) + 5
            for t in (1, 107, 400):
                block, _, row_bytes = clocks._walk_plan(m, k, t)
                blocked = block == np.ceil(np.sqrt(m)) < m
                assert blocked or (block == m and row_bytes <= clocks.WALK_BYTES // 2), (m, k, t)
        assert walk_states(49_152, k) < 49_152 // 20
        assert clocks._walk_plan(49_152, k, 107)[0] < 49_152


@pytest.mark.parametrize("k", [2, 3, 5])
def test_left_out_nodes_and_row_chunks(monkeypatch, k):
    """The nodes the walk leaves out, and its row chunks, on the weights PTS walks (each row's own end,
    :func:`row_weights`; rows of a chunk share the widest grid): one row a chunk (its clock factors formed a block
    at a time, not once for the row) gives the same bits; below :func:`early_nodes` the nodes hold below 2^-56 of
    each availability — the walk over them too agrees to 1e-15 relative (plus the conditioning slack of
    :func:`assert_close`), on all the rows in one chunk and on the Zipf rows alone (whose smaller largest rate
    moves the cut up).  On Zipf, Dirichlet and confident rows; the cuts are real (Zipf rows keep under half of the
    default grid for k ≥ 3), and a cut inside the integrands' support would show."""
    cases = [walk_inputs(p, q, k, 0.7) for _, p, q in rows(300, k)]
    s = max((c[2] for c in cases), key=len)
    W = np.stack([np.concatenate([own_end(c[0], k, c[2], c[3])[0], np.zeros(s.size - c[3].size)]) for c in cases])
    qs, cs = np.stack([c[0] for c in cases]), np.stack([c[1] for c in cases])
    want = thinning_walk(qs, cs, k, s, W)
    kept = [np.count_nonzero(W[i]) - early_nodes(k, cases[i][2], qs.max(), qs.sum(-1).max()) for i in range(2)]
    assert all(n < (0.5 if k >= 3 else 0.67) * cases[0][2].size for n in kept), kept
    zipf = slice(0, 2)                  # alone, without a confident row's dominant rate: the cut moves up
    assert early_nodes(k, s, qs[zipf].max(), qs[zipf].sum(-1).max()) > early_nodes(k, s, qs.max(), 1.0)
    zipf_want = thinning_walk(qs[zipf], cs[zipf], k, s, W[zipf])
    monkeypatch.setattr(clocks, "WALK_BYTES", 1)
    got = thinning_walk(qs, cs, k, s, W)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    early = clocks.early_nodes
    monkeypatch.setattr(clocks, "early_nodes", lambda k, s, fastest, total: 0)
    full = thinning_walk(qs, cs, k, s, W)
    for i in range(len(cases)):
        assert_close(want[0][i], full[0][i], "θ without the early nodes", qs[i], full[0][i], rtol=1e-15)
        assert_close(want[1][i], full[1][i], "avail without the early nodes", qs[i], full[0][i], rtol=1e-15)
        if i < 2:
            assert_close(zipf_want[0][i], full[0][i], "θ, Zipf rows alone", qs[i], full[0][i], rtol=1e-15)
            assert_close(zipf_want[1][i], full[1][i], "avail, Zipf rows alone", qs[i], full[0][i], rtol=1e-15)
    # the comparison sees a cut inside the integrands' support: 8 nodes past the early ones
    monkeypatch.setattr(clocks, "early_nodes", lambda *args: early(*args) + 8)
    assert not np.array_equal(thinning_walk(qs, cs, k, s, W)[1], want[1])


@pytest.mark.parametrize("V", [2, 7, 60, 3000])
def test_pair_walk_is_the_fixed_point_bit_for_bit(V):
    """k = 2: the compiled walk (``pair_thinning_walk``, the CPU's path) returns the fixed point's floats
    exactly — the accelerator's path (``pair_avail`` + ``thinning_fixed_point``) — on Zipf, Dirichlet (peaky
    and flat, a quarter undrafted), p = q, zero targets and confident rows (tails to 1e-310, where the closed
    form overflows and both leave the row to the clock integral), ρ ∈ {1, 0.5, 0}, all rows in one batch."""
    rng = np.random.default_rng(V)
    cases = list(rows(V, 2))
    for concentration in (0.05, 1.0, 5.0):
        q = rng.dirichlet(np.full(V, concentration))
        q[rng.choice(V, V // 4, replace=False)] = 0.0
        cases.append((f"dirichlet {concentration}", rng.dirichlet(np.full(V, concentration)), q / q.sum()))
    p = rng.dirichlet(np.ones(V))
    cases += [("p = q", p, p), ("zero targets", np.where(np.arange(V) % 2 == 0, 2 * p, 0.0) / (2 * p[::2].sum()), p)]
    qs, cs = zip(*(walk_inputs(p, q, 2, rho)[:2] for _, p, q in cases for rho in (1.0, 0.5, 0.0)))
    qs, cs = np.stack(qs), np.stack(cs)
    on = qs > 0
    theta, avail, finite = pair_thinning_walk(qs, on, cs)
    avail_of, finite_fp = pair_avail(qs, on)
    with np.errstate(all="ignore"):
        theta_fp, avail_fp = thinning_fixed_point(avail_of, on & finite_fp[:, None], cs)
    assert (finite == finite_fp).all() and finite.any() and (V < 3 or not finite.all())
    worst = np.abs(np.concatenate([theta - theta_fp, avail - avail_fp])).max()
    assert (theta == theta_fp).all() and (avail == avail_fp).all(), f"largest difference {worst:.2e}"
    assert (theta[~finite] == 0).all() and (avail[~finite] == 0).all()


@pytest.mark.parametrize("k", [3, 4])
def test_walk_plans_give_the_same_bits(monkeypatch, k):
    """How the walk is laid out changes which states it holds, not a float: on Zipf, Dirichlet and confident rows
    (V = 300, three rows a chunk), one block (every suffix state kept), blocks of ⌈√m⌉ with the chunk's clock
    factors formed once (one compiled call a pass) and blocks with the factors formed a block at a time (a call a
    block) return the same θ and availabilities bit for bit.  (A block plan that dropped a checkpoint or
    misplaced a block's suffix states would differ.)"""
    cases = [walk_inputs(p, q, k, 0.7) for _, p, q in rows(300, k)]
    s = max((c[2] for c in cases), key=len)
    W = np.stack([np.concatenate([c[3], np.zeros(s.size - c[3].size)]) for c in cases])
    qs, cs = np.stack([c[0] for c in cases]), np.stack([c[1] for c in cases])
    results = []
    for block, kept in ((300, True), (18, True), (18, False), (7, False)):
        monkeypatch.setattr(clocks, "_walk_plan", lambda m, k, t: (block, kept, 1))
        results.append(thinning_walk(qs, cs, k, s, W))
    for theta, avail in results[1:]:
        assert np.array_equal(theta, results[0][0]) and np.array_equal(avail, results[0][1])


@pytest.mark.parametrize("k", [3, 4])
def test_lane_padding_changes_no_float(monkeypatch, k):
    """The walk pads its nodes to a multiple of ``WALK_LANES`` with identity nodes (``s = −∞``, weight 0:
    ``clocks._lane_padded``): on Zipf, Dirichlet and confident rows whose grids are not such a multiple, θ and the
    availabilities are those of the walk over the nodes alone, bit for bit.  (Either choice alone makes a padded node
    add nothing; padding with weighted nodes at a finite time would differ.)"""
    cases = [walk_inputs(p, q, k, 0.7) for _, p, q in rows(300, k)]
    s = max((c[2] for c in cases), key=len)
    W = np.stack([np.concatenate([c[3], np.zeros(s.size - c[3].size)]) for c in cases])
    qs, cs = np.stack([c[0] for c in cases]), np.stack([c[1] for c in cases])
    seen = []
    padded = clocks._lane_padded
    monkeypatch.setattr(clocks, "_lane_padded", lambda s, w: seen.append(s.size) or padded(s, w))
    want = thinning_walk(qs, cs, k, s, W)
    assert seen and seen[0] % clocks.WALK_LANES, seen       # the grid walked needs padding
    monkeypatch.setattr(clocks, "_lane_padded", lambda s, w: (s, np.ascontiguousarray(w)))
    got = thinning_walk(qs, cs, k, s, W)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_walks_on_threads_keep_their_own_scratch():
    """The clock factors live in a scratch buffer kept between walks (``clocks._workspace``), one per thread: walks
    of different rows and sizes run on four threads at once, switching every microsecond, return the bits of the
    same walks run one after another."""
    import sys
    from concurrent.futures import ThreadPoolExecutor
    jobs = [walk_inputs(p, q, k, 0.7) + (k,) for k in (3, 4) for V in (40, 300) for _, p, q in rows(V, k)]
    run = lambda job: thinning_walk(job[0][None], job[1][None], job[4], job[2], job[3][None])
    serial = [run(job) for job in jobs]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(4) as pool:
            threaded = list(pool.map(run, jobs * 3))
    finally:
        sys.setswitchinterval(interval)
    for i, (theta, avail) in enumerate(threaded):
        want = serial[i % len(jobs)]
        assert np.array_equal(theta, want[0]) and np.array_equal(avail, want[1]), jobs[i % len(jobs)][4]


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_row_weights_leave_out_only_the_grids_tail(monkeypatch, k):
    """``row_weights`` zeroes the nodes past a row's own end, where the k-th arrival has not come with probability
    at most ``k·e^{−50}`` (of its two bounds the smaller end; the grid's panels go on to a panel boundary): the walk
    on them against the walk on the whole panels — every availability within ``k²·e^{−50}`` absolute (plus 1e-15
    relative: the dropped terms are the last of each sum), θ within the conditioning slack of :func:`assert_close`
    and that absolute slack over the availability.  On Zipf, Dirichlet and confident rows (tails to 1e-310),
    and a row whose k largest rates hold all but 3e-298, ρ = 0.7.  The cut is real (the Zipf rows keep ≤ 85% of
    their panel's nodes), each bound sets some row's end, each end holds the k-th arrival's tail to its bound, and
    ends at ``e^{−5}`` instead show."""
    heavy = np.concatenate([np.full(k, 1.0 / k), np.full(300 - k, 1e-300)])     # the k largest hold all but 3e-298
    cases = [walk_inputs(p, q, k, 0.7) for _, p, q in [*rows(300, k), ("k heavy", heavy[::-1], heavy)]]
    slack = k * k * np.exp(-50.0)

    def compare(cut_off):
        worst = 0.0
        for qs, cs, s, w in cases:
            cut = own_end(qs, k, s, w)
            assert np.all((cut[0] == w) | (cut[0] == 0)) and np.all(np.diff((cut[0] > 0).astype(int)) <= 0)
            theta, avail = (x[0] for x in thinning_walk(qs[None], cs[None], k, s, cut))
            ref_theta, ref_avail = (x[0] for x in thinning_walk(qs[None], cs[None], k, s, w[None]))
            worst = worst_of(worst, np.max(np.abs(avail - ref_avail) - 1e-15 * np.abs(ref_avail)) / slack)
            if not cut_off:
                floor = np.min(ref_avail[ref_avail > 0])
                assert_close(theta, ref_theta, "θ", qs, ref_theta, rtol=1e-15 + slack / floor)
        return worst

    assert compare(False) <= 1.0
    kept, bounds = [], []
    for qs, _, s, w in cases:
        n = np.count_nonzero(own_end(qs, k, s, w))
        kept.append(n / s.size)
        if n < s.size:                  # the first node left out: the k-th arrival's tail is within its bound there
            top = np.sort(qs)[::-1]                             # q·T as exp(log q + s): T itself may overflow
            first = k * np.exp(-np.exp(np.log(top[k - 1]) + s[n]))
            second = (np.count_nonzero(qs) + 1) ** (k - 1) * np.exp(-np.exp(np.log(top[k - 1:].sum()) + s[n]))
            bounds.append(first < second)
            assert min(first, second) <= k * np.exp(-50.0) * (1 + 1e-9), (n, first, second)
    assert max(kept[:2]) <= 0.85 and len(set(bounds)) == 2, (kept, bounds)
    monkeypatch.setattr(clocks, "TAIL_RATE_TIME", 5.0)
    assert compare(True) > 1.0


def test_early_nodes_reads_the_rates():
    """``early_nodes``' cut rises as the largest rate falls (a longer stretch ``T ≤ 1/q_max`` on which the lower
    bound holds) and as the rows' total falls, never for k = 1 (the grid's head covers it), is none without a
    positive rate, and stays finite where the sums of ``x^j/j!`` are large (k = 80 over 49 152 tokens)."""
    s, _ = log_time_grid(LOG_T_NODES, 30.0)
    for k in (2, 3, 4, 8):
        cuts = [early_nodes(k, s, fastest, 1.0) for fastest in (1.0, 0.5, 0.1, 1e-3)]
        assert cuts == sorted(cuts) and cuts[0] < cuts[-1], cuts
        assert early_nodes(k, s, 0.1, 0.5) >= cuts[2]
        assert early_nodes(k, s, 0.0, 1.0) == 0
    assert early_nodes(1, s, 0.01, 1.0) == 0
    assert 0 < early_nodes(80, s, 1 / 49_152, 1.0) < s.size


def test_early_nodes_at_any_width():
    """``early_nodes`` formed γ(k, x) as ``(k − 1)!·(…)``, a float OverflowError from k = 172 children (a
    ``--tree 1000`` decode crashed there): γ is in logs now — the cut of the formula with scipy's regularised
    incomplete gamma at every k up to 1 000, and none where ``γ(k, x)/(k − 1)!`` is below EARLY_SHARE_FLOOR
    (there the sum it is formed from is round-off: k = 40, x = 2 cut 203 nodes where 195 may go)."""
    import math

    from scipy.special import gammainc
    s = np.linspace(-30, 30, 400)

    def oracle(k, fastest, total):
        share = float(gammainc(k, total / fastest))
        if share <= clocks.EARLY_SHARE_FLOOR:
            return 0
        lower = (math.log(k * clocks.EARLY_TAIL) + math.lgamma(k) + math.log(share)
                 + (k - 1) * math.log(-math.expm1(-1.0))) / k - math.log(total)
        return int(np.count_nonzero(s < lower))

    cases = [(k, f, t) for k in (2, 3, 8, 40, 120, 171, 172, 500, 1000)
             for f, t in ((0.01, 1.0), (0.2, 1.0), (1e-4, 0.5), (0.5, 1.0), (0.002, 1.0))]
    got = [early_nodes(k, s, f, t) for k, f, t in cases]
    assert got == [oracle(*c) for c in cases]
    assert early_nodes(40, s, 0.5, 1.0) == 0 < early_nodes(1000, s, 1e-4, 0.5)   # round-off: no cut; a cut at k = 1000
