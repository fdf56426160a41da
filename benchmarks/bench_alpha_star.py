"""Closed-form α* (univer_theory.alpha_star) against the CondOT LP (solvers.condot_lp), and α* alone at LLM
vocabulary sizes.  One run prints both tables; every time is the median of ``--repeats`` runs
(``time.perf_counter``), and "speed-up" is LP time / closed-form time measured in this run.

    python benchmarks/bench_alpha_star.py [--repeats 3] [--seed 0] [--large 32000 128000]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from solvers import condot_lp
from univer_theory.alpha_star import alpha_star

from bench_args import at_least     # a sibling module (benchmarks/ is the script's path)


def median_ms(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times)), out


def instance(rng: np.random.Generator, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """A peaky target and a draft that partly agrees with it (Dirichlet(0.5) rows, 30 % shared)."""
    p = rng.dirichlet(np.full(vocab, 0.5))
    q = 0.3 * p + 0.7 * rng.dirichlet(np.full(vocab, 0.5))
    return p, q


def small_table(rng, repeats: int) -> None:
    print("closed-form α* vs CondOT LP (ρ = 1)")
    print(f"{'V':>4} {'k':>2} {'process':>7} {'tuples':>7} {'|α_fast − α_LP|':>16} {'LP ms':>9} {'fast ms':>9} "
          f"{'speed-up':>9}")
    for vocab in (6, 8, 10):
        p, q = instance(rng, vocab)
        for k in (2, 3):
            for process in ("iid", "wor"):
                lp_ms, lp = median_ms(lambda: condot_lp(p, q, 1.0, k, process), repeats)
                fast_ms, fast = median_ms(lambda: alpha_star(p, q, k, process), repeats)
                status = "" if lp.success else f"  LP: {lp.message}"
                print(f"{vocab:>4} {k:>2} {process:>7} {len(lp.tuples):>7} {abs(fast - lp.value):>16.2e} "
                      f"{lp_ms:>9.2f} {fast_ms:>9.3f} {lp_ms / fast_ms:>8.0f}×{status}")


def large_table(rng, repeats: int, vocabs) -> None:
    print("\nclosed-form α* alone (ρ = 1)")
    print(f"{'V':>7} {'k':>2} {'process':>7} {'α*':>10} {'ms':>10}")
    for vocab in vocabs:
        p, q = instance(rng, vocab)
        for process in ("iid", "wor"):
            for k in (2, 3):
                ms, value = median_ms(lambda: alpha_star(p, q, k, process), repeats)
                print(f"{vocab:>7} {k:>2} {process:>7} {value:>10.6f} {ms:>10.2f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--large", type=int, nargs="*", default=[32_000, 128_000])
    args = parser.parse_args(argv)
    # k = 3 children without replacement need 3 tokens; numpy's generators take no negative seed
    at_least(parser, [("--repeats", args.repeats, 1), ("--seed", args.seed, 0)]
             + [("--large", vocab, 3) for vocab in args.large])
    rng = np.random.default_rng(args.seed)
    alpha_star(*instance(rng, 4), 3, "wor")  # builds the cached quadrature rule outside the timings
    small_table(rng, args.repeats)
    large_table(rng, args.repeats, args.large)


if __name__ == "__main__":
    main()
