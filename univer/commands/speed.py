"""``univer speed``: wall-clock tokens/s of plain sampling, Hugging Face assisted generation and speculative
decoding with each verifier, on the same prompts, seeds and (target, draft) pair.

Prints ``{"methods": {NAME: {"tokens_per_s", "tokens_per_step", "acceptance_length", "share": {"draft", "target",
"verify"}, …}}}``
(with ``--json``; a table otherwise) and writes ``speed.json``, ``speed.csv`` (one row per method) and
``speed.png`` (tokens/s bars and the phase split) into ``--out``.  Progress bars (runs, and the tokens of each
speculative run) go to stderr, none with ``--json`` (a machine reads it).  ``--batch B`` decodes the prompts in
groups of B in shared forwards (:func:`gpu.llm.speed.speed_compare`); ``per_prompt_tokens_per_s`` then holds one
value per group.
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from univer_theory import VERIFIERS

from .common import method_names, output_folder, positive_int, print_json
from .decode import add_llm_options, check_draftable, load_models

#: Methods in the order they are reported; ``sps`` runs on ``--chain``, the tree verifiers on ``--tree``.
ALL_METHODS = ("plain", "hf-assisted", "sps", "rrsw", "tv", "univer")
#: Tree of the tree verifiers unless ``--tree`` is given.
DEFAULT_TREE = "binary:2"


def add_parser(sub) -> None:
    p = sub.add_parser("speed", help="tokens/s: plain sampling vs HF assisted generation vs speculative decoding")
    p.add_argument("--prompts", default="mtbench", choices=("mtbench", "humaneval", "all"),
                   help="prompt set (default mtbench)")
    p.add_argument("--n", type=positive_int, default=8, help="number of prompts, round-robin over categories "
                                                            "(default 8)")
    p.add_argument("--max-new-tokens", type=positive_int, default=64, help="token budget per prompt (default 64)")
    p.add_argument("--methods", default=None,
                   help=f"comma-separated subset of {','.join(ALL_METHODS)} (default all; with --batch > 1 all "
                        "but hf-assisted, which cannot batch)")
    p.add_argument("--batch", type=positive_int, default=1,
                   help="requests decoded together in shared forwards: the prompts go in groups of B (the last "
                        "may be smaller) and tokens/s counts all requests of a group over its wall time; plain "
                        "sampling and the speculative methods batch, hf-assisted cannot (default 1; at most --n)")
    p.add_argument("--tree", action="append", default=None,
                   help="tree of rrsw / tv / univer: binary:D, eagle[:W], chain:D or a TreeShape string (default "
                        f"{DEFAULT_TREE}); repeat the option to run several trees, each method then named "
                        "METHOD@TREE")
    p.add_argument("--chain", default="chain:3", help="chain of sps (default chain:3)")
    p.add_argument("--out", default="results/speed", help="output folder (default results/speed)")
    add_llm_options(p, threads=1)
    p.set_defaults(func=run)


def speed_methods(args) -> list:
    """The :class:`gpu.llm.speed.SpeedMethod` list the options name (checked before any model is loaded)."""
    from gpu.llm.speed import UNBATCHED, SpeedMethod
    from gpu.llm.tree_draft import tree_shape

    if args.methods is None:
        names = [m for m in ALL_METHODS if args.batch == 1 or m not in UNBATCHED]
        if len(names) < len(ALL_METHODS):
            print(f"speed: left out {[m for m in ALL_METHODS if m not in names]} (cannot batch requests)",
                  file=sys.stderr)
    else:
        names = method_names(args.methods, ALL_METHODS)
    cannot = {m: UNBATCHED[m] for m in names if m in UNBATCHED}
    if args.batch > 1 and cannot:
        raise ValueError(f"--batch {args.batch}: method(s) {list(cannot)} cannot batch requests "
                         f"({'; '.join(cannot.values())}); leave them out of --methods or use --batch 1")
    trees = args.tree or [DEFAULT_TREE]
    repeated = sorted({spec for spec in trees if trees.count(spec) > 1})
    if repeated:        # two runs under one label METHOD@TREE: speed_compare would merge them into one entry
        raise ValueError(f"--tree {', '.join(repeated)} given more than once; name each tree once")
    if args.tree and all(name in ("plain", "hf-assisted", "sps") for name in names):
        raise ValueError(f"--tree {', '.join(args.tree)}: none of the methods {names} drafts a tree (sps drafts "
                         f"--chain); add a tree method or leave --tree out")
    out = []
    for name in ALL_METHODS:
        if name not in names:
            continue
        if name in ("plain", "hf-assisted"):
            out.append(SpeedMethod(name, name))
            continue
        for spec in ([args.chain] if name == "sps" else trees):
            shape = tree_shape(spec)
            check_draftable(shape, args, spec)
            if not VERIFIERS[name].supports(shape, args.process):
                raise ValueError(f"method {name!r} does not apply to tree {spec} with process {args.process!r} "
                                 f"(processes {VERIFIERS[name].processes}"
                                 f"{', chains only' if VERIFIERS[name].chain_only else ''})")
            label = name if name == "sps" or len(trees) == 1 else f"{name}@{spec}"
            out.append(SpeedMethod(label, name, shape))
    return out


def write_outputs(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "speed.json").write_text(json.dumps(report, indent=2))
    with (out / "speed.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["method", "tokens_per_s", "speedup_vs_plain", "tokens_per_s_min", "tokens_per_s_median",
                    "tokens_per_step", "acceptance_length", "share_draft", "share_target", "share_verify",
                    "new_tokens", "wall_s"])
        for name, m in report["methods"].items():
            w.writerow([name, f"{m['tokens_per_s']:.4f}", f"{m['speedup_vs_plain']:.4f}" if "speedup_vs_plain" in m
                        else "",
                        f"{m['tokens_per_s_min']:.4f}", f"{m['tokens_per_s_median']:.4f}",
                        f"{m['tokens_per_step']:.4f}", f"{m['acceptance_length']:.4f}",
                        *(f"{m['share'][k]:.4f}" for k in ("draft", "target", "verify")),
                        m["new_tokens"], f"{m['wall_s']:.3f}"])
    plot(report, out / "speed.png")


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["methods"])
    ms = [report["methods"][n] for n in names]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(8.0, 1.6 * len(names)), 4.0))
    ax1.bar(names, [m["tokens_per_s"] for m in ms], color="tab:blue")
    ax1.set_ylabel("tokens / s (higher is better)")
    ax1.set_title("decoding speed")
    bottom = [0.0] * len(ms)
    for k, colour in (("draft", "tab:orange"), ("target", "tab:green"), ("verify", "tab:red")):
        vals = [m["share"][k] for m in ms]
        ax2.bar(names, vals, bottom=bottom, label=k, color=colour)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax2.set_ylabel("share of wall time")
    ax2.set_title("where a step's time goes")
    ax2.legend(fontsize="small")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args) -> int:
    import datetime
    import platform

    from gpu.llm.models import DEFAULT_DRAFT
    from gpu.llm.prompts import encode_prompt, load_prompts
    from gpu.llm.speed import speed_compare
    from univer_theory.models import resolve_draft_temperature

    methods = speed_methods(args)
    prompts = load_prompts(args.prompts, args.n)
    if args.batch > len(prompts):
        raise ValueError(f"--batch {args.batch} exceeds the number of prompts ({len(prompts)}; --n {args.n})")
    output_folder(args.out)
    pair = load_models(args)
    ids = [encode_prompt(pair.tokenizer, p) for p in prompts]
    report = speed_compare(pair, ids, methods, args.process, args.temperature, args.max_new_tokens, args.seed,
                           progress=not args.json, batch=args.batch, draft_top=args.draft_top,   # bars on stderr
                           draft_temperature=args.draft_temperature)
    plain = report["methods"].get("plain")
    for m in report["methods"].values():
        if plain:
            m["speedup_vs_plain"] = m["tokens_per_s"] / plain["tokens_per_s"]
    import torch

    report = {"methods": report["methods"], "per_prompt_tokens_per_s": report["per_prompt"],
              "config": {"prompts": args.prompts, "n": len(prompts), "batch": args.batch,
                         "max_new_tokens": args.max_new_tokens,
                         "draft": args.draft or DEFAULT_DRAFT, "trees": args.tree or [DEFAULT_TREE], "chain": args.chain,
                         "process": args.process, "temperature": args.temperature,
                         "draft_temperature": resolve_draft_temperature(args.temperature, args.draft_temperature),
                         "draft_top": args.draft_top,
                         "seed": args.seed,
                         "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
                         "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}}
    write_outputs(report, Path(args.out))
    if args.json:
        print_json(report)
        return 0
    print(f"{'method':18s} {'tokens/s':>9s} {'× plain':>8s} {'tok/step':>9s} {'acc len':>8s} {'draft':>6s} "
          f"{'target':>7s} {'verify':>7s}")
    for name, m in report["methods"].items():
        speedup = f"{m['speedup_vs_plain']:8.2f}" if "speedup_vs_plain" in m else f"{'-':>8s}"   # plain not run
        print(f"{name:18s} {m['tokens_per_s']:9.2f} {speedup} "
              f"{m['tokens_per_step']:9.2f} {m['acceptance_length']:8.2f} {m['share']['draft']:6.1%} "
              f"{m['share']['target']:7.1%} {m['share']['verify']:7.1%}")
    print(f"wrote {args.out}/speed.json, speed.csv, speed.png")
    return 0
