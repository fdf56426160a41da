"""Claim 5 — on real SmolLM2 draft trees UniVer accepts more tokens than RRSw (paper: +4.2% to +8.5%).

Paired offline evaluation (``gpu.llm.accept_bench``): along target-sampled continuations of MT-Bench and
HumanEval prompts, one tree is drafted per position (without replacement, T = 1, draft = the target re-quantised
to 4 bits) and every method's exact ``E[τ | T]`` is computed on that same tree.  The paper's acceptance length
is tokens per target forward, ``E[τ] + 1`` (its 3.29 vs 3.06 on a depth-5 binary tree: +7.5%); it is reported
first, with the gain of UniVer over RRSw on it (ratio of per-prompt means minus 1, delta-method standard error
clustered by prompt), and the gain on ``E[τ]`` (accepted drafted tokens only; for the point estimates exactly
``(1 + RRSw E[τ])/RRSw E[τ]`` times larger) beside it.  The claim holds on a tree shape when the 95% confidence
interval of the per-forward gain pooled over both prompt sets lies above 0; that gain is the one compared with
the paper's range.  The per-set gains and TV's gain are reported too.

Full: binary tree of depth 4 (30 nodes) and the EAGLE-like tree (24 nodes), 6 prompts per set × 6 positions
(on 2 CPU cores about 40 s per prompt for the EAGLE-like tree, ~6 s for binary:4).
``fast``: binary depth 2, 4 prompts per set × 12 positions (a CI-sized run: its interval rests on 8 prompts).
"""
from __future__ import annotations

import json
from pathlib import Path

from .base import CheckResult, markdown_table
from .studies import gain_interval, missing_batched, real_bench, real_prompts, subset_stats

NAME = "real_gain"
NEEDS_REAL_MODEL = True
CLAIM = ("On SmolLM2 trees (T = 1, wor; {trees}; MT-Bench + HumanEval) UniVer's acceptance "
         "length (tokens per target forward, E[τ] + 1) exceeds RRSw's: the 95% CI of the paired gain lies above 0 "
         "(paper: +4.2% to +8.5%).")
#: How the claim names the trees of each grid.
TREE_NAMES = {False: "binary depth 4 and EAGLE-like", True: "binary depth 2, a CI-sized run"}
METHODS = ("rrsw", "tv", "univer")
#: The paper's gains of UniVer over RRSw, on tokens per target forward (e.g. 3.29 vs 3.06, depth-5 binary tree).
PAPER_RANGE = (0.042, 0.085)
FULL = {"trees": ("binary:4", "eagle"), "per_set": 6, "positions": 6}
FAST = {"trees": ("binary:2",), "per_set": 4, "positions": 12}
SETS = {"mtbench": lambda c: c != "humaneval", "humaneval": lambda c: c == "humaneval"}


def _pct(x) -> str:
    return "–" if x != x else f"{100 * x:+.2f}%"


def _versus_paper(g: float, lo: float, hi: float) -> str:
    """Where a per-forward gain ``g`` (95% CI ``[lo, hi]``) lies relative to the paper's range."""
    a, b = PAPER_RANGE
    where = "within" if a <= g <= b else ("above" if g > b else "below")
    return f"{where}, CI {'overlaps' if lo <= b and hi >= a else 'misses'} the paper's range"


def _gain_cell(stats: dict, key: str) -> str:
    g, lo, hi = gain_interval(stats, key=key)
    return f"{_pct(g)} [{_pct(lo)}, {_pct(hi)}]"


def run(fast: bool, out_dir, progress: bool = True) -> CheckResult:
    claim = CLAIM.format(trees=TREE_NAMES[fast])             # the trees this run decides on
    missing = missing_batched(METHODS)
    if missing:
        msg = (f"cannot run: method(s) {missing} have no batched verifier in gpu.METHODS (the exact core is far "
               "too slow at V = 49 152); the claim is undecided, so the check fails")
        return CheckResult(NAME, claim, False, msg, msg)
    cfg = FAST if fast else FULL
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prompts = real_prompts(list(SETS), cfg["per_set"])
    rows, problems = [], []
    for tree in cfg["trees"]:
        result = real_bench(prompts, tree, METHODS, 1.0, cfg["positions"], progress=progress)
        (out_dir / f"{NAME}_{tree.replace(':', '')}.json").write_text(json.dumps(result.as_json(), indent=1))
        groups = {"both (pooled)": lambda c: True, **SETS}
        for label, keep in groups.items():
            stats = subset_stats(result, keep)
            g, lo, hi = gain_interval(stats["univer"], key="gain_per_forward")
            pooled = label.startswith("both")
            if pooled and not lo > 0:
                problems.append(f"{tree}: UniVer gain per forward {_pct(g)}, 95% CI [{_pct(lo)}, {_pct(hi)}] does not "
                                "lie above 0")
            rows.append([tree, label, stats["prompts"], stats["positions"], stats["rrsw"]["tokens_per_step"],
                         stats["univer"]["tokens_per_step"], _gain_cell(stats["univer"], "gain_per_forward"),
                         stats["rrsw"]["expected_accepted"], stats["univer"]["expected_accepted"],
                         _gain_cell(stats["univer"], "gain"), _gain_cell(stats["tv"], "gain_per_forward"),
                         ("✓ CI > 0" if lo > 0 else "✗") if pooled else "reported", _versus_paper(g, lo, hi)])
    passed = not problems
    pooled = [r for r in rows if r[1].startswith("both")]
    summary = ("UniVer vs RRSw, tokens per target forward (E[τ] + 1): "
               + "; ".join(f"{r[0]} {r[6]} ({r[12]}), on E[τ] {r[9]}" for r in pooled)
               + f" (paper {_pct(PAPER_RANGE[0])} … {_pct(PAPER_RANGE[1])} per forward)"
               + (" — CI-sized run" if fast else "") + ".")
    table = markdown_table(["tree", "prompts", "n prompts", "positions", "RRSw tokens/forward",
                            "UniVer tokens/forward", "UniVer gain per forward [95% CI]", "RRSw E[τ]", "UniVer E[τ]",
                            "UniVer gain on E[τ] [95% CI]", "TV gain per forward [95% CI]", "claim",
                            f"per forward vs paper's {_pct(PAPER_RANGE[0])} … {_pct(PAPER_RANGE[1])}"], rows)
    table += ("\n\nAcceptance length = tokens per target forward, E[τ] + 1 (the paper's convention: its 3.29 vs 3.06 "
              "on a depth-5 binary tree is +7.5%); the gain on E[τ] (accepted drafted tokens only) is exactly "
              "(1 + RRSw E[τ])/RRSw E[τ] times larger.  Paired design: all methods are scored on the same drafted "
              "trees; the interval is gain ± 1.96·se with a delta-method se clustered by prompt.  A gain outside the "
              "paper's range is reported as measured (our draft is the target re-quantised to 4 bits, not the "
              "paper's drafter).")
    if problems:
        table += "\n\n**Violations**\n\n" + "\n".join(f"- {p}" for p in problems)
    return CheckResult(NAME, claim, passed, table, summary)
