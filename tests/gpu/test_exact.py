"""The torch verifiers reproduce the exact core: E[τ | T] per tree and every node's pass-1 decision.

Random ragged batches of trees (V ≤ 6, several shapes) drafted from Dirichlet models; each method on each
process it supports.  Tolerances: 1e-12 in float64, 1e-6 in float32 (E[τ] ≤ depth, float32 ε = 6e-8 per op).
"""
import numpy as np
import pytest
import torch

from gpu import METHODS, TreeBatch, engine, expected_accepted_length, probs_from_logits, verify
from gpu.engine import allocate, first_token_law
from univer_theory import BUG_ZOO, VERIFIERS, DirichletModel, DraftTree, TreeShape, sample_tree
from univer_theory.engine import NodeContext
from univer_theory.engine import allocate as exact_allocate

from .helpers import TORCH_ZOO, on_device, padded_rows

SHAPES = ["2,2", "3,1", "2,1,2", "((..),.)", "1,1,1", "3", "((.(..)),(.),.)"]
CASES = [(m, proc) for m in METHODS for proc in ("iid", "wor", "topk", "greedy") if proc in VERIFIERS[m].processes]


def random_batch(process, V, seed, count=14):
    """``count`` trees of mixed shapes from one context-dependent model (a ragged batch)."""
    rng = np.random.default_rng(seed)
    model = DirichletModel(V, seed=seed, similarity=0.4, concentration=0.7)
    trees = [sample_tree(model, TreeShape.parse(SHAPES[i % len(SHAPES)]), process, rng) for i in range(count)]
    return model, trees


@pytest.mark.parametrize("method, process", CASES, ids=[f"{m}-{p}" for m, p in CASES])
@pytest.mark.parametrize("V", [3, 6])
def test_expected_accepted_length_matches_exact_core(method, process, V):
    check_against_exact_core(method, process, V, "cpu")


def check_against_exact_core(method, process, V, device):
    """E[τ | T] of :func:`random_batch` on ``device`` as the exact core, float64 and float32."""
    model, trees = random_batch(process, V, seed=V)
    ref = np.array([VERIFIERS[method].expected_accepted_length(t, *model.node_probs(t), process) for t in trees])
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        batch, p, q = padded_rows(trees, model, dtype)
        got = expected_accepted_length(*on_device(device, batch, p, q), process, method)
        assert got.dtype == dtype and got.device.type == device
        np.testing.assert_allclose(got.double().cpu().numpy(), ref, rtol=0, atol=tol,
                                   err_msg=f"{method} {process} {dtype}")


#: A V = 6 tree (shape 2,3) whose float32 rows are peaky with p ≈ q at the root (p(2) ≈ q(2) ≈ 0.9978): the
#: rows as a float32 model's softmax gives them, each a few ulps off summing to 1.
PEAKY_TREE = ((-1, 0, 0, 1, 1, 1, 2, 2, 2), (-1, 0, 2, 2, 1, 3, 4, 0, 5))
PEAKY_P = [[2.1575021e-03, 1.0408348e-08, 9.9781173e-01, 1.4135173e-06, 1.9964678e-05, 9.3564158e-06],
           [1.3797293e-06, 2.5515787e-02, 9.7410643e-01, 1.5677708e-04, 6.7961650e-05, 1.5166287e-04],
           [3.0849844e-01, 3.0992955e-02, 2.4710931e-02, 3.1647965e-02, 8.5178852e-02, 5.1897085e-01],
           [8.2322350e-04, 4.3378673e-03, 2.7745668e-09, 2.4136470e-04, 1.2812260e-02, 9.8178530e-01],
           [0.0, 0.0, 0.0, 1.0, 0.0, 0.0],
           [1.2231900e-03, 8.9971781e-01, 8.2666238e-09, 1.1965291e-07, 5.0169206e-07, 9.9058367e-02],
           [3.4035966e-02, 6.8929250e-05, 9.5771247e-01, 1.3411642e-04, 3.4572706e-06, 8.0450531e-03],
           [5.5599742e-02, 0.0, 0.0, 0.0, 5.5076903e-01, 3.9363119e-01],
           [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]]
PEAKY_Q = [[2.2199193e-03, 3.4155139e-08, 9.9777198e-01, 3.9806784e-07, 7.0083274e-06, 6.8196061e-07],
           [1.8465851e-06, 2.1275909e-01, 7.8664291e-01, 4.6396861e-04, 3.8167527e-05, 9.3992341e-05],
           [2.9602507e-01, 1.7485438e-02, 3.0744856e-02, 1.7113123e-02, 2.4805827e-01, 3.9057326e-01],
           [4.9849949e-04, 4.0710196e-03, 1.1489992e-09, 1.1413631e-04, 9.5873717e-03, 9.8572898e-01],
           [2.6559323e-01, 3.7823010e-02, 6.7604080e-02, 2.0295253e-02, 1.6284932e-01, 4.4583511e-01],
           [1.0630795e-03, 9.2849004e-01, 6.6005601e-09, 4.5881166e-08, 2.9120629e-06, 7.0443906e-02],
           [8.7084845e-03, 9.7052862e-06, 9.8307472e-01, 5.7904639e-05, 8.6111515e-07, 8.1483200e-03],
           [1.3222343e-01, 1.1191883e-01, 3.5307825e-01, 1.5494284e-03, 3.8556173e-01, 1.5668342e-02],
           [4.5533802e-02, 6.6645402e-01, 8.0393590e-03, 1.6265614e-01, 7.1627244e-02, 4.5689441e-02]]


@pytest.mark.parametrize("method, process", [("rrsw", "wor"), ("rrs", "iid"), ("tv", "wor"), ("univer", "wor")])
def test_float32_rows_are_decided_on_the_simplex(method, process):
    """Float32 rows within 1e-6 of the exact core on the same values put on the simplex in float64: RRSw read its
    float32 rows as given, and on the peaky root (p ≈ q) a row's ulps off 1 moved ``[P − Q]_+`` by 1e-3 relative
    and E[τ | T] by 1.2e-5."""
    from univer_theory import DraftTree

    tree = DraftTree(*PEAKY_TREE)
    p32, q32 = torch.tensor(PEAKY_P, dtype=torch.float32), torch.tensor(PEAKY_Q, dtype=torch.float32)
    p, q = (x.double() / x.double().sum(-1, keepdim=True) for x in (p32, q32))
    ref = VERIFIERS[method].expected_accepted_length(tree, p.numpy(), q.numpy(), process)
    got = expected_accepted_length(TreeBatch.from_trees([tree]), p32[None], q32[None], process, method)
    assert abs(float(got) - ref) <= 1e-6


@pytest.mark.parametrize("method, process", CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_float32_rows_off_by_the_tolerance_are_decided_on_the_simplex(method, process):
    """Float32 rows 9e-6 off summing to 1 (valid: SIMPLEX_TOL 1e-5) within 1e-6 of the exact core on the same values
    put on the simplex: NSS and K-SEQ read such rows as given, 4.2e-5 and 1.6e-5 off."""
    model, trees = random_batch(process, 6, seed=11, count=7)
    batch, p, q = padded_rows(trees, model)
    p32, q32 = (p * (1 - 9e-6)).float(), (q * (1 + 9e-6)).float()
    ref = [VERIFIERS[method].expected_accepted_length(
        t, *(x[b, :t.num_nodes].double() / x[b, :t.num_nodes].double().sum(-1, keepdim=True) for x in (p32, q32)),
        process) for b, t in enumerate(trees)]
    got = expected_accepted_length(batch, p32, q32, process, method)
    np.testing.assert_allclose(got.double().numpy(), ref, rtol=0, atol=1e-6)


def decision_gap(trees, model, process, torch_rule, exact_rule) -> float:
    """Largest difference between the torch pass 1 and the exact engine's: ρ, enter, stop and the residual of
    every node — its mass ``ρ − α`` where the rule reports α (where that is 0 at ``f > 0``, round-off noise or the
    fallback ``ρp`` of :func:`univer_theory.plans.base.residual_rows`), its normalised shape where that mass is above
    round-off (at α = ρ = 1 the residual is 1e-16 noise that neither side ever samples)."""
    batch, p, q = padded_rows(trees, model)
    alloc = allocate(batch, p, q, process, torch_rule, keep_residuals=True)
    gap = 0.0
    for b, t in enumerate(trees):
        pn, qn = model.node_probs(t)
        rho, dec = exact_allocate(t, pn, qn, process, exact_rule)
        for u in range(t.num_nodes):
            diffs = [abs(float(alloc.stop[b, u]) - float(dec[u].stop))]
            for c, a, s in zip(t.children[u], dec[u].enter, dec[u].scale):
                diffs += [abs(float(alloc.enter[b, c]) - float(a)), abs(float(alloc.rho[b, c]) - float(s))]
            res, want = alloc.residual[b, u].numpy(), np.asarray(dec[u].residual, dtype=np.float64)
            if "alpha" in dec[u].info:           # ρ − α; where that is 0 at f > 0, noise or the fallback ρp
                mass = max(0.0, float(rho[u]) - float(dec[u].info["alpha"]))
                both = (mass, float(rho[u]) * pn[u].sum()) if mass == 0 and float(dec[u].stop) > 0 else (mass,)
                diffs.append(min(abs(res.sum() - m) for m in both))
            if float(dec[u].stop) > 0 and want.sum() > 0 and max(res.sum(), want.sum()) > 1e-12:
                diffs += list(np.abs(res / res.sum() - want / want.sum()))     # a zero torch row: NaN, a failure
            gap = float(np.max([gap] + diffs))          # np.max propagates NaN, so a NaN fails the caller's check
    return gap


@pytest.mark.parametrize("method, process", CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_every_node_decision_matches_exact_allocate(method, process):
    """ρ, enter, stop and the normalised residual of every node equal the exact engine's pass 1 (1e-12)."""
    model, trees = random_batch(process, 5, seed=11, count=8)
    assert decision_gap(trees, model, process, METHODS[method], VERIFIERS[method].rule) < 1e-12


@pytest.mark.parametrize("method", ["tv", "rrsw", "univer"])
def test_a_row_whose_mass_is_one_token_reads_it_as_one(method):
    """A fresh-seed sweep's tree (V = 3, wor): after the root's children 2 and 0 its draft row holds token 1 alone,
    and ``X̃(1)·(1/X̃(1))`` read ``Q(1)`` as 1 − 1 ulp, so TV gave node 3 ρ = 1 − 1 ulp; after node 3's first child
    ``R`` is ~6e-14 and ``r ← R/(R + 1 − r)`` turned that ulp into r = 0.99626: E[τ | T] 0.99629 against the exact
    core's 1.0000274 (its rows divide once, as the rows do now)."""
    P = np.array([1.354225859238305e-05, 0.9999864577414076, 0.0])
    Q = np.array([0.4945735461702574, 0.5054264538297131, 3e-14])
    Q /= Q.sum()
    tree = DraftTree((-1, 0, 0, 0, 3, 3), (-1, 2, 0, 1, 0, 2))
    p, q = np.tile(P, (6, 1)), np.tile(Q, (6, 1))
    ref = VERIFIERS[method].expected_accepted_length(tree, p, q, "wor")
    got = expected_accepted_length(TreeBatch.from_trees([tree]), torch.tensor(p)[None], torch.tensor(q)[None],
                                   "wor", method)
    assert abs(float(got[0]) - float(ref)) <= 1e-12, (float(got[0]), float(ref))


@pytest.mark.parametrize("method, process", CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_every_rule_decides_in_the_levels_dtype(method, process):
    """A level rule hands back ``enter``, ``scale``, ``stop`` and ``residual`` in its rows' dtype (float32 levels
    here), whatever it computes in: rules are composed (the bug zoo reuses them), so the cast is theirs."""
    model, trees = random_batch(process, 5, seed=12, count=4)
    batch, p, q = padded_rows(trees, model, torch.float32)
    seen = []

    def spy(ctx):
        dec = METHODS[method](ctx)
        seen.append({name: getattr(dec, name).dtype for name in ("enter", "scale", "stop", "residual")})
        return dec
    allocate(batch, p, q, process, spy)
    assert seen and all(set(d.values()) == {torch.float32} for d in seen), seen


@pytest.mark.parametrize("method, process", CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_row_blocks_change_no_float_and_no_draw(method, process):
    """On the CPU a level's whole rows are decided in blocks (``block_bytes`` of :func:`gpu.engine.allocate`;
    UniVer's hold one row at V = 49 152, ``gpu.verify.BLOCK_BYTES``): blocks of one row give the same allocation,
    bit for bit, and the same draws as one block a level (levels of 23 to 64 rows here)."""
    model, trees = random_batch(process, 6, seed=11, count=40)
    batch, p, q = padded_rows(trees, model)
    rule = METHODS[method]
    one_row, whole = 1, 1 << 30
    assert max(len(level[0]) for level in batch.level_nodes) >= 16
    a, b = (allocate(batch, p, q, process, rule, keep_residuals=True, block_bytes=n) for n in (one_row, whole))
    for name in ("rho", "enter", "stop", "residual"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    draws = [engine.sample(batch, p, q, process, rule, torch.Generator().manual_seed(5), block_bytes=n)
             for n in (one_row, whole)]
    for name in ("accepted_nodes", "num_accepted", "next_token"):
        assert torch.equal(getattr(draws[0], name), getattr(draws[1], name)), name


@pytest.mark.parametrize("method, process", CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_consecutive_rows_are_read_in_place(monkeypatch, method, process):
    """On the CPU a level's whole rows that are consecutive input rows reach the rule as a view of the input, not a
    copy (``gpu.engine._run_start``; every level of one tree here, none of a ragged batch's): no rule writes into
    them — the inputs are unchanged after pass 1, the draws and E[τ] — and the allocation, E[τ] and the draws are
    the copies', bit for bit."""
    model, trees = random_batch(process, 6, seed=3, count=7)
    seen = []

    def run(batch, p, q):
        def spy(ctx):
            seen.append(ctx.target.untyped_storage().data_ptr() == p.untyped_storage().data_ptr())
            return METHODS[method](ctx)
        seen.clear()
        return (allocate(batch, p, q, process, spy, keep_residuals=True),
                engine.sample(batch, p, q, process, spy, torch.Generator().manual_seed(5)),
                expected_accepted_length(batch, p, q, process, method))

    run(*padded_rows(trees[:6], model))
    assert not any(seen), seen                        # six trees: no level's rows are consecutive
    batch, p, q = padded_rows(trees[6:], model)       # one tree "((.(..)),(.),.)": levels of one and two rows
    inputs = p.clone(), q.clone()
    views = run(batch, p, q)
    assert seen and all(seen), seen
    assert torch.equal(p, inputs[0]) and torch.equal(q, inputs[1])
    monkeypatch.setattr(engine, "_run_start", lambda src: None)
    copies = run(batch, p, q)
    assert seen and not any(seen), seen
    for name in ("rho", "enter", "stop", "residual"):
        assert torch.equal(getattr(views[0], name), getattr(copies[0], name)), name
    for name in ("accepted_nodes", "num_accepted", "next_token"):
        assert torch.equal(getattr(views[1], name), getattr(copies[1], name)), name
    assert torch.equal(views[2], copies[2])


@pytest.mark.parametrize("method", ["tv", "univer"])
def test_residuals_are_kept_through_a_row_index(method):
    """``keep_residuals`` on rows read through ``row_index`` (flat rows, slot by slot) keeps ``[B, N, V]`` residuals, those
    of the same rows laid out ``[B, N, V]`` bit for bit (it indexed the flat rows as ``[B, N, V]``: a shape error)."""
    from .test_walk import slot_major
    model, trees = random_batch("wor", 6, seed=3, count=5)
    batch, p, q = padded_rows(trees, model)
    want = allocate(batch, p, q, "wor", METHODS[method], keep_residuals=True)
    p_flat, q_flat, row_index = slot_major(p, q)
    got = allocate(batch, p_flat, q_flat, "wor", METHODS[method], keep_residuals=True, row_index=row_index)
    for name in ("rho", "enter", "stop", "residual"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


def test_each_method_is_given_its_row_blocks(monkeypatch):
    """``gpu.verify`` and ``gpu.expected_accepted_length`` hand the engine a method's own row blocks
    (``gpu.verify.BLOCK_BYTES``, one row of 49 152 float64 for UniVer) and None (the engine's default per
    device) to the others — ``verify`` through :func:`gpu.engine.walk` for the methods of ``gpu.verify.WALK``, through
    :func:`gpu.engine.traverse` for those of ``gpu.verify.TRAVERSE``."""
    from gpu.verify import BLOCK_BYTES
    assert 49152 * 8 <= BLOCK_BYTES["univer"] < 2 * 49152 * 8
    seen = []
    for name in ("allocate", "walk", "traverse"):
        real = getattr(engine, name)
        monkeypatch.setattr(engine, name, lambda *a, real=real, **kw: seen.append(kw["block_bytes"]) or real(*a, **kw))
    model, trees = random_batch("wor", 4, seed=2, count=3)
    batch, p, q = padded_rows(trees, model)
    for method in METHODS:
        if "wor" in VERIFIERS[method].processes:
            seen.clear()
            verify(batch, p, q, "wor", method, torch.Generator().manual_seed(0))
            expected_accepted_length(batch, p, q, "wor", method)
            assert seen == [BLOCK_BYTES.get(method)] * 2, method


@pytest.mark.parametrize("name", sorted(TORCH_ZOO))
def test_torch_bug_zoo_matches_exact_zoo(name):
    """The test-only torch zoo implements exactly the theory zoo's lossy variants (so the Monte Carlo tests
    reject the intended bugs, not accidental ones), and differs from the correct rule on these trees."""
    model, trees = random_batch("iid", 4, seed=3)
    assert decision_gap(trees, model, "iid", TORCH_ZOO[name], BUG_ZOO[name].rule) < 1e-12
    correct = VERIFIERS["rrs" if name.startswith("rrs") else "tv"].rule
    assert decision_gap(trees, model, "iid", TORCH_ZOO[name], correct) > 1e-3


@pytest.mark.parametrize("name, process", [("tv", "iid"), ("rrsw", "wor"), ("tv-original-p", "wor")])
def test_first_token_law_matches_exact_core(name, process):
    """Per tree, ``first_token_law`` equals the exact law's first-output-token marginal (lossless or not)."""
    model, trees = random_batch(process, 3, seed=11)
    verifier = VERIFIERS.get(name) or BUG_ZOO[name]
    rule = TORCH_ZOO[name] if name in TORCH_ZOO else METHODS[name]
    batch, p, q = padded_rows(trees, model)
    got = first_token_law(batch, p, q, process, rule).numpy()
    for b, tree in enumerate(trees):
        want = np.zeros(3)
        for key, pr in verifier.law(tree, *model.node_probs(tree), process).items():
            want[key[0]] += pr
        np.testing.assert_allclose(got[b], want, rtol=0, atol=1e-12, err_msg=f"{name} tree {b}")


def test_probs_from_logits():
    logits = torch.tensor([[2.0, -1.0, 0.5, 100.0], [-100.0, 3.0, 3.0, 0.0]])
    for low in (torch.bfloat16, torch.float16):
        got = probs_from_logits(logits.to(low), 1.3)
        assert got.dtype == torch.float32
        want = torch.softmax(logits.to(low).double() / 1.3, -1)
        torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=0)
    one_hot = probs_from_logits(logits, 0.0)
    assert one_hot.tolist() == [[0, 0, 0, 1], [0, 1, 0, 0]]     # first maximum on ties
    assert probs_from_logits(logits.double(), 0.7).dtype == torch.float64
    with pytest.raises(ValueError, match="temperature"):
        probs_from_logits(logits, -0.5)
    with pytest.raises(ValueError, match="NaN"):
        probs_from_logits(torch.tensor([[0.0, float("nan")]]), 1.0)
    top = probs_from_logits(logits.double(), 0.7, top=2)        # the two largest logits of each row
    want = torch.softmax(logits.double()[:, [3, 0]] / 0.7, -1)
    assert top[0, [3, 0]].tolist() == want[0].tolist() and top[0, [1, 2]].tolist() == [0, 0]
    assert (top[1] > 0).tolist() == [False, True, True, False] and top.sum(-1).tolist() == pytest.approx([1, 1])
    assert torch.equal(probs_from_logits(logits, 1.3, top=4), probs_from_logits(logits, 1.3))
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="top"):
            probs_from_logits(logits, 1.0, top=bad)


@pytest.mark.parametrize("V", [65, 1025, 4096, 4097, 49152])
def test_sample_rows_is_the_inverse_cdf_of_its_uniforms(V):
    """Both paths of :func:`gpu.probs.sample_rows` (one float64 cumsum up to ``SAMPLE_DIRECT`` columns, the two-level
    block search above it) map each of their uniforms ``U`` to the token a full-row float64 inverse CDF gives for
    ``U·Σ`` — the first token whose cumulative mass exceeds it — on seeded rows with zeros and a 10-decade spread:
    the law is exactly ``norm(weights)``, not only its support.  The uniforms are replayed from the same seed (the
    sampler draws one ``torch.rand(R, S)``)."""
    from gpu.probs import sample_rows
    gen = torch.Generator().manual_seed(V)
    w = torch.rand(6, V, generator=gen, dtype=torch.float64) * 10.0 ** (-10 * torch.rand(6, V, generator=gen,
                                                                                           dtype=torch.float64))
    w = torch.where(torch.rand(6, V, generator=gen) < 0.3, 0.0, w)
    got = sample_rows(w, torch.Generator().manual_seed(1), num_samples=2000)
    u = torch.rand(6, 2000, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    cdf = w.cumsum(-1)
    want = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    assert torch.equal(got, want)               # ties at a cumulative-mass boundary have probability ~1e-16


@pytest.mark.parametrize("V", [1, 4096, 4097])
def test_skip_rows_takes_what_sample_rows_takes(V):
    """:func:`gpu.probs.skip_rows` advances the generator exactly as :func:`gpu.probs.sample_rows` of as many rows
    does on either path (up to ``SAMPLE_DIRECT`` columns and above): the next draws after either are the same, so the
    rows a verification skips leave the others' draws in place."""
    from gpu.probs import sample_rows, skip_rows
    w = torch.rand(5, V, dtype=torch.float64, generator=torch.Generator().manual_seed(V))
    after = []
    for step in (lambda g: sample_rows(w, g), lambda g: skip_rows(5, w.device, g)):
        gen = torch.Generator().manual_seed(3)
        step(gen)
        after.append(torch.rand(4, dtype=torch.float64, generator=gen))
    assert torch.equal(*after)
    gen = torch.Generator().manual_seed(3)
    skip_rows(4, w.device, gen)                  # a row short: the next draws differ
    assert not torch.equal(torch.rand(4, dtype=torch.float64, generator=gen), after[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_probs_from_logits_at_small_temperatures(dtype):
    """``softmax((z − max z)/T)``: a T below the dtype's range gave NaN rows (``z/T`` overflowing, then 0/0); a
    quotient taken before the shift rounded at ``ulp(|z|/T)`` — near-tied logits around 30 at T = 1e-3 came out
    up to ~1e-2 relative off the float64 row of the same inputs.  Exact ties at a tiny T share the mass."""
    z = torch.tensor([[2.0, 1.0, 0.0], [5.0, 5.0, -float("inf")]]).to(dtype)
    for T in (1e-30, 1e-46, 5e-324):
        assert probs_from_logits(z, T).tolist() == [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]]
    near = torch.tensor([[30.0, 30.0 - 2.0 ** -10, 29.99]])              # float32-exact logits
    for T in (1e-2, 1e-3):
        got, ref = probs_from_logits(near, T).double(), probs_from_logits(near.double(), T)
        assert ((got - ref).abs() / ref).max() <= 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_probs_from_logits_at_temperatures_beyond_the_dtype(dtype):
    """A temperature finite in float64 but not in the logits' dtype (1e39 in float32 or bfloat16) became inf, and
    ``−inf/inf`` (a −inf logit, or a token cut by ``top``) a NaN row: it is taken at the dtype's largest value, the
    row uniform over its finite logits, for a number and a float64 tensor of temperatures alike."""
    z = torch.tensor([[1.0, 2.0, -float("inf")]]).to(dtype)
    for T in (1e39, 1e300, torch.tensor([1e300], dtype=torch.float64)):
        assert probs_from_logits(z, T).tolist() == [[0.5, 0.5, 0.0]]
        assert probs_from_logits(z[:, :2], T, top=1).tolist() == [[0.0, 1.0]]


def test_probs_from_logits_at_a_temperature_zero_in_the_dtype_on_subnormal_gaps():
    """Float32 logits a subnormal ulp or two apart at a T positive in float64 but 0 in float32: the halves
    ``z/2`` and ``max z/2`` rounded to one float and ``0/0`` made the row NaN; ``z − max z`` is exact there."""
    cases = [([[1.4013e-45, 0.0]], 1e-50, [[1.0, 0.0]]), ([[0.0, 1.4013e-45, -1.0]], 1e-300, [[0.0, 1.0, 0.0]]),
             ([[7.0065e-45, 5.6052e-45]], torch.tensor([1e-60], dtype=torch.float64), [[1.0, 0.0]])]
    for z, T, want in cases:
        assert probs_from_logits(torch.tensor(z), T).tolist() == want, (z, T)


def test_two_level_draws_keep_each_tokens_share_of_its_block():
    """A block's mass is a sum of float32 chunk sums, its tokens' float64 cumsum another: the gap between the two
    went to (or came from) the block's last positive token — a 1e-12 token drawn w.p. 1.8e-9 on one row, never on
    another.  ``U`` is placed by hand (a patched ``torch.rand``): in the gap above the block's own sum, and in the
    last token's interval scaled to the block's mass."""
    from gpu.probs import SAMPLE_BLOCK as b, SAMPLE_CHUNK as c, sample_rows
    V, seen = 8192, set()
    for seed in range(400):
        w = torch.softmax(3 * torch.randn(1, V, generator=torch.Generator().manual_seed(seed)), -1)
        w[0, b - 1] = 1e-12
        chunked = w[0, :b].reshape(b // c, c).sum(-1).sum(dtype=torch.float64)
        mass = chunked + w[0, b:].reshape(-1, c).sum(-1).sum(dtype=torch.float64)
        inner = w[0, :b].double().cumsum(0)
        gap = float(chunked - inner[-1])
        if abs(gap) < 1e-9 or (gap > 0) in seen:
            continue
        seen.add(gap > 0)
        point = float(inner[-1]) + gap / 2 if gap > 0 else (float(inner[-2]) + float(inner[-1])) / 2
        u = point / float(inner[-1]) * float(chunked) if gap < 0 else point
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch, "rand", lambda *shape, **kw: torch.full(shape[:2], u / float(mass), dtype=torch.float64))
            token = int(sample_rows(w, num_samples=1)[0, 0])
        assert (token != b - 1) if gap > 0 else (token == b - 1), (seed, gap, token)
    assert seen == {True, False}, seen


def test_a_uniform_on_a_cumulative_mass_boundary_takes_the_next_positive_token():
    """The inverse CDF's convention where ``U·Σ`` hits a cumulative mass exactly (probability ~2^-53 a draw,
    so no sampled test reaches it): token i owns ``[cdf_{i−1}, cdf_i)``, so a hit on ``cdf_i`` goes to the next
    token of positive mass (past zero-weight ones), 0 to the first positive token, and the total to the last
    positive token, never past it."""
    from gpu.probs import _first_above
    cdf = torch.tensor([[0.0, 0.25, 0.5, 0.5, 1.0, 1.0]], dtype=torch.float64)    # weights 0, ¼, ¼, 0, ½, 0
    u = torch.tensor([[0.0, 0.25, 0.5, 0.75, 1.0]], dtype=torch.float64)
    assert _first_above(cdf, u).tolist() == [[1, 2, 4, 4, 4]]


@pytest.mark.parametrize("V", [7, 256, 1000, 4097, 5000])
def test_sample_rows_returns_positive_tokens_only(V):
    """The two-level inverse CDF (:func:`gpu.probs.sample_rows`, blocks through :func:`gpu.probs.sample_blocks`):
    a row with one positive token returns it wherever it sits (first, last, at a block edge; float32 too), a
    draw never lands on a zero-weight token, and no rows give no tokens."""
    from gpu.probs import SAMPLE_BLOCK, sample_rows
    gen = torch.Generator().manual_seed(V)
    spots = sorted({0, V - 1, min(V - 1, SAMPLE_BLOCK - 1), min(V - 1, SAMPLE_BLOCK), V // 2})
    for dtype in (torch.float64, torch.float32):
        one = torch.zeros(len(spots), V, dtype=dtype)
        one[torch.arange(len(spots)), torch.tensor(spots)] = 0.25
        assert sample_rows(one, gen, num_samples=50).eq(torch.tensor(spots)[:, None]).all()
        keep = torch.rand(16, V, generator=gen) < 0.05
        sparse = torch.rand(16, V, generator=gen, dtype=torch.float64).to(dtype) * keep
        sparse[:, V - 1] = 1e-3                                         # every row positive somewhere
        got = sample_rows(sparse, gen, num_samples=200)
        assert (sparse.gather(1, got) > 0).all()
    assert sample_rows(torch.zeros(0, V)).shape == (0,) and sample_rows(torch.zeros(0, V), num_samples=3).shape == (0, 3)


@pytest.mark.parametrize("method", ["gr", "kseq", "rrs", "rrsw"])
def test_a_residual_that_rounds_away_is_the_target(method):
    """p = q with p(0) = 0, two i.i.d. children at the root (stop 1): GR's and K-SEQ's accepted mass ``a`` is p up to
    round-off, so ``[p − a]_+`` often cancels to the zero row while the children can still all fail (by round-off).
    The batched rule's residual is then ``p`` (:func:`univer_theory.plans.base.residual_rows`), never a zero row
    (whose draw was token 0, where p = 0), and the exact core's keeps its mass 1 in p's support (which of the two
    layers cancels to the zero row, where ρ* differs in its last bits, may differ; rows with mass are compared by
    :func:`test_every_node_decision_matches_exact_allocate`)."""
    rng = np.random.default_rng(0)
    fallbacks = 0
    for _ in range(200):
        V = int(rng.integers(3, 7))
        p = np.concatenate([[0.0], rng.dirichlet(np.ones(V - 1))])
        kids = tuple(int(y) for y in rng.choice(V, size=2, p=p))
        ctx = engine.LevelContext(torch.ones(1, dtype=torch.float64), torch.tensor(p)[None], torch.tensor(p)[None],
                                  torch.tensor([kids]), torch.ones(1, 2, dtype=torch.bool), "iid")
        res = METHODS[method](ctx).residual[0].numpy()
        want = VERIFIERS[method].rule(NodeContext(1.0, p, p, kids, "iid", (".", "."))).residual
        assert res.sum() > 0 and res[0] == 0, (p, kids, res)
        assert want.sum() == pytest.approx(1.0, abs=1e-12) and want[0] == 0, (p, kids, want)
        fallbacks += bool(np.array_equal(res, p))
    assert fallbacks >= 20, fallbacks            # the cancellation is common here, so the test reaches it
