"""Options shared by the model-level subcommands (``exact``, ``bound``, ``check``)."""
from __future__ import annotations

import json

from univer_theory import DirichletModel, TableModel, TemperedModel, TreeShape, VERIFIERS
from univer_theory.processes import EXACT_PROCESSES


def add_model_options(p) -> None:
    p.add_argument("--vocab", type=int, default=4, help="vocabulary size V of the synthetic model (default 4)")
    p.add_argument("--shape", default="2,2",
                   help="tree shape: branching per depth '2,2' or nested '((..),.)' (default 2,2)")
    p.add_argument("--process", default="wor", choices=EXACT_PROCESSES,
                   help="draft process (default wor); 'hub' is SpecHub's two-draft law (exact only)")
    p.add_argument("--seed", type=int, default=0, help="seed of the Dirichlet model family")
    p.add_argument("--similarity", type=float, default=0.5, help="draft–target similarity in [0,1] (default 0.5)")
    p.add_argument("--concentration", type=float, default=1.0, help="Dirichlet concentration; small = peaky")
    p.add_argument("--temperature", type=float, default=1.0, help="temperature applied to target and draft")
    p.add_argument("--model-file", help='JSON tables {"vocab": V, "target": {"": [...], "0,2": [...]}, "draft": {...}}')
    p.add_argument("--rational", action="store_true", help="exact Fraction arithmetic (rational methods only)")
    p.add_argument("--methods", help="comma-separated method names (default: every method that applies)")
    p.add_argument("--json", action="store_true", help="print the JSON object instead of the table")


def build_model(args):
    """The model the options describe (synthetic Dirichlet family or the user's tables)."""
    if args.model_file:
        model = TableModel.from_json(args.model_file, exact=args.rational)
    else:
        model = DirichletModel(args.vocab, seed=args.seed, similarity=args.similarity,
                               concentration=args.concentration, exact=args.rational)
    if args.temperature != 1.0:
        if args.rational and args.temperature != 0:
            raise ValueError("--rational supports only --temperature 0 or 1")
        model = TemperedModel(model, args.temperature)
    return model


def selected_methods(args, shape: TreeShape, exact: bool) -> list:
    """Verifiers that apply to (shape, process[, rational]); ``nss`` is listed for ``topk`` only."""
    if args.methods:
        names = [m.strip() for m in args.methods.split(",") if m.strip()]
        unknown = [m for m in names if m not in VERIFIERS]
        if unknown:
            raise ValueError(f"unknown method(s) {unknown}; choose from {sorted(VERIFIERS)}")
        for v in (VERIFIERS[m] for m in names):
            why = v.unsupported(shape, args.process, exact)
            if why:
                flag = "--shape" if hasattr(args, "shape") else "--tree"     # exact / bound, or the LLM commands
                raise ValueError(f"unsupported method/shape/process combination: --methods {v.name} with "
                                 f"{flag} {getattr(args, flag[2:], None) or shape} --process {args.process}"
                                 f"{' --rational' if exact else ''}: {why}")
        return [VERIFIERS[m] for m in names]
    out = []
    for v in VERIFIERS.values():
        if not v.supports(shape, args.process) or (exact and not v.rational):
            continue
        if v.name == "nss" and args.process != "topk":
            continue
        out.append(v)
    if not out:
        raise ValueError(f"no method applies to shape {shape} with process {args.process!r}"
                         + (" in rational mode" if exact else ""))
    return out


def output_folder(text: str):
    """``--out`` as a folder path: a ValueError, before any run, when it names an existing file."""
    from pathlib import Path

    out = Path(text)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {text} is a file; give a folder (created if missing)")
    return out


def positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1 (a clear usage error otherwise)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer ≥ 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1, got {value}")
    return value


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False))
