"""``univer exact``: every verifier's exact E[τ] and distance to the target law on one model/shape/process."""
from __future__ import annotations

from tqdm import tqdm

from univer_theory import TreeShape, evaluate

from .common import add_model_options, build_model, check_enumeration_size, print_json, selected_methods


def add_parser(sub) -> None:
    p = sub.add_parser("exact", help="exact E[τ] and losslessness of every verifier (enumeration)")
    add_model_options(p)
    p.set_defaults(func=run)


def exact_results(args, progress: bool = True, model=None):
    """``(model, shape, {name: MethodResult}, {name: reason})`` for the options in ``args`` (``model``: the one
    they describe, when the caller has built it and passed :func:`check_enumeration_size`); a method whose solver
    fails (RuntimeError, e.g. an LP HiGHS cannot solve) is left out of the results with its reason."""
    shape = TreeShape.parse(args.shape)
    if model is None:
        model = build_model(args)
        check_enumeration_size(model.vocab_size, shape, args.process)
    methods = selected_methods(args, shape, model.exact)
    results, errors = {}, {}
    for v in tqdm(methods, desc="enumerating", unit="method", disable=not progress, leave=False):
        with tqdm(desc=f"  {v.name}", unit=" nodes", disable=not progress, leave=False) as nodes:
            try:                        # nodes: the distinct (prefix, ρ, children) evaluations of a rule
                results[v.name] = evaluate(model, shape, args.process, v, lambda info: nodes.update())
            except RuntimeError as err:
                errors[v.name] = str(err)
    return model, shape, results, errors


def run(args) -> int:
    """Print (or ``--json``) every method's result; exit status 1 when some method failed."""
    _, shape, results, errors = exact_results(args, progress=not args.json)
    if args.json:
        out = {"methods": {k: r.as_json() for k, r in results.items()}}
        if errors:
            out["errors"] = errors
        print_json(out)
        return 1 if errors else 0
    print(f"shape {shape}  process {args.process}  ({'rational' if args.rational else 'float64'})")
    print(f"{'method':<10}{'E[tau]':>12}{'distance':>14}  lossless")
    for name, r in results.items():
        print(f"{name:<10}{float(r.expected_accepted):>12.6f}{float(r.distance):>14.3e}  {'✓' if r.lossless else '✗'}")
    for name, reason in errors.items():
        print(f"{name:<10}FAILED: {reason}")
    if args.rational:
        print("exact E[tau]: " + ", ".join(f"{name} {r.expected_accepted}" for name, r in results.items()))
    for name, r in results.items():
        if r.plans:
            print(f"{name} node plans: " + ", ".join(f"{c} ×{n}" for c, n in sorted(r.plans.items())))
    return 1 if errors else 0
