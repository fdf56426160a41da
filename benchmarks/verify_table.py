"""The README's verification-cost table, and its figure, from several runs of ``bench_verify.py --json``.

Each cell is the range of ``verify_over_forward`` (one ``gpu.verify`` / the target's forward of the same tree)
over the runs and over the trees of a case — the SmolLM2-drafted trees of a shape and process, or the Zipf rows'
tree at B = 1 — per method; bold where the whole range meets the goal (≤ 0.10).  Above the table: how many runs,
the forward's range, α*(ρ)'s medians and the largest peak-memory rise of a batched call.  ``--plot`` draws the same
ranges, one line per method and case on a log axis, with the goal marked (matplotlib, the ``dev`` extra).

    python benchmarks/bench_verify.py --json ... > run1.json   # several times, as the README says
    python benchmarks/verify_table.py run*.json [--plot verify_cost.png]

``--batched`` prints instead one table per batch size B of ``batched_over_loop`` (the exact per-tree loop's time /
one batched ``gpu.verify`` of the B trees) per Zipf-row case and method, with the batched call's time — each cell
its range over the runs, bold at B = 64 where the whole range meets that goal (≥ 5) — from runs with a loop
(``bench_verify.py --json --no-model --batches 8,64 ...``).

The runs must share the settings a cell's numbers depend on (:func:`settings`); a table of runs that differ in
one is refused.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from bench_args import image_path     # a sibling module (benchmarks/ is the script's path)

#: The issue's goal for ``verify_over_forward``.
GOAL = 0.10
#: The issue's goal for ``batched_over_loop``, at batches of :data:`BATCHED_GOAL_B` trees.
BATCHED_GOAL, BATCHED_GOAL_B = 5.0, 64
METHODS = ("univer", "rrsw", "tv")
#: RRSw is the without-replacement rule; its i.i.d. counterpart RRS shares its column.
SAME_COLUMN = {"rrs": "rrsw"}
ROWS = {"smollm2": "SmolLM2-drafted", "zipf": "Zipf rows"}
SHAPES = {"eagle": "EAGLE-like"}


def load(paths: list[str]) -> list[dict]:
    """The runs, each one ``bench_verify.py --json`` object; a clear error for a file that is not one, or that
    holds a NaN or infinity, an overflowing literal included (``bench_verify.py`` writes ``null`` where it measured
    nothing; a NaN time made a cell's range and its bold depend on the order of the runs)."""
    runs = []
    for path in paths:
        with open(path) as f:
            try:
                run = json.load(f, parse_constant=_not_a_time, parse_float=_finite, parse_int=_finite_int)
            except ValueError as e:                         # (JSONDecodeError and UnicodeDecodeError are ValueErrors)
                raise ValueError(f"{path}: not a JSON object from bench_verify.py --json ({e})") from None
        if (not isinstance(run, dict) or not {"synthetic", "real", "alpha_star"} <= run.keys()
                or not isinstance(run["alpha_star"], dict)
                or not all(isinstance(rows, list) and all(isinstance(row, dict) and "method" in row for row in rows)
                           for rows in (run["synthetic"], run["real"]))):
            raise ValueError(f"{path}: expected bench_verify.py --json output (keys synthetic and real: lists of "
                             f"rows each naming its method; alpha_star: an object)")
        runs.append(run)
    same_settings(runs, paths)
    return runs


def _not_a_time(constant: str):
    raise ValueError(f"it holds {constant}, not a measured number")


def _finite(text: str) -> float:
    """A JSON number as a float; one that overflows (``1e999``) is infinity, refused as :func:`_not_a_time`."""
    x = float(text)
    return x if math.isfinite(x) else _not_a_time(text)


def _finite_int(text: str) -> int:
    """A JSON integer, refused where no float holds it (400 digits: an OverflowError in the table's arithmetic)."""
    _finite(text)
    return int(text)


def settings(run: dict) -> dict:
    """What ``bench_verify.py`` measured the run with: its top-level torch threads, repeats and device, α*'s
    vocabulary, and the vocabularies (``--vocab`` and the model's), shapes, processes, draft truncations, batch
    sizes and methods of its rows, in the order they ran (one generator draws every case's Zipf rows in turn, and
    the first method runs right after the forward)."""
    rows = run["synthetic"] + run["real"]
    present = lambda key: list(dict.fromkeys(row.get(key) for row in rows))
    return {"torch_threads": run.get("torch_threads"), "repeat": run.get("repeat"), "device": run.get("device"),
            "alpha_star vocab": run["alpha_star"].get("vocab"), "vocab": present("vocab"), "shapes": present("shape"),
            "processes": present("process"), "draft_top": present("draft_top"), "batches": present("B"),
            "methods": list(dict.fromkeys(SAME_COLUMN.get(row["method"], row["method"]) for row in rows))}


def same_settings(runs: list[dict], paths: list[str]) -> None:
    """A ValueError naming the setting and the two files where a run's :func:`settings` differ from the first
    run's (their measured times may differ, of course)."""
    first = settings(runs[0])
    for run, path in zip(runs[1:], paths[1:]):
        for key, value in settings(run).items():
            if value != first[key]:
                raise ValueError(f"runs measured with different settings: {key} is {first[key]} in {paths[0]} but "
                                 f"{value} in {path}; tabulate runs of one bench_verify.py command")


def cells(runs: list[dict]) -> dict:
    """``{(rows, shape, process, draft_top): {"label", "trees", method: [ratios]}}`` over every run, in the order
    the cases first appear, SmolLM2-drafted trees first (the whole row before truncations, larger m first)."""
    out: dict = {}
    for run in runs:
        for row in run["real"] + run["synthetic"]:
            if "verify_over_forward" not in row:
                continue
            key = (row["rows"], row["shape"], row["process"], row["draft_top"])
            cell = out.setdefault(key, {"nodes": row["nodes"], "trees": set()})
            cell["trees"].add(row.get("tree", 0))
            cell.setdefault(SAME_COLUMN.get(row["method"], row["method"]), []).append(row["verify_over_forward"])
    if not out:
        raise ValueError("no run has verify_over_forward rows: run bench_verify.py with the model (without "
                         "--no-model) and B = 1 among --batches")
    return _ordered(out)


def _ordered(out: dict) -> dict:
    """The cases ``{(rows, shape, process, draft_top): …}`` in the order their tree first appears, each tree's
    whole row before its truncations, larger m first."""
    group = {}
    for key in out:
        group.setdefault(key[:3], len(group))
    return dict(sorted(out.items(), key=lambda kv: (group[kv[0][:3]], kv[0][3] is not None, -(kv[0][3] or 0))))


def batched_cells(runs: list[dict]) -> dict:
    """``{B: {(rows, shape, process, draft_top): {"nodes", method: [(batched_over_loop, batched median ms)]}}}``
    over every run's synthetic rows with a loop, B ascending, the cases as :func:`cells` orders them."""
    out: dict = {}
    for run in runs:
        for row in run["synthetic"]:
            if "batched_over_loop" not in row:
                continue
            key = (row["rows"], row["shape"], row["process"], row["draft_top"])
            cell = out.setdefault(row["B"], {}).setdefault(key, {"nodes": row["nodes"]})
            cell.setdefault(SAME_COLUMN.get(row["method"], row["method"]), []).append(
                (row["batched_over_loop"], row["batched"]["median_ms"]))
    if not out:
        raise ValueError("no run has batched_over_loop rows: run bench_verify.py with Zipf-row batches "
                         "(--batches) and its exact loop")
    return {B: _ordered(out[B]) for B in sorted(out)}


def _figure(x: float) -> str:
    """Three significant figures, trailing zeros kept, no exponent (``0.706``, ``12.0``); from 1 000 up whole."""
    if x >= 999.5 or not x > 0:
        return f"{x:.0f}"
    r = float(f"{x:.3g}")
    return f"{r:.{max(0, 2 - math.floor(math.log10(r)))}f}"


def _span(values) -> str:
    """``lo–hi`` in :func:`_figure`'s figures, one figure where they are the same."""
    lo, hi = _figure(min(values)), _figure(max(values))
    return lo if lo == hi else f"{lo}–{hi}"


def batched_table(B: int, found: dict) -> str:
    """The markdown table of one batch size: per case and method ``lo–hi×`` of ``batched_over_loop`` (bold where
    B = :data:`BATCHED_GOAL_B` and ``lo`` meets :data:`BATCHED_GOAL`) and the batched call's ``lo–hi ms``
    (:func:`_span`)."""
    lines = [f"| Zipf rows, B = {B} | process | draft | " + " | ".join(METHODS) + " |", "|---|---|---|---|---|---|"]
    last = None
    for key, cell in found.items():
        head = f"| {SHAPES.get(key[1], key[1])} ({cell['nodes']} nodes) | {key[2]} |" if key[:3] != last else "|  |  |"
        last = key[:3]
        draft = "all" if key[3] is None else f"top {key[3]}"
        cols = []
        for m in METHODS:
            if m not in cell:
                cols.append("-")
                continue
            ratios, ms = zip(*cell[m])
            text = f"{_span(ratios)}×"
            bold = B == BATCHED_GOAL_B and min(ratios) >= BATCHED_GOAL
            cols.append(f"{f'**{text}**' if bold else text} ({_span(ms)} ms)")
        lines.append(f"{head} {draft} | " + " | ".join(cols) + " |")
    return "\n".join(lines)


def case_label(key: tuple, cell: dict) -> str:
    """``SmolLM2-drafted binary:4 (31 nodes), 2 trees`` / ``Zipf rows, EAGLE-like (24 nodes), B = 1``."""
    rows, shape = key[:2]
    head = f"{ROWS.get(rows, rows)}{', ' if rows == 'zipf' else ' '}{SHAPES.get(shape, shape)} ({cell['nodes']} nodes)"
    n = len(cell["trees"])
    return f"{head}, {n} tree{'s' if n > 1 else ''}" if rows != "zipf" else f"{head}, B = 1"


def cell_range(values: list[float]) -> str:
    """``lo–hi`` (three decimals below 1, else two), bold where ``hi`` meets :data:`GOAL`."""
    lo, hi = min(values), max(values)
    text = f"{lo:.3f}–{hi:.3f}" if hi < 1 else f"{lo:.2f}–{hi:.2f}"
    return f"**{text}**" if hi <= GOAL else text


def summary(runs: list[dict]) -> list[str]:
    """The lines above the table: runs, the forward's range, α*(ρ), the largest peak-memory rise."""
    rows = [r for run in runs for r in run["synthetic"] + run["real"]]
    fwd = [r["forward"]["median_ms"] for r in rows if "forward" in r]
    wor = [run["alpha_star"]["wor"]["median_ms"] / 1e3 for run in runs]
    iid = [run["alpha_star"]["iid"]["median_ms"] / 1e3 for run in runs]
    vocab = runs[0]["alpha_star"]["vocab"]
    peaks = [r["peak_mb_batched"] for r in rows if r.get("peak_mb_batched") is not None]
    lines = [f"{len(runs)} runs; target forward {min(fwd):.0f}–{max(fwd):.0f} ms (medians)" if fwd else
             f"{len(runs)} runs",
             f"alpha*(rho) at V = {vocab}, k = 3: wor {min(wor):.2f}–{max(wor):.2f} s, "
             f"iid {min(iid):.3f}–{max(iid):.3f} s (medians)"]
    if peaks:
        lines.append(f"largest peak-memory rise of a batched call: {max(peaks):.1f} MB")
    return lines


def table(found: dict) -> str:
    """The markdown table: one row per case, the case's name on its first draft row only."""
    lines = ["| trees | process | draft | ver/fwd univer | ver/fwd rrsw | ver/fwd tv |", "|---|---|---|---|---|---|"]
    last = None
    for key, cell in found.items():
        head = (f"| {case_label(key, cell)} | {key[2]} |" if key[:3] != last else "|  |  |")
        last = key[:3]
        draft = "all" if key[3] is None else f"top {key[3]}"
        cols = [cell_range(cell[m]) if m in cell else "-" for m in METHODS]
        lines.append(f"{head} {draft} | " + " | ".join(cols) + " |")
    return "\n".join(lines)


def plot(found: dict, path: str) -> None:
    """Each case's range per method as a horizontal line on a log axis, the goal dashed (the folder is created
    if missing)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(found)
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(keys) + 1.4))
    colors = {"univer": "tab:red", "rrsw": "tab:blue", "tv": "tab:green"}
    for i, key in enumerate(keys):
        for j, m in enumerate(METHODS):
            if m in found[key]:
                v = found[key][m]
                y = i + (j - 1) * 0.22
                ax.plot([min(v), max(v)], [y, y], color=colors[m], lw=3, solid_capstyle="butt",
                        label=m if i == 0 else None)
                ax.plot([min(v), max(v)], [y, y], "|", color=colors[m], ms=6)
    names = [f"{case_label(k, found[k]).split(' (')[0]} · {k[2]} · {'all' if k[3] is None else f'top {k[3]}'}"
             for k in keys]
    ax.set_yticks(range(len(keys)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    ticks = [t for t in (0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.3, 0.5, 1, 2, 3, 5, 10) if lo <= t <= hi]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.axvline(GOAL, color="k", ls="--", lw=1, label=f"goal {GOAL:g}")
    ax.set_xlabel("one gpu.verify / the target's forward of the same tree\n(range over runs and trees; log axis)")
    ax.legend(loc="lower right", fontsize=7)
    ax.grid(axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="files holding bench_verify.py --json output")
    ap.add_argument("--plot", type=image_path, help="also draw the ranges into this image file")
    ap.add_argument("--batched", action="store_true", help="the batched_over_loop tables instead (one per B)")
    args = ap.parse_args(argv)
    if args.batched and args.plot:
        ap.error("--plot draws the verify_over_forward ranges: not with --batched")
    try:
        runs = load(args.runs)
        found = batched_cells(runs) if args.batched else cells(runs)
    except (ValueError, OSError) as e:
        ap.error(str(e))
    print("\n".join(summary(runs)))
    print()
    if args.batched:
        print("\n\n".join(batched_table(B, cases) for B, cases in found.items()))
        return
    print(table(found))
    if args.plot:
        plot(found, args.plot)
        print(f"\nwrote {args.plot}")


if __name__ == "__main__":
    main()
