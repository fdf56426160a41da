"""Paper checks 2–6: each passes on its fast grid, writes its evidence, and fails when its claim is broken."""
import json
from dataclasses import replace
from functools import partial
from itertools import islice

import pytest

from paper_checks import global_gap, optimality, real_gain, reductions, studies, temperature
from univer_theory import VERIFIERS, Verifier
from univer_theory.univer import make_univer_verifier
from univer_theory.verifiers import rrsw_rule


def _first(instances, n):
    """A check's instance generator cut to its first ``n`` instances (failure tests need only a few)."""
    return lambda fast, *args: islice(instances(fast, *args), n)


@pytest.mark.parametrize("module", [optimality, reductions, global_gap], ids=lambda m: m.NAME)
def test_exact_check_passes_on_fast_grid(module, tmp_path):
    res = module.run(fast=True, out_dir=tmp_path, progress=False)
    assert res.passed, res.table
    assert res.name == module.NAME and res.table.startswith("**") and "|---|" in res.table
    for fig in res.figures:
        assert fig.is_file() and fig.stat().st_size > 1000
    assert len(res.figures) == (0 if module is reductions else 1)


def test_temperature_toy_part_passes(tmp_path):
    res = temperature.run(fast=True, out_dir=tmp_path, progress=False, real_model=False)
    assert res.passed, res.table
    assert "not run" in res.table and res.figures[0].is_file()


def test_optimality_runs_where_every_value_underflows(monkeypatch, tmp_path):
    """The full grid's confident instances whose draft tails are 1e-300 and 1e-310 (a target with no mass on the
    top draft token): every E[τ] is ~1e-300 and the LP's CF bound is 0 at its tolerance.  The check passes, counts
    them as ties against CF and TV (no 0/0), and the value-aware oracle's E[τ] is a number (its tuples of
    probability 0 select nothing) — the full `univer check` divided by CF = 0 there before."""
    picked = [inst for inst in optimality.instances(False)
              if inst[0].startswith("confident-zero_top/d1e-3") and inst[3] == "iid"]
    assert len(picked) >= 2
    monkeypatch.setattr(optimality, "instances", lambda fast: iter(picked))
    res = optimality.run(fast=False, out_dir=tmp_path, progress=False)
    assert res.passed, res.table
    assert "nan" not in res.table.lower() and "below CF by 0.00% on average" in res.summary


def test_optimality_fails_when_a_node_misses_alpha_star(monkeypatch, tmp_path):
    """TV's plan labelled as the α*-optimal iid layout: its node acceptance is below α*(ρ)."""
    tv_plan = make_univer_verifier("tv", slot_rule=False)

    def mislabelled(ctx):
        d = tv_plan.rule(ctx)
        return replace(d, info={**d.info, "construction": "layout"})

    monkeypatch.setitem(VERIFIERS, "univer", replace(tv_plan, name="univer", rule=mislabelled))
    monkeypatch.setattr(optimality, "instances", _first(optimality.instances, 2))
    res = optimality.run(fast=True, out_dir=tmp_path, progress=False)
    assert not res.passed
    assert "(layout) α =" in res.table and "≠ α*(ρ)" in res.table


def test_optimality_fails_when_univer_is_too_far_below_tv(monkeypatch, tmp_path):
    """The per-instance claim UniVer ≥ (1 − x)·TV is enforced: TV's plan handing its children half their
    scalings (fewer accepted tokens) fails it, with the shortfall named."""
    tv_plan = make_univer_verifier("tv", slot_rule=False)

    def halved(ctx):
        d = tv_plan.rule(ctx)
        return replace(d, scale=tuple(s / 2 for s in d.scale))

    monkeypatch.setitem(VERIFIERS, "univer", replace(tv_plan, name="univer", rule=halved))
    monkeypatch.setattr(optimality, "instances", _first(optimality.instances, 2))
    res = optimality.run(fast=True, out_dir=tmp_path, progress=False)
    assert not res.passed
    assert f"is more than {100 * optimality.TV_SHORTFALL:g}% below TV" in res.table


def test_reductions_fail_when_depth_one_is_not_optimal(monkeypatch, tmp_path):
    """TV's own plan is Block Verification on chains but only RRS / RRSw at depth 1 (below α*)."""
    monkeypatch.setitem(VERIFIERS, "univer", make_univer_verifier("tv", slot_rule=False))
    res = reductions.run(fast=True, out_dir=tmp_path, progress=False)
    assert not res.passed
    assert "UniVer's per-tree law differs" not in res.table          # chains still equal BV
    assert "vs α* LP" in res.table


def test_global_gap_fails_with_an_underestimated_global_bound(monkeypatch, tmp_path):
    """The known pitfall of theory.md §4.3 (merging i.i.d. duplicates) puts the 'bound' below CF."""
    from solvers import global_tree_lp

    monkeypatch.setattr(studies, "global_tree_lp", partial(global_tree_lp, merge_duplicates=True))
    monkeypatch.setattr(global_gap, "instances", _first(global_gap.instances, 2))     # the 2nd: V = 3 [3,1] iid
    res = global_gap.run(fast=True, out_dir=tmp_path, progress=False)
    assert not res.passed
    assert "above the global LP" in res.table


def test_temperature_fails_against_a_baseline_that_wastes_drafts(monkeypatch, tmp_path):
    """A lossless baseline that only ever tries the first child loses at T = 0 when y* is drafted second."""
    def first_child_only(ctx):          # token-level SpS on child 1; later children are never entered
        d = rrsw_rule(replace(ctx, children=ctx.children[:1], child_shapes=ctx.child_shapes[:1]))
        rest = len(ctx.children) - 1
        return replace(d, enter=d.enter + (0,) * rest, scale=d.scale + (1,) * rest)

    monkeypatch.setitem(VERIFIERS, "rrsw", Verifier("rrsw", first_child_only, ("wor",), "first child only"))
    monkeypatch.setattr(temperature, "toy_instances", _first(temperature.toy_instances, 1))
    res = temperature.run(fast=True, out_dir=tmp_path, progress=False, real_model=False)
    assert not res.passed
    assert "at T = 0 UniVer" in res.table


def test_real_gain_fails_without_a_batched_univer(monkeypatch, tmp_path):
    """Never a silent skip: without UniVer in the batched layer the check fails and says why."""
    import gpu

    monkeypatch.delitem(gpu.METHODS, "univer", raising=False)
    res = real_gain.run(fast=True, out_dir=tmp_path, progress=False)
    assert not res.passed
    assert "no batched verifier" in res.summary and "univer" in res.summary


@pytest.mark.llm
def test_real_checks_pass_in_fast_mode(tmp_path):
    """The SmolLM2 checks, smoke-sized: the gain interval lies above 0, and T = 0 gives equal E[τ] per tree."""
    gain = real_gain.run(fast=True, out_dir=tmp_path, progress=False)
    assert gain.passed, gain.table
    assert "tokens per target forward" in gain.summary and "on E[τ]" in gain.summary      # paper's convention first
    saved = json.loads((tmp_path / "real_gain_binary2.json").read_text())["methods"]["univer"]
    assert saved["tokens_per_step"] == pytest.approx(saved["expected_accepted"] + 1)
    assert 0 < saved["gain_per_forward"] < saved["gain"]          # same sign, smaller relative gain per forward
    temp = temperature.run(fast=True, out_dir=tmp_path, progress=False)
    assert temp.passed, temp.table
    assert "SmolLM2" in temp.table and "not run" not in temp.table


@pytest.mark.slow
@pytest.mark.llm
def test_real_model_claims_full(tmp_path):
    """The long run (``python3 -m pytest -m slow``, ~25 min on 2 cores): the real-model checks on their full grids
    (MT-Bench + HumanEval, binary depth 4 and the EAGLE-like tree; the temperature sweep)."""
    for module in (real_gain, temperature):
        result = module.run(fast=False, out_dir=tmp_path, progress=False)
        assert result.passed, f"{module.NAME}: {result.summary}"
