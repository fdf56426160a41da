"""Engine adapters (``gpu.engines``) vs the ``gpu.verify`` call they wrap: the adapters' added time.

Cells (default B = 64 requests, N = 16 slots, V = 49152, float32 rows; one torch thread unless ``--threads``):

* ``sglang-<method>``: :func:`gpu.engines.sglang_verify_tree` on SGLang's tensors (links stored in topological
  slot order, as SGLang's tree builder stores them) vs :func:`gpu.verify` on the same trees and rows (random
  shapes, wor children: ``bench_gpu.random_batch``);
* ``sglang-<method>-scrambled``: the links stored in a random slot order (the adapter reorders the tree and
  reads the rows where they are; the reference gets them in topological order);
* ``vllm-<method>``: :func:`gpu.engines.vllm_rejection_sample` on flattened chains of N − 1 draft tokens per
  request vs :func:`gpu.verify` on the chain batch with its rows laid out ``[B, N, V]`` (bonus row included).

Both sides validate their inputs and draw with the same seeded generator; each side gets fresh tensors of
indices (derived tree structure is computed inside the timing, as in a decode step).  The two sides alternate
within every repeat; per cell the min and median ms of each side and the ratio adapter / verify of both are
printed.  On a shared machine the difference of two ~100 ms timings is noise-dominated, so the adapter's own
steps (input conversion and output writing, everything it does besides ``gpu.verify``) are also timed alone,
alternating with the others, and reported as ``own`` ms and ``own / verify`` (min over min).  ``--json`` writes
the cells.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from bench_args import at_least, known, output_path, write_text
from bench_gpu import random_batch
from gpu import TreeBatch, verify
from gpu.engines import sglang, sglang_verify_tree, vllm, vllm_rejection_sample
from gpu.engines.sglang import uniform_draft_rows

#: SGLang methods timed on the wor-drafted trees (nss without draft rows); rrs verifies i.i.d. children only.
SGLANG_METHODS = ("nss", "rrsw", "tv", "univer")
#: vLLM's methods and the gpu.verify method each is on one chain.
VLLM_METHODS = {"sps": "rrs", "bv": "tv"}


def sglang_tensors(batch, perm):
    """SGLang's int64 tensors of ``batch`` with node v of tree b stored at slot ``perm[b, v]``."""
    B, N = batch.parent.shape
    first, nxt = batch.to_sglang()
    inv = torch.empty_like(perm).scatter_(1, perm, torch.arange(N).expand(B, N))
    move = lambda x: torch.where(x >= 0, perm.gather(1, x.clamp(min=0)), -1).gather(1, inv)
    cand = batch.token.clamp(min=0).gather(1, inv)
    return {"candidates": cand, "retrive_index": torch.arange(B * N).view(B, N),
            "retrive_next_token": move(first), "retrive_next_sibling": move(nxt)}


def interleaved(fns, repeat):
    """ms per call of each of ``fns``, called in turn (the order rotates every repeat)."""
    times = [[] for _ in fns]
    for r in range(repeat):
        for k in range(len(fns)):
            i = (k + r) % len(fns)
            t = time.perf_counter()
            fns[i]()
            times[i].append((time.perf_counter() - t) * 1e3)
    return times


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--repeat", type=int, default=7, help="timed runs per side (min and median reported)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--methods", default="nss,tv", help="SGLang methods (nss runs without draft rows)")
    ap.add_argument("--vllm-methods", default="sps,bv")
    ap.add_argument("--json", type=output_path, default=None, help="write the cells as JSON here")
    args = ap.parse_args(argv)
    # a random tree's widest node may have all N − 1 other nodes as wor children, which need as many tokens
    at_least(ap, (("--batch", args.batch, 1), ("--nodes", args.nodes, 2), ("--vocab", args.vocab, args.nodes - 1),
                  ("--repeat", args.repeat, 1), ("--threads", args.threads, 1)))
    known(ap, "--methods", args.methods, SGLANG_METHODS)
    known(ap, "--vllm-methods", args.vllm_methods, VLLM_METHODS)
    torch.set_num_threads(args.threads)
    B, N, V = args.batch, args.nodes, args.vocab
    gen = torch.Generator().manual_seed(0)
    batch, p, q = random_batch(B, N, V, "cpu", gen)
    fresh = lambda b: TreeBatch(b.parent.clone(), b.token.clone(), b.num_nodes.clone())
    cells = []

    def report(name, ta, tb, tc):
        cell = {"cell": name, "B": B, "N": N, "V": V, "verify_min_ms": min(ta), "verify_median_ms": statistics.median(ta),
                "adapter_min_ms": min(tb), "adapter_median_ms": statistics.median(tb),
                "own_min_ms": min(tc), "own_median_ms": statistics.median(tc)}
        cell["ratio_min"] = cell["adapter_min_ms"] / cell["verify_min_ms"]
        cell["ratio_median"] = cell["adapter_median_ms"] / cell["verify_median_ms"]
        cell["own_over_verify"] = cell["own_min_ms"] / cell["verify_min_ms"]
        cells.append(cell)
        print(f"{name:>24} {cell['verify_min_ms']:>9.1f} {cell['verify_median_ms']:>9.1f} {cell['adapter_min_ms']:>9.1f} "
              f"{cell['adapter_median_ms']:>9.1f} {cell['ratio_min']:>8.3f} {cell['ratio_median']:>8.3f} "
              f"{cell['own_min_ms']:>7.2f} {cell['own_over_verify']:>8.4f}", flush=True)

    print(f"torch threads {torch.get_num_threads()}, B = {B}, N = {N}, V = {V}, float32 rows; ms over {args.repeat} "
          f"interleaved runs per side")
    print(f"{'cell':>24} {'verify min':>9} {'median':>9} {'adapter min':>9} {'median':>9} {'min/min':>8} {'med/med':>8} "
          f"{'own min':>7} {'own/verify':>8}")
    rng = np.random.default_rng(1)
    scrambled = torch.tensor(np.stack([np.concatenate([[0], 1 + rng.permutation(N - 1)]) for _ in range(B)]))
    for method in args.methods.split(","):
        process = "iid" if method == "nss" else "wor"
        q_ref = uniform_draft_rows(p) if method == "nss" else q
        q_in = None if method == "nss" else q
        for tag, perm in (("", torch.arange(N).expand(B, N)), ("-scrambled", scrambled)):
            ints = sglang_tensors(batch, perm)
            p_in = torch.empty_like(p).scatter_(1, perm[:, :, None].expand(B, N, V), p)
            q_st = None if q_in is None else torch.empty_like(q).scatter_(1, perm[:, :, None].expand(B, N, V), q)
            g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
            b_in, p_r, q_r, r_i, order = sglang.tree_inputs(ints["candidates"], ints["retrive_next_token"],
                                                            ints["retrive_next_sibling"], p_in, q_st)
            res = verify(b_in, p_r, q_r, process, method, g1, row_index=r_i)
            outs = sglang.SGLangOutputs(torch.full((B * N,), -1, dtype=torch.int32),
                                        torch.full((B, b_in.max_depth + 1), -1, dtype=torch.int32),
                                        torch.zeros(B, dtype=torch.int32))

            def own():
                sglang.tree_inputs(ints["candidates"], ints["retrive_next_token"], ints["retrive_next_sibling"],
                                   p_in, q_st)
                sglang.fill_outputs(res, order, ints["candidates"], ints["retrive_index"], *outs)

            ta, tb, tc = interleaved([
                lambda: verify(fresh(batch), p, q_ref, process, method, g1),
                lambda: sglang_verify_tree(**ints, target_probs=p_in, draft_probs=q_st, method=method,
                                           process=process, generator=g2),
                own], args.repeat)
            report(f"sglang-{method}{tag}", ta, tb, tc)
            del p_in, q_st
    # vLLM: chains of N − 1 draft tokens per request
    chain = TreeBatch.from_tensors(torch.arange(-1, N - 1).expand(B, N), torch.cat(
        [torch.full((B, 1), -1), q[:, :-1].argmax(-1)], 1), vocab_size=V)
    ids = chain.token[:, 1:].reshape(-1)
    cu = torch.arange(1, B + 1) * (N - 1)
    bonus = torch.randint(0, V, (B, 1), generator=gen)
    p_flat, q_flat = p[:, :-1].reshape(-1, V).clone(), q[:, :-1].reshape(-1, V).clone()
    p_chain = p.clone()
    p_chain[:, -1] = torch.nn.functional.one_hot(bonus[:, 0], V).float()
    for method in args.vllm_methods.split(","):
        gpu_method = VLLM_METHODS[method]
        g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
        b_in, p_r, q_r, r_i, lengths, bon = vllm.tree_inputs(ids, cu, q_flat, p_flat, bonus)
        res = verify(b_in, p_r, q_r, "iid", gpu_method, g1, row_index=r_i)

        def own():
            vllm.tree_inputs(ids, cu, q_flat, p_flat, bonus)
            vllm.output_tokens(b_in, res, lengths, bon, N)

        ta, tb, tc = interleaved([
            lambda: verify(fresh(chain), p_chain, q, "iid", gpu_method, g1),
            lambda: vllm_rejection_sample(ids, cu, q_flat, p_flat, bonus, g2, method=method),
            own], args.repeat)
        report(f"vllm-{method}", ta, tb, tc)
    if args.json:
        write_text(args.json, json.dumps(cells, indent=1))


if __name__ == "__main__":
    main()
