"""UniVer's per-node plan cost at V = 49 152 (SmolLM2's vocabulary) and one binary:4 tree end to end.

Rows (float64): ``gauss`` — target softmax of N(0, 1) logits (temperature 1), draft = softmax(log p + 0.5·N(0, 1));
``peaky`` — target softmax of 3·N(0, 1) logits, draft = softmax(log p + N(0, 1)) (a perturbed p, LLM-like).

Part 1, per node (seconds, ρ ∈ {1, 0.5}, k = 2): the automatic choice (``choose_plan``) and its construction,
``w(S)`` on a realised tuple, and for wor the PTS availability walk before / after this change — the
exponential-clock quadrature (:func:`~univer_theory.plans.clocks.sequential_thinning_avail`, 400 nodes, the
construction used for k = 2 before) against the closed form
(:func:`~univer_theory.plans.pts.pair_thinning_avail`, used now), with their largest difference.
Part 1b, the i.i.d. layout (rule 2) per node, k ∈ {2, 3}, ρ ∈ {1, 0.5}: the largest block (tokens), the plan
(closed-form targets) and ``w(S)`` on a tuple drawn from the largest block (its tridiagonal densities and the
Gauss–Legendre integral), seconds.
Part 2: ``gpu.expected_accepted_length(..., "univer")`` on one binary:4 tree (15 internal nodes, k = 2) drafted
per process and row family, next to TV's: seconds, and the exact E[τ | T] of that one drafted tree T (not an
average over trees).

Every timed call runs once untimed first (:func:`bench_timing.warm_timed`: numba's cache load or compile,
lazy imports).

Run: ``python benchmarks/bench_univer_plans.py [--vocab 49152] [--seed 0]``
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from gpu import draft_tree, expected_accepted_length, sample_children
from univer_theory import TreeShape
from univer_theory.plans.choose import choose_plan
from univer_theory.plans.clocks import sequential_thinning_avail
from univer_theory.plans.layout import layout_plan
from univer_theory.plans.pts import pair_thinning_avail, priority_order

from bench_args import at_least, seed_below     # sibling modules (benchmarks/ is the script's path)
from bench_timing import warm_timed

FAMILIES = {"gauss": (1.0, 0.5), "peaky": (3.0, 1.0)}


def rows(V: int, family: str, gen: torch.Generator, n: int = 1):
    """``n`` (p, q) row pairs ``[n, V]`` float64 of one family (module docstring)."""
    scale, noise = FAMILIES[family]
    p = torch.softmax(scale * torch.randn(n, V, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(torch.log(p) + noise * torch.randn(n, V, generator=gen, dtype=torch.float64), -1)
    return p, q


def node_table(V: int, gen: torch.Generator):
    print(f"Part 1: one node, V = {V}, k = 2; seconds")
    print(f"{'rows':>6} {'proc':>4} {'rho':>4} | {'construction':>12} {'plan':>7} {'w(S)':>7} | "
          f"{'PTS before':>10} {'PTS after':>9} {'ratio':>6} {'max |Δavail|':>12}")
    for family in FAMILIES:
        for process in ("wor", "iid"):
            for rho in (1.0, 0.5):
                p, q = (x[0].numpy() for x in rows(V, family, gen))
                make = lambda: choose_plan(p, q, rho, 2, process)
                plan, t_plan = warm_timed(make)
                S = tuple(sample_children(torch.from_numpy(q)[None], 2, process, gen)[0].tolist())
                _, t_sel = warm_timed(lambda: plan.select(S), warm=lambda: make().select(S))
                extra = ""
                if process == "wor":
                    order = priority_order(p, q)
                    (a0, _), t0 = warm_timed(lambda: sequential_thinning_avail(q, order, rho * p, 2))
                    (a1, _), t1 = warm_timed(lambda: pair_thinning_avail(q, order, rho * p))
                    extra = f"{t0:>10.3f} {t1:>9.4f} {t0 / t1:>6.0f} {np.abs(a0 - a1).max():>12.1e}"
                print(f"{family:>6} {process:>4} {rho:>4} | {plan.construction:>12} {t_plan:>7.3f} {t_sel:>7.3f} | "
                      f"{extra}")


def layout_table(V: int, gen: torch.Generator):
    print(f"\nPart 1b: the i.i.d. layout at one node, V = {V}; seconds")
    print(f"{'rows':>6} {'k':>2} {'rho':>4} | {'block':>6} {'plan':>7} {'w(S)':>7}")
    rng = np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=gen)))
    for family in FAMILIES:
        for k in (2, 3):
            for rho in (1.0, 0.5):
                p, q = (x[0].numpy() for x in rows(V, family, gen))
                make = lambda: layout_plan(p, q, rho, k, "iid")
                plan, t_plan = warm_timed(make)
                t = plan.info["layout"].targets
                i = int(np.argmax(np.diff(t.bounds)))
                block = t.order[t.bounds[i]:t.bounds[i + 1]]
                S = tuple(int(y) for y in rng.choice(block, size=k))
                _, t_sel = warm_timed(lambda: plan.select(S), warm=lambda: make().select(S))
                print(f"{family:>6} {k:>2} {rho:>4} | {block.size:>6} {t_plan:>7.3f} {t_sel:>7.3f}")


def tree_table(V: int, gen: torch.Generator):
    shape = TreeShape.uniform([2, 2, 2, 2])
    N = shape.num_nodes
    print(f"\nPart 2: one drafted binary:4 tree T per row ({N} nodes, 15 internal, k = 2), V = {V}; seconds, and "
          f"the exact E[τ | T] of that one tree (not an average over trees)")
    print(f"{'rows':>6} {'proc':>4} | {'univer s':>8} {'E[τ|T]':>6} | {'tv s':>6} {'E[τ|T]':>6}")
    for family in FAMILIES:
        for process in ("wor", "iid"):
            p, q = rows(V, family, gen, N)
            batch, Q = draft_tree(shape, q, process, 1, gen)
            P = p[None]
            e_u, t_u = warm_timed(lambda: expected_accepted_length(batch, P, Q, process, "univer"))
            e_t, t_t = warm_timed(lambda: expected_accepted_length(batch, P, Q, process, "tv"))
            print(f"{family:>6} {process:>4} | {t_u:>8.3f} {float(e_u[0]):>6.3f} | {t_t:>6.3f} {float(e_t[0]):>6.3f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    at_least(ap, [("--vocab", args.vocab, 2)])          # wor children are k = 2 distinct tokens
    seed_below(ap, args.seed, 2 ** 64, "torch.Generator's")
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(args.seed)
    node_table(args.vocab, gen)
    layout_table(args.vocab, gen)
    tree_table(args.vocab, gen)


if __name__ == "__main__":
    main()
