"""Claim 3 — UniVer reduces to Block Verification on chains and to the optimal flat multi-draft OT at depth 1.

Chains (theory.md §3.6, §6.1: k = 1 has the unique plan ``w = min(1, ρp/q)``): for every enumerated chain T the
law of (accepted path, Y) of UniVer must equal Block Verification's (BV is implemented in its own backward form,
not on the node engine) — exactly in Fractions, and in floats within 1e-12 on the joint law Q(T)·P(path, Y | T).
Exactly: UniVer's rule at k = 1 is :func:`~univer_theory.plans.choose.single_child_plan`, which computes in
Fractions on Fraction rows (UniVer is declared float-only for its k ≥ 2 constructions), so the registered rule
itself runs in Fractions on the exact twin of each model (:func:`exact_twin`) against BV in Fractions (the exact
core refuses any float in its decisions there).  In floats the joint
law, not the conditional one, is held to 1e-12: a tree's conditional law can be ill-conditioned (on rows where p
and q agree to 1e-8 on the likely token, UniVer's and BV's conditional laws of a tree of probability 1.5e-9 were
1.2e-9 apart, each ~5e-10 off the law computed in Fractions from the same rows); the per-tree maximum is
reported beside it.  Includes the §3.6 toy (context-free p = (1/3, 2/3), q = (2/3, 1/3), γ = 2), whose BV value
11/9 is recomputed exactly, not pasted.
Depth 1 (§4.1): UniVer's E[τ] on a single node with k children must equal α* of the flat OT — by the LP
(``solvers.flat_ot_lp``, 1e-9) and by the closed form (``alpha_star``, 1e-9) — for iid and wor.

Grid: chains of 2 and 3 drafted tokens, V ∈ {3, 4, 5}, Dirichlet (similarity 0.5, concentration 0.8) and peaky
(concentration 0.2), seeds 0–1; depth 1: k ∈ {2, 3, 4} (k < V), V ∈ {3, 4, 5, 6}, a dissimilar family
(similarity 0.1, concentration 0.5) and the two above, seeds 0–1.  ``fast``: chains of 3 with V ∈ {3, 4},
depth 1 with V ∈ {4, 5} and k ∈ {2, 3}, the first family, seed 0.  Both grids add confident models
(:data:`CONFIDENT`: near-deterministic drafts, tails 1e-16 … 1e-310; ``fast`` the first) on the same V.  Every
depth-1 support is at most 6 tokens, so a wor node that is neither rule 3's nor PTS's α* is rule 1's (the LP).
"""
from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import numpy as np
from tqdm import tqdm

from univer_theory import (VERIFIERS, ConfidentModel, DirichletModel, TreeShape, context_free, enumerate_trees,
                           evaluate)
from univer_theory.alpha_star import alpha_star

from .base import CheckResult, markdown_table

NAME = "reductions"
CLAIM = ("UniVer equals Block Verification on chains (joint law per tree) and the optimal flat multi-draft OT "
         "α* at depth 1 (iid and wor).")
#: Joint-law tolerance (float round-off only) and α* tolerance (HiGHS runs at 1e-10).
LAW_TOL, ALPHA_TOL = 1e-12, 1e-9
#: (similarity, concentration) of the Dirichlet families; the dissimilar one keeps α* well below 1 at depth 1.
FAMILIES = {"dirichlet": (0.5, 0.8), "peaky": (0.5, 0.2), "dissimilar": (0.1, 0.5)}
#: Confident models (``ConfidentModel``: draft tail d, target family) added to every grid; ``fast`` the first.
CONFIDENT = [(1e-16, "ties"), (1e-310, "dirichlet"), (1e-12, "zero_top"), (1e-300, "same")]


def _models(fast: bool, vocab_sizes, families):
    for fam in (families[:1] if fast else families):
        sim, conc = FAMILIES[fam]
        for V in vocab_sizes:
            for seed in ((0,) if fast else (0, 1)):
                yield f"{fam}/V{V}/s{seed}", DirichletModel(V, seed=seed, similarity=sim, concentration=conc)
    for seed, (tail, target) in enumerate(CONFIDENT[:1] if fast else CONFIDENT):
        for V in vocab_sizes:
            yield (f"confident-{target}/d{tail:g}/V{V}/s{seed}",
                   ConfidentModel(V, seed=seed, tail=tail, target=target))


def chain_instances(fast: bool):
    toy = context_free(np.array([Fraction(1, 3), Fraction(2, 3)]), np.array([Fraction(2, 3), Fraction(1, 3)]))
    yield "toy §3.6 (γ = 2)", toy, TreeShape.uniform([1, 1])
    for mid, model in _models(fast, (3, 4) if fast else (3, 4, 5), ["dirichlet", "peaky"]):
        for gamma in ((3,) if fast else (2, 3)):
            yield f"{mid}/chain{gamma}", model, TreeShape.uniform([1] * gamma)


def depth1_instances(fast: bool):
    for mid, model in _models(fast, (4, 5) if fast else (3, 4, 5, 6), ["dissimilar", "dirichlet", "peaky"]):
        for k in ((2, 3) if fast else (2, 3, 4)):
            for process in ("iid", "wor"):
                if k < model.vocab_size:     # wor with k = V drafts every token: α* = 1 trivially
                    yield f"{mid}/k{k}/{process}", model, k, process


def exact_twin(model):
    """The model itself when its rows are Fractions (the toy), a Dirichlet model's rows rounded to Fractions
    (``exact=True``), else None (a confident model's tails lie below any Fraction grid)."""
    if model.exact:
        return model
    if isinstance(model, DirichletModel):
        return DirichletModel(model.vocab_size, seed=model.seed, similarity=model.similarity,
                              concentration=model.concentration, exact=True)
    return None


def _exact_mismatch(model, shape) -> str | None:
    """On an exact model: "" when UniVer's rule and BV give the same law, in Fractions, on every chain of ``shape``
    (iid and wor), else the first tree where they differ; None without a model."""
    if model is None:
        return None
    univer, bv = replace(VERIFIERS["univer"], rational=True), VERIFIERS["bv"]      # k = 1: module docstring
    for process in ("iid", "wor"):
        for tree, _ in enumerate_trees(model, shape, process):
            p, q = model.node_probs(tree)
            try:
                same = univer.law(tree, p, q, process) == bv.law(tree, p, q, process)
            except ValueError as err:                 # a float decision on Fraction rows (engine.check_decision)
                return f"UniVer's rule is not exact on chains: {err}"
            if not same:
                return f"UniVer's law differs from BV's on tree {tree.token} ({process})"
    return ""


def _as_float(model, prefix):
    return (np.asarray(model.target(prefix), dtype=np.float64), np.asarray(model.draft(prefix), dtype=np.float64))


def run(fast: bool, out_dir, progress: bool = True) -> CheckResult:
    from solvers import flat_ot_lp

    univer, bv = VERIFIERS["univer"], VERIFIERS["bv"]
    problems, chain_rows, depth_rows = [], [], []
    for iid, model, shape in tqdm(list(chain_instances(fast)), desc=f"{NAME} chains", disable=not progress):
        worst, joint, n_trees, e_u, e_bv = 0.0, 0.0, 0, 0.0, 0
        for process in ("iid", "wor"):          # k = 1: both processes draft one token from q
            for tree, Q in enumerate_trees(model, shape, process):
                p, q = model.node_probs(tree)
                law_bv = bv.law(tree, p, q, process)            # exact (Fraction) on the toy
                pf, qf = p.astype(np.float64), q.astype(np.float64)
                law_u = univer.law(tree, pf, qf, process)
                keys = set(law_u) | set(law_bv)
                diff = max(abs(law_u.get(key, 0.0) - float(law_bv.get(key, 0))) for key in keys)
                worst, joint = max(worst, diff), max(joint, float(Q) * diff)
                n_trees += 1
                if process == "iid":
                    e_bv += Q * bv.expected_accepted_length(tree, p, q, process)
                    e_u += float(Q) * univer.expected_accepted_length(tree, pf, qf, process)
        exact = _exact_mismatch(exact_twin(model), shape)
        if joint > LAW_TOL:
            problems.append(f"{iid}: UniVer's joint law differs from BV by {joint:.2e}")
        if exact:
            problems.append(f"{iid}: in Fractions, {exact}")
        if abs(e_u - float(e_bv)) > LAW_TOL:
            problems.append(f"{iid}: E[τ] UniVer {e_u:.12g} ≠ BV {float(e_bv):.12g}")
        chain_rows.append([iid, n_trees, str(e_bv) if isinstance(e_bv, Fraction) else float(e_bv), e_u, joint, worst,
                           "—" if exact is None else "equal" if not exact else "differ"])
    for iid, model, k, process in tqdm(list(depth1_instances(fast)), desc=f"{NAME} depth 1", disable=not progress):
        shape = TreeShape.uniform([k])
        res = evaluate(model, shape, process, univer)
        e_u = float(res.expected_accepted)
        p, q = _as_float(model, ())
        lp = flat_ot_lp(p, q, k, process)
        if not lp.success:
            problems.append(f"{iid}: flat OT LP failed: {lp.message}")
        closed = float(alpha_star(p, q, k, process))
        cons = ", ".join(sorted(res.plans or {}))
        gap = max(abs(e_u - lp.value), abs(e_u - closed))
        if gap > ALPHA_TOL:
            problems.append(f"{iid}: UniVer E[τ] {e_u:.12g} vs α* LP {lp.value:.12g} / closed form {closed:.12g}")
        depth_rows.append([iid, cons, e_u, lp.value, closed, gap])
    passed = not problems
    worst_chain = max(chain_rows, key=lambda r: r[4])
    worst_depth = max(depth_rows, key=lambda r: r[-1])
    n_exact = sum(row[-1] == "equal" for row in chain_rows)
    summary = (f"{len(chain_rows)} chain instances: max joint-law difference UniVer vs BV {worst_chain[4]:.1e} "
               f"({worst_chain[0]}), equal in Fractions on {n_exact}; {len(depth_rows)} depth-1 instances: max "
               f"|E[τ] − α*| {worst_depth[-1]:.1e} ({worst_depth[0]})"
               + ("" if passed else f"; {len(problems)} violation(s)") + ".")
    table = ("**Chains: UniVer vs Block Verification** (every enumerated chain T, iid and wor; E[τ] under iid; the "
             "joint law is Q(T)·P(path, Y | T); in Fractions: on the model's exact twin, — where it has none)\n\n"
             + markdown_table(["instance", "trees", "BV E[τ]", "UniVer E[τ]", "max joint-law difference",
                               "max per-tree law difference", "in Fractions"], chain_rows)
             + "\n\n**Depth 1: UniVer vs the optimal flat multi-draft OT α***\n\n"
             + markdown_table(["instance", "UniVer construction", "UniVer E[τ]", "α* (LP)",
                               "α* (closed form)", "max difference"], depth_rows))
    if problems:
        table += "\n\n**Violations**\n\n" + "\n".join(f"- {p}" for p in problems[:30])
    return CheckResult(NAME, CLAIM, passed, table, summary)
