"""Options shared by the model-level subcommands (``exact``, ``bound``, ``check``)."""
from __future__ import annotations

import json

from univer_theory import DirichletModel, TableModel, TemperedModel, TreeShape, VERIFIERS
from univer_theory.models import resolve_draft_temperature
from univer_theory.processes import EXACT_PROCESSES
from univer_theory.validation import check_temperature


def add_model_options(p) -> None:
    p.add_argument("--vocab", type=int, default=4, help="vocabulary size V of the synthetic model (default 4)")
    p.add_argument("--shape", default="2,2",
                   help="tree shape: branching per depth '2,2' or nested '((..),.)' (default 2,2)")
    p.add_argument("--process", default="wor", choices=EXACT_PROCESSES,
                   help="draft process (default wor); 'hub' is SpecHub's two-draft law (exact only)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the Dirichlet model family")
    p.add_argument("--similarity", type=float, default=0.5, help="draft–target similarity in [0,1] (default 0.5)")
    p.add_argument("--concentration", type=float, default=1.0, help="Dirichlet concentration; small = peaky")
    p.add_argument("--temperature", type=temperature, default=1.0,
                   help="target temperature T, applied to the draft too unless --draft-temperature (default 1.0)")
    p.add_argument("--draft-temperature", type=temperature, default=None,
                   help="draft temperature (default: T, or 1.0 when T = 0, as the LLM commands)")
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
    draft_temperature = resolve_draft_temperature(args.temperature, args.draft_temperature)
    if (args.temperature, draft_temperature) != (1.0, 1.0):
        if args.rational and not {args.temperature, draft_temperature} <= {0.0, 1.0}:
            raise ValueError("--rational supports only temperatures 0 or 1")
        model = TemperedModel(model, args.temperature, draft_temperature)
    return model


#: Most child tuples one node may draft (full support) in the commands' enumeration: ``V^k`` i.i.d.,
#: ``V!/(V−k)!`` without replacement.  The exact engine visits each (V = 300, k = 2 wor: 9·10⁴ tuples, ~30 s a
#: method on 2 cores), so beyond this a run would not end in reasonable time; it is refused before it starts.
MAX_NODE_TUPLES = 10 ** 6


def check_enumeration_size(vocab: int, shape: TreeShape, process: str) -> None:
    """A ValueError when a node of ``shape`` drafts more than :data:`MAX_NODE_TUPLES` tuples over ``vocab``."""
    import math

    k = shape.max_children
    tuples = vocab ** k if process == "iid" else math.perm(vocab, k) if process == "wor" else 0
    if tuples > MAX_NODE_TUPLES:
        raise ValueError(f"vocabulary {vocab} with {k} children a node ({process}) is {tuples:.3g} child tuples to "
                         f"enumerate at one node, above {MAX_NODE_TUPLES:.0e}: the exact engine is for small "
                         f"vocabularies (at LLM scale use gpu.expected_accepted_length)")


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


def _int_at_least(text: str, low: int) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer ≥ {low}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be ≥ {low}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1 (a clear usage error otherwise)."""
    return _int_at_least(text, 1)


def seed_int(text: str) -> int:
    """argparse type: a seed, an integer ≥ 0 (numpy's and torch's generators take no negative seed)."""
    return _int_at_least(text, 0)


def temperature(text: str) -> float:
    """argparse type: a temperature, finite and ≥ 0 (:func:`univer_theory.validation.check_temperature`), so a
    bad one is a usage error before any model loads."""
    import argparse

    try:
        return check_temperature(float(text), "")
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number ≥ 0, got {text!r}") from None


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False))
