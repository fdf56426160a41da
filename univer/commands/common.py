"""Options shared by the model-level subcommands (``exact``, ``bound``, ``check``)."""
from __future__ import annotations

import json

from univer_theory import DirichletModel, TableModel, TemperedModel, TreeShape, VERIFIERS
from univer_theory.models import check_seed, resolve_draft_temperature
from univer_theory.processes import EXACT_PROCESSES
from univer_theory.validation import check_temperature, count_text


#: The synthetic model's options and their defaults (None on the command line: a ``--model-file`` run refuses them).
SYNTHETIC_DEFAULTS = {"vocab": 4, "seed": 0, "similarity": 0.5, "concentration": 1.0}


def synthetic_option(args, name: str):
    """The synthetic model's option ``name`` as given, or its default (:data:`SYNTHETIC_DEFAULTS`)."""
    value = getattr(args, name)
    return SYNTHETIC_DEFAULTS[name] if value is None else value


def add_model_options(p) -> None:
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size V of the synthetic model (default 4)")
    p.add_argument("--shape", "--tree", dest="shape", default="2,2",
                   help="tree shape: branching per depth '2,2', nested '((..),.)', binary:D, chain:D or eagle[:W] "
                        "(default 2,2; --tree is the same option, as the LLM commands spell it)")
    p.add_argument("--process", default="wor", choices=EXACT_PROCESSES,
                   help="draft process (default wor); 'hub' is SpecHub's two-draft law (exact only)")
    p.add_argument("--seed", type=model_seed, default=None,
                   help="seed of the Dirichlet model family, below 2^32 (default 0)")
    p.add_argument("--similarity", type=float, default=None, help="draft–target similarity in [0,1] (default 0.5)")
    p.add_argument("--concentration", type=float, default=None,
                   help="Dirichlet concentration; small = peaky (default 1.0)")
    p.add_argument("--temperature", type=temperature, default=1.0,
                   help="target temperature T, applied to the draft too unless --draft-temperature (default 1.0)")
    p.add_argument("--draft-temperature", type=temperature, default=None,
                   help="draft temperature (default: T, or 1.0 when T = 0, as the LLM commands)")
    p.add_argument("--model-file", help='JSON tables {"vocab": V, "target": {"": [...], "0,2": [...]}, "draft": {...}}')
    p.add_argument("--rational", action="store_true",
                   help="exact Fraction arithmetic (rational methods only); the synthetic model's rows are rounded "
                        "to multiples of 1/1000 (each positive entry kept ≥ 1/1000), a nearby model, not the float "
                        "one; a --model-file's rows are read as exact fractions")
    p.add_argument("--methods", help="comma-separated method names (default: every method that applies; nss only "
                                     "for topk, or where no other applies)")
    p.add_argument("--json", action="store_true", help="print the JSON object instead of the table")


def build_model(args):
    """The model the options describe (synthetic Dirichlet family or the user's tables; a ValueError for the
    synthetic family's options beside ``--model-file``, which would be ignored)."""
    if args.model_file is not None:
        if not args.model_file.strip():         # (an empty path read as "not given" ran the synthetic model)
            raise ValueError(f"--model-file {args.model_file!r} names no file")
        given = [f"--{name}" for name in SYNTHETIC_DEFAULTS if getattr(args, name) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} describe{'s' if len(given) == 1 else ''} the synthetic model; "
                             f"with --model-file the file sets the model (its \"vocab\" is V)")
        model = TableModel.from_json(args.model_file, exact=args.rational)
    else:
        vocab, seed, similarity, concentration = (synthetic_option(args, name) for name in SYNTHETIC_DEFAULTS)
        model = DirichletModel(vocab, seed=seed, similarity=similarity, concentration=concentration,
                               exact=args.rational)
    draft_temperature = resolve_draft_temperature(args.temperature, args.draft_temperature)
    if (args.temperature, draft_temperature) != (1.0, 1.0):
        if args.rational and not {args.temperature, draft_temperature} <= {0.0, 1.0}:
            raise ValueError("--rational supports only temperatures 0 or 1")
        model = TemperedModel(model, args.temperature, draft_temperature)
    return model


#: Most (prefix, child tuple) pairs, over every internal node, and target-law outputs the commands' enumeration
#: may visit (full support).  The exact engine plans every tuple of every prefix a node can have (V = 300, one
#: wor node of k = 2: 9·10⁴ tuples, ~30 s a method on 2 cores) and compares ``V^{D+1}`` outputs with the target
#: law, so beyond this a run would not end in reasonable time; it is refused before it starts.
MAX_ENUMERATION = 10 ** 6


def check_enumeration_size(vocab: int, shape: TreeShape, process: str) -> None:
    """A ValueError when the exact engine on ``shape`` over ``vocab`` tokens would visit more than
    :data:`MAX_ENUMERATION` (prefix, child tuple) pairs — ``Σ_u n(u)·T(k_u)`` over the internal nodes u, ``T`` =
    :func:`univer_theory.processes.tuple_count` on full support and ``n(u)`` the prefixes u can have (the product,
    down its path, of the tokens each position can hold: V, but one for a top-k position) — or compare more
    outputs ``V^{D+1}``."""
    from univer_theory.processes import tuple_count

    if process != "iid" and shape.max_children > vocab:     # no row can draft it: refused before any method runs
        raise ValueError(f"process {process!r} drafts {shape.max_children} distinct tokens at shape {shape}'s widest "
                         f"node, more than the vocabulary's {vocab}; use a smaller node or --process iid")
    prefixes = [1] * shape.num_nodes
    for u, kids in enumerate(shape.children):      # parents come before their children
        k = len(kids)
        for j, c in enumerate(kids):
            if process == "topk" or (process == "greedy" and j < k - 1):
                held = 1                            # a top token
            elif process == "greedy":
                held = tuple_count(vocab, k, process)   # the drawn child: any token but the top k − 1
            else:
                held = vocab
            prefixes[c] = prefixes[u] * held
    pairs = sum(prefixes[u] * tuple_count(vocab, len(kids), process) for u, kids in enumerate(shape.children) if kids)
    outputs = vocab ** (shape.max_depth + 1)
    for size, what in ((pairs, "(prefix, child tuple) pairs to plan"), (outputs, "outputs to compare with the "
                                                                               "target law")):
        if size > MAX_ENUMERATION:
            raise ValueError(f"vocabulary {vocab} on shape {shape} ({process}) is {count_text(size)} {what}, above "
                             f"{MAX_ENUMERATION:.0e}: the exact engine is for small vocabularies and trees (at LLM "
                             f"scale use gpu.expected_accepted_length)")


def method_names(text: str, choices) -> list[str]:
    """The names of a comma-separated ``--methods`` value; a ValueError where it names none, or one outside
    ``choices``."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise ValueError(f"--methods {text!r} names no method; choose from {sorted(choices)}")
    unknown = [m for m in names if m not in choices]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {sorted(choices)}")
    return names


def selected_methods(args, shape: TreeShape, exact: bool) -> list:
    """Verifiers that apply to (shape, process[, rational]); ``nss`` is listed for ``topk``, and otherwise only
    where nothing else applies (``greedy`` in rational mode)."""
    if args.methods is not None:
        chosen = [VERIFIERS[m] for m in method_names(args.methods, VERIFIERS)]
        for v in chosen:
            why = v.unsupported(shape, args.process, exact)
            if why:
                flag = "--shape" if hasattr(args, "shape") else "--tree"     # exact / bound, or the LLM commands
                raise ValueError(f"unsupported method/shape/process combination: --methods {v.name} with "
                                 f"{flag} {getattr(args, flag[2:], None) or shape} --process {args.process}"
                                 f"{' --rational' if exact else ''}: {why}")
        return chosen
    found = [v for v in VERIFIERS.values() if v.supports(shape, args.process) and (v.rational or not exact)]
    out = [v for v in found if v.name != "nss" or args.process == "topk"] or found
    if not out:
        raise ValueError(f"no method applies to shape {shape} with process {args.process!r}"
                         + (" in rational mode" if exact else ""))
    return out


def output_folder(text: str):
    """``--out`` as a folder path: a ValueError, before any run, when it or the nearest of its parents that exists
    is a file, a link on the way to it points nowhere, or that folder is not writable (the folder or its files
    could not be created)."""
    import os
    from pathlib import Path

    out = Path(text)
    try:
        if out.exists():
            if not out.is_dir():
                raise ValueError(f"--out {text} is a file; give a folder (created if missing)")
            folder = out
        else:
            path = [out.absolute(), *out.absolute().parents]
            folder = next(p for p in path if p.exists())
            broken = next((p for p in path[:path.index(folder)] if p.is_symlink()), None)
            if broken is not None:
                raise ValueError(f"--out {text}: {broken} is a link to nothing, so the folder cannot be created")
            if not folder.is_dir():
                raise ValueError(f"--out {text}: {folder} is a file, so the folder cannot be created")
    except OSError as err:                      # e.g. a name longer than the file system allows
        raise ValueError(f"--out {text}: {err.strerror or err}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--out {text}: {folder} is not writable")
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


#: The largest seed: torch's generators take a 64-bit unsigned one (2^64 was an overflow after the models loaded).
MAX_SEED = 2 ** 64 - 1


def seed_int(text: str) -> int:
    """argparse type: a seed, an integer in ``[0, MAX_SEED]`` (numpy's and torch's generators take no negative
    seed, torch's none past 64 bits)."""
    import argparse

    value = _int_at_least(text, 0)
    if value > MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be ≤ 2^64 − 1, got {value}")
    return value


def model_seed(text: str) -> int:
    """argparse type: a seed of the synthetic model families, an integer in ``[0, 2^32)``
    (:func:`univer_theory.models.check_seed`), so a bad one is a usage error before any model is built."""
    import argparse

    value = _int_at_least(text, 0)
    try:
        return check_seed(value, "")
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be below 2^32 (the model family's seed), got {value}") from None


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
