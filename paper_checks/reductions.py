"""Claim 3 — UniVer reduces to Block Verification on chains and to the optimal flat multi-draft OT at depth 1.

Chains (theory.md §3.6, §6.1: k = 1 has the unique plan ``w = min(1, ρp/q)``): for every enumerated chain T the
law of (accepted path, Y) of UniVer must equal Block Verification's (BV is implemented in its own backward form,
not on the node engine) — exactly in Fractions, and in floats to round-off.
Exactly: on each model's own rows as Fractions (:class:`ExactRows`; the toy's are), UniVer's registered rule runs
with ``rational=True`` — at k = 1 it is :func:`~univer_theory.plans.choose.single_child_plan`, whose Fraction
branch is the exact computation that checks its float one (UniVer is float-only for its k ≥ 2 constructions), and
the exact core refuses a float in its decisions — and must give BV's law in Fractions on every tree (this covers
that branch and the engine's assembly of the law; the float branch is what the float comparisons cover).
In floats: the joint law Q(T)·P(path, Y | T) within :data:`LAW_TOL`, and each tree's conditional law within
:data:`TREE_TOL`.  A conditional law can be ill-conditioned (on rows where p and q agree to 1e-8 on the likely token,
UniVer's and BV's conditional laws of a tree of probability 1.5e-9 were 1.2e-9 apart, each ~5e-10 off the law in
Fractions of the same rows: a ratio of two masses ~1e-8), so its bound is looser; it still catches a rule wrong on
an unlikely tree (a tail token's scaling halved: 0.875), whose joint law hides it.  Includes the §3.6 toy
(context-free p = (1/3, 2/3), q = (2/3, 1/3), γ = 2), whose BV value 11/9 is recomputed exactly, not pasted.
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
from univer_theory.models import Model
from univer_theory.tolerance import exceeds, worst_of

from .base import CheckResult, law_distance, markdown_table

NAME = "reductions"
CLAIM = ("UniVer equals Block Verification on chains (the law of path and correction on every tree: exactly in "
         "Fractions, to round-off in floats) and the optimal flat multi-draft OT α* at depth 1 (iid and wor).")
#: Joint-law tolerance in floats (round-off only) and α* tolerance (HiGHS runs at 1e-10).
LAW_TOL, ALPHA_TOL = 1e-12, 1e-9
#: A tree's conditional law in floats (module docstring: ill-conditioned on unlikely trees; 1.2e-9 the worst seen).
TREE_TOL = 1e-6
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


class ExactRows(Model):
    """A float model's own rows as Fractions: every entry exactly (a float is a dyadic rational, tails of 1e-310
    included), divided by the row's exact sum."""

    def __init__(self, model: Model):
        self.model, self.vocab_size = model, model.vocab_size

    @staticmethod
    def _exact(row) -> np.ndarray:
        row = [Fraction(float(x)) for x in row]
        total = sum(row)
        return np.array([x / total for x in row], dtype=object)

    def target(self, prefix):
        return self._exact(self.model.target(prefix))

    def draft(self, prefix):
        return self._exact(self.model.draft(prefix))


def _exact_mismatch(model, shape) -> tuple[int, str]:
    """``(trees, problem)``: UniVer's rule and BV in Fractions on every chain of ``shape`` (iid and wor) of the
    model's rows as Fractions; ``problem`` is "" when their laws are equal on all of them, else the first tree where
    they differ or UniVer's rule decided in floats."""
    model = model if model.exact else ExactRows(model)
    univer, bv = replace(VERIFIERS["univer"], rational=True), VERIFIERS["bv"]      # k = 1: module docstring
    trees = 0
    for process in ("iid", "wor"):
        for tree, _ in enumerate_trees(model, shape, process):
            p, q = model.node_probs(tree)
            law_bv = bv.law(tree, p, q, process)
            try:
                law_u = univer.law(tree, p, q, process)
            except ValueError as err:                 # a float decision on Fraction rows (engine.check_decision)
                return trees, f"UniVer's rule is not exact on chains: {err}"
            trees += 1
            if law_u != law_bv:
                return trees, f"UniVer's law differs from BV's on tree {tree.token} ({process})"
    return trees, ""


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
                diff = law_distance(law_u, law_bv)
                worst, joint = worst_of(worst, diff), worst_of(joint, float(Q) * diff)
                n_trees += 1
                if process == "iid":
                    e_bv += Q * bv.expected_accepted_length(tree, p, q, process)
                    e_u += float(Q) * univer.expected_accepted_length(tree, pf, qf, process)
        exact_trees, exact = _exact_mismatch(model, shape)
        if exceeds(joint, LAW_TOL):
            problems.append(f"{iid}: UniVer's joint law differs from BV by {joint:.2e}")
        if exceeds(worst, TREE_TOL):
            problems.append(f"{iid}: UniVer's law on a tree differs from BV by {worst:.2e}")
        if exact:
            problems.append(f"{iid}: in Fractions, {exact}")
        elif exact_trees != n_trees:
            problems.append(f"{iid}: in Fractions, {exact_trees} chains enumerated against {n_trees} in floats")
        if exceeds(abs(e_u - float(e_bv)), LAW_TOL):
            problems.append(f"{iid}: E[τ] UniVer {e_u:.12g} ≠ BV {float(e_bv):.12g}")
        chain_rows.append([iid, n_trees, str(e_bv) if isinstance(e_bv, Fraction) else float(e_bv), e_u, joint, worst,
                           "differ" if exact else "equal"])
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
        gap = worst_of(abs(e_u - lp.value), abs(e_u - closed))
        if exceeds(gap, ALPHA_TOL):
            problems.append(f"{iid}: UniVer E[τ] {e_u:.12g} vs α* LP {lp.value:.12g} / closed form {closed:.12g}")
        depth_rows.append([iid, cons, e_u, lp.value, closed, gap])
    passed = not problems
    worst_chain = worst_of(*((r[4], r) for r in chain_rows))[1]
    worst_tree = worst_of(*((r[5], r) for r in chain_rows))[1]
    worst_depth = worst_of(*((r[-1], r) for r in depth_rows))[1]
    n_exact = sum(row[-1] == "equal" for row in chain_rows)
    summary = (f"{len(chain_rows)} chain instances: UniVer == BV in Fractions on {n_exact}; in floats max joint-law "
               f"difference {worst_chain[4]:.1e} ({worst_chain[0]}), per tree {worst_tree[5]:.1e} ({worst_tree[0]}); "
               f"{len(depth_rows)} depth-1 instances: max |E[τ] − α*| {worst_depth[-1]:.1e} ({worst_depth[0]})"
               + ("" if passed else f"; {len(problems)} violation(s)") + ".")
    table = ("**Chains: UniVer vs Block Verification** (every enumerated chain T, iid and wor; E[τ] under iid; the "
             "joint law is Q(T)·P(path, Y | T); in Fractions: on the model's rows as Fractions)\n\n"
             + markdown_table(["instance", "trees", "BV E[τ]", "UniVer E[τ]", "max joint-law difference",
                               "max per-tree law difference", "in Fractions"], chain_rows)
             + "\n\n**Depth 1: UniVer vs the optimal flat multi-draft OT α***\n\n"
             + markdown_table(["instance", "UniVer construction", "UniVer E[τ]", "α* (LP)",
                               "α* (closed form)", "max difference"], depth_rows))
    if problems:
        table += "\n\n**Violations**\n\n" + "\n".join(f"- {p}" for p in problems[:30])
    return CheckResult(NAME, CLAIM, passed, table, summary)
