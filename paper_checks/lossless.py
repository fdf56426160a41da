"""Claim 1 — every lossless method is exactly lossless; every bug-zoo variant is flagged.

Grid: V ∈ {3, 4}, shapes [1,1,1], [2,2], [3,1], [2,1,2] and the asymmetric ((..),.), every process (iid, wor,
topk, greedy, and SpecHub's hub where every internal node has two children: no method runs hub elsewhere),
Dirichlet family (similarity 0.4, concentration 0.8) and a peaky family (concentration 0.2), seeds 0–1
(``fast``: V = 3, seed 0, the Dirichlet family), plus confident instances
(:func:`paper_checks.instances.confident_instances`: near-deterministic drafts with tails 1e-8 … 1e-310 on the
same shapes, V ≤ 4, iid / wor; 12, ``fast`` 4), plus sparse rows (target and draft zeros, V = 5, seeds 0–1,
``fast`` 0) on [3,1] and ((..),.), iid and wor: the rows on which UniVer takes PTS at k = 3 (its clock path, on
no other row of the grid); the full grid adds one wide wor node (k = 6, V = 9, a confident row at PTS's cap:
:func:`wide_node_model`), the only node past k = 3 — the clock grid grows with k.  Float distance must be
≤ 1e-12; in Fraction mode (the rational methods — UniVer, K-SEQ and GR compute in floats — V = 3) it must be
exactly 0.  Lossy variants must show distance > 1e-6 on at least one instance.
"""
from __future__ import annotations

import numpy as np
from tqdm import tqdm

from univer_theory import BUG_ZOO, LOSSLESS_TOL, VERIFIERS, DirichletModel, TreeShape, context_free, evaluate
from univer_theory.plans.clocks import sequential_thinning_avail
from univer_theory.processes import EXACT_PROCESSES
from univer_theory.tolerance import worst_of

from .base import CheckResult, markdown_table
from .instances import RandomRowsModel, confident_instances

NAME = "lossless"
CLAIM = ("Every lossless verifier reproduces the target law exactly (distance ≤ 1e-12 in float, = 0 in "
         "Fraction mode); every bug-zoo variant is flagged (distance > 1e-6).")
SHAPES = ["1,1,1", "2,2", "3,1", "2,1,2", "((..),.)"]
#: Shapes of the sparse rows (target and draft zeros, :class:`~paper_checks.instances.RandomRowsModel`), V = 5.
SPARSE_SHAPES = ["3,1", "((..),.)"]
#: Every draft process of the exact core (SpecHub's ``hub`` on the shapes whose internal nodes have two children).
PROCESSES = EXACT_PROCESSES


def instances(fast: bool):
    """``(name, float model, Fraction model or None, shape, process)`` of the grid."""
    families = [("dirichlet", 0.8)] if fast else [("dirichlet", 0.8), ("peaky", 0.2)]
    for V in ((3,) if fast else (3, 4)):
        for seed in ((0,) if fast else (0, 1)):
            for fam, conc in families:
                fmodel = DirichletModel(V, seed=seed, similarity=0.4, concentration=conc)
                emodel = DirichletModel(V, seed=seed, similarity=0.4, concentration=conc, exact=True) if V == 3 else None
                for spec, shape in zip(SHAPES, map(TreeShape.parse, SHAPES)):
                    for process in PROCESSES:
                        if any(v.supports(shape, process) for v in VERIFIERS.values()):    # hub: two-child nodes
                            yield f"{fam}/V{V}/s{seed}/{spec}/{process}", fmodel, emodel, shape, process
    for seed in ((0,) if fast else (0, 1)):      # sparse rows: three children on a 4-token draft support take PTS
        model = RandomRowsModel(5, "sparse", seed, 0.4, context_free=False, min_support=3)   # at k = 3 (clocks)
        for spec in SPARSE_SHAPES:
            for process in ("iid", "wor"):
                yield f"sparse/V5/s{seed}/{spec}/{process}", model, None, TreeShape.parse(spec), process
    for inst in confident_instances(4 if fast else 12, 0, {shape: 4 for shape in SHAPES}):
        yield inst.name, inst.model, None, inst.shape, inst.process
    if not fast:
        yield "wide/V9/k6/wor", wide_node_model(), None, TreeShape.uniform([6]), "wor"


def wide_node_model():
    """One wor node of k = 6 children on a confident row (one sure token, seven tails at rate e^−30): the sure token's
    target mass sits 1e-15 above its availability Pr(y ∈ S), so a clock integral that under-resolves the 6th arrival
    (plans.clocks.clock_nodes) puts PTS past its cap ρp — 1.2e-12 with 400 nodes and numpy's Legendre weights."""
    V, k, tail = 8, 6, np.exp(-30.0)
    q = np.r_[np.full(V, tail), 0.0]
    q[0] = 1.0 - (V - 1) * tail
    avail, _ = sequential_thinning_avail(q, range(V), np.r_[1.0, np.zeros(V)], k)
    p = np.r_[min(avail[0] + 1e-15, 1.0 - 4 * tail), np.full(V - 1, 0.5 * tail), 0.0]
    p[-1] = 1.0 - p.sum()
    return context_free(p, q)


def run(fast: bool, out_dir, progress: bool = True) -> CheckResult:
    methods = {**VERIFIERS, **BUG_ZOO}
    cells: dict[str, dict[str, str]] = {m: {} for m in methods}
    ok, flagged = True, {name: False for name in BUG_ZOO}
    worst, worst_at = 0.0, "–"
    for iid, fmodel, emodel, shape, process in tqdm(list(instances(fast)), desc="lossless", disable=not progress):
        for name, v in methods.items():
            if not v.supports(shape, process):
                continue
            d = float(evaluate(fmodel, shape, process, v).distance)
            exact_zero = None
            if emodel is not None and v.rational and v.lossless:
                exact_zero = evaluate(emodel, shape, process, v).distance == 0
            if v.lossless:
                good = d <= LOSSLESS_TOL and exact_zero is not False
                ok &= good
                worst, worst_at = worst_of((worst, worst_at), (d, f"{name} on {iid}"))
                cells[name][iid] = ("✓" if good else "✗") + ("=" if exact_zero else "")
            else:
                flagged[name] |= d > 1e-6
                cells[name][iid] = "flagged" if d > 1e-6 else "·"
    passed = ok and all(flagged.values())
    cols = [i[0] for i in instances(fast)]
    rows = []
    for name, by in cells.items():
        if by:
            n_ok = sum(c.startswith("✓") or c == "flagged" for c in by.values())
            rows.append([name, "lossless" if methods[name].lossless else "lossy", f"{n_ok}/{len(by)}",
                         sum(c.endswith("=") for c in by.values())])
    table = markdown_table(["method", "kind", "✓ (lossless) / flagged (lossy) of instances",
                            "exact-zero in Fraction mode"], rows)
    matrix = markdown_table(["method"] + [c.replace("/", " ") for c in cols],
                            [[n] + [by.get(c, "") for c in cols] for n, by in cells.items() if by])
    summary = (f"{len(cols)} instances; worst float distance of a lossless method {worst:.2e} ({worst_at}); lossy "
               f"variants flagged: {sum(flagged.values())}/{len(flagged)}.")
    return CheckResult(NAME, CLAIM, passed, table + "\n\n<details><summary>method × instance</summary>\n\n"
                       + matrix + "\n\n</details>", summary)
