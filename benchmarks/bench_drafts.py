"""Draft models of SmolLM2-135M: forward cost relative to the target's, and per-token acceptance.

For each draft spec: the wall time of one incremental forward of ``Q`` tokens (``--q``, default 1 and 4) on a
cached context, divided by the target's on the same context — draft and target timed interleaved, ``--repeat``
times, min and median ratio reported — and the per-token acceptance ``α = 1 − TV(p, q)`` at temperature 1,
averaged over the positions of target-sampled continuations of MT-Bench prompts (the acceptance rate of one
drafted token under token-level speculative sampling; tokens per step of a chain follow from it).
One torch thread (``torch.set_num_threads(1)``).  Prints a table; ``--json`` writes the numbers.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu.llm.decode import feed_sequences, sample_plain  # noqa: E402
from gpu.llm.models import build_draft, load_target, ModelPair, parse_draft_spec  # noqa: E402
from gpu.llm.prompts import encode_prompt, load_prompts  # noqa: E402
from gpu.llm.ragged_cache import RaggedCache  # noqa: E402

from bench_args import at_least, output_path, write_text  # noqa: E402  (a sibling module)

#: The forms of :func:`gpu.llm.models.build_draft`'s specs (their ranges are checked once the target is loaded).
SPEC = re.compile(r"rtn:\d+:\d+|early:\d+|hf:.+")


def forward_seconds(cache: RaggedCache, q: int) -> float:
    """Seconds of one forward of ``q`` causal tokens on top of ``cache`` (the cache is restored)."""
    n = int(cache.lengths[0])
    start = time.perf_counter()
    cache.feed(torch.arange(q)[None] + 100, torch.arange(n, n + q)[None], torch.ones(1, q, q, dtype=torch.bool).tril())
    elapsed = time.perf_counter() - start
    cache.commit([[]])
    return elapsed


@torch.inference_mode()
def acceptance(target, draft, seqs) -> float:
    """Mean ``1 − TV(p, q)`` over the continuation positions of ``seqs`` (``(prompt, continuation)`` pairs)."""
    alphas = []
    for prompt, cont in seqs:
        ids = torch.tensor([prompt + cont])
        p = torch.softmax(target(ids).logits[0, len(prompt) - 1:-1].double(), -1)
        q = torch.softmax(draft(ids).logits[0, len(prompt) - 1:-1].double(), -1)
        alphas.append(1 - 0.5 * (p - q).abs().sum(-1))
    return float(torch.cat(alphas).mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafts", nargs="+", default=["rtn:4:32", "rtn:4:64", "rtn:4:128", "early:4", "early:12"],
                    help="draft specs (default rtn:4:32 rtn:4:64 rtn:4:128 early:4 early:12)")
    ap.add_argument("--prompts", type=int, default=3, help="MT-Bench prompts for the acceptance (default 3)")
    ap.add_argument("--tokens", type=int, default=32, help="continuation length per prompt (default 32)")
    ap.add_argument("--q", type=int, nargs="+", default=[1, 4], help="tokens per timed forward (default 1 4)")
    ap.add_argument("--repeat", type=int, default=7, help="interleaved timing repeats (default 7)")
    ap.add_argument("--json", type=output_path, default=None, help="write the numbers to this JSON file")
    args = ap.parse_args(argv)
    at_least(ap, [("--prompts", args.prompts, 1), ("--tokens", args.tokens, 1), ("--repeat", args.repeat, 1)]
             + [("--q", q, 1) for q in args.q])
    bad = [spec for spec in args.drafts if not SPEC.fullmatch(spec)]
    if bad:
        ap.error(f"--drafts: cannot read {bad}; expected rtn:BITS:GROUP, early:L or hf:DIR")
    for spec in args.drafts:                # ranges and folders too, before the target loads (were tracebacks)
        try:
            parse_draft_spec(spec, "--drafts")
        except ValueError as err:
            ap.error(str(err))
    torch.set_num_threads(1)
    target, tokenizer = load_target()
    try:
        drafts = {spec: build_draft(target, spec) for spec in args.drafts}
    except ValueError as err:               # early:L beyond the target's layers, known once it is loaded
        ap.error(str(err))
    pair = ModelPair(target, target, tokenizer, "target")
    seqs = []
    for i, prompt in enumerate(load_prompts("mtbench", args.prompts)):
        ids = encode_prompt(tokenizer, prompt)
        seqs.append((ids, list(sample_plain(pair, ids, 1.0, args.tokens, torch.Generator().manual_seed(i)).tokens)))
    context = seqs[0][0]
    caches = {name: RaggedCache(m, 1) for name, m in {"target": target, **drafts}.items()}
    for cache in caches.values():
        feed_sequences(cache, [context], 1)
    rows = {}
    for q in args.q:
        times = {name: [] for name in caches}
        for _ in range(args.repeat):                  # interleaved: target, each draft, again
            for name, cache in caches.items():
                times[name].append(forward_seconds(cache, q))
        for spec in drafts:
            ratios = [d / t for d, t in zip(times[spec], times["target"])]
            rows.setdefault(spec, {})[f"cost_q{q}"] = {"min": min(ratios), "median": statistics.median(ratios)}
        rows.setdefault("target", {})[f"ms_q{q}"] = 1e3 * statistics.median(times["target"])
    for spec, draft in drafts.items():
        rows[spec]["acceptance"] = acceptance(target, draft, seqs)
    print("target forward: " + ", ".join(f"Q={q} {rows['target'][f'ms_q{q}']:.1f} ms" for q in args.q))
    print(f"{'draft':12s} {'α = 1−TV':>9s} " + " ".join(f"{'cost Q=' + str(q) + ' min/med':>20s}" for q in args.q))
    for spec in drafts:
        r = rows[spec]
        print(f"{spec:12s} {r['acceptance']:9.3f} " +
              " ".join(f"{r[f'cost_q{q}']['min']:9.3f} /{r[f'cost_q{q}']['median']:7.3f}  " for q in args.q))
    print("cost = draft forward / target forward, same context, interleaved, one thread")
    if args.json:
        write_text(args.json, json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
