"""Claim 1 — every lossless method is exactly lossless; every bug-zoo variant is flagged.

Grid: V ∈ {3, 4}, shapes [1,1,1], [2,2], [3,1], [2,1,2] and the asymmetric ((..),.), every process (iid, wor,
topk, greedy, and SpecHub's hub where every internal node has two children: no method runs hub elsewhere),
Dirichlet family (similarity 0.4, concentration 0.8) and a peaky family (concentration 0.2), seeds 0–1
(``fast``: V = 3, seed 0, the Dirichlet family), plus confident instances
(:func:`paper_checks.instances.confident_instances`: near-deterministic drafts with tails 1e-8 … 1e-310 on the
same shapes, V ≤ 4, iid / wor; 12, ``fast`` 4).  Float distance must be ≤ 1e-12; in Fraction mode (the rational
methods — UniVer, K-SEQ and GR compute in floats — V = 3) it must be exactly 0.  Lossy variants must show
distance > 1e-6 on at least one instance.
"""
from __future__ import annotations

from tqdm import tqdm

from univer_theory import BUG_ZOO, LOSSLESS_TOL, VERIFIERS, DirichletModel, TreeShape, evaluate
from univer_theory.processes import EXACT_PROCESSES

from .base import CheckResult, markdown_table
from .instances import confident_instances

NAME = "lossless"
CLAIM = ("Every lossless verifier reproduces the target law exactly (distance ≤ 1e-12 in float, = 0 in "
         "Fraction mode); every bug-zoo variant is flagged (distance > 1e-6).")
SHAPES = ["1,1,1", "2,2", "3,1", "2,1,2", "((..),.)"]
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
    for inst in confident_instances(4 if fast else 12, 0, {shape: 4 for shape in SHAPES}):
        yield inst.name, inst.model, None, inst.shape, inst.process


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
                if d > worst:
                    worst, worst_at = d, f"{name} on {iid}"
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
