"""Batched torch verifiers (``gpu.verify``) vs the exact-core sampler looped over the batch.

Grid: B ∈ {1, 8, 64} trees, N ∈ {8, 32, 64} nodes, V = 49152 (SmolLM2's vocabulary); methods TV and RRSw on
wor-drafted trees (random EAGLE-like shapes: each node's parent uniform among earlier nodes of depth < 4).
Rows are float32 softmaxes of Gaussian logits (target) and noisy copies (draft).  Printed per cell: ms per
batch for ``gpu.verify`` (inputs already validated, ``validate=False``), the one-off validation cost, ms per
batch for ``univer_theory``'s ``Verifier.sample`` looped over the trees (float64 numpy; timed on
``min(B, --loop-trees)`` trees and scaled to B), and the ratio loop / batched measured in this run.

``--device cuda`` runs the same script on a GPU (synchronising before reading the clock): it then measures
the batched kernels' wall time on the device against the same CPU loop — the end-to-end speed-up of moving
verification from a per-tree Python loop to one batched call, transfers excluded (rows are created on the
device).  The UniVer torch verifier is not implemented yet, so it is not in the grid.
``--quick`` runs B ∈ {1, 8}, N ∈ {8, 32} (~15 s on a loaded 2-core CPU; the full CPU grid takes minutes,
dominated by B = 64: each level allocates fresh ``[B·W, V]`` float32 temporaries, and on CPU their page faults
grow faster than linearly with B).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from gpu import TreeBatch, verify
from gpu.verify import validate_inputs
from gpu.drafting import sample_children
from univer_theory import VERIFIERS, DraftTree


def random_batch(B, N, V, device, gen):
    """B trees of N nodes (random shapes, wor children drafted from q) with rows ``[B, N, V]``."""
    p = torch.softmax(2.0 * torch.randn(B, N, V, generator=gen, device=device), -1)
    q = torch.softmax(torch.log(p) + 0.8 * torch.randn(B, N, V, generator=gen, device=device), -1)
    parent = torch.full((B, N), -1, dtype=torch.long)
    token = torch.full((B, N), -1, dtype=torch.long)
    rng = np.random.default_rng(0)
    for b in range(B):
        depth = [0]
        for v in range(1, N):
            u = int(rng.choice([w for w in range(v) if depth[w] < 4]))
            parent[b, v] = u
            depth.append(depth[u] + 1)
        kids: dict = {}
        for v in range(1, N):
            kids.setdefault(int(parent[b, v]), []).append(v)
        for u, vs in kids.items():
            token[b, vs] = sample_children(q[b, u:u + 1].cpu(), len(vs), "wor").view(-1)
    return TreeBatch.from_tensors(parent, token, vocab_size=V, device=device), p, q


def timed(fn, device, repeat):
    if device == "cuda":
        fn()                                  # warm-up (kernel selection, caching allocator)
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / repeat * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true", help="B ∈ {1, 8}, N ∈ {8, 32}")
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--loop-trees", type=int, default=2, help="trees timed in the exact-core loop (scaled to B)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1, like the numpy loop)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    gen = torch.Generator(device=args.device).manual_seed(0)
    Bs, Ns = ((1, 8), (8, 32)) if args.quick else ((1, 8, 64), (8, 32, 64))
    V = args.vocab
    print(f"device {args.device}, V = {V}, float32 rows; exact-core loop timed on ≤ {args.loop_trees} trees")
    print(f"{'B':>3} {'N':>3} {'method':>6} {'batched ms':>11} {'validate ms':>12} {'loop ms':>10} {'loop/batched':>13}")
    for B in Bs:
        for N in Ns:
            batch, p, q = random_batch(B, N, V, args.device, gen)
            t_val = timed(lambda: validate_inputs("bench", batch, p, q, "wor"), args.device, 1)
            trees = batch.to("cpu").to_trees()[:min(B, args.loop_trees)]
            f64 = lambda x: (lambda a: a / a.sum(-1, keepdims=True))(x.double().cpu().numpy())  # exact core: 1e-9
            rows = [(f64(p[b]), f64(q[b])) for b in range(len(trees))]
            for method in ("tv", "rrsw"):
                g = torch.Generator(device=args.device).manual_seed(1)
                t_b = timed(lambda: verify(batch, p, q, "wor", method, g, validate=False), args.device, 1)
                rng = np.random.default_rng(1)
                t0 = time.perf_counter()
                for t, (pn, qn) in zip(trees, rows):
                    VERIFIERS[method].sample(t, pn, qn, "wor", rng)
                t_loop = (time.perf_counter() - t0) * 1e3 / len(trees) * B
                print(f"{B:>3} {N:>3} {method:>6} {t_b:>11.1f} {t_val:>12.1f} {t_loop:>10.1f} {t_loop / t_b:>13.1f}")
            del batch, p, q


if __name__ == "__main__":
    main()
