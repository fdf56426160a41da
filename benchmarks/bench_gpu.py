"""Batched torch verifiers (``gpu.verify``) vs the exact-core sampler looped over the same trees.

Cells: B trees of N nodes, V = 49152 (SmolLM2's vocabulary); methods TV, RRSw (UniVer opt-in) on wor-drafted
trees (random EAGLE-like shapes: each node's parent uniform among earlier nodes of depth < 4, so trees in a batch
differ).  ``--shape 2,2,2`` puts one uniform shape under every tree instead (N = its size): there every UniVer
node is planned in torch — i.i.d. children by the layout (:mod:`gpu.layout`, ``--process iid``), wor children by
:mod:`gpu.wor_plans`; on random shapes the slot rule too (:func:`solvers.slot_rule.slot_weights`, k = 3, 4, its
LPs by the batched lexicographic simplex of :mod:`solvers.lex_simplex`).  PTS's θ for k ≥ 3 wor children comes
from the exact core's sequential walk per distinct row (on the host for ``--device cuda`` too); ``--clock-walk
fixed_point`` times the batched fixed point instead (on the CPU its 24–29 passes at this V cost ~40× the walk).
Rows are float32 softmaxes of Gaussian logits (target) and noisy copies (draft).

Both sides verify the same B trees with the same rows, each tree once per repeat, and neither timing includes
building inputs: the batched side gets the ``[B, N, V]`` rows on the device and a fresh
:class:`gpu.TreeBatch` (its derived structure is computed inside the timing, as in a decode step), the loop
gets fresh :class:`univer_theory.DraftTree` objects and float64 numpy rows of every tree (converted
beforehand).  Sampling is timed without input checks on both sides (``gpu.verify(validate=False)``
vs :func:`univer_theory.engine.tree_sample` with the verifier's rule, made anew for every repeat: UniVer's plan
cache starts empty, a cold loop as in ``bench_verify.py``); the checks are timed separately
(``gpu.validate_inputs`` once per batch vs ``univer_theory.verifiers.validate_inputs`` per tree).  Printed
per cell: median ms over ``--repeat`` runs and the ratios loop / batched measured in this run.

Every batched call, and every loop, runs once untimed first (numba's cache load or compile; on a GPU also kernel
selection).
``--device cuda`` runs the batched side on a GPU (synchronising before reading the clock): it then measures the end-to-end speed-up of moving verification from a per-tree CPU loop to one batched
call on the device, transfers excluded (rows are created on the device).
Default grid: B ∈ {1, 8, 64}, N ∈ {8, 32}, methods TV and RRSw (under two minutes on a 2-core CPU);
``--full`` adds N = 64, ``--methods tv,rrsw,univer`` adds UniVer.  ``--threads`` sets torch's intra-op threads
(default: torch's choice); on a CPU shared with other jobs, ``--threads 1`` measures the code rather than
thread hand-off (with a busy second core, every multi-threaded op can wait milliseconds for its worker).
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time

import numpy as np
import torch

from gpu import TreeBatch, engine
from gpu.univer_rule import univer_rule
from gpu.verify import METHODS as BATCHED, engine_options
from gpu.wor_plans import WALKS
from gpu.drafting import sample_children
from gpu.verify import validate_inputs, verify
from univer_theory import VERIFIERS, DraftTree, TreeShape
from univer_theory.engine import tree_sample
from univer_theory.verifiers import validate_inputs as exact_validate_inputs

from bench_args import at_least, device_arg, known
from bench_verify import FOR_PROCESS, fresh_rule     # a sibling script (benchmarks/ is the script's path)


def random_batch(B, N, V, device, gen, process="wor", shape=None):
    """B trees of N nodes (random shapes, or ``shape`` for all), children drafted from q by ``process``, with
    rows ``[B, N, V]``."""
    p = torch.softmax(2.0 * torch.randn(B, N, V, generator=gen, device=device), -1)
    q = torch.softmax(torch.log(p) + 0.8 * torch.randn(B, N, V, generator=gen, device=device), -1)
    parent = torch.full((B, N), -1, dtype=torch.long)
    token = torch.full((B, N), -1, dtype=torch.long)
    rng = np.random.default_rng(0)
    for b in range(B):
        depth = [0]
        for v in range(1, N):
            u = shape.parent[v] if shape is not None else int(rng.choice([w for w in range(v) if depth[w] < 4]))
            parent[b, v] = u
            depth.append(depth[u] + 1)
        kids: dict = {}
        for v in range(1, N):
            kids.setdefault(int(parent[b, v]), []).append(v)
        for u, vs in kids.items():
            token[b, vs] = sample_children(q[b, u:u + 1].cpu(), len(vs), process).view(-1)
    return TreeBatch.from_tensors(parent, token, vocab_size=V, device=device), p, q


def batched_call(method: str, args, p, q, g):
    """``gpu.verify(b, p, q, ..., validate=False)`` of a batch ``b`` — for UniVer with a ``--clock-walk`` other than
    ``auto``, the same call's engine pass (:func:`gpu.engine.sample` with :func:`gpu.verify.engine_options`) on
    its rule with that walk."""
    if method == "univer" and args.clock_walk != "auto":
        rule, options = functools.partial(univer_rule, walk=args.clock_walk), engine_options(method, args.process)
        return lambda b: engine.sample(b, p, q, args.process, rule, g, **options)
    return lambda b: verify(b, p, q, args.process, method, g, validate=False)


def clock(device) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter()


def time_batched(fn, batch, device, repeat) -> float:
    """Median ms of ``fn(fresh copy of batch)``."""
    fresh = lambda: TreeBatch(batch.parent, batch.token, batch.num_nodes)   # derived structure not cached
    fn(fresh())                                         # warm-up: numba's cache load, CUDA's kernel selection
    times = []
    for _ in range(repeat):
        b = fresh()
        t = clock(device)
        fn(b)
        times.append((clock(device) - t) * 1e3)
    return statistics.median(times)


def time_loop(make, trees, rows, repeat) -> float:
    """Median over repeats of the summed ms of ``f(fresh tree, p rows, q rows)`` over the trees, with
    ``f = make()`` made anew before each repeat (untimed): a node rule made there starts with empty caches, so
    UniVer's loop is cold in every repeat (its exact core keeps plans per rule object).  The first of
    ``repeat + 1`` passes is not counted (numba's cache load or compile, lazy imports), as the batched side's."""
    times = []
    for _ in range(repeat + 1):
        fn, total = make(), 0.0
        for t, (pn, qn) in zip(trees, rows):
            tree = DraftTree(t.parent, t.token, t.vocab_size)
            start = time.perf_counter()
            fn(tree, pn, qn)
            total += time.perf_counter() - start
        times.append(total * 1e3)
    return statistics.median(times[1:])


def f64_rows(x) -> np.ndarray:
    """Float64 numpy rows renormalised for the exact core's 1e-9 simplex check."""
    a = x.double().cpu().numpy()
    return a / a.sum(-1, keepdims=True)


def check_args(ap, args) -> tuple:
    """One-line argparse errors, before anything is timed, for values the cells would fail on later; returns
    ``--shape`` as a TreeShape (None: random shapes) and the cells' node counts N."""
    try:
        shape = TreeShape.parse(args.shape) if args.shape is not None else None     # '' ran the random grid
    except ValueError as err:
        ap.error(f"--shape: {err}")
    device_arg(ap, args.device)
    Ns = (shape.num_nodes,) if shape else (8, 32, 64) if args.full else (8, 32)
    # wor children are distinct tokens: the widest node of --shape, or of a random shape (up to N − 1 children)
    widest = 1 if args.process == "iid" else shape.max_children if shape else max(Ns) - 1
    at_least(ap, [("--vocab", args.vocab, widest), ("--repeat", args.repeat, 1)]
             + ([] if args.threads is None else [("--threads", args.threads, 1)]))
    # RRSw is the without-replacement rule; on i.i.d. trees its counterpart RRS runs (as in bench_verify.py)
    args.methods = ",".join(FOR_PROCESS.get((m, args.process), m) for m in args.methods.split(","))
    known(ap, "--methods", args.methods, [m for m in BATCHED if args.process in VERIFIERS[m].processes])
    return shape, Ns


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--full", action="store_true", help="all cells: B ∈ {1, 8, 64}, N ∈ {8, 32, 64}")
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--repeat", type=int, default=3, help="runs per timing (median reported)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--process", default="wor", choices=["wor", "iid"])
    ap.add_argument("--shape", default=None, help="one TreeShape for every tree (e.g. 2,2,2); default random shapes")
    ap.add_argument("--methods", default="tv,rrsw",
                    help="comma-separated methods (tv, rrsw, univer); on random shapes univer's k ≥ 3 wor nodes "
                         "take seconds per batch at this V on the CPU, so it is opt-in")
    ap.add_argument("--clock-walk", default="auto", choices=list(WALKS),
                    help="how PTS's θ is found for k ≥ 3 wor children (gpu.univer_rule.univer_rule's walk)")
    args = ap.parse_args(argv)
    shape, Ns = check_args(ap, args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    gen = torch.Generator(device=args.device).manual_seed(0)
    Bs = (1, 8, 64)
    V = args.vocab
    print(f"device {args.device}, torch threads {torch.get_num_threads()}, V = {V}, float32 rows, {args.process} trees; "
          f"median of {args.repeat} runs, ms per batch (loop: summed over the same B trees)")
    print(f"{'B':>3} {'N':>3} {'method':>6} {'batched':>9} {'loop':>9} {'loop/batched':>13}")
    checks = []
    for B in Bs:
        for N in Ns:
            batch, p, q = random_batch(B, N, V, args.device, gen, args.process, shape)
            trees = batch.to("cpu").to_trees(V)
            rows = [(f64_rows(p[i, :t.num_nodes]), f64_rows(q[i, :t.num_nodes])) for i, t in enumerate(trees)]
            for method in args.methods.split(","):
                g = torch.Generator(device=args.device).manual_seed(1)
                t_b = time_batched(batched_call(method, args, p, q, g), batch, args.device, args.repeat)
                rng = np.random.default_rng(1)
                t_l = time_loop(lambda: functools.partial(tree_sample, process=args.process, rule=fresh_rule(method),
                                                          rng=rng), trees, rows, args.repeat)
                print(f"{B:>3} {N:>3} {method:>6} {t_b:>9.1f} {t_l:>9.1f} {t_l / t_b:>13.1f}", flush=True)
            v_b = time_batched(lambda b: validate_inputs("bench", b, p, q, args.process), batch, args.device, args.repeat)
            v_l = time_loop(lambda: functools.partial(exact_validate_inputs, "bench", process=args.process), trees,
                            rows, args.repeat)
            checks.append((B, N, v_b, v_l))
            del batch, p, q, rows
    print("input checks (once per batch vs per tree):")
    print(f"{'B':>3} {'N':>3} {'batched':>9} {'loop':>9} {'loop/batched':>13}")
    for B, N, v_b, v_l in checks:
        print(f"{B:>3} {N:>3} {v_b:>9.1f} {v_l:>9.1f} {v_l / v_b:>13.1f}")


if __name__ == "__main__":
    main()
