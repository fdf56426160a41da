"""Bad input raises ValueError (NotImplementedError for unsupported combinations); seeded runs repeat exactly;
the CUDA path (when a GPU is present) gives the same E[τ] as the CPU."""
from dataclasses import replace

import numpy as np
import pytest
import torch

from gpu import METHODS, TreeBatch, draft_tree, expected_accepted_length, verify
from gpu.probs import SIMPLEX_TOL, check_rows
from univer_theory import VERIFIERS, DirichletModel, DraftTree, TreeShape

from .helpers import on_device, padded_rows

MODEL = DirichletModel(4, seed=1, similarity=0.5)
TREES = [DraftTree((-1, 0, 0, 1), (-1, 2, 0, 1)), DraftTree.chain([3, 1])]


def inputs(dtype=torch.float64):
    return padded_rows(TREES, MODEL, dtype)


def edited(x, index, value):
    x = x.clone()
    x[index] = value
    return x


def renormalised_with_zero(q, b, u, y):
    q = q.clone()
    q[b, u, y] = 0
    q[b, u] /= q[b, u].sum()
    return q


@pytest.mark.parametrize("case, rule", [
    ("target_short_vocab", "disagree"),
    ("batch_rows", r"must be \[B, N, V\]"),
    ("sum", "does not sum to 1"),
    ("negative", "negative entry"),
    ("negative_tiny", "negative entry"),     # within the sum's tolerance, still below 0
    ("nan", "NaN or inf"),
    ("bf16", "float32 or float64"),
    ("dtype_mix", "float32 or float64 of one dtype, got torch.float32 and torch.float64"),
    ("q_zero", "draft_probs\\[0, 0, 2\\] = 0"),
    ("token_range", "outside \\[0, 3\\)"),
])
def test_bad_input_raises_value_error(case, rule):
    batch, p, q = inputs()
    if case == "target_short_vocab":
        p = p[:, :, :3] / p[:, :, :3].sum(-1, keepdim=True)
    elif case == "batch_rows":
        p, q = p[:1], q[:1]
    elif case == "sum":
        p = edited(p, (1, 2), p[1, 2] * 0.9)
    elif case == "negative":
        p = edited(p, (0, 1, 0), -0.1)
    elif case == "negative_tiny":
        p = edited(edited(p, (0, 1, 0), -5e-10), (0, 1, 1), p[0, 1, 1] + p[0, 1, 0] + 5e-10)   # sums to 1
    elif case == "nan":
        q = edited(q, (0, 3, 1), float("nan"))
    elif case == "bf16":
        p, q = p.bfloat16(), q.bfloat16()
    elif case == "dtype_mix":
        p = p.float()
    elif case == "q_zero":
        q = renormalised_with_zero(q, 0, 0, 2)
    elif case == "token_range":
        p, q = p[:, :, :3] / p[:, :, :3].sum(-1, keepdim=True), q[:, :, :3] / q[:, :, :3].sum(-1, keepdim=True)
    with pytest.raises(ValueError, match=rule):
        verify(batch, p, q, "iid", "tv", torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=rule):
        expected_accepted_length(batch, p, q, "iid", "tv")



def test_a_zero_draft_token_is_named_by_its_flat_row():
    """With flat rows (``row_index``, any order) a drafted token of draft probability 0 is named by its parent's row
    of ``draft_probs [R, V]``: tree 0's root lies in row 7 of the reversed rows."""
    batch, p, q = inputs()
    q = renormalised_with_zero(q, 0, 0, 2)                    # tree 0's node 1 drafts token 2 from the root's row
    B, N, V = p.shape
    row_index = (B * N - 1 - torch.arange(B * N)).view(B, N)
    flat = lambda x: x.reshape(B * N, V).flip(0)                                                  # noqa: E731
    for call in (verify, expected_accepted_length):
        with pytest.raises(ValueError, match=r"tree 0 node 1 drafts token 2 but its parent's draft_probs\[7, 2\] = 0"):
            call(batch, flat(p), flat(q), "iid", "tv", row_index=row_index)

def test_process_rules_and_options():
    batch, p, q = inputs()
    dup = TreeBatch.from_trees([DraftTree((-1, 0, 0), (-1, 1, 1))])
    pd, qd = p[:1, :3], q[:1, :3]
    with pytest.raises(ValueError, match="same token"):
        verify(dup, pd, qd, "wor", "tv")
    top = int(torch.sort(q[0, 0], descending=True, stable=True).indices[3])   # the least likely root token
    not_top = TreeBatch.from_trees([DraftTree((-1, 0), (-1, top))])
    with pytest.raises(ValueError, match="top-1 draft tokens"):
        verify(not_top, p[:1, :2], q[:1, :2], "topk", "nss")
    with pytest.raises(ValueError, match="unknown method 'bogus'"):
        verify(batch, p, q, "iid", "bogus")
    with pytest.raises(ValueError, match="unknown process"):
        verify(batch, p, q, "beam", "tv")
    with pytest.raises(NotImplementedError, match="rrsw is defined for processes"):
        verify(batch, p, q, "iid", "rrsw")
    with pytest.raises(ValueError, match="batch must be a TreeBatch"):
        verify(TREES, p, q, "iid", "tv")
    with pytest.raises(ValueError, match="generator must be a torch.Generator or None, got int"):
        verify(batch, p, q, "iid", "tv", 0)                       # was a TypeError inside torch.rand


def test_a_level_rule_without_an_exact_twin_is_named(monkeypatch):
    """A method added to ``gpu.METHODS`` alone (no Verifier of that name in the exact core, whose processes
    and law check it) was a bare KeyError."""
    from gpu import METHODS
    batch, p, q = inputs()
    monkeypatch.setitem(METHODS, "mine", METHODS["tv"])
    with pytest.raises(ValueError, match="method 'mine' has a level rule in gpu.METHODS but no exact twin"):
        verify(batch, p, q, "iid", "mine")


@pytest.mark.parametrize("process", ["topk", "greedy"])
def test_top_children_out_of_order_are_refused_in_both_layers(process):
    """The process drafts its top tokens most likely first, so listing them in another order is a tree of
    probability 0: the exact core once gave UniVer E[τ] = 0 there while the batched layer gave 0.8 (= α*), both
    accepting it.  Both refuse it now; in drafting order both give the same E[τ]."""
    from univer_theory import VERIFIERS
    P = np.array([[.5, .3, .2]])
    k = 2 if process == "topk" else 3
    first = (0, 1) if process == "topk" else (0, 1, 2)      # top-k, or top-(k−1) then any other token
    swapped = (1, 0) + first[2:]
    for toks, ok in ((first, True), (swapped, False)):
        tree = DraftTree((-1,) + (0,) * k, (-1,) + toks)
        rows = np.repeat(P[:1], k + 1, 0)                    # every node's row: the root's (p = q)
        batch, p = TreeBatch.from_trees([tree]), torch.tensor(rows[None])
        for method in ("univer", "nss"):
            if ok:
                exact = VERIFIERS[method].expected_accepted_length(tree, rows, rows, process)
                batched = expected_accepted_length(batch, p, p, process, method).item()
                assert abs(exact - batched) <= 1e-12 and exact > 0
                continue
            with pytest.raises(ValueError, match="most likely first"):
                VERIFIERS[method].expected_accepted_length(tree, rows, rows, process)
            with pytest.raises(ValueError, match="child 0 .* must be token 0"):
                expected_accepted_length(batch, p, p, process, method)
            with pytest.raises(ValueError, match="most likely first"):
                verify(batch, p, p, process, method)


def test_drafting_inputs_a_user_gets_wrong():
    """Each was a TypeError from inside torch, a refusal of a numpy integer, or a message about −inf rows."""
    from gpu import probs_from_logits, sample_children
    q = torch.tensor([[0.5, 0.5]])
    with pytest.raises(ValueError, match="k must be an integer ≥ 1, got 2.0"):
        sample_children(q, 2.0, "wor")
    with pytest.raises(ValueError, match="generator must be a torch.Generator or None, got int"):
        sample_children(q, 2, "wor", 0)
    with pytest.raises(ValueError, match="non-empty vocabulary axis, got shape \\[2, 0\\]"):
        probs_from_logits(torch.zeros(2, 0))
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    assert torch.equal(probs_from_logits(logits, 1.0, top=np.int64(2), support=np.int64(2)),
                       probs_from_logits(logits, 1.0, top=2, support=2))
    q4 = torch.full((4,), 0.25, dtype=torch.float64)                  # a shape's text, as the exact core takes it
    text, parsed = (draft_tree(s, q4, "wor", 3, torch.Generator().manual_seed(0))
                    for s in ("2,1", TreeShape.parse("2,1")))
    assert torch.equal(text[0].token, parsed[0].token) and torch.equal(text[1], parsed[1])
    with pytest.raises(ValueError, match="shape must be a TreeShape or its text like '2,2', got int"):
        draft_tree(3, q4, "wor", 3)


def test_padded_rows_are_ignored():
    batch, p, q = inputs()
    p2 = edited(p, (1, 3), float("nan"))          # tree 1 has 3 nodes: slot 3 is padding
    got = expected_accepted_length(batch, p2, q, "iid", "tv")
    torch.testing.assert_close(got, expected_accepted_length(batch, p, q, "iid", "tv"), rtol=0, atol=0)


def run_all(device):
    batch, p, q = inputs(torch.float32)
    batch, p, q = on_device(device, batch, p, q)
    gen = torch.Generator(device=device).manual_seed(7)
    drafted, qd = draft_tree(TreeShape.parse("2,2"), q[0, 0], "wor", 64, gen, device=device)
    pd = p[0, 0].expand(64, 7, 4).contiguous()
    res = [verify(drafted, pd, qd, "wor", m, gen) for m in ("tv", "rrsw", "nss")]
    return drafted.token, [(r.accepted_nodes, r.num_accepted, r.next_token) for r in res]


def test_same_seed_same_results():
    a, b = run_all("cpu"), run_all("cpu")
    assert torch.equal(a[0], b[0])
    for x, y in zip(a[1], b[1]):
        assert all(torch.equal(u, v) for u, v in zip(x, y))
    gen = torch.Generator().manual_seed(8)
    other = draft_tree(TreeShape.parse("2,2"), inputs()[2][0, 0], "wor", 64, gen)[0]
    assert not torch.equal(a[0], other.token)     # a different seed draws different trees


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA duplicate of the CPU tests")
def test_cuda_determinism_and_agreement():
    a, b = run_all("cuda"), run_all("cuda")
    assert torch.equal(a[0], b[0])
    for x, y in zip(a[1], b[1]):
        assert all(torch.equal(u, v) for u, v in zip(x, y))
    batch, p, q = inputs()
    for method, process in (("tv", "iid"), ("kseq", "iid"), ("rrsw", "wor"), ("nss", "iid")):
        cpu = expected_accepted_length(batch, p, q, process, method)
        gpu = expected_accepted_length(batch.to("cuda"), p.cuda(), q.cuda(), process, method)
        torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype, off", [(torch.float64, 1e-7), (torch.float32, 1e-4)])
def test_rows_off_the_simplex_by_more_than_the_dtypes_tolerance_are_refused(dtype, off):
    """float64 rows within 1e-9 of the simplex pass and 1e-7 off fail; float32 within 1e-5, 1e-4 off fail."""
    row = torch.tensor([[0.5, 0.5, 0.0]], dtype=dtype)
    check_rows("test", "rows", row + torch.tensor([[0.0, SIMPLEX_TOL[dtype] / 2, 0.0]], dtype=dtype))
    with pytest.raises(ValueError, match="does not sum to 1"):
        check_rows("test", "rows", row + torch.tensor([[0.0, off, 0.0]], dtype=dtype))


@pytest.mark.parametrize("method", ["univer", "rrsw", "tv"])
def test_rows_that_require_grad_are_read_detached(method):
    """Rows that require grad raised torch's RuntimeError from the host path (``.numpy()``); verification is a
    sampler, so they are read detached and give the detached rows' draws and E[τ] bit for bit."""
    model = DirichletModel(6, seed=2, similarity=0.4)
    trees = [DraftTree.from_shape(TreeShape.parse("2,2"), [1, 2, 3, 4, 0, 5]),
             DraftTree.from_shape(TreeShape.parse("2,1"), [4, 1, 2, 3])]
    batch, p, q = padded_rows(trees, model)
    pg, qg = p.clone().requires_grad_(True), q.clone().requires_grad_(True)
    for process in (pr for pr in ("wor", "iid") if pr in VERIFIERS[method].processes):
        a = verify(batch, p, q, process, method, torch.Generator().manual_seed(5))
        b = verify(batch, pg, qg, process, method, torch.Generator().manual_seed(5))
        assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("accepted_nodes", "num_accepted", "next_token"))
        e = expected_accepted_length(batch, pg, qg, process, method)
        assert not e.requires_grad and torch.equal(e, expected_accepted_length(batch, p, q, process, method))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_rows_are_refused_without_validation_too(dtype):
    """``validate=False`` skipped the dtype check: bfloat16 / float16 rows reached the support scan's per-dtype
    table as a bare KeyError. The dtypes are checked either way (O(1))."""
    b = TreeBatch.from_trees([DraftTree.chain([1])])
    p = torch.tensor([[[0.25, 0.75], [0.5, 0.5]]], dtype=dtype)
    with pytest.raises(ValueError, match=f"verify: target_probs and draft_probs must be float32 or float64 of one "
                                         f"dtype, got {dtype} and {dtype}"):
        verify(b, p, p, "iid", "tv", torch.Generator().manual_seed(0), validate=False)
    with pytest.raises(ValueError, match="expected_accepted_length: .* got torch.float32 and torch.float64"):
        expected_accepted_length(b, p.float(), p.double(), "iid", "tv", validate=False)


def test_a_temperature_per_row_gives_each_row_its_own_temperatures_row():
    """An engine holds a temperature per request: a tensor of one T per row gives, bit for bit, the row each T
    alone gives — greedy (T = 0) rows one-hot on the whole row's first maximum (ties included), ``top`` and
    ``support`` applied as for a number; a tensor that does not give one per row (axes aligned from the left), or a
    T < 0, NaN or bool, is refused (vLLM marks greedy requests T = −1: clamp them to 0 first)."""
    from gpu.probs import probs_from_logits
    g = torch.Generator().manual_seed(0)
    T = torch.tensor([[0.0, 0.7, 1.0, 2.3, 0.0, 1e-3], [0.31, 0.0, 5.0, 1.0, 0.9, 0.0]], dtype=torch.float64)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = (3 * torch.randn(2, 6, 50, generator=g)).to(dtype)
        x[0, 0, :5] = x[0, 0].max() + 1                  # greedy rows with tied maxima: topk keeps another of them
        x[1, 1] = 2.0
        x[1, 5, 3:9] = x[1, 5].max() + 1
        for top, support in ((None, None), (5, None), (None, 3), (5, 3), (1, None), (2, 1)):
            got = probs_from_logits(x, T, top, support)
            want = torch.stack([torch.stack([probs_from_logits(x[i, j], float(T[i, j]), top, support)
                                             for j in range(6)]) for i in range(2)])
            assert torch.equal(got, want), (dtype, top, support)
        assert torch.equal(probs_from_logits(x, torch.tensor(0.7, dtype=torch.float64)), probs_from_logits(x, 0.7))
        assert torch.equal(probs_from_logits(x, torch.zeros(2, 1)), probs_from_logits(x, 0))
        # a [B] tensor (one per request) aligns with the rows' first axis: request b's rows all take its T
        per_request = probs_from_logits(x, torch.tensor([0.0, 0.7], dtype=torch.float64))
        assert torch.equal(per_request[0], probs_from_logits(x[0], 0)) and torch.equal(per_request[1],
                                                                                      probs_from_logits(x[1], 0.7))
    # checked and decided greedy in its own precision: 1e-50 (0 in float32) is a tiny T, 1e300 (inf) a huge one
    ones = torch.tensor([[1.0, 1.0, 0.0]])
    for t in (1e-50, 1e300):
        assert torch.equal(probs_from_logits(ones, torch.tensor([t], dtype=torch.float64)), probs_from_logits(ones, t))
    x = torch.randn(2, 5, generator=g)
    for bad, match in ((torch.tensor([[0.7], [1.0]]), "temperature of shape \\[2, 1\\] does not give one per row "
                                                        "\\[2\\]"),
                       (torch.tensor([0.7, 1.0, 1.0]), "temperature of shape \\[3\\] does not give one per row"),
                       (torch.tensor([0.7, -1.0]), "temperature of row \\[1\\] must be finite and ≥ 0, got -1"),
                       (torch.tensor([float("nan"), 1.0]), "temperature of row \\[0\\] must be finite"),
                       (torch.tensor([True, False]), "temperature must be real numbers, got a torch.bool tensor"),
                       (None, "temperature must be one real number, got NoneType None"),
                       ("0.7", "temperature must be one real number, got str '0.7'")):
        with pytest.raises(ValueError, match=f"^probs_from_logits: {match}"):
            probs_from_logits(x, bad)


@pytest.mark.parametrize("bad", ["enter", "scale", "stop"])
def test_a_level_rule_deciding_outside_the_unit_interval_is_named(bad):
    """A level rule whose enter, scale or stop is NaN or outside [0, 1] is a ValueError naming the rule and the
    quantity, for sampling and E[τ | T] alike (a NaN scale — the layout's overflowed share before item 102 — was
    sampled from silently, and E[τ | T] came out NaN); an in-range rule passes the same check."""
    from functools import partial

    from gpu import engine
    from gpu.rules import rrs_rule

    def broken(ctx, value):
        dec = rrs_rule(ctx)
        fields = {"enter": dec.enter, "scale": dec.scale, "stop": dec.stop, "residual": dec.residual}
        fields[bad] = torch.full_like(fields[bad], value)
        return engine.LevelDecision(**fields)

    model = DirichletModel(5, seed=0)
    trees = [DraftTree((-1, 0, 0, 1), (-1, 1, 2, 3), 5)]
    batch, p, q = padded_rows(trees, model)
    for value in (float("nan"), 1.5, -0.25, 1 + 2 ** -52, -2 ** -1074):     # by one ulp too: [0, 1] exactly
        with pytest.raises(ValueError, match=f"level rule broken: a {bad} outside"):
            engine.sample(batch, p, q, "iid", partial(broken, value=value), torch.Generator().manual_seed(0))
        with pytest.raises(ValueError, match=f"level rule broken: a {bad} outside"):
            engine.expected_accepted(batch, p, q, "iid", partial(broken, value=value))
    engine.expected_accepted(batch, p, q, "iid", partial(broken, value=1.0))


@pytest.mark.parametrize("V", [5, 5000])                      # a short row's direct draw and the two-level one
def test_a_level_rule_with_a_broken_residual_is_named(V, monkeypatch):
    """A level rule whose residual holds a NaN, an infinity or a negative entry is a ValueError naming the rule
    (``broken``), on each path that draws from residuals (``sample``, ``traverse``, ``walk``): a NaN residual drew
    token V (outside the vocabulary; a short row) or failed inside torch (``index 20 is out of bounds``; a long row),
    a negative one drew a token of weight below 0; a valid residual, zero rows included, passes.  ``gpu.verify``
    checks with ``validate`` (each path: TV traverses, RRS walks, UniVer samples)."""
    from functools import partial

    from gpu import engine
    from gpu.rules import rrs_rule, tv_rule

    def broken(ctx, value, rule):
        dec = rule(ctx)
        residual = dec.residual.clone()
        residual[:, 0] = value
        return replace(dec, residual=residual)

    rng = np.random.default_rng(0)
    tree = DraftTree((-1, 0, 0, 1), (-1, 1, 2, 3), V)
    batch = TreeBatch.from_trees([tree] * 3)
    p, q = (torch.tensor(rng.dirichlet(np.ones(V), size=(3, 4))) for _ in range(2))
    paths = ((engine.sample, tv_rule), (engine.traverse, tv_rule), (engine.walk, rrs_rule))
    for run, rule in paths:
        for value in (float("nan"), float("inf"), -0.25):
            with pytest.raises(ValueError, match=r"level rule broken: a residual with an entry negative, "
                                                 r"infinite or NaN at a level of \d+ rows, first tree 0"):
                run(batch, p, q, "iid", partial(broken, value=value, rule=rule), torch.Generator().manual_seed(0))
        run(batch, p, q, "iid", partial(broken, value=0.0, rule=rule), torch.Generator().manual_seed(0))
    # the last row of a later unit alone (every unit and every row is read, not the first)
    calls = []

    def late(ctx, rule):
        dec = rule(ctx)
        calls.append(1)
        if len(calls) < 2:
            return dec
        residual = dec.residual.clone()
        residual[-1, 0] = float("nan")
        return replace(dec, residual=residual)
    for run, rule in paths[:2]:
        calls.clear()
        with pytest.raises(ValueError, match=r"level rule late: a residual with an entry negative"):
            run(batch, p, q, "iid", partial(late, rule=rule), torch.Generator().manual_seed(0))
        assert len(calls) >= 2
    # gpu.verify checks them with its inputs (validate=True); a serving loop's validate=False skips the pass
    for method, rule in (("tv", tv_rule), ("rrs", rrs_rule), ("univer", METHODS["univer"])):
        with monkeypatch.context() as patch:
            patch.setitem(METHODS, method, partial(broken, value=float("nan"), rule=rule))
            with pytest.raises(ValueError, match="level rule broken: a residual with an entry negative"):
                verify(batch, p, q, "iid", method, torch.Generator().manual_seed(0))
            verify(batch, p, q, "iid", method, torch.Generator().manual_seed(0), validate=False)


@pytest.mark.parametrize("dtype, off", [(torch.float32, 4e-6), (torch.float64, 5e-10)])
def test_rows_a_little_above_one_are_verified(dtype, off):
    """A row that validation accepts (its sum within ``SIMPLEX_TOL`` of its dtype) may hold an entry 1 + 4e-6
    (float32) or 1 + 5e-10 (float64): every method verifies it — the target-only procedure's enter probability p(y)
    is clamped at 1, as the others' are (the engine's [0, 1] check had named NSS's rule for valid input; float32
    rows reach the rule renormalised in float64, float64 rows as given, so only the latter reach the clamp) — and a
    certain token is accepted."""
    tree = DraftTree((-1, 0, 0, 1), (-1, 0, 1, 0))
    batch = TreeBatch.from_trees([tree])
    rows = lambda top: torch.tensor([top] + [[1 / 3] * 3] * 3, dtype=dtype)[None]   # noqa: E731
    p, q = rows([1 + off, 0.0, 0.0]), rows([1 - off, off, 0.0])
    for method in METHODS:
        for process in VERIFIERS[method].processes:
            e = expected_accepted_length(batch, p, q, process, method)
            assert float(e[0]) >= 1, (method, process)      # node 1 (token 0, p = 1) is accepted surely
            verify(batch, p, q, process, method, torch.Generator().manual_seed(0))


def test_inputs_torch_itself_used_to_refuse():
    """Each raised an error from inside torch (a RuntimeError, TypeError or AssertionError, or a message naming no
    argument), blamed the other argument, or was accepted silently (the declared vocabulary); each is a ValueError
    naming what is wrong now."""
    from gpu import sample_children
    from gpu.probs import check_generator
    batch, p = TreeBatch.from_trees([DraftTree((-1, 0), (-1, 1))]), torch.full((1, 2, 4), 0.25, dtype=torch.float64)
    rows = torch.full((3, 4), 0.25, dtype=torch.float64)                     # tree "2": a root and two children
    for call in (lambda: expected_accepted_length(batch, p.to_sparse(), p, "iid", "tv"),
                 lambda: verify(batch, p, p.to_sparse(), "iid", "tv"),
                 lambda: sample_children(p[0].to_sparse(), 2, "iid"),
                 lambda: draft_tree("2", rows[0].to_sparse(), "iid", 2),              # failed inside expand
                 lambda: draft_tree("2", rows.to_sparse(), "iid", 2),
                 lambda: draft_tree("2", lambda t, n: rows[n].expand(2, len(n), 4).to_sparse(), "iid", 2)):
        with pytest.raises(ValueError, match="must be a dense \\(strided\\) tensor, got layout torch.sparse_coo"):
            call()
    with pytest.raises(ValueError, match="generator is on cpu but the rows are on cuda"):
        check_generator("verify", torch.Generator(), torch.device("cuda"))       # (no device needed to compare)
    rows = p.reshape(2, 4)
    with pytest.raises(ValueError, match="target_probs and draft_probs must hold the same rows, got 1 and 2"):
        verify(batch, rows[:1], rows, "iid", "tv", row_index=torch.arange(2).view(1, 2))
    declared = DraftTree((-1, 0), (-1, 1), vocab_size=4)
    p6 = torch.full((1, 2, 6), 1 / 6, dtype=torch.float64)
    for b in (TreeBatch.from_trees([declared]), TreeBatch.from_tensors([[-1, 0]], [[-1, 1]], vocab_size=4)):
        assert b.vocab_size == 4 and b.to("cpu").vocab_size == 4 and b.with_tokens(b.token).vocab_size == 4
        with pytest.raises(ValueError, match="the batch declares vocab_size 4 but the rows have V = 6"):
            expected_accepted_length(b, p6, p6, "iid", "tv")
        with pytest.raises(ValueError, match="the batch declares vocab_size 4 but the rows have V = 6"):
            verify(b, p6, p6, "iid", "tv")
        assert b.to_trees() == [declared]
        assert expected_accepted_length(b, p, p, "iid", "tv").item() == VERIFIERS["tv"].expected_accepted_length(
            declared, p[0].numpy(), p[0].numpy(), "iid")
    with pytest.raises(ValueError, match="vocab_size must be ≥ 1, got -5"):
        DraftTree((-1,), (-1,), -5)                                   # a root-only tree: no token to catch it


@pytest.mark.parametrize("call, message", [
    (lambda: TreeBatch.from_tensors(None, None), "from_tensors: parent must be an integer array, got NoneType"),
    (lambda: TreeBatch.from_tensors("ab", "cd"), "from_tensors: parent must be an integer array, got str"),
    (lambda: TreeBatch.from_tensors([[-1, 0], [-1]], [[-1, 0], [-1]]), "parent must be an integer array, got list"),
    (lambda: TreeBatch.from_tensors([[-1, 0]], [[-1, 1]], [None]), "num_nodes must be an integer array"),
    (lambda: TreeBatch.from_tensors([[-1, 0]], [[-1, 1]], device="bogus"), "device 'bogus' cannot hold parent"),
    *([] if torch.cuda.is_available() else           # torch's AssertionError ("Torch not compiled with CUDA enabled")
      [(lambda: TreeBatch.from_tensors([[-1, 0]], [[-1, 1]], device="cuda"), "device 'cuda' cannot hold parent")]),
    (lambda: TreeBatch.from_tensors([[-1]], [[-1]], vocab_size=0), "vocab_size must be an integer ≥ 1, got 0"),
    (lambda: TreeBatch.from_sglang(None, None, None), "from_sglang: retrive_next_token must be an integer array"),
    (lambda: TreeBatch.from_trees(None), "trees must be a non-empty list of DraftTree, got NoneType"),
    (lambda: TreeBatch.from_trees(DraftTree.chain([1])), "got one DraftTree \\(wrap it in a list\\)"),
    (lambda: TreeBatch.from_trees([DraftTree.chain([1])]).with_tokens(None), "token must be an integer array"),
    (lambda: TreeBatch.from_trees([DraftTree.chain([1])]).positions(None), "offset must be an integer scalar"),
    (lambda: draft_tree("2", None, "iid", 2), "draft_probs must be rows .* or a callable, got NoneType"),
    (lambda: draft_tree("2,2", lambda token, nodes: torch.full((2, len(nodes), 4 if nodes == [0] else 3),
                                                               1 / (4 if nodes == [0] else 3), dtype=torch.float64),
                        "iid", 2), "returned rows of V = 3, torch.float64 on cpu at depth 1, but V = 4"),
    (lambda: draft_tree("2,2", lambda token, nodes: torch.full(
        (2, len(nodes), 4), 0.25, dtype=torch.float64 if nodes == [0] else torch.float32), "iid", 2),
     "returned rows of V = 4, torch.float32 on cpu at depth 1, but V = 4, torch.float64"),
    (lambda: draft_tree("2,1", lambda token, nodes: torch.full(       # another device (meta: no accelerator needed)
        (2, len(nodes), 4), 0.25, dtype=torch.float64, device="cpu" if nodes == [0] else "meta"), "iid", 2),
     "returned rows of V = 4, torch.float64 on meta at depth 1, but V = 4, torch.float64 on cpu at the root"),
])
def test_tree_builders_name_the_argument_torch_could_not_take(call, message):
    """Each was torch's own RuntimeError / TypeError (``Could not infer dtype of NoneType``, ``shape mismatch``) or
    a ValueError naming no argument."""
    with pytest.raises(ValueError, match=message):
        call()
