"""``univer bound``: the global tree LP and the conditional-framework optimum CF beside every verifier.

Prints, for one model/shape/process, the global bound (theory.md §4.3, any lossless verifier), CF (§6.4,
verifiers of the conditional framework), each verifier's exact E[τ] with its relative gap to both, and the
value-aware oracle ``univer-va``.  ``--json`` prints the ``univer exact`` object plus ``global_bound``,
``cf_bound`` (with ``alpha_root_value``: CF with the root restricted to α*-optimal plans, an upper bound on
UniVer) and, for depth-1 shapes, ``alpha_star`` (LP and closed form at ρ = 1).
"""
from __future__ import annotations

import argparse

import numpy as np

from univer_theory import VERIFIERS, TreeShape, evaluate
from univer_theory.alpha_star import alpha_star
from univer_theory.processes import PROCESSES
from univer_theory.validation import Unsupported
from univer_theory.verifiers import VALUE_AWARE

from .common import (add_model_options, build_model, check_enumeration_size, method_names, print_json,
                     synthetic_option)
from .exact import exact_results


def add_parser(sub) -> None:
    p = sub.add_parser("bound", help="global tree LP and CF bounds beside every verifier's exact E[τ]")
    add_model_options(p)
    p.set_defaults(func=run)


def bound_results(args, progress: bool = True) -> dict:
    """The JSON object of ``univer bound`` for the options in ``args``.

    A bound whose LP fails even after the solvers' re-solves and repair is reported as ``{"error": reason}``
    under its key (and in ``errors``); every other number is still computed.
    """
    shape = TreeShape.parse(args.shape)  # a bad --shape is reported before the solvers are imported
    if args.process not in PROCESSES:
        raise Unsupported(f"the global tree LP and CF are defined for processes {PROCESSES}; "
                          f"process {args.process!r} is supported by `univer exact` only")
    from solvers.cf_bound import MAX_CF_NODE_TUPLES, cf_bound
    from solvers.condot import MAX_NODE_LP_TUPLES, condot_lp, node_lp_tuples
    from solvers.global_lp import enumerate_tree_arrays, global_tree_lp, model_rows
    from solvers.value_aware import value_aware_verifier

    names = method_names(args.methods, [*VERIFIERS, VALUE_AWARE]) if args.methods is not None else None
    others = None if names is None else ",".join(m for m in names if m != VALUE_AWARE)
    if args.rational and names is not None and VALUE_AWARE in names:
        raise Unsupported(f"--methods {VALUE_AWARE} with --rational: the value-aware oracle's node LPs are "
                          f"solved in floats; it has no exact rational form")
    model = build_model(args)
    check_enumeration_size(model.vocab_size, shape, args.process)          # exact_results, given the model, does not

    def check_node_lp(draft, u: int) -> None:
        """CF's node LP of node u over this draft row, refused before any method runs."""
        count = node_lp_tuples(np.asarray(draft, dtype=np.float64), len(shape.children[u]), args.process)
        if count > MAX_CF_NODE_TUPLES:
            raise ValueError(f"vocabulary {model.vocab_size} on shape {shape} ({args.process}): CF's node LP at node "
                             f"{u} has {count} draft tuples, above solvers.cf_bound.MAX_CF_NODE_TUPLES = "
                             f"{MAX_CF_NODE_TUPLES:.0e}")

    check_node_lp(model.draft(()), 0)                           # the root's before the trees are enumerated,
    trees = enumerate_tree_arrays(model, shape, args.process)   # which refuses above solvers.global_lp.MAX_TREES,
    for u, kids in enumerate(shape.children[1:], 1):            # then every other node's at each of its prefixes
        for code in np.unique(trees.codes[:, u]) if kids else ():
            check_node_lp(trees.drafts[int(code)], u)
    if others == "":  # only univer-va asked for
        results, errors = {}, {}
    else:
        _, shape, results, errors = exact_results(
            argparse.Namespace(**{**vars(args), "methods": others}), progress, model)
    out = {"methods": {k: r.as_json() for k, r in results.items()}}
    glob = _attempt(errors, "global_bound", lambda: _checked(global_tree_lp(model, shape, args.process,
                                                                            trees=trees)))
    cf = _attempt(errors, "cf_bound", lambda: _checked(cf_bound(model, shape, args.process)))
    if (names is None or VALUE_AWARE in names) and not model.exact:
        if cf is None:
            errors[VALUE_AWARE] = "needs the CF value functions, and cf_bound failed"
        else:
            va = _attempt(errors, VALUE_AWARE, lambda: evaluate(
                model, shape, args.process, value_aware_verifier(model, shape, args.process, cf)))
            if va is not None:
                out["methods"][VALUE_AWARE] = va.as_json()
    out["global_bound"] = {"error": errors["global_bound"]} if glob is None else {
        "value": glob.value, "trees": glob.trees, "classes": glob.classes, "variables": glob.variables,
        "constraints": glob.constraints, "seconds": glob.seconds, "lp_objective": glob.lp_objective,
        "primal_value": glob.primal_value, "tolerance": glob.tolerance}
    out["cf_bound"] = {"error": errors["cf_bound"]} if cf is None else {
        "value": cf.value, "alpha_root_value": cf.alpha_root_value, "breakpoints": cf.breakpoints,
        "lp_solves": cf.lp_solves, "tolerance": cf.tolerance, "margin": cf.margin,
        "seconds": cf.seconds}
    if shape.max_depth == 1:
        k = len(shape.children[0])
        p, q = model_rows(model, (), "univer bound")   # the rows the methods, the LP and CF read
        fast = float(alpha_star(p, q, k, args.process, rho=1.0))
        tuples = node_lp_tuples(q, k, args.process)
        if tuples > MAX_NODE_LP_TUPLES:     # the LP is a cross-check: the closed form stands alone (the LP's
            out["alpha_star"] = {"lp": None, "fast": fast,       # refusal lost every result above, after minutes)
                                 "lp_skipped": f"{tuples} draft tuples exceed MAX_NODE_LP_TUPLES = "
                                               f"{MAX_NODE_LP_TUPLES:.0e}"}
        else:
            lp = _attempt(errors, "alpha_star", lambda: _checked(condot_lp(p, q, 1.0, k, args.process)))
            out["alpha_star"] = {"error": errors["alpha_star"]} if lp is None else {"lp": float(lp.value), "fast": fast}
    if errors:
        out["errors"] = errors
    return out


def _checked(result):
    """``result`` if its solver reports success, else RuntimeError with the solver's message."""
    if not result.success:
        raise RuntimeError(result.message)
    return result


def _attempt(errors: dict, name: str, compute):
    """``compute()``, or None with ``errors[name]`` set to the reason when its LP fails (RuntimeError)."""
    try:
        return compute()
    except RuntimeError as err:
        errors[name] = str(err)
        return None


def run(args) -> int:
    """Print the bounds and every method's gap to them; exit status 1 when some bound failed."""
    out = bound_results(args, progress=not args.json)
    errors = out.get("errors", {})
    if args.json:
        print_json(out)
        return 1 if errors else 0
    glob, cf = out["global_bound"], out["cf_bound"]
    vocab = "from file" if args.model_file is not None else synthetic_option(args, "vocab")
    print(f"shape {args.shape}  process {args.process}  V {vocab}")
    if "error" in glob:
        print(f"global tree LP  FAILED: {glob['error']}")
    else:
        print(f"global tree LP  E[tau] ≤ {glob['value']:.9f}   ({glob['trees']} trees, {glob['classes']} classes, "
              f"{glob['variables']} variables, {glob['seconds']:.2f} s)")
        if glob["value"] - glob["primal_value"] > 1e-9:
            print(f"                (certified dual bound; the best feasible point found reaches "
                  f"{glob['primal_value']:.9f})")
    if "error" in cf:
        print(f"CF optimum      FAILED: {cf['error']}")
    else:
        print(f"CF optimum      E[tau] = {cf['value']:.9f}   ({cf['breakpoints']} breakpoints, {cf['seconds']:.2f} s)")
        print(f"CF, α* root     E[tau] ≤ {cf['alpha_root_value']:.9f}   (bound on every verifier whose root attains α*)")
    if "alpha_star" in out:
        a = out["alpha_star"]
        print(f"alpha*          FAILED: {a['error']}" if "error" in a else
              f"alpha*          closed form {a['fast']:.9f}   LP skipped: {a['lp_skipped']}" if a["lp"] is None else
              f"alpha*          LP {a['lp']:.9f}   closed form {a['fast']:.9f}")
    print(f"{'method':<11}{'E[tau]':>12}{'distance':>12}  lossless{'gap→global':>12}{'gap→CF':>10}")

    def gap(bound, e):  # relative; a difference within the bound's stated tolerance and margin is round-off: 0
        if "error" in bound:
            return "—"
        d = bound["value"] - e
        if abs(d) <= bound["tolerance"] + bound.get("margin", 0.0) + 1e-12:
            return f"{0.0:.2%}"
        return f"{d / bound['value']:.2%}"

    for name, r in out["methods"].items():
        e = r["expected_accepted"]
        print(f"{name:<11}{e:>12.6f}{r['distance']:>12.2e}  {'✓' if r['lossless'] else '✗':^8}"
              f"{gap(glob, e):>11}{gap(cf, e):>10}")
    for name, reason in errors.items():
        if name in out["methods"] or name in ("global_bound", "cf_bound", "alpha_star"):
            continue
        print(f"{name:<11}FAILED: {reason}")
    return 1 if errors else 0
