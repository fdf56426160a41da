"""Global tree LP (theory.md §4.3): solve time against the number of enumerated trees.

For a range of (V, shape, process) up to a few 10⁵ trees: enumeration time, trees → string-set classes,
LP size, HiGHS time and total time, with the class reduction (default) and, on the smaller cases, without
it (the literal position-indexed LP on every tree).  Prints a table and saves a log-log plot.

    python benchmarks/bench_global_lp.py [--out results/global_lp_scaling.png] [--full]

``--full`` adds V = 8, shape [2,2], wor (1.8·10⁵ trees, 2.2·10⁴ classes: ~11 s with its enumeration on the 2-core
AMD host, 2026-12-06).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from solvers.global_lp import enumerate_tree_arrays, global_tree_lp
from univer_theory import DirichletModel
from univer_theory.models import SEED_LIMIT

from bench_args import image_path, seed_below     # a sibling module (benchmarks/ is the script's path)

CASES = [(4, "2,2", "wor"), (4, "2,2", "iid"), (3, "2,1,2", "iid"), (5, "2,2", "wor"), (5, "2,2", "iid"),
         (6, "2,2", "wor"), (4, "3,2", "wor"), (7, "2,2", "wor"), (7, "2,2", "iid"), (3, "2,2,2", "wor"),
         (5, "3,2", "wor")]
FULL_CASES = [(8, "2,2", "wor")]
#: The unreduced LP is solved only up to this many trees (it grows faster than linearly).
UNREDUCED_MAX_TREES = 20_000


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=image_path, default="results/global_lp_scaling.png",
                        help="path of the log-log plot (PNG)")
    parser.add_argument("--full", action="store_true", help="add the largest case (V = 8 2,2 wor, ~11 s)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    seed_below(parser, args.seed, SEED_LIMIT, "DirichletModel's")    # (its error came after the table had begun)

    rows = []
    print(f"{'V':>2} {'shape':<7}{'proc':<5}{'trees':>9}{'classes':>9}{'vars':>9}{'rows':>9}"
          f"{'enum s':>8}{'HiGHS s':>9}{'total s':>9}{'unreduced s':>12}  E[tau] bound")
    for V, shape, process in CASES + (FULL_CASES if args.full else []):
        model = DirichletModel(V, seed=args.seed, similarity=0.4)
        t0 = time.perf_counter()
        trees = enumerate_tree_arrays(model, shape, process)
        enum_s = time.perf_counter() - t0
        res = global_tree_lp(model, shape, process, trees=trees)
        unreduced = None
        if trees.num_trees <= UNREDUCED_MAX_TREES:
            full = global_tree_lp(model, shape, process, trees=trees, reduce=False)
            assert abs(full.value - res.value) <= 1e-9, (full.value, res.value)
            unreduced = full.seconds
        rows.append((trees.num_trees, res.classes, res.seconds + enum_s, unreduced))
        print(f"{V:>2} {shape:<7}{process:<5}{res.trees:>9}{res.classes:>9}{res.variables:>9}{res.constraints:>9}"
              f"{enum_s:>8.2f}{res.solve_seconds:>9.2f}{res.seconds + enum_s:>9.2f}"
              f"{'' if unreduced is None else f'{unreduced:.2f}':>12}  {res.value:.9f}  {'' if res.success else res.message}")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog([r[0] for r in rows], [r[2] for r in rows], "o", label="class-reduced LP (default)")
    small = [r for r in rows if r[3] is not None]
    ax.loglog([r[0] for r in small], [r[3] for r in small], "s", label="position-indexed LP on every tree")
    ax.set_xlabel("enumerated trees")
    ax.set_ylabel("wall time [s] (enumeration + build + HiGHS)")
    ax.set_title("Global tree LP scaling")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"plot saved to {out}")


if __name__ == "__main__":
    main()
