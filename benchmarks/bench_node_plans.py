"""Per-node plan cost of UniVer's constructions (theory.md §6.3) versus the vocabulary size V, and of the exact
LP (rule 1) versus the draft support m.  One run, printed tables; times are wall seconds of this machine.

Layout (rule 2) columns:
  targets   closed-form b(y), cut and blocks (sort + cumsum + cummin, O(V log V));
  realised  placing only the blocks that a random realised tuple touches, plus w(S) (what a verifier needs);
  full      placing every block (the whole layout: fractional densities, one tridiagonal scan per block);
  max block the largest block (tokens): its scan is O(n log n) array work, then O(G) per realised token.
wor-2 (rule 3) and PTS (rule 4) build their plans for wor children at the same (p, q).
The shape rule (``univer_theory.plans.shape_lp``: rule 1's LP with position weights) for a root with children
``((..),.)`` (k = 2), per node: ``exact`` :func:`~univer_theory.plans.lp_plan.lp_plan` one node at a time,
``batched`` :func:`gpu.condot.condot_weights` on ``--batch`` nodes at once (this CPU), and their ratio.  It applies only up to ``shape_lp.MAX_TUPLES`` tuples.
Every timed call runs once untimed first (:func:`bench_timing.warm_timed`: numba's cache load or compile,
solver start-up).

Run: ``python benchmarks/bench_node_plans.py [--vocab 100 1000 10000 130000] [--k 2 3] [--seed 0]``
"""
from __future__ import annotations

import argparse

import numpy as np

from univer_theory.plans.layout import PrivateLayout, layout_plan
import torch

from gpu.condot import condot_weights
from solvers.condot_simplex import CONDOT_CHUNK, tableau_entries
from univer_theory.plans import shape_lp
from univer_theory.plans.lp_plan import lp_plan
from univer_theory.plans.pts import pts_plan
from univer_theory.plans.wor_pair import wor_pair_plan
from univer_theory.processes import tuple_count

from bench_args import at_least     # sibling modules (benchmarks/ is the script's path)
from bench_timing import warm_timed


def llm_like(V: int, rng: np.random.Generator):
    """Zipf target; draft = the target shifted by a few ranks and log-normally perturbed (LLM-like pairs)."""
    z = 1.0 / np.arange(1, V + 1) ** 1.1
    q = np.roll(z, 3) * np.exp(rng.normal(0.0, 1.0, V))
    return z / z.sum(), q / q.sum()


def layout_row(p, q, k, rho, rng):
    """Layout columns of one (V, k) row: seconds of the targets, the realised tuple's blocks and every block, and
    the largest block's size and the number of blocks of more than one token."""
    make = lambda: layout_plan(p, q, rho, k, "iid")
    plan, t_targets = warm_timed(make)
    S = tuple(int(y) for y in rng.choice(p.size, size=k, p=q))
    _, t_real = warm_timed(lambda: plan.select(S), warm=lambda: make().select(S))
    targets = plan.info["layout"].targets
    blocks = np.diff(targets.bounds)
    place = lambda layout: [layout.block(i) for i in range(blocks.size)]          # PrivateLayout caches blocks
    fresh = PrivateLayout.build(targets)
    _, t_full = warm_timed(lambda: place(fresh), warm=lambda: place(PrivateLayout.build(targets)))
    return t_targets, t_real, t_full, int(blocks.max()), int((blocks > 1).sum())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, nargs="+", default=[100, 1000, 10_000, 130_000])
    ap.add_argument("--k", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--rho", type=float, default=1.0)
    ap.add_argument("--support", type=int, nargs="+", default=[4, 6, 8, 10, 12, 14])
    ap.add_argument("--batch", type=int, default=16, help="nodes per batched shape-rule call")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    # wor children are k distinct tokens (the shape rule's k = 2 too); numpy's generators take no negative seed
    widest = max(2, *args.k)
    at_least(ap, [("--k", k, 1) for k in args.k] + [("--vocab", V, max(args.k)) for V in args.vocab]
             + [("--support", m, widest) for m in args.support]
             + [("--batch", args.batch, 1), ("--seed", args.seed, 0)])
    if not 0 <= args.rho <= 1:
        ap.error(f"--rho must lie in [0, 1], got {args.rho}")
    too_big = [(m, k) for m in args.support for k in args.k if tableau_entries(m, k, "iid") > CONDOT_CHUNK]
    if too_big:                             # the exact LP's dense tableau (iid: the larger of the two processes)
        ap.error(f"--support m with --k k: rule 1's tableau exceeds CONDOT_CHUNK = 2^25 entries at (m, k) = "
                 f"{too_big[0]} (k = 3 reaches m = 14, k = 4 m = 7)")
    rng = np.random.default_rng(args.seed)
    print(f"Node plans vs V (LLM-like Zipf pairs, rho = {args.rho}); seconds")
    print(f"{'V':>7} {'k':>2} | {'targets':>8} {'realised':>8} {'full':>8} {'max block':>9} {'#multi':>6}"
          f" | {'wor-2':>8} {'pts':>8}")
    for V in args.vocab:
        p, q = llm_like(V, rng)
        for k in args.k:
            t_tg, t_re, t_full, big, multi = layout_row(p, q, k, args.rho, rng)
            t_w2 = warm_timed(lambda: wor_pair_plan(p, q, args.rho, k, "wor"))[1] if k == 2 else float("nan")
            t_pts = warm_timed(lambda: pts_plan(p, q, args.rho, k, "wor"))[1]
            print(f"{V:>7} {k:>2} | {t_tg:8.4f} {t_re:8.4f} {t_full:8.3f} {big:>9} {multi:>6}"
                  f" | {t_w2:8.4f} {t_pts:8.3f}")

    print("\nExact LP (rule 1) vs draft support m (Dirichlet(1) pairs); seconds")
    print(f"{'m':>3} {'k':>2} {'process':>7} | {'tuples':>7} {'time':>8}")
    for m in args.support:
        p, q = rng.dirichlet(np.ones(m)), rng.dirichlet(np.ones(m))
        for k in args.k:
            for process in ("iid", "wor"):
                plan, t = warm_timed(lambda: lp_plan(p, q, args.rho, k, process))
                n = tuple_count(m, k, process)
                print(f"{m:>3} {k:>2} {process:>7} | {n:>7} {t:8.3f}")

    print(f"\nShape rule vs draft support m, children ((..),.) (k = 2, MAX_TUPLES = {shape_lp.MAX_TUPLES}); "
          f"seconds per node, batched over {args.batch} nodes")
    print(f"{'m':>3} {'process':>7} | {'tuples':>7} {'exact':>8} {'batched':>8} {'exact/batched':>13}")
    shapes = ("(.,.)", ".")
    omega = shape_lp.position_weights(shapes)
    for m in args.support:
        rows = [(rng.dirichlet(np.ones(m)), rng.dirichlet(np.ones(m))) for _ in range(args.batch)]
        for process in ("iid", "wor"):
            if not shape_lp.applies(rows[0][1], shapes, process):
                continue
            _, t_exact = warm_timed(lambda: [lp_plan(p, q, args.rho, 2, process, omega) for p, q in rows])
            c, q = (torch.tensor(np.array(x)) for x in zip(*rows))
            kids = torch.tensor([[0, 1]] * args.batch)
            _, t_batch = warm_timed(lambda: condot_weights(args.rho * c, q, kids, process,
                                                      torch.tensor([omega] * args.batch, dtype=torch.float64)))
            n = tuple_count(m, 2, process)
            print(f"{m:>3} {process:>7} | {n:>7} {t_exact / args.batch:8.4f} {t_batch / args.batch:8.4f}"
                  f" {t_exact / t_batch:13.2f}")


if __name__ == "__main__":
    main()
