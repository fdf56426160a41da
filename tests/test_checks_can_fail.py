"""Every claim's checker can fail: each test feeds a check (or the CLI that reports it) one violation and sees it
refused — the kill tests of a mutation campaign over paper_checks/ and univer/ (docs/deviations.md item 98).
Inputs are faked where the real ones are slow (SmolLM2's bench, the LPs); the grids are cut to 1–3 instances."""
import contextlib
import io
import json
import re
from dataclasses import dataclass, fields, replace
from fractions import Fraction
from itertools import islice
from types import SimpleNamespace

import numpy as np
import pytest

import solvers
import univer.commands.check as check
import univer.commands.exact as exact
from paper_checks import (global_gap, lossless, optimality, real_gain, reductions, run_checks,
                          temperature)
from paper_checks.base import CheckResult
from paper_checks.instances import FAMILIES, random_instances
from univer.cli import main
from univer_theory import VERIFIERS, Verifier
from univer_theory.processes import EXACT_PROCESSES, enumerate_trees


def run(check, tmp_path, fast: bool = True):
    """One paper check, as ``univer check`` runs it (no progress bars)."""
    return check.run(fast=fast, out_dir=str(tmp_path), progress=False)


def scale_univer(monkeypatch, factor: float, where=lambda ctx: True) -> None:
    """UniVer with its child scalings multiplied by ``factor`` at the nodes where ``where(ctx)`` holds."""
    u = VERIFIERS["univer"]

    def rule(ctx):
        d = u.rule(ctx)
        return replace(d, scale=tuple(factor * s for s in d.scale)) if where(ctx) else d
    monkeypatch.setitem(VERIFIERS, "univer", replace(u, rule=rule))


def first(instances, n):
    """``instances`` cut to its first ``n`` (the grid generators take ``fast`` and optional arguments)."""
    return lambda fast, *args: islice(instances(fast, *args), n)


def test_lossless_exact_zero(monkeypatch, tmp_path):
    """A rational lossless method whose Fraction-mode distance is 1e-30 (not 0) while its float distance is 0
    must fail the lossless check."""
    real = lossless.evaluate
    def evaluate(model, shape, process, v):
        r = real(model, shape, process, v)
        return SimpleNamespace(distance=Fraction(1, 10**30)) if isinstance(r.distance, Fraction) else r
    monkeypatch.setattr(lossless, "evaluate", evaluate)
    monkeypatch.setattr(lossless, "BUG_ZOO", {})
    monkeypatch.setattr(lossless, "VERIFIERS", {"rrs": VERIFIERS["rrs"]})
    monkeypatch.setattr(lossless, "instances", first(lossless.instances, 2))
    res = run(lossless, tmp_path)
    assert not res.passed, "a nonzero Fraction-mode distance passed"


def test_lossless_all_flagged(monkeypatch, tmp_path):
    """Two lossy variants, one flagged, one never: the check must fail, 1/2."""
    rrs = VERIFIERS["rrs"]
    monkeypatch.setattr(lossless, "BUG_ZOO", {"bad": replace(rrs, name="bad", lossless=False),
                                    "fake": replace(rrs, name="fake", lossless=False)})
    monkeypatch.setattr(lossless, "VERIFIERS", {"rrs": rrs})
    monkeypatch.setattr(lossless, "instances", first(lossless.instances, 2))
    real = lossless.evaluate
    monkeypatch.setattr(lossless, "evaluate",
              lambda m, s, p, v: SimpleNamespace(distance=1e-3) if v.name == "bad" else real(m, s, p, v))
    res = run(lossless, tmp_path)
    assert "flagged: 1/2" in res.summary, res.summary
    assert not res.passed, "one unflagged lossy variant out of two passed"


def test_lossless_worst(monkeypatch, tmp_path):
    """A lossless method 5e-13 off (within 1e-12) is the reported worst."""
    monkeypatch.setattr(lossless, "BUG_ZOO", {})
    monkeypatch.setattr(lossless, "VERIFIERS", {"rrs": VERIFIERS["rrs"]})
    monkeypatch.setattr(lossless, "instances", first(lossless.instances, 2))
    real = lossless.evaluate
    def evaluate(m, s, p, v):
        r = real(m, s, p, v)
        return r if isinstance(r.distance, Fraction) else SimpleNamespace(distance=5e-13)
    monkeypatch.setattr(lossless, "evaluate", evaluate)
    res = run(lossless, tmp_path)
    assert res.passed and "worst float distance of a lossless method 5.00e-13 (rrs on " in res.summary, res.summary


def test_lossless_every_process(monkeypatch, tmp_path):
    """UniVer 1e-6 off the target on wor trees only must fail; every exact process appears in the grid."""
    assert {i[4] for i in lossless.instances(True)} == set(EXACT_PROCESSES)
    monkeypatch.setattr(lossless, "BUG_ZOO", {})
    monkeypatch.setattr(lossless, "VERIFIERS", {"univer": VERIFIERS["univer"]})
    # one shape, every process
    monkeypatch.setattr(lossless, "instances", first(lossless.instances, len(EXACT_PROCESSES)))
    real = lossless.evaluate
    def evaluate(m, s, p, v):
        r = real(m, s, p, v)
        return SimpleNamespace(distance=1e-6) if p == "wor" and not isinstance(r.distance, Fraction) else r
    monkeypatch.setattr(lossless, "evaluate", evaluate)
    res = run(lossless, tmp_path)
    assert not res.passed, "UniVer lossy on wor trees passed"


def test_optimality_node_tol(monkeypatch, tmp_path):
    """UniVer's scalings shrunk by 1e-7 (α off α* by ~1e-7, lossy) must fail."""
    scale_univer(monkeypatch, 1 - 1e-7)
    monkeypatch.setattr(optimality, "instances", first(optimality.instances, 2))
    res = run(optimality, tmp_path)
    assert not res.passed, "α off α*(ρ) by 1e-7 passed"


def test_optimality_node_checks(tmp_path):
    """With the α*-required test switched off, an α*(ρ) put 1e-6 below every applied α must fail ("exceeds
    α*(ρ)"); an applied marginal 1e-6 above ρp on one node context must fail ("exceeds ρp").  (The suite's test
    reaches "exceeds α*(ρ)" only where the LP returns a round-off negative α* for an α = 1 node.)"""
    def patched(patches):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(optimality, "instances", first(optimality.instances, 1))
            for name, f in patches.items():
                mp.setattr(optimality, name, f)
            return run(optimality, tmp_path)

    real_star, real_audit = optimality.alpha_star_lp, optimality.node_audit
    res = patched({"alpha_star_guaranteed": lambda *a: False,
               "alpha_star_lp": lambda model, r, process, cache: min(real_star(model, r, process, cache),
                                                                     r.alpha) - 1e-6})
    assert not res.passed and "exceeds α*(ρ)" in res.table, res.summary

    def audit(*a):
        recs = real_audit(*a)
        return [replace(recs[0], excess=1e-6)] + recs[1:]
    res = patched({"node_audit": audit})
    assert not res.passed and "exceeds ρp by 1e-06" in res.table, res.summary

    def leaky(*a):
        recs = real_audit(*a)
        return [replace(recs[0], leak=1e-11)] + recs[1:]
    res = patched({"node_audit": leaky})
    assert not res.passed and "miss ρp by 1e-11" in res.table, res.summary


def test_lossless_reaches_pts_at_three_children(monkeypatch, tmp_path):
    """PTS (wor, k ≥ 3) reporting its marginal in priority order instead of token order — the same α, weights and
    E[τ], the residual ``ρp − a`` of other tokens — must fail the fast lossless grid: its sparse rows are the only
    ones on which UniVer takes PTS at k = 3 (item 106; a fresh UniVer, so no plan comes from another test's cache)."""
    import numpy as np

    from univer_theory.plans import choose
    from univer_theory.plans.base import NodePlan
    from univer_theory.univer import make_univer_verifier

    real = choose.CONSTRUCTIONS["pts"][0]

    def mutant(p, q, rho, k, process, nodes=None):
        plan = real(p, q, rho, k, process, nodes)
        if plan is None or k < 3:
            return plan
        order = plan.info["order"]
        marginal = np.zeros_like(plan.marginal)
        marginal[:len(order)] = plan.marginal[order]
        return NodePlan(plan.construction, plan.rho, plan.target, marginal, plan.select, plan.info)
    monkeypatch.setattr(choose, "pts_plan", mutant)
    monkeypatch.setitem(choose.CONSTRUCTIONS, "pts", (mutant, ("wor",)))
    monkeypatch.setattr(lossless, "BUG_ZOO", {})
    monkeypatch.setattr(lossless, "VERIFIERS", {"univer": make_univer_verifier()})
    grid = lossless.instances
    monkeypatch.setattr(lossless, "instances", lambda fast: (i for i in grid(fast) if i[0].startswith("sparse/")))
    res = run(lossless, tmp_path)
    assert not res.passed and "sparse/" in res.summary, res.summary


def test_optimality_mean_kseq(monkeypatch, tmp_path):
    """K-SEQ 3% above UniVer on every iid instance must fail; 5% above on the last, and its mean row names it."""
    real, iids = optimality.expected_lengths, [i[0] for i in first(optimality.instances, 4)(True) if i[3] == "iid"]
    calls = []
    def expected_lengths(*a):
        v = dict(real(*a))
        if "kseq" in v:
            calls.append(1)
            v["kseq"] = (1.05 if len(calls) == len(iids) else 1.03) * v["univer"]
        return v
    monkeypatch.setattr(optimality, "expected_lengths", expected_lengths)
    monkeypatch.setattr(optimality, "instances", first(optimality.instances, 4))
    assert iids
    res = run(optimality, tmp_path)
    assert not res.passed and "< kseq" in res.table, res.summary
    row = next(line for line in res.table.splitlines() if line.startswith("| kseq |"))
    assert f"| -4.76% ({iids[-1]}) |" in row, row             # 1/1.05 − 1


def test_optimality_worst_cf(monkeypatch, tmp_path):
    """CF doubled on the 2nd of 3 instances makes it the worst, 50% below CF; the summary must name it and print
    the max."""
    real_b, real_l, n = optimality.bounds, optimality.expected_lengths, [0]
    def bounds(model, shape, process, *a, **k):
        b = dict(real_b(model, shape, process, *a, **k))
        n[0] += 1
        if n[0] == 2:
            b["cf"] = 2 * real_l(model, shape, process, ["univer"])["univer"]
        return b
    monkeypatch.setattr(optimality, "bounds", bounds)
    monkeypatch.setattr(optimality, "instances", first(optimality.instances, 3))
    second = list(first(optimality.instances, 3)(True))[1][0]
    res = run(optimality, tmp_path)
    assert f"(worst 50.00%, {second})" in res.summary, res.summary


def test_optimality_alpha_root_bound_above_cf(monkeypatch, tmp_path):
    """The claim's "≤ its α*-root bound ≤ CF": an α*-root bound 0.1 above CF passed (only UniVer ≤ each was
    checked)."""
    real_b = optimality.bounds
    monkeypatch.setattr(optimality, "instances", first(optimality.instances, 1))
    for above in (lambda b: 0.1, lambda b: b["cf_tolerance"] + b["cf_margin"] + 1e-9):   # 1e-9 past its slack too
        raised = lambda b: {**b, "cf_alpha_root": b["cf"] + above(b)}     # noqa: E731
        monkeypatch.setattr(optimality, "bounds", lambda *a, **k: raised(real_b(*a, **k)))
        res = run(optimality, tmp_path)
        assert not res.passed and "the α*-root bound" in res.summary + res.table, res.summary


def test_optimality_alpha_off_alpha_star_by_more_than_node_tol(monkeypatch, tmp_path):
    """Where α = α*(ρ) is required, an α*(ρ) put 1e-8 above the applied α (10 NODE_TOL; α below it, no other test
    involved) must fail."""
    real_star = optimality.alpha_star_lp
    monkeypatch.setattr(optimality, "alpha_star_lp", lambda *a: real_star(*a) + 1e-8)
    monkeypatch.setattr(optimality, "instances", first(optimality.instances, 1))
    res = run(optimality, tmp_path)
    assert not res.passed and "≠ α*(ρ)" in res.table, res.summary


def test_optimality_whole_grid(monkeypatch, tmp_path):
    """Every instance of the grid is evaluated and counted."""
    monkeypatch.setattr(optimality, "instances", first(optimality.instances, 3))
    res = run(optimality, tmp_path)
    names = [i[0] for i in first(optimality.instances, 3)(True)]
    assert res.summary.startswith("3 instances") and all(f"| {n} |" in res.table for n in names), res.summary


@pytest.mark.parametrize("factor, where, chains", [
    (1 - 1e-10, lambda ctx: len(ctx.children) == 1, slice(1, 3)),      # a per-tree law off by ~1e-10
    (0.5, lambda ctx: ctx.process == "wor" and tuple(int(y) for y in ctx.children) == (0,), slice(1, 2)),
])
def test_reductions_chain_law(monkeypatch, tmp_path, factor, where, chains):
    """UniVer's chain scalings shrunk by 1e-10 everywhere, or halved on wor chain nodes drafting token 0 only (not
    the last tree enumerated), must fail UniVer == BV on chains."""
    scale_univer(monkeypatch, factor, where)
    res = run_chains(monkeypatch, tmp_path, list(reductions.chain_instances(True))[chains])
    assert not res.passed and "joint law differs" in res.table, res.table[-600:]
    assert "UniVer's rule is not exact on chains" in res.table       # the float factor, on the rows as Fractions


def test_reductions_chain_law_in_fractions(monkeypatch, tmp_path):
    """UniVer's chain scalings shrunk by 10^-30 in Fractions — a change no float row sees (the float laws stay
    equal to BV's) — must fail UniVer == BV on chains in Fractions, on the exact twin of a Dirichlet model."""
    scale_univer(monkeypatch, 1 - Fraction(1, 10 ** 30), lambda ctx: len(ctx.children) == 1)
    res = run_chains(monkeypatch, tmp_path, list(reductions.chain_instances(True))[1:2])
    assert not res.passed and "in Fractions, UniVer's law differs from BV's" in res.table, res.table[-600:]
    assert "joint law differs" not in res.table


def float_tail(ctx) -> bool:
    """A one-child node on float rows whose drafted token is a tail (q < 1e-6) of a confident model."""
    return ctx.target.dtype != object and len(ctx.children) == 1 and float(ctx.draft[int(ctx.children[0])]) < 1e-6


def confident_chains(fast: bool) -> list:
    """The reductions grid's chains of confident models."""
    return [c for c in reductions.chain_instances(fast) if c[0].startswith("confident")]


def univer_as(cls):
    """UniVer's registered verifier as an instance of ``cls`` (a :class:`Verifier` subclass overriding a method)."""
    u = VERIFIERS["univer"]
    return cls(**{f.name: getattr(u, f.name) for f in fields(u)})


def run_chains(monkeypatch, tmp_path, chains: list):
    """The reductions check on ``chains`` and the fast grid's first depth-1 instance."""
    monkeypatch.setattr(reductions, "depth1_instances", first(reductions.depth1_instances, 1))
    monkeypatch.setattr(reductions, "chain_instances", lambda fast: chains)
    return run(reductions, tmp_path)


def test_reductions_chain_law_on_unlikely_trees(monkeypatch, tmp_path):
    """UniVer's k = 1 scaling halved, on float rows only, where the drafted token is a tail (q < 1e-6) of the
    confident models: the joint law hides it (those trees have probability ≤ 1e-6) and the rows as Fractions do not
    see it, so only the per-tree bound (TREE_TOL) can fail it — it must."""
    scale_univer(monkeypatch, 0.5, float_tail)
    res = run_chains(monkeypatch, tmp_path, confident_chains(True))
    assert not res.passed and "UniVer's law on a tree differs from BV by" in res.table, res.table[-600:]
    assert "joint law differs" not in res.table and "in Fractions," not in res.table


def test_reductions_fail_on_a_nan_law(monkeypatch, tmp_path):
    """A UniVer whose float law is NaN on the trees through a confident model's tail token (q < 1e-6; the engine now
    refuses a rule's NaN residual by name, so the law itself is broken here): every float law comparison then met a
    NaN, which ``>`` and ``max`` passed — the check must fail, naming the NaN."""
    @dataclass(frozen=True)
    class NanOnTails(Verifier):
        def law(self, tree, p, q, process):
            out = super().law(tree, p, q, process)
            tail = p.dtype != object and any(float(q[tree.parent[v]][tree.token[v]]) < 1e-6
                                             for v in range(1, tree.num_nodes))
            return {key: np.nan for key in out} if tail else out
    monkeypatch.setitem(VERIFIERS, "univer", univer_as(NanOnTails))
    res = run_chains(monkeypatch, tmp_path, confident_chains(True))
    assert not res.passed and "differs from BV by nan" in res.table, res.table[-600:]


def test_reductions_fail_when_the_fraction_rows_drop_trees(monkeypatch, tmp_path):
    """Rows as Fractions rounded to 1/1000 (the twin ``ExactRows`` replaced) drop the confident models' tails, so
    their chains through a tail token are never compared in Fractions though UniVer and BV agree on all the rest:
    the check must say so, not pass on the trees it still has."""
    def rounded(row):
        row = [Fraction(round(float(x) * 1000), 1000) for x in row]
        return np.array([x / sum(row) for x in row], dtype=object)
    monkeypatch.setattr(reductions.ExactRows, "_exact", staticmethod(rounded))
    res = run_chains(monkeypatch, tmp_path, confident_chains(True))
    assert not res.passed and "chains enumerated against" in res.table, res.table[-600:]
    assert "differs" not in res.table and "not exact" not in res.table


def test_reductions_take_an_ill_conditioned_chain(monkeypatch, tmp_path):
    """Rows where p and q agree to 1e-8 on the likely token and a drafted token has p = 0 (a sweep's instance):
    UniVer's and BV's conditional laws of the tree (0, 1), of probability 1.5e-9, are 1.2e-9 apart in floats — each
    ~5e-10 off the law of the same rows in Fractions — which a per-tree tolerance of 1e-12 refused; the joint law
    agrees to 1e-12."""
    from univer_theory import TreeShape, context_free

    p = [0.9999999868562687, 0.0, 8.123413862366409e-09, 5.020317392168392e-09]
    q = [0.99999999819216012, 1.5102250481202260e-09, 9.1813518695518047e-11, 2.0580129328736287e-10]
    model = context_free(np.array(p) / sum(p), np.array(q) / sum(q))
    res = run_chains(monkeypatch, tmp_path, [("sweep", model, TreeShape.parse("1,1"))])
    row = next(line for line in res.table.splitlines() if line.startswith("| sweep |"))
    per_tree = float(row.split("|")[6])
    assert res.passed and per_tree > 1e-10, (res.summary, row)


def test_reductions_lp_failure(monkeypatch, tmp_path):
    """Flat_ot_lp reporting failure (with a right value) must fail the check."""
    real = solvers.flat_ot_lp
    monkeypatch.setattr(solvers, "flat_ot_lp",
                        lambda *a, **k: replace(real(*a, **k), success=False, message="HiGHS: time limit"))
    monkeypatch.setattr(reductions, "depth1_instances", first(reductions.depth1_instances, 1))
    monkeypatch.setattr(reductions, "chain_instances", first(reductions.chain_instances, 1))
    res = run(reductions, tmp_path)
    assert not res.passed and "flat OT LP failed" in res.table


def test_reductions_depth1_wor(monkeypatch, tmp_path):
    """UniVer halved at wor nodes of k ≥ 2 must fail the depth-1 α* claim."""
    scale_univer(monkeypatch, 0.5, lambda ctx: ctx.process == "wor" and len(ctx.children) > 1)
    monkeypatch.setattr(reductions, "depth1_instances", first(reductions.depth1_instances, 2))
    monkeypatch.setattr(reductions, "chain_instances", first(reductions.chain_instances, 1))
    res = run(reductions, tmp_path)
    assert not res.passed and "/wor: UniVer E[τ]" in res.table, res.table[-600:]


@pytest.mark.parametrize("above, va_below", [(1e-3, 1e-2), (1e-6, None), (1e-6, 1e-2)])
def test_global_gap_cf_above_global(monkeypatch, tmp_path, above, va_below):
    """CF above the global LP must fail — by 1e-3 with univer-va below the LP, or by only 1e-6 (the LP's slack)."""
    real = global_gap.bounds

    def bounds(*a, **k):
        b = dict(real(*a, **k))
        b["global"] = b["cf"] - above
        if va_below is not None:
            b["univer-va"] = b["global"] - va_below
        return b
    monkeypatch.setattr(global_gap, "bounds", bounds)
    monkeypatch.setattr(global_gap, "instances", first(global_gap.instances, 1))
    res = run(global_gap, tmp_path)
    assert not res.passed and "above the global LP" in res.table


def test_global_gap_every_method(monkeypatch, tmp_path):
    """TV put 0.5 above CF must fail the ordering."""
    real_l, real_b = global_gap.expected_lengths, global_gap.bounds
    def expected_lengths(model, shape, process, vs):
        v = dict(real_l(model, shape, process, vs))
        v["tv"] = real_b(model, shape, process, with_global=False)["cf"] + 0.5
        return v
    monkeypatch.setattr(global_gap, "expected_lengths", expected_lengths)
    monkeypatch.setattr(global_gap, "instances", first(global_gap.instances, 1))
    res = run(global_gap, tmp_path)
    assert not res.passed and "tv " in res.table and "above CF" in res.table


def test_global_gap_worst(monkeypatch, tmp_path):
    """UniVer halved on the 2nd of 3 instances is the worst gap; the summary must name it and print the largest
    gap."""
    real, n = global_gap.expected_lengths, [0]
    def expected_lengths(*a):
        v = dict(real(*a)); n[0] += 1
        if n[0] == 2:
            v["univer"] /= 2
        return v
    monkeypatch.setattr(global_gap, "expected_lengths", expected_lengths)
    monkeypatch.setattr(global_gap, "instances", first(global_gap.instances, 3))
    second = list(first(global_gap.instances, 3)(True))[1][0]
    res = run(global_gap, tmp_path)
    rows = [l.split("|") for l in res.table.splitlines() if l.startswith("| ") and l.count("|") == 13]
    gaps = {r[1].strip(): float(r[10].strip().rstrip("%")) for r in rows if r[10].strip().endswith("%")}
    assert max(gaps, key=gaps.get) == second, gaps
    assert f"(worst {max(gaps.values()):.2f}%, {second})" in res.summary, (gaps, res.summary)


def test_real_gain_claim(tmp_path):
    """Real_bench / subset_stats faked.  A gain of +2% whose 95% CI is [-1.9%, +5.9%] must fail; on the full
    grid, a first tree clearly above 0 and a second whose CI crosses 0 must fail."""
    def stats(g, se):
        m = lambda e, gain: {"tokens_per_step": e + 1, "expected_accepted": e, "gain": gain, "gain_se": se,
                             "gain_per_forward": gain, "gain_per_forward_se": se, "acceptance_length": e + 1}
        return {"prompts": 8, "positions": 96, "rrsw": m(2.0, 0.0), "univer": m(2.0 * (1 + g), g), "tv": m(2.0, 0.0)}

    def claim(fast, per_tree):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(real_gain, "missing_batched", lambda methods: [])
            mp.setattr(real_gain, "real_prompts", lambda sets, n: [])
            mp.setattr(real_gain, "real_bench",
                       lambda prompts, tree, *a, **k: SimpleNamespace(tree=tree, as_json=lambda: {}))
            mp.setattr(real_gain, "subset_stats", lambda result, keep: stats(*per_tree[result.tree]))
            return run(real_gain, tmp_path, fast)

    assert claim(True, {"binary:2": (0.05, 0.01)}).passed                     # sanity: CI above 0 passes
    res = claim(True, {"binary:2": (0.02, 0.02)})
    assert not res.passed and "does not lie above 0" in res.table, res.summary
    res = claim(False, {"binary:4": (0.05, 0.01), "eagle": (0.02, 0.02)})
    assert not res.passed and "eagle" in res.table, res.summary


def test_temperature_claims(tmp_path):
    """The toys' T = 0 equality at 1e-12, the shrink claim on both measures (per forward and on E[τ]), and the
    SmolLM2 part's per-tree equality at T = 0 (its bench faked) each fail on one violation."""
    def patched(edit, real_model=False, bench=None):
        real = temperature.expected_lengths

        def expected_lengths(tm, shape, process, names):
            v = dict(real(tm, shape, process, names))
            if process == "wor":
                edit(v, names[0], tm.temperature)
            return v
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(temperature, "expected_lengths", expected_lengths)
            mp.setattr(temperature, "toy_instances", first(temperature.toy_instances, 1))
            if bench:
                mp.setattr(temperature, "missing_batched", lambda m: [])
                mp.setattr(temperature, "real_prompts", lambda s, n: [])
                mp.setattr(temperature, "real_bench", bench)
            return temperature.run(fast=True, out_dir=str(tmp_path), progress=False, real_model=real_model)

    # T1: UniVer 1e-10 above RRSw at T = 0
    def off_at_zero(v, base, T):
        if T == 0:
            v["univer"] = v[base] + 1e-10
    res = patched(off_at_zero)
    assert not res.passed and "at T = 0 UniVer" in res.table, res.summary

    # T4: per forward the gain at T = 0.1 is the smallest, on E[τ] it is the largest
    values = {0.0: (1.0, 1.0), 0.1: (0.1, 0.11), 0.3: (1.0, 1.02), 0.6: (1.0, 1.03), 1.0: (1.0, 1.04)}
    def shaped(v, base, T):
        v[base], v["univer"] = values[T]
    res = patched(shaped)
    assert not res.passed and "mean gain on E[τ] at T = 0.1" in res.table, res.table[-400:]

    # T3: SmolLM2 part, UniVer and RRSw 1e-6 apart on a drafted tree at T = 0
    def bench(prompts, tree, methods, T, positions, **k):
        st = {"gain": 0.0, "gain_se": float("nan"), "gain_per_forward": 0.0, "gain_per_forward_se": float("nan"),
              "acceptance_length": 2.0}
        rec = SimpleNamespace(expected={"rrsw": [1.0, 1.0], "univer": [1.0, 1.0 + (1e-6 if T == 0 else 0.01)]})
        return SimpleNamespace(summary=lambda: {"all": {"prompts": 1, "rrsw": st, "univer": st}}, records=[rec])
    res = patched(lambda v, b, T: None, real_model=True, bench=bench)
    assert not res.passed and "SmolLM2 at T = 0" in res.table, res.summary


def test_instances_grid(tmp_path):
    """The seeded grids draw both processes, every family, and the sparse family's rows hold zeros."""
    for module in (optimality, global_gap):
        count, _, seed, *rest = module.GRID[True]
        insts = random_instances(count, seed, module.SHAPES)
        assert {i.process for i in insts} == {"iid", "wor"}, module.NAME
    insts = random_instances(40, 0, {"2,2": 5, "((..),.)": 5})
    assert {i.name.split("/")[0].removesuffix("-cf") for i in insts} == set(FAMILIES)
    sparse = [i for i in insts if i.name.startswith("sparse")]
    for i in sparse:
        p, q = i.model.target(()), i.model.draft(())
        assert (p == 0).any() and (q == 0).any(), i.name


def test_runner_contract(monkeypatch, tmp_path):
    """Run_checks([]) is refused; run_checks(["temperature", "real_gain"], real_model=False) never benches
    SmolLM2, runs the toy part and writes real_gain as NOT RUN."""
    try:
        run_checks([])
    except ValueError:
        pass
    else:
        raise AssertionError("run_checks([]) ran nothing and returned")

    def no_model(*a, **k):
        raise AssertionError("SmolLM2 benched despite real_model=False")
    monkeypatch.setattr(temperature, "real_bench", no_model)
    monkeypatch.setattr(real_gain, "real_bench", no_model)
    monkeypatch.setattr(temperature, "toy_instances", first(temperature.toy_instances, 1))
    out = str(tmp_path)
    res = run_checks(["temperature", "real_gain"], fast=True, out_dir=out, progress=False, real_model=False)
    report = open(f"{out}/paper_checks.md").read()
    assert [r.name for r in res] == ["temperature"] and "## real_gain — NOT RUN" in report


def test_cli_check_exit(monkeypatch, tmp_path):
    """Run_checks faked with one failing result."""
    seen = {}
    def fake(names, fast, out_dir, real_model):
        seen["real_model"] = real_model
        return [CheckResult("ok", "c", True, "t", "fine"), CheckResult("bad", "c", False, "t", "broken")]
    monkeypatch.setattr(check, "run_checks", fake)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["check", "--fast", "--no-real-model", "--out", str(tmp_path)])
    out = buf.getvalue()
    assert rc == 1, rc
    assert "FAIL  bad" in out and "PASS  ok" in out, out
    assert seen["real_model"] is False


def test_cli_check_that_ran_nothing_is_not_a_pass(monkeypatch, tmp_path):
    """``--only real_gain --no-real-model`` decided nothing, said nothing and exited 0: the skipped check is named
    NOT RUN on stdout and the exit status is 1."""
    monkeypatch.setattr(check, "run_checks", lambda names, fast, out_dir, real_model: [])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["check", "--only", "real_gain", "--no-real-model", "--out", str(tmp_path)])
    assert rc == 1 and "NOT RUN  real_gain" in buf.getvalue(), buf.getvalue()


def test_signed_percentages_never_print_minus_zero():
    """A round-off negative gain printed "-0.00%" (docs/deviations.md item 94 says it never does)."""
    from paper_checks.base import percent

    assert percent(-1e-7, signed=True) == "+0.00" and percent(-1e-7) == "0.00"
    assert percent(0.0123, signed=True) == "+1.23" and percent(-0.0123, signed=True) == "-1.23"


def test_cli_runtime_error(monkeypatch, tmp_path):
    """A solver failure inside `univer check` (bounds raises RuntimeError) exits 1 with one 'failed:' line."""
    def boom(*a, **k):
        raise RuntimeError("bounds: cf_bound failed: HiGHS Infeasible")
    monkeypatch.setattr(check, "run_checks", boom)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["check", "--fast", "--out", str(tmp_path)])
    assert rc == 1 and "univer check: failed: bounds: cf_bound failed" in err.getvalue(), (rc, err.getvalue())


def test_cli_exact_reporting(monkeypatch, tmp_path):
    """``univer exact --json`` exits 1 and names the failed method under ``errors``; a lossy method is printed ✗
    in the ``exact`` and ``bound`` tables."""
    def call(argv):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            rc = main(argv)
        return rc, buf.getvalue()

    real = exact.evaluate
    def failing(model, shape, process, v, *a, **k):
        if v.name == "univer":
            raise RuntimeError("slot_rule_lp: HiGHS returned Infeasible")
        return real(model, shape, process, v, *a, **k)
    monkeypatch.setattr(exact, "evaluate", failing)
    rc, out = call(["exact", "--vocab", "3", "--shape", "2", "--process", "iid", "--json"])
    assert rc == 1, rc
    assert json.loads(out)["errors"] == {"univer": "slot_rule_lp: HiGHS returned Infeasible"}
    monkeypatch.undo()

    def lossy(model, shape, process, v, *a, **k):
        r = real(model, shape, process, v, *a, **k)
        return replace(r, distance=1e-3) if v.name == "tv" else r
    monkeypatch.setattr(exact, "evaluate", lossy)
    for cmd in ("exact", "bound"):
        rc, out = call([cmd, "--vocab", "3", "--shape", "2", "--process", "iid", "--methods", "tv,rrs"])
        row = next(l for l in out.splitlines() if l.startswith("tv "))
        assert "✗" in row and "✓" not in row, (cmd, row)


def test_global_gap_univer_va_above_cf(monkeypatch, tmp_path):
    """The value-aware oracle halfway between CF and the global LP (above CF, below the LP) must fail: CF bounds
    every verifier of the conditional framework, univer-va included (it was held to the global LP only)."""
    real = global_gap.bounds
    monkeypatch.setattr(global_gap, "bounds",
                        lambda *a, **k: (lambda b: {**b, "univer-va": (b["cf"] + b["global"]) / 2})(real(*a, **k)))
    grid = global_gap.instances
    monkeypatch.setattr(global_gap, "instances", lambda fast: islice(grid(fast), 1, 2))   # CF below the LP
    res = run(global_gap, tmp_path)
    assert not res.passed and "univer-va" in res.table and "above CF" in res.table, res.summary


def _nan_univer(real):
    """``expected_lengths`` with UniVer's E[τ] NaN."""
    def expected_lengths(*args, **kwargs):
        return {**real(*args, **kwargs), "univer": float("nan")}
    return expected_lengths


def test_checks_fail_on_a_nan_they_compute(monkeypatch, tmp_path):
    """Each tolerance test of the paper checks fails on a NaN (``nan > tol`` is False: a NaN E[τ], node audit, law
    or gap passed them): UniVer's E[τ] NaN in optimality and global_gap, a node's excess NaN, UniVer's E[τ] at T = 0
    NaN on the toys, and in reductions a NaN in one entry of a tree's law (not the first), a NaN E[τ] on a chain and
    a NaN α* at depth 1 — each alone, each named."""
    import dataclasses
    import math

    from paper_checks import studies

    def fails(check, needle, **patches):
        with monkeypatch.context() as patch:
            for name, value in patches.items():
                patch.setattr(check, name, value)
            res = (check.run(fast=True, out_dir=str(tmp_path), progress=False, real_model=False)
                   if check is temperature else run(check, tmp_path))
        assert not res.passed and needle in res.table, (check.__name__, needle, res.table[-500:])

    fails(optimality, "UniVer nan > its α*-root bound", instances=first(optimality.instances, 1),
          expected_lengths=_nan_univer(optimality.expected_lengths))
    audit = studies.node_audit
    fails(optimality, "the applied marginal exceeds ρp by nan", instances=first(optimality.instances, 1),
          node_audit=lambda *a: (dataclasses.replace(r, excess=math.nan) for r in audit(*a)))
    fails(global_gap, "univer nan", instances=first(global_gap.instances, 1),
          expected_lengths=_nan_univer(global_gap.expected_lengths))
    gains = temperature.toy_gains

    def toy_gains(fast, process="wor", progress=False):
        out = gains(fast, process, progress)
        first_toy = next(iter(out))
        out[first_toy][0.0] = (out[first_toy][0.0][0], math.nan)
        return out
    fails(temperature, "at T = 0 UniVer nan", toy_instances=first(temperature.toy_instances, 2), toy_gains=toy_gains)

    confident = confident_chains(True)[:1]
    chains, depth1 = (lambda fast: confident), first(reductions.depth1_instances, 1)

    @dataclass(frozen=True)
    class NanEntry(Verifier):                   # a NaN in every float law, in the entry the check reads last
        def law(self, tree, p, q, process):
            out = super().law(tree, p, q, process)
            return {**out, list(set(out))[-1]: np.nan} if p.dtype != object else out

    @dataclass(frozen=True)
    class NanLength(Verifier):
        def expected_accepted_length(self, tree, p, q, process):
            return np.nan
    for cls, needle in ((NanEntry, "UniVer's joint law differs from BV by nan"),
                        (NanEntry, "UniVer's law on a tree differs from BV by nan"),
                        (NanLength, "E[τ] UniVer nan")):
        with monkeypatch.context() as patch:
            patch.setitem(VERIFIERS, "univer", univer_as(cls))
            fails(reductions, needle, chain_instances=chains, depth1_instances=depth1)
    fails(reductions, "closed form nan", chain_instances=chains, depth1_instances=depth1,
          alpha_star=lambda *a, **k: np.nan)


# A NaN on one instance must be the reported worst, named by that instance (Python's max/min and a running
# ``if err > worst`` keep a NaN only where it comes first): each test puts a NaN on the 2nd instance of a cut grid and
# reads the summary; the verdict failed before, the summary named a finite worst elsewhere.

NAN = float("nan")


def on_call(fn, n, patch):
    """``fn`` with its ``n``-th call's result passed through ``patch``."""
    calls = [0]

    def wrapped(*a, **k):
        calls[0] += 1
        r = fn(*a, **k)
        return patch(r) if calls[0] == n else r
    return wrapped


def second_instance(instances) -> str:
    return list(first(instances, 2)(True))[1][0]


def test_lossless_worst_is_a_nan(monkeypatch, tmp_path):
    monkeypatch.setattr(lossless, "BUG_ZOO", {})
    monkeypatch.setattr(lossless, "VERIFIERS", {"rrs": VERIFIERS["rrs"]})
    monkeypatch.setattr(lossless, "instances", first(lossless.instances, 2))
    real, calls = lossless.evaluate, [0]

    def evaluate(m, s, p, v):                           # rrs's float distance on the 2nd instance: NaN
        r = real(m, s, p, v)
        if isinstance(r.distance, Fraction):
            return r
        calls[0] += 1
        return SimpleNamespace(distance=NAN) if calls[0] == 2 else r
    monkeypatch.setattr(lossless, "evaluate", evaluate)
    res = run(lossless, tmp_path)
    assert not res.passed and f"of a lossless method nan (rrs on {second_instance(lossless.instances)})" \
        in res.summary, res.summary


def test_optimality_worst_alpha_is_a_nan(monkeypatch, tmp_path):
    """α*(ρ) NaN at the 2nd instance's first node context: the summary's max |α − α*| is that NaN, at that node."""
    monkeypatch.setattr(optimality, "instances", first(optimality.instances, 2))
    n_first = len(optimality.node_audit(*list(first(optimality.instances, 1)(True))[0][1:], VERIFIERS["univer"]))
    monkeypatch.setattr(optimality, "alpha_star_lp", on_call(optimality.alpha_star_lp, n_first + 1, lambda a: NAN))
    res = run(optimality, tmp_path)
    assert not res.passed and f"max |α − α*| = nan ({second_instance(optimality.instances)}: node " \
        in res.summary, res.summary


def test_optimality_worst_cf_gap_is_a_nan(monkeypatch, tmp_path):
    """A NaN CF bound is no tie (``relative`` took a NaN reference for one near 0)."""
    monkeypatch.setattr(optimality, "instances", first(optimality.instances, 2))
    monkeypatch.setattr(optimality, "bounds", on_call(optimality.bounds, 2, lambda b: {**b, "cf": NAN}))
    res = run(optimality, tmp_path)
    assert not res.passed and f"(worst nan%, {second_instance(optimality.instances)})" in res.summary, res.summary
    row = next(line for line in res.table.splitlines() if line.startswith("| cf |"))
    assert f"nan% ({second_instance(optimality.instances)})" in row, row       # the mean table's worst instance too


def test_optimality_relative_keeps_a_nan_value():
    """A NaN E[τ] against a reference near 0 (the underflow instances) read as a tie, 1.0."""
    assert optimality.relative(NAN, 0.0) != optimality.relative(NAN, 0.0)
    assert optimality.relative(NAN, 2.0) != optimality.relative(NAN, 2.0)
    assert optimality.relative(1e-300, 0.0) == 1.0 and optimality.relative(3.0, 2.0) == 1.5


def test_reductions_worst_chain_and_tree_are_a_nan(monkeypatch, tmp_path):
    """The law distance NaN on the first tree of the 2nd chain instance: both chain worsts name it."""
    chains = list(first(reductions.chain_instances, 2)(True))
    _, model0, shape0 = chains[0]
    n_first = sum(1 for process in ("iid", "wor") for _ in enumerate_trees(model0, shape0, process))
    monkeypatch.setattr(reductions, "chain_instances", lambda fast: chains)
    monkeypatch.setattr(reductions, "depth1_instances", first(reductions.depth1_instances, 1))
    monkeypatch.setattr(reductions, "law_distance", on_call(reductions.law_distance, n_first + 1, lambda d: NAN))
    res = run(reductions, tmp_path)
    assert not res.passed and f"max joint-law difference nan ({chains[1][0]})" in res.summary, res.summary
    assert f"per tree nan ({chains[1][0]})" in res.summary, res.summary


def test_reductions_worst_depth1_is_a_nan(monkeypatch, tmp_path):
    monkeypatch.setattr(reductions, "chain_instances", first(reductions.chain_instances, 1))
    monkeypatch.setattr(reductions, "depth1_instances", first(reductions.depth1_instances, 2))
    monkeypatch.setattr(reductions, "alpha_star", on_call(reductions.alpha_star, 2, lambda a: NAN))
    res = run(reductions, tmp_path)
    assert not res.passed and f"max |E[τ] − α*| nan ({second_instance(reductions.depth1_instances)})" \
        in res.summary, res.summary


def test_temperature_worst_at_zero_is_a_nan(monkeypatch, tmp_path):
    monkeypatch.setattr(temperature, "toy_instances", first(temperature.toy_instances, 2))
    real, calls = temperature.expected_lengths, [0]

    def expected_lengths(tm, shape, proc, methods):
        v = real(tm, shape, proc, methods)
        if proc == "wor":
            calls[0] += 1
            if calls[0] == 1 + len(temperature.TOY_TEMPERATURES):      # the 2nd instance at T = 0
                v = {**v, "univer": NAN}
        return v
    monkeypatch.setattr(temperature, "expected_lengths", expected_lengths)
    res = temperature.run(fast=True, out_dir=str(tmp_path), progress=False, real_model=False)
    assert not res.passed and f"at T = 0 nan ({second_instance(temperature.toy_instances)})" in res.summary, \
        res.summary
    row0 = next(line for line in res.table.splitlines() if line.startswith("| 0 |"))
    assert row0.count("nan") == 5, row0                # the two means, the two smallest gains and max |ΔE[τ]|


def test_global_gap_nan_bound_is_not_below_the_floor(monkeypatch, tmp_path):
    """A NaN global bound is no bound "below the floor" (its instance was dropped from the gaps)."""
    monkeypatch.setattr(global_gap, "instances", first(global_gap.instances, 2))
    monkeypatch.setattr(global_gap, "bounds", on_call(global_gap.bounds, 2, lambda b: {**b, "global": NAN}))
    res = run(global_gap, tmp_path)
    assert not res.passed and "(0 with a global bound below" in res.summary, res.summary
    assert f"(worst nan%, {second_instance(global_gap.instances)})" in res.summary, res.summary
    row = next(line for line in res.table.splitlines()
               if line.startswith(f"| {second_instance(global_gap.instances)} |"))
    assert row.count("nan%") == 2, row                 # its two gaps, not "–" (below the floor)


def assert_tables_aligned(text: str) -> None:
    """Every markdown table in ``text`` has as many cells in each row as in its delimiter row (an unescaped ``|``
    in a cell, ``max |α − α*|``, split it: a header wider than its delimiter row is no table on GitHub)."""
    cells = lambda line: len(re.findall(r"(?<!\\)\|", line))
    lines = text.splitlines() + [""]
    for i, line in enumerate(lines):
        if re.fullmatch(r"\|(---\|)+", line):
            end = next(k for k in range(i + 1, len(lines)) if not lines[k].startswith("|"))
            block = [lines[i - 1]] + lines[i + 1:end]
            assert all(cells(row) == cells(line) for row in block), (line, block[:3])


def test_optimality_alpha_worst_is_over_required_nodes_and_its_tables_align(monkeypatch, tmp_path):
    """Nodes where α* is not required (α* put at 0.99, far from α) are no |α − α*| worst; the tables render."""
    monkeypatch.setattr(optimality, "instances", first(optimality.instances, 2))
    monkeypatch.setattr(optimality, "alpha_star_guaranteed", lambda *a: False)
    monkeypatch.setattr(optimality, "alpha_star_lp", lambda *a: 0.99)
    res = run(optimality, tmp_path)
    assert_tables_aligned(res.table)
    assert "max |α − α*| = 0.0e+00 (–)" in res.summary, res.summary


def test_temperature_names_each_smallest_gain_and_its_tables_align(tmp_path):
    """Each T's smallest i.i.d. gain against RRS and its instance, recomputed from the toys."""
    res = temperature.run(fast=True, out_dir=str(tmp_path), progress=False, real_model=False)
    assert_tables_aligned(res.table)
    iid, shift = temperature.toy_gains(True, "iid", False), temperature.MEASURES["per forward"]
    rows = [line for line in res.table.splitlines() if re.match(r"\| [0-9.]+ \|", line)]
    assert len(rows) == len(temperature.TOY_TEMPERATURES)
    for line in rows:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        gains = {name: temperature._gain(by_t[float(cells[0])], shift) for name, by_t in iid.items()}
        name = min(gains, key=gains.get)
        assert cells[-1] == f"{100 * gains[name]:.4f} ({name})", (cells, gains)
