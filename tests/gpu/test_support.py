"""Levels planned on their drafted support (gpu/support.py) against the same levels on whole rows, the exact core
and the exact laws: every method of ``gpu.verify`` with i.i.d. / wor children, pass-1 decisions, E[τ | T], the
first-token law and the sampler (G-test, with the lossy variant that draws an undrafted correction from all of p
shown to be rejected)."""
import math

import numpy as np
import pytest
import torch

import gpu.engine as engine
import gpu.support as support
from gpu import TreeBatch, expected_accepted_length, verify
from gpu.drafting import draft_tree
from gpu.probs import sample_rows
from gpu.verify import DRAFTED_SUPPORT, METHODS
from univer_theory import VERIFIERS, DraftTree, TreeShape

from ..stats import assert_fits, assert_rejects, g_test
from .helpers import cell_counts, repeated

CASES = [(m, pr) for m in METHODS for pr in DRAFTED_SUPPORT if pr in VERIFIERS[m].processes]


def truncated_trees(spec: str, rows: str, process: str, seed: int, V: int = 60):
    """Trees of ``spec`` drafted from draft rows truncated to 4–12 of V tokens (tree ``B`` keeps whole rows):
    ``(part, full, p, q)`` — ``part`` the truncated trees, ``full`` the same plus the whole-row tree.  Rows
    ``near`` the target, or ``confident`` ones whose top token holds all but ~1e-10."""
    B = 6
    gen = torch.Generator().manual_seed(seed)
    shape = TreeShape.parse(spec)
    p = torch.softmax(3 * torch.randn(B + 1, shape.num_nodes, V, generator=gen, dtype=torch.float64), -1)
    scale = 1.0 if rows == "near" else 25.0
    q = torch.softmax(scale * (torch.log(p) + torch.randn(p.shape, generator=gen, dtype=torch.float64)), -1)
    for b, m in enumerate([4, 5, 12, 4, 8, 6]):
        kept = q[b].topk(m, -1).indices
        q[b] = torch.zeros_like(q[b]).scatter(-1, kept, q[b].gather(-1, kept))
        q[b] /= q[b].sum(-1, keepdim=True)
    full, q = draft_tree(shape, q, process, B + 1, gen)
    part = TreeBatch(full.parent[:B], full.token[:B], full.num_nodes[:B])
    return part, full, p, q


@pytest.fixture
def compacted(monkeypatch):
    """Counts the levels planned on their drafted support."""
    calls = []
    real = support.compact

    def spy(*args):
        calls.append(args[0].cols.shape)
        return real(*args)

    monkeypatch.setattr(support, "compact", spy)
    return calls


def assert_same_allocation(a, b, what):
    for name in ("rho", "enter", "stop", "residual"):
        x, y = getattr(a, name), getattr(b, name)
        np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=0, atol=1e-12, err_msg=f"{what}: {name}")


@pytest.mark.parametrize("method,process", CASES, ids=[f"{m}-{p}" for m, p in CASES])
@pytest.mark.parametrize("spec,rows", [("3,2", "near"), ("((..),.)", "confident")])
def test_every_method_plans_a_level_on_its_drafted_support(method, process, spec, rows, compacted):
    """Truncated trees planned on their drafted columns plus the undrafted one give the pass-1 decisions of the
    same trees planned on all V — scalings, stop probabilities, residuals (the undrafted column spread back as
    ``r·p/p_rest``) — and their E[τ | T] and first-token laws (1e-12); E[τ | T] is the exact core's, which plans
    every node on its whole row (1e-10).  A batch holding one whole-row tree is planned on all V."""
    part, full, p, q = truncated_trees(spec, rows, process, len(spec) + len(method))
    B, rule = part.parent.shape[0], METHODS[method]
    on, off = (engine.allocate(part, p[:B], q[:B], process, rule, keep_residuals=True, drafted_support=d)
               for d in (True, False))
    assert compacted, "no level was planned on its drafted support"
    assert_same_allocation(on, off, f"{method}-{process}")
    laws = [engine.first_token_law(part, p[:B], q[:B], process, rule, drafted_support=d) for d in (True, False)]
    np.testing.assert_allclose(laws[0].numpy(), laws[1].numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(laws[0].sum(1).numpy(), 1.0, rtol=0, atol=1e-12)
    got = expected_accepted_length(part, p[:B], q[:B], process, method).numpy()
    exact = [VERIFIERS[method].expected_accepted_length(t, p[b].numpy(), q[b].numpy(), process)
             for b, t in enumerate(part.to_trees())]
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-10)
    if rows == "near":                  # (confident drafts' tails underflow in float32)
        for off in (0.0, 9e-6):         # float32 rows off summing to 1 by up to their tolerance are read as p / Σp
            p32, q32 = (p[:B] * (1 - off)).float(), (q[:B] * (1 + off)).float()   # (8.5e-6 off when the undrafted
            single = expected_accepted_length(part, p32, q32, process, method).double().numpy()  # column took it)
            np.testing.assert_allclose(single, exact, rtol=0, atol=1e-6, err_msg=f"float32 rows, {off} off")
    compacted.clear()
    mixed = engine.allocate(full, p, q, process, rule, keep_residuals=True, drafted_support=True)
    assert not compacted, "a level with a whole-row draft was planned on its drafted support"
    assert_same_allocation(mixed, engine.allocate(full, p, q, process, rule, keep_residuals=True), "whole rows")


@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("spec,rows", [("2,2", "near"), ("((..),.)", "near"), ("(.,(.),(..))", "near"),
                                       ("3,2", "confident")])
def test_univer_rules_on_the_drafted_support(process, spec, rows, compacted):
    """UniVer's rules beyond the grid above — rule 1 and the shape rule on small supports, rule 3, PTS, the
    coupling, the slot rule — on their drafted support: the undrafted tokens get no marginal (their residual is
    ``ρp``, 1e-15 relative beside the complement's ``|1 − Σ p| / p_rest``), and the decisions and E[τ | T] are the
    whole rows' (1e-12)."""
    part, _, p, q = truncated_trees(spec, rows, process, len(spec))
    B = part.parent.shape[0]
    on, off = (engine.allocate(part, p[:B], q[:B], process, METHODS["univer"], keep_residuals=True,
                               drafted_support=d) for d in (True, False))
    assert compacted
    assert_same_allocation(on, off, "univer")
    internal = torch.zeros(p[:B].shape, dtype=torch.bool)
    internal[:, part.parent[0][part.parent[0] >= 0].unique()] = True
    cell = (q[:B] == 0) & internal
    rho_p = (on.rho[..., None] * p[:B])[cell]
    rest = torch.where(q[:B] == 0, p[:B], 0).sum(-1, keepdim=True)
    slack = ((1 - p[:B].sum(-1, keepdim=True)).abs() + 4e-16) / rest + 1e-15     # support.scan's complement
    assert ((on.residual[cell] - rho_p).abs() <= slack.expand_as(p[:B])[cell] * rho_p).all()
    e = [engine.expected_accepted(part, p[:B], q[:B], process, METHODS["univer"], drafted_support=d)
         for d in (True, False)]
    np.testing.assert_allclose(e[0].numpy(), e[1].numpy(), rtol=0, atol=1e-12)


def random_support_rows(gen, V, sizes, dtype=torch.float64):
    p = torch.softmax(torch.randn(len(sizes), V, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(len(sizes), V, generator=gen, dtype=torch.float64), -1)
    for r, m in enumerate(sizes):
        q[r, torch.randperm(V, generator=gen)[m:]] = 0
    return p.to(dtype), (q / q.sum(1, keepdim=True)).to(dtype)


#: The threshold the scan's complement path is tested at, per dtype: :data:`gpu.support.EXACT_REST_BELOW`
#: (float32 rows are always summed there, so the compiled scans' complement is exercised on them at 1e-2).
COMPLEMENT_FROM = {torch.float64: support.EXACT_REST_BELOW[torch.float64], torch.float32: 1e-2}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_host_complement_is_compensated_over_many_drafted_tokens(dtype):
    """``p_rest = 1 − Σ_drafted p`` on the CPU is summed with Neumaier's compensation: within ~ε of its correctly
    rounded value however many tokens are drafted (20 000 here; a plain running sum is ~1e-14 off)."""
    gen = torch.Generator().manual_seed(8)
    V, m = 40_000, 20_000
    p, q = random_support_rows(gen, V, [m] * 4, dtype)
    cols, _, _, rest = support._scan_host(p, q, torch.arange(4), V // 2, COMPLEMENT_FROM[dtype])
    for r in range(4):
        complement = math.fsum([1.0] + (-p[r, q[r] > 0].double()).tolist())
        assert complement >= COMPLEMENT_FROM[dtype] and (cols[r] != support.PAD).sum() == m
        assert abs(float(rest[r]) - complement) <= 2.3e-16 * complement


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_scan_and_compact_contract(dtype):
    """The compiled CPU scan and the accelerator's torch scan agree: each row's drafted tokens in id order
    (padding after them) and ``p_rest`` — ``1 − Σ_drafted p`` (to ~ε of its correctly rounded value, so within
    ``|1 − Σ p|`` of the undrafted mass) where that is at least ``EXACT_REST_BELOW``, else the undrafted mass
    summed (1e-15 relative; exactly 0 when no undrafted token has mass, though the complement is ±ε there); a row
    drafting more than V/2 tokens gives up; both give the undrafted mass per block of token ids (for the final
    draw).  ``compact`` puts p, q and the children on those columns and keeps the sums; ``tokens`` maps sampled
    columns back (the undrafted column and padding to V); ``expand`` is its inverse."""
    gen = torch.Generator().manual_seed(3)
    V, sizes = 50, [5, 17, 25, 1, 3, 4, 6]
    p, q = random_support_rows(gen, V, sizes, dtype)
    p[4] = q[4]                                                     # no undrafted mass: p_rest must be 0
    p[5] = torch.where(q[5] > 0, q[5] * (1 - 1e-9), 1e-9 / (V - 4)).to(dtype)   # p_rest 1e-9: summed
    p[6] = torch.where(q[6] > 0, q[6] * (1 - 1e-3), 1e-3 / (V - 6)).to(dtype)   # 1e-3: summed in float32 only
    src = torch.tensor([4, 0, 1, 2, 3, 5, 6])             # rows in any order, as the engine gathers them
    found = [scan(p, q, src, V // 2, COMPLEMENT_FROM[dtype])
             for scan in (support._scan_host, support._scan_device)]
    for (cols, p_s, q_s, rest), summed_error in zip(found, (4e-16, 25 * 1.2e-16)):   # compensated on the CPU
        assert cols.shape == (7, 25) and rest.dtype == torch.float64
        for i, r in enumerate(src.tolist()):
            drafted = (q[r] > 0).nonzero().squeeze(1)
            assert torch.equal(cols[i, :drafted.numel()], drafted)
            assert (cols[i, drafted.numel():] == support.PAD).all()
            undrafted = p[r].double()[q[r] == 0].sum()
            complement = math.fsum([1.0] + (-p[r, drafted].double()).tolist())   # correctly rounded
            if complement >= COMPLEMENT_FROM[dtype]:
                assert abs(float(rest[i]) - complement) <= 4e-16 * complement + summed_error
                assert abs(float(rest[i]) - float(undrafted)) <= abs(1 - math.fsum(p[r].double().tolist())) + 4e-15
            else:
                assert abs(float(rest[i]) - float(undrafted)) <= 1e-15 * float(undrafted)
            assert torch.equal(p_s[i, :drafted.numel()], p[r, drafted]) and (p_s[i, drafted.numel():] == 0).all()
            assert torch.equal(q_s[i, :drafted.numel()], q[r, drafted]) and (q_s[i, drafted.numel():] == 0).all()
    assert float(found[0][3][0]) == 0.0 and float(found[1][3][0]) == 0.0
    summed = [float(found[0][3][5])] + ([float(found[0][3][6])] if dtype == torch.float32 else [])
    assert all(x < COMPLEMENT_FROM[dtype] for x in summed)
    for a, b in zip(found[0][:3], found[1][:3]):
        assert torch.equal(a, b)
    torch.testing.assert_close(found[0][3], found[1][3], rtol=0, atol=4e-15)
    wide_rows = random_support_rows(gen, 300, [1] + [140] * 20, dtype)  # past the room the first row sizes: it grows
    sparse_rows = random_support_rows(gen, 1000, [1, 7, 30, 120, 499], dtype)   # words skipped
    last_wide = random_support_rows(gen, 300, [1] * 19 + [150], dtype)  # laid out [20, 150]: past the room
    for rows_, cap in ((wide_rows, 150), (sparse_rows, 500), (last_wide, 150)):
        rows = torch.arange(rows_[0].shape[0])
        for a, b in zip(support._scan_host(*rows_, rows, cap, 1e-6), support._scan_device(*rows_, rows, cap, 1e-6)):
            torch.testing.assert_close(a, b, rtol=0, atol=2e-14)
    many = random_support_rows(gen, 300, [140, 100, 120, 90], dtype)
    rows = torch.arange(4)
    undrafted = torch.where(many[1] > 0, 0, many[0]).double()
    B = support.SCAN_BLOCK
    want = torch.stack([undrafted[:, i:i + B].sum(1) for i in range(0, 300 // B * B + 1, B)], 1)  # and the tail
    cols = support.scan(*many, rows).cols                           # each row's drafted tokens, PAD padded
    for blocks in (support._undrafted_blocks_host, support._undrafted_blocks_device):
        torch.testing.assert_close(blocks(many[0], rows, cols), want, rtol=1e-14, atol=0)
    wide = torch.tensor([0, 2])
    q_wide = q.clone()
    q_wide[2, :26] = 1 / 26
    assert all(scan(p, q_wide, wide, V // 2, 1e-6) is None for scan in (support._scan_host, support._scan_device))
    src = src[:5]
    sup = support.scan(p, q, src)
    children = torch.stack([torch.multinomial(q[r].double(), 1, generator=gen).repeat(2) for r in src.tolist()])
    p_s, q_s, kids = support.compact(sup, children)
    assert p_s.shape == (5, 26) and p_s.dtype == dtype and (q_s[:, -1] == 0).all()
    assert torch.equal(sup.cols.gather(1, kids), children)
    tol = 2e-7 if dtype == torch.float32 else 1e-15
    for x_s, x in ((p_s, p), (q_s, q)):
        torch.testing.assert_close(x_s.double().sum(1), x[src].double().sum(1), rtol=0, atol=tol)
    columns = torch.tensor([2, 4, 25, 24, 1])      # 25: the undrafted column; the last row drafts 1 token (padding)
    tok = support.tokens(sup, columns, V)
    assert tok.tolist() == [int(sup.cols[0, 2]), int(sup.cols[1, 4]), V, int(sup.cols[3, 24]), V]
    full = support.expand(p_s.double(), p.double(), q.double(), src, sup)
    torch.testing.assert_close(full, p[src].double(), rtol=1e-15 if dtype == torch.float64 else 1e-7, atol=0)


def undrafted_from_p(law: dict, tree: DraftTree, pn, qn) -> dict:
    """The exact law of the lossy variant that draws an undrafted correction token from all of p instead of
    ``p·1[q = 0]``: at an internal endpoint u, the mass ``U_u`` the true law puts on u's undrafted tokens is
    spread as ``U_u·p_u(x)`` over every token (drafted ones included)."""
    out = dict(law)
    for u in range(tree.num_nodes):
        if not tree.children[u]:
            continue
        path = tree.path(u)
        undrafted = [x for x in range(len(pn[u])) if qn[u][x] == 0]
        mass = sum(float(law.get(path + (x,), 0)) for x in undrafted)
        for x in undrafted:
            out[path + (x,)] = 0.0
        for x in range(len(pn[u])):
            out[path + (x,)] = out.get(path + (x,), 0.0) + mass * float(pn[u][x])
    return {k: v for k, v in out.items() if v > 0}


N_SAMPLES = 200_000
#: A wor / iid tree on V = 6 with draft rows on 3 tokens (root: two children, its first child: two).
SAMPLED = {"wor": DraftTree(parent=(-1, 0, 0, 1, 1), token=(-1, 0, 1, 2, 0), vocab_size=6),
           "iid": DraftTree(parent=(-1, 0, 0, 1, 1), token=(-1, 0, 0, 2, 2), vocab_size=6)}


def sampled_instance(process):
    """``(tree, pn, qn)``: Dirichlet target rows and draft rows on three tokens each (undrafted target mass ~1/2):
    {0, 1, 3} at the root, {0, 2, 4} at its first child — endpoints with different drafted sets, so that an
    undrafted draw reading another row's drafted tokens shows — and {0, 1, 2} at the leaves."""
    rng = np.random.default_rng(11)
    tree = SAMPLED[process]
    pn = rng.dirichlet(np.ones(6), size=tree.num_nodes)
    qn = np.zeros_like(pn)
    for u, drafted in enumerate([[0, 1, 3], [0, 2, 4]] + [[0, 1, 2]] * (tree.num_nodes - 2)):
        qn[u, drafted] = rng.dirichlet(np.ones(3))
    return tree, pn, qn


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_scan_finds_tokens_at_word_edges_and_refuses_rows_over_its_cap(dtype):
    """The compiled scan (a bit mask of drafted tokens per word, then each word's set bits) on rows of three full
    words and a tail: drafted tokens at each word's first and last id (bits 0 and 63) and in the tail, a fully
    drafted word, a word drafting one token, a row of subnormal draft entries — each row's tokens all found, in id
    order, as the torch scan finds them; a row drafting exactly ``cap`` tokens is scanned and one more gives up
    (both scans)."""
    W = support.SCAN_WORD
    V = 3 * W + 5
    gen = torch.Generator().manual_seed(21)
    p = torch.softmax(torch.randn(6, V, generator=gen, dtype=torch.float64), -1)
    q = torch.zeros(6, V, dtype=torch.float64)
    q[0, [0, W - 1, W, 2 * W - 1, 3 * W, V - 1]] = 1.0                 # word edges and the tail's ends
    q[1, W:2 * W] = 1.0                                                 # one word drafted whole
    q[1, 3 * W + 2] = 1.0
    q[2, 2 * W + 17] = 1.0                                              # one token in all the row
    q[3, torch.randperm(V, generator=gen)[:40]] = 5e-324 * 2 ** 40     # tiny entries are drafted too
    cap = W + 22                                                        # above row 1's W + 1 tokens
    q[4, torch.randperm(V, generator=gen)[:cap]] = 1.0                  # exactly the cap
    q[5, torch.randperm(V, generator=gen)[:cap + 1]] = 1.0              # one over it
    q = q / q.sum(1, keepdim=True)
    p, q = p.to(dtype), q.to(dtype)
    assert (q[3] > 0).sum() == 40
    rows = torch.arange(5)
    host, device = (scan(p, q, rows, cap, 1e-6) for scan in (support._scan_host, support._scan_device))
    for i in range(5):
        drafted = (q[i] > 0).nonzero().squeeze(1)
        assert torch.equal(host[0][i, :drafted.numel()], drafted)
        assert (host[0][i, drafted.numel():] == support.PAD).all()
        assert torch.equal(host[2][i, :drafted.numel()], q[i, drafted])
        assert torch.equal(host[1][i, :drafted.numel()], p[i, drafted])
    for a, b in zip(host[:3], device[:3]):
        assert torch.equal(a, b)
    for scan in (support._scan_host, support._scan_device):
        assert scan(p, q, torch.tensor([4, 5]), cap, 1e-6) is None
        assert scan(p, q, torch.tensor([5]), cap + 1, 1e-6) is not None


@pytest.mark.parametrize("method,process", [("univer", "wor"), ("rrsw", "wor"), ("tv", "iid")])
def test_sampler_on_the_drafted_support_follows_exact_law(method, process, compacted):
    """``gpu.verify`` on a truncated draft (every level on its drafted support, correction tokens from the
    undrafted column drawn again from ``p·1[q = 0]``) follows the exact core's law (G-test, power against the
    lossy variant that draws them from all of p)."""
    tree, pn, qn = sampled_instance(process)
    law = VERIFIERS[method].law(tree, pn, qn, process)
    batch, p, q = repeated(tree, pn, qn, N_SAMPLES)
    result = verify(batch, p, q, process, method, torch.Generator().manual_seed(4))
    assert compacted
    assert_fits(cell_counts(result, tree), law, {"undrafted from p": undrafted_from_p(law, tree, pn, qn)},
                f"{method}-{process}")


@pytest.mark.parametrize("method", ["univer", "rrsw"])
def test_same_test_rejects_undrafted_tokens_from_all_of_p(monkeypatch, method):
    """The lossy variant (an undrafted correction token drawn from all of p) is rejected against the true law
    and fits its own exact law (:func:`undrafted_from_p`) — UniVer's draws from its allocation, RRSw's from its
    walk (:func:`gpu.engine.walk`)."""
    tree, pn, qn = sampled_instance("wor")
    law = VERIFIERS[method].law(tree, pn, qn, "wor")
    lossy = undrafted_from_p(law, tree, pn, qn)
    monkeypatch.setattr(support, "draw_undrafted",
                        lambda p_rows, q_rows, src, cols, gen: sample_rows(p_rows.index_select(0, src), gen))
    batch, p, q = repeated(tree, pn, qn, N_SAMPLES)
    counts = cell_counts(verify(batch, p, q, "wor", method, torch.Generator().manual_seed(5)), tree)
    assert_rejects(g_test(counts, law), "undrafted from p")
    assert_fits(counts, lossy, {method: law}, "undrafted from p vs its own exact law")


def test_undrafted_draw_reads_each_endpoints_own_drafted_tokens():
    """``cols_at`` gives each endpoint slot its own level row's drafted tokens (levels of different widths, slots
    in any order, a slot in no level padded), and ``draw_undrafted`` with them never returns a token its row
    drafts, on rows whose drafted sets differ (their law: the block masses above and
    ``test_sampler_on_the_drafted_support_follows_exact_law``)."""
    at = [torch.tensor([0, 7, 3]), torch.tensor([5, 1])]
    cols = [torch.tensor([[1, 4, support.PAD], [2, 3, 9], [0, support.PAD, support.PAD]]), torch.tensor([[6], [8]])]
    got = support.cols_at(list(zip(at, cols)), torch.tensor([1, 3, 2, 7, 5]), 8)
    P = support.PAD
    assert got.tolist() == [[8, P, P], [0, P, P], [P, P, P], [2, 3, 9], [6, P, P]]
    gen = torch.Generator().manual_seed(3)
    p, q = random_support_rows(gen, 400, [30, 200, 1, 120])
    rows = torch.arange(4).repeat(2000)
    drafted = support.scan(p, q, torch.arange(4)).cols
    y = support.draw_undrafted(p, q, rows, drafted[rows], gen)
    assert not (q[rows, y] > 0).any()
    assert all(len(set(y[rows == r].tolist())) > 100 for r in range(4))       # spread over the undrafted tokens


def far_trees(spec: str, process: str, seed: int, top: int | None, V: int = 200, B: int = 4):
    """``(batch, p, q)``: B trees of ``spec`` drafted from rows far from the target (independent softmaxes of
    3·N(0, 1) logits), truncated to their ``top`` tokens unless None — many pairs meet both sides of UniVer's cut,
    whose A* child is then never reached (ρ = 0)."""
    gen = torch.Generator().manual_seed(seed)
    shape = TreeShape.parse(spec)
    p, q = (torch.softmax(3 * torch.randn(B, shape.num_nodes, V, generator=gen, dtype=torch.float64), -1)
            for _ in range(2))
    if top is not None:
        kept = q.topk(top, -1).indices
        q = torch.zeros_like(q).scatter(-1, kept, q.gather(-1, kept))
        q = q / q.sum(-1, keepdim=True)
    batch, q = draft_tree(shape, q, process, B, gen)
    return batch, p, q


@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("spec", ["2,2,2", "(.,(.),(..))"])
def test_unreached_rows_are_left_unplanned(process, spec):
    """UniVer's nodes with ρ = 0 (never reached: ``gpu.verify.REACHED_ONLY``) left out of their level — scan,
    compaction and rule — give the allocation (ρ, enter, stop, residuals), E[τ | T] and draws of planning every
    row, bit for bit: on a level's drafted support (truncated trees) and on whole rows, in blocks of one row (a
    block of unreached rows is not planned) and of every row (planned whole); the candidates of reached nodes are
    the same, an unreached node left out keeps −1.  (Fails when its children's ρ is not zeroed, or when an
    unreached row does not take its uniform.)"""
    planned = []

    def rule(ctx):
        planned.append(ctx.rho.shape[0])
        return METHODS["univer"](ctx)

    for top, support_, block in ((20, True, engine.CPU_BLOCK_BYTES), (None, False, 8 * 200),
                                 (None, False, engine.CPU_BLOCK_BYTES)):
        batch, tp, dq = far_trees(spec, process, 5, top)
        opts = {"drafted_support": support_, "block_bytes": block}
        counts, allocs = [], []
        for reached in (False, True):
            planned.clear()
            allocs.append(engine.allocate(batch, tp, dq, process, rule, torch.Generator().manual_seed(3),
                                          sample=True, keep_residuals=True, reached_only=reached, **opts))
            counts.append(sum(planned))
        off, on = allocs
        internal = batch.num_children > 0
        unreached = internal & (off.rho == 0)
        assert unreached.any(), "no unreached node: the case tests nothing"
        for name in ("rho", "enter", "stop", "residual"):
            assert torch.equal(getattr(on, name), getattr(off, name)), name
        assert torch.equal(on.candidate[internal & ~unreached], off.candidate[internal & ~unreached])
        if support_ or block < engine.CPU_BLOCK_BYTES:  # left out: fewer rows planned
            assert (on.candidate[unreached] == -1).all() and counts[1] < counts[0]
        else:                                           # one block holding reached rows: planned whole
            assert torch.equal(on.candidate, off.candidate) and counts[1] == counts[0]
        e = [engine.expected_accepted(batch, tp, dq, process, rule, reached_only=r, **opts) for r in (False, True)]
        assert torch.equal(e[0], e[1])
        for seed in range(4):
            a, b = (engine.sample(batch, tp, dq, process, rule, torch.Generator().manual_seed(seed),
                                  reached_only=r, **opts) for r in (False, True))
            assert torch.equal(a.accepted_nodes, b.accepted_nodes) and torch.equal(a.next_token, b.next_token)


@pytest.mark.parametrize("n", [0, 1, 5])
@pytest.mark.parametrize("V", [300, 256])
def test_accelerator_block_masses_are_the_hosts(n, V):
    """The accelerator's undrafted block masses (torch, :func:`gpu.support._undrafted_blocks_device`, run here on CPU
    tensors) equal the CPU's compiled pass, V // SCAN_BLOCK + 1 blocks whether or not V is a multiple — and on zero
    rows, where the torch view raised (no engine call reaches it: the engine draws only where a tree needs it)."""
    from gpu.support import _undrafted_blocks_device, _undrafted_blocks_host
    gen = torch.Generator().manual_seed(V + n)
    p = torch.softmax(torch.randn(6, V, generator=gen, dtype=torch.float64), -1)
    src = torch.arange(n)
    cols = torch.sort(torch.randint(0, V, (n, 7), generator=gen), dim=1).values
    cols[:, -2:] = support.PAD
    host, dev = _undrafted_blocks_host(p, src, cols), _undrafted_blocks_device(p, src, cols)
    assert host.shape == dev.shape == (n, V // support.SCAN_BLOCK + 1)
    torch.testing.assert_close(dev, host, rtol=1e-12, atol=1e-15)
