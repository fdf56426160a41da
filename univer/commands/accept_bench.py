"""``univer accept-bench``: paired offline acceptance-length benchmark on real draft trees.

Writes ``accept_bench.json`` (configuration, per-method and per-category statistics, per-position values),
``accept_bench.csv`` (one row per prompt position, one column per method) and ``accept_bench.png`` (bars of
tokens per target forward ``E[τ] + 1`` — the paper's acceptance length — by category and method, ± one standard
error) into ``--out``.  ``accept_bench.jsonl`` there receives each prompt's record as it finishes; ``--resume``
continues a stopped run from it (same settings required).
"""
from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

from .common import output_folder, positive_int, print_json, selected_methods
from .decode import add_llm_options, check_draftable, load_models

#: Settings of ``--fast`` (CI): few prompts, a small tree, few positions — unless given explicitly.
FAST = {"limit": 2, "positions": 3, "tree": "binary:2"}
#: Defaults of a full run.
FULL = {"limit": None, "positions": 32, "tree": "binary:4"}


def add_parser(sub) -> None:
    p = sub.add_parser("accept-bench", help="exact E[τ] of every verifier on real SmolLM2 draft trees")
    p.add_argument("--prompts", default="mtbench", choices=("mtbench", "humaneval", "all"), help="prompt set (default mtbench)")
    p.add_argument("--limit", type=positive_int, default=None,
                   help=f"number of prompts, round-robin over categories (default all; --fast {FAST['limit']})")
    p.add_argument("--positions", type=positive_int, default=None,
                   help=f"positions per prompt along the target's continuation (default {FULL['positions']}; "
                        f"--fast {FAST['positions']})")
    p.add_argument("--tree", default=None, help=f"tree shape: binary:D, chain:D, eagle[:W] or a TreeShape string "
                                                f"(default {FULL['tree']}; --fast {FAST['tree']})")
    p.add_argument("--methods", default=None,
                   help="comma-separated methods (default: every method that applies and runs batched, plus the "
                        "chain-only sps / bv)")
    p.add_argument("--out", default="results/accept_bench", help="output folder (default results/accept_bench)")
    p.add_argument("--fast", action="store_true", help="short run for CI")
    p.add_argument("--resume", action="store_true",
                   help="continue a stopped run: reuse the prompts recorded in --out's accept_bench.jsonl (same "
                        "settings required) and compute only the others")
    add_llm_options(p)
    p.set_defaults(func=run)


def default_methods(args, shape) -> list[str]:
    """``--methods`` as given, else every applicable method that has a batched verifier — UniVer included —
    plus the chain-only ``sps`` / ``bv`` (cheap on the exact core); the others (exact-core-only variants) are
    named on stderr (pass them with ``--methods``)."""
    from gpu import METHODS

    applicable = selected_methods(args, shape, exact=False)
    if args.methods is not None:
        return [v.name for v in applicable]
    keep = [v.name for v in applicable if v.name in METHODS or v.chain_only]
    left = [v.name for v in applicable if v.name not in keep]
    if left:
        print(f"accept-bench: left out {left} (no batched verifier yet; add them with --methods)", file=sys.stderr)
    return keep


def write_csv(result, path: Path) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["prompt", "category", "position", *result.methods])
        for r in result.records:
            for i in range(r.positions):
                w.writerow([r.id, r.category, i, *(f"{r.expected[m][i]:.12g}" for m in result.methods)])


def plot(result, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = result.summary()
    cats = [c for c in summary if c != "all"] + ["all"]
    width = 0.8 / len(result.methods)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(cats) * max(1, len(result.methods) / 2)), 4.0))
    for j, m in enumerate(result.methods):
        means = [summary[c][m]["tokens_per_step"] for c in cats]
        errs = [summary[c][m]["se"] or 0.0 for c in cats]
        ax.bar([i + (j - (len(result.methods) - 1) / 2) * width for i in range(len(cats))], means, width,
               yerr=errs, capsize=2, label=m)
    cfg = result.config
    ax.set_xticks(range(len(cats)), cats, rotation=30, ha="right")
    ax.set_ylabel("tokens per target forward E[τ] + 1")
    ax.set_title(f"tree {cfg['shape']} ({cfg['nodes']} nodes), {cfg['process']}, T={cfg['temperature']}, "
                 f"draft {cfg['draft']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args) -> int:
    from gpu.llm.accept_bench import accept_bench
    from gpu.llm.prompts import load_prompts
    from gpu.llm.tree_draft import tree_shape

    preset = FAST if args.fast else FULL
    limit = args.limit if args.limit is not None else preset["limit"]
    positions = args.positions if args.positions is not None else preset["positions"]
    shape = tree_shape(args.tree or preset["tree"])
    check_draftable(shape, args, args.tree or preset["tree"])
    methods = default_methods(args, shape)
    if not methods:
        raise ValueError(f"no method applies to tree {shape} with process {args.process!r}")
    prompts = load_prompts(args.prompts, limit)
    out = output_folder(args.out)
    pair = load_models(args)
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    result = accept_bench(pair, prompts, shape, args.process, methods, args.temperature, positions, args.seed,
                          args.draft_temperature, progress=not args.json, log=out / "accept_bench.jsonl",
                          resume=args.resume, draft_top=args.draft_top)
    obj = result.as_json()
    obj["config"].update(prompts=args.prompts, limit=limit, wall_s=time.perf_counter() - start)
    (out / "accept_bench.json").write_text(json.dumps(obj, indent=1))
    write_csv(result, out / "accept_bench.csv")
    plot(result, out / "accept_bench.png")
    if args.json:
        print_json({"config": obj["config"], "baseline": obj["baseline"], "methods": obj["methods"]})
        return 0
    summary = result.summary()
    base = result.baseline
    print(f"tree {shape} ({shape.num_nodes} nodes)  process {args.process}  T={args.temperature}  draft {pair.draft_spec}"
          f"  {summary['all']['prompts']} prompts, {summary['all']['positions']} positions")
    print("acceptance length = tokens per target forward E[tau] + 1 (the paper's convention); E[tau] = accepted "
          "drafted tokens")
    header = f"{'category':<12}{'method':<8}{'tok/fwd':>9}{'E[tau]':>9}{'± se':>8}"
    print(header + (f"{'gain/fwd vs ' + base:>22}{'gain E[tau]':>20}" if base else ""))
    def se(x, scale=1.0):                      # one prompt: no standard error
        return f"{scale * x:.4f}" if x is not None else "-"

    def pct(x):                                 # a gain that rounds to 0 prints +0.00, not −0.00
        return f"{100 * x if round(100 * x, 2) else 0.0:>+10.2f}"

    for cat, entry in summary.items():
        for m in result.methods:
            s = entry[m]
            line = f"{cat:<12}{m:<8}{s['tokens_per_step']:>9.4f}{s['expected_accepted']:>9.4f}{se(s['se']):>8}"
            if base:
                line += f"  {pct(s['gain_per_forward'])}% ± {se(s['gain_per_forward_se'], 100)}" \
                        f"{pct(s['gain'])}% ± {se(s['gain_se'], 100)}"
            print(line)
    print(f"wrote {out / 'accept_bench.json'}, .csv, .png, .jsonl")
    return 0
