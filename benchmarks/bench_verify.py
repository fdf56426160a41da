"""Cost of one verification step: ``gpu.verify`` against the target's tree forward, batched against the exact
per-tree loop, and α*(ρ) at a large vocabulary — one run, ratios measured in it, one torch thread.

Sections (all printed as a table, and as one JSON object with ``--json``):

* ``alpha_star``: ``univer_theory.alpha_star`` for wor and iid, k = 3, on one Zipf row pair at ``--alpha-vocab``
  (default 128 000); the clock grid is built once before timing (a process-wide cache).  ``wor_torch``: the
  same function on the same row as torch tensors (``alpha_star_rows``, the batched layer's call, a batch of one).
* ``synthetic``: Zipf rows (``p ∝ rank^{-1.1}`` over a random permutation per node, ``q = norm(p·e^{0.8 z})``,
  float64) at V = ``--vocab``, trees of each ``--shapes`` skeleton drafted by ``gpu.drafting.draft_tree`` for
  each ``--processes``, ``--batches`` trees at a time.  Per method (univer, rrsw — rrs on i.i.d. trees —, tv):
  ``batched`` = one ``gpu.verify(validate=False)`` of the B trees on the batch a decode step of their skeleton
  builds (:meth:`gpu.TreeBatch.with_tokens`: the skeleton's structure derived once), ``structure`` = a fresh
  ``TreeBatch`` of them and its derived structure (what a step with a new skeleton adds); ``loop`` =
  ``univer_theory.engine.tree_sample`` per tree with a fresh node rule (UniVer's plan cache empty: a cold
  run); ``batched_over_loop`` = loop / batched (the speed-up of batching, > 1 is faster).  On truncated drafts
  also ``scan`` = ``gpu.support.scan`` of the internal nodes' rows alone (the one read of every draft row, and of
  the target rows at the drafted tokens, that a batched call starts with; compiled) and ``loop_over_scan`` = loop
  / scan: the most ``batched_over_loop`` a verifier that reads each draft row once at that speed can reach.  With the target
  model available (``--no-model`` skips it) and B = 1: ``forward`` = SmolLM2's forward of the same tree after a
  fixed context (``gpu.llm.decode.score_trees``, the decoder's one target forward per step: the context's
  last token and the tree's nodes) and ``verify_over_forward`` = batched / forward.
* ``real`` (``--real-trees`` > 0): trees drafted by SmolLM2's RTN-4 draft (``gpu.llm.tree_draft``) after the
  first MT-Bench prompt at T = 1, scored by the target; ``verify_over_forward`` per method per tree.

``--draft-top`` (a comma list; ``all`` = the whole row): every case is also run with the draft truncated to its m
most likely tokens per row (``gpu.probs.probs_from_logits(..., top=m)``, on SmolLM2's draft logits and on
``log q`` of the Zipf rows) — a draft process of its own, verified exactly against its truncated
rows, on which every method plans a level over m + 1 columns (:mod:`gpu.support`).  Rows carry
``draft_top`` (null: the whole row).

Timing: ``time.perf_counter``, ``torch.set_num_threads(1)``; within a repeat every variant runs once, in a
fixed interleaved order (forward, then each method's batched and loop), and min and median over
``--repeat`` repeats are reported; ratios use the medians.  Every timed call runs once untimed first (numba's
cache load or compile, lazy imports, CUDA's start-up).  In the SmolLM2 section the first method (UniVer) runs
right after the forward, the others after it.  Memory: ``peak_mb`` is the rise of the process's
peak resident set (``VmHWM`` of ``/proc/self/status``, reset through ``/proc/self/clear_refs`` before the call,
after the C heap's free memory is handed back — else a call reusing what earlier calls freed reads ~0 MB;
numpy and torch CPU allocations alike; ``null`` where that interface is missing) for one batched call and
for one loop, beside ``inputs_mb``, the size of the B trees' p and q rows.

``--device cuda`` (with ``--no-model``: the SmolLM2 forward runs on the CPU) runs the batched side — ``batched``,
``scan`` and ``wor_torch`` — on that device: the rows are drafted on the CPU and copied there before timing, the
clock is read after
``torch.cuda.synchronize()``, and ``peak_mb_batched`` is the rise of the device's peak allocated memory
(``torch.cuda.max_memory_allocated``) over what was allocated before the call.  The loop stays on the CPU, so
``batched_over_loop`` is the speed-up of moving verification from the per-tree CPU loop to one batched call on the
device.

    python benchmarks/bench_verify.py [--json] [--repeat 3] [--real-trees 2] [--draft-top all,64]
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import statistics

import numpy as np
import torch

from gpu import TreeBatch, verify
from gpu.drafting import draft_tree
from gpu.probs import probs_from_logits
from gpu.support import scan
from gpu.tree_batch import STRUCTURE
from univer_theory import VERIFIERS
from univer_theory.alpha_star import alpha_star, alpha_star_rows
from univer_theory.engine import tree_sample
from univer_theory.multidraft import FlatPlanRule
from univer_theory.plans.clocks import clock_nodes, log_time_grid, log_time_upper
from univer_theory.univer import UniVerRule

from bench_args import at_least, device_arg, known     # sibling modules (benchmarks/ is the script's path)
from bench_timing import repeated_times

METHODS = ("univer", "rrsw", "tv")
#: RRSw is the without-replacement rule; on i.i.d. children its counterpart is RRS.
FOR_PROCESS = {("rrsw", "iid"): "rrs"}


# ----------------------------------------------------------------------------------------- measuring
def on(device: torch.device, fn):
    """``fn`` that returns only once ``device`` has finished its work (CUDA runs asynchronously)."""
    if device.type != "cuda":
        return fn

    def run():
        out = fn()
        torch.cuda.synchronize(device)
        return out
    return run


def summary(times: list[float]) -> dict:
    return {"min_ms": 1e3 * min(times), "median_ms": 1e3 * statistics.median(times)}


def _status_kb(field: str):
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return None


def _trim_heap() -> None:
    """Hand the C allocator's free memory back to the OS (glibc's ``malloc_trim``; nothing elsewhere): what the
    warm-up and timed calls freed stays resident otherwise, and a call that reuses it raises no RSS."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass


def peak_mb(fn, device: torch.device = torch.device("cpu")):
    """Rise of the peak resident set during ``fn()`` in MB (None where /proc does not offer it), the heap's free
    memory handed back first (:func:`_trim_heap`); on a CUDA device the rise of its peak allocated memory over
    what was allocated before."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    _trim_heap()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                                   # resets VmHWM to the current RSS
    except OSError:
        return None
    before = _status_kb("VmRSS")
    fn()
    after = _status_kb("VmHWM")
    return None if before is None or after is None else max(0, after - before) / 1024


# ----------------------------------------------------------------------------------------- rows and trees
def zipf_rows(shape: tuple, V: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``p ∝ rank^{-1.1}`` over a random permutation per row, ``q = norm(p·e^{0.8 z})``, float64 ``[*shape, V]``."""
    log_rank = torch.log(torch.arange(1, V + 1, dtype=torch.float64))
    perm = torch.argsort(torch.rand(*shape, V, generator=gen), dim=-1)
    log_p = torch.log_softmax(-1.1 * log_rank[perm], dim=-1)
    q = torch.softmax(log_p + 0.8 * torch.randn(*shape, V, generator=gen, dtype=torch.float64), dim=-1)
    return log_p.exp(), q


def draft_tops(text: str) -> list[int | None]:
    """``--draft-top``: ``all`` (None) or positive ints."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if item != "all" and not (item.isdigit() and int(item) > 0):
            raise ValueError(f"--draft-top: expected 'all' or a positive int, got {item!r}")
        out.append(None if item == "all" else int(item))
    return out


def shape_specs(text: str) -> list[str]:
    """``--shapes``: tree_shape specs, comma-separated — a comma inside parentheses (``((.,.),.)``) or between
    digits (``3,2``, one uniform TreeShape.parse string) is part of its spec."""
    out, depth = [""], 0
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            out.append("")
        else:
            out[-1] += ch
    specs = []
    for item in (x.strip() for x in out):
        if specs and item.isdigit() and specs[-1].replace(",", "").isdigit():
            specs[-1] += "," + item
        else:
            specs.append(item)
    return specs


def methods(args, process: str) -> list[str]:
    return [FOR_PROCESS.get((m, process), m) for m in args.methods.split(",")]


def fresh_rule(method: str):
    """The method's node rule with empty caches (UniVer and the flat-plan rules, GR's, keep plans per rule
    object)."""
    rule = VERIFIERS[method].rule
    if method == "univer":
        return UniVerRule()
    if isinstance(rule, FlatPlanRule):
        return FlatPlanRule(rule.name, rule.build, rule.processes)
    return rule


def loop_call(method, trees, rows, process):
    rng = np.random.default_rng(1)

    def run():
        rule = fresh_rule(method)
        for tree, (pn, qn) in zip(trees, rows):
            tree_sample(tree, pn, qn, process, rule, rng)
    return run


def batched_call(method, batch, p, q, process):
    """One ``gpu.verify`` of the trees on the batch a decode step of their fixed skeleton builds: the drafted tokens
    on a batch sharing the skeleton's derived structure (:meth:`gpu.TreeBatch.with_tokens` of ``batch``, which
    :func:`gpu.drafting.draft_tree` drafted with that structure already derived — the loop's trees, too, are built
    once).  A new skeleton's structure is :func:`structure_call`."""
    gen = torch.Generator(device=p.device).manual_seed(1)
    return on(p.device, lambda: verify(batch.with_tokens(batch.token), p, q, process, method, gen, validate=False))


def structure_call(batch):
    """A fresh batch of the trees and its derived structure (:data:`gpu.tree_batch.STRUCTURE`): what a step whose
    skeleton is new (a dynamic tree) adds to ``batched``."""
    return lambda: [getattr(TreeBatch(batch.parent, batch.token, batch.num_nodes), name) for name in STRUCTURE]


def scan_call(batch, p, q):
    """The drafted-support scan of the batch's internal nodes' rows alone (module docstring: ``scan``)."""
    src = (batch.num_children > 0).flatten().nonzero().squeeze(1)
    V = p.shape[-1]
    return on(p.device, lambda: scan(p.reshape(-1, V), q.reshape(-1, V), src))


# ----------------------------------------------------------------------------------------- sections
#: Children of the α*(ρ) section's node (wor: at most ``--alpha-vocab`` of them).
ALPHA_K = 3


def alpha_star_section(V: int, repeat: int, device: torch.device) -> dict:
    gen = torch.Generator().manual_seed(0)
    p, q = (x.numpy() for x in zipf_rows((), V, gen))
    log_time_grid(clock_nodes(ALPHA_K), log_time_upper(float(q.min())))  # the process-wide grid cache, untimed
    out = {"vocab": V, "k": ALPHA_K, "torch_device": str(device)}
    tp, tq = (torch.from_numpy(x)[None].to(device) for x in (p, q))
    rho = torch.ones(1, dtype=torch.float64, device=device)
    times = repeated_times({"wor": lambda: alpha_star(p, q, ALPHA_K, "wor"),
                            "iid": lambda: alpha_star(p, q, ALPHA_K, "iid"),
                            "wor_torch": on(device, lambda: alpha_star_rows(tp, tq, ALPHA_K, "wor", rho))}, repeat)
    for process, t in times.items():
        out[process] = summary(t)
    out["wor_over_iid"] = out["wor"]["median_ms"] / out["iid"]["median_ms"]
    return out


class Target:
    """SmolLM2's tree forward after a fixed context (``gpu.llm.decode.score_trees``) and its draft's trees."""

    def __init__(self):
        from gpu.llm.decode import feed_sequences, start_caches
        from gpu.llm.models import load_pair
        from gpu.llm.prompts import encode_prompt, load_prompts

        self.pair = load_pair()
        self.ids = encode_prompt(self.pair.tokenizer, load_prompts("mtbench", limit=1)[0])
        with torch.inference_mode():
            self.cache, self.draft_cache, self.root, pending = start_caches(self.pair, [self.ids])
            self.draft_logits = feed_sequences(self.draft_cache, pending, 1)[:, -1]

    def forward(self, batch):
        """Target logits ``[N, V]`` of the one tree of ``batch``; the cache is back at the context afterwards."""
        from gpu.llm.decode import score_trees
        with torch.inference_mode():
            logits = score_trees(self.cache, batch, self.root)[0]
            self.cache.commit([[]])
        return logits

    def draft(self, shape, process, gen, top=None):
        """``(batch, draft rows [1, N, V])`` of one tree drafted after the context (from the ``top`` most likely
        tokens of each row when given)."""
        from gpu.llm.tree_draft import draft_tree_cached
        with torch.inference_mode():
            batch, q, _, _ = draft_tree_cached(self.draft_cache, self.draft_logits, shape, process, 1.0, gen,
                                               top=top)
            self.draft_cache.commit([[]])
        return batch, q


def synthetic_section(args, target) -> list[dict]:
    from gpu.llm.tree_draft import tree_shape

    device = torch.device(args.device)
    rows_out = []
    gen = torch.Generator().manual_seed(0)
    for spec in shape_specs(args.shapes):
        shape = tree_shape(spec)
        N = shape.num_nodes
        for process, top in ((pr, t) for pr in args.processes.split(",") for t in draft_tops(args.draft_top)):
            for B in (int(b) for b in args.batches.split(",")):
                p, q = zipf_rows((B, N), args.vocab, gen)
                if top is not None:      # the top-m draft process, as SmolLM2's draft gets it
                    q = probs_from_logits(q.log(), 1.0, top)
                batch, q = draft_tree(shape, q, process, B, gen)
                trees = batch.to_trees(args.vocab)
                rows = [(p[i].numpy(), q[i].numpy()) for i in range(B)]
                calls = {"structure": structure_call(batch)}
                dev = (batch, p, q) if device.type == "cpu" else (batch.to(device), p.to(device), q.to(device))
                if top is not None:
                    calls["scan"] = scan_call(*dev)
                if target is not None and B == 1:
                    calls["forward"] = lambda: target.forward(batch)
                for method in methods(args, process):
                    calls[f"{method} batched"] = batched_call(method, *dev, process)
                    calls[f"{method} loop"] = loop_call(method, trees, rows, process)
                times = repeated_times(calls, args.repeat)
                inputs_mb = 2 * p.numel() * 8 / 2**20
                for method in methods(args, process):
                    b, lp = summary(times[f"{method} batched"]), summary(times[f"{method} loop"])
                    row = {"rows": "zipf", "shape": spec, "nodes": N, "process": process, "draft_top": top, "B": B,
                           "method": method, "vocab": args.vocab, "batched": b, "loop": lp,
                           "batched_over_loop": lp["median_ms"] / b["median_ms"],
                           "structure": summary(times["structure"]), "inputs_mb": inputs_mb,
                           "device": str(device), "peak_mb_batched": peak_mb(calls[f"{method} batched"], device),
                           "peak_mb_loop": peak_mb(calls[f"{method} loop"])}
                    if "scan" in times:
                        row["scan"] = summary(times["scan"])
                        row["loop_over_scan"] = lp["median_ms"] / row["scan"]["median_ms"]
                    if "forward" in times:
                        row["forward"] = summary(times["forward"])
                        row["verify_over_forward"] = b["median_ms"] / row["forward"]["median_ms"]
                    rows_out.append(row)
                    print_row(row, args.json)
    return rows_out


def real_section(args, target) -> list[dict]:
    from gpu.llm.tree_draft import tree_shape

    rows_out = []
    for spec in shape_specs(args.shapes):
        shape = tree_shape(spec)
        for process, top in ((pr, t) for pr in args.processes.split(",") for t in draft_tops(args.draft_top)):
            for i in range(args.real_trees):
                gen = torch.Generator().manual_seed(i)
                batch, q = target.draft(shape, process, gen, top)
                p = probs_from_logits(target.forward(batch).double(), 1.0)[None]
                calls = {"forward": lambda: target.forward(batch)}
                for method in methods(args, process):       # UniVer's right after the forward (module docstring)
                    calls[method] = batched_call(method, batch, p, q, process)
                calls["structure"] = structure_call(batch)
                times = repeated_times(calls, args.repeat)
                fwd = summary(times["forward"])
                for method in methods(args, process):
                    b = summary(times[method])
                    row = {"rows": "smollm2", "shape": spec, "nodes": shape.num_nodes, "process": process,
                           "draft_top": top, "B": 1, "tree": i, "method": method, "vocab": p.shape[-1], "batched": b,
                           "forward": fwd, "verify_over_forward": b["median_ms"] / fwd["median_ms"],
                           "structure": summary(times["structure"]),
                           "inputs_mb": 2 * p.numel() * 8 / 2**20, "peak_mb_batched": peak_mb(calls[method])}
                    rows_out.append(row)
                    print_row(row, args.json)
    return rows_out


def print_row(row: dict, quiet: bool) -> None:
    if quiet:
        return
    vof = f"{row['verify_over_forward']:.3f}" if "verify_over_forward" in row else "-"
    bol = f"{row['batched_over_loop']:.2f}" if "batched_over_loop" in row else "-"
    peak = row.get("peak_mb_batched")
    top = "all" if row["draft_top"] is None else row["draft_top"]
    print(f"{row['rows']:>8} {row['shape']:>9} {row['process']:>4} {top:>5} {row['B']:>3} {row['method']:>6} "
          f"{row['batched']['median_ms']:>10.1f} {row.get('loop', {}).get('median_ms', float('nan')):>10.1f} "
          f"{row.get('forward', {}).get('median_ms', float('nan')):>9.1f} {vof:>8} {bol:>8} "
          f"{'-' if peak is None else f'{peak:.0f}':>7} {row['inputs_mb']:>7.1f} "
          f"{row.get('scan', {}).get('median_ms', float('nan')):>8.1f} {row.get('loop_over_scan', float('nan')):>9.2f}",
          flush=True)


def check_args(ap, args) -> None:
    """One-line argparse errors, before anything is timed, for values the sections would fail on later."""
    from gpu.llm.tree_draft import tree_shape

    at_least(ap, (("--repeat", args.repeat, 1), ("--vocab", args.vocab, 2),
                  ("--alpha-vocab", args.alpha_vocab, ALPHA_K), ("--real-trees", args.real_trees, 0)))
    if not all(b.strip().isdigit() and int(b) > 0 for b in args.batches.split(",")):
        ap.error(f"--batches: expected positive ints, comma-separated, got {args.batches!r}")
    known(ap, "--methods", args.methods, METHODS)
    known(ap, "--processes", args.processes, ("wor", "iid"))
    try:
        tops = draft_tops(args.draft_top)
        widest = max(tree_shape(spec).max_children for spec in shape_specs(args.shapes))
    except ValueError as err:
        ap.error(str(err))
    if "wor" in args.processes.split(","):  # a wor node draws its k children from k distinct tokens of its row
        at_least(ap, [("--vocab", args.vocab, widest)] + [("--draft-top", m, widest) for m in tops if m is not None])
    over = [m for m in tops if m is not None and m > args.vocab]
    if over:                                # as decode / speed / accept-bench: it would truncate nothing
        ap.error(f"--draft-top {over[0]} exceeds --vocab {args.vocab} and would truncate nothing")
    device_arg(ap, args.device)                 # meta or a backend torch lacks failed after the α* section


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object only")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--alpha-vocab", type=int, default=128_000)
    ap.add_argument("--shapes", default="binary:4,eagle",
                    help="gpu.llm.tree_draft.tree_shape specs, comma-separated; a TreeShape.parse string keeps its "
                         "commas (3,2: one uniform shape; ((.,.),.): one nested shape)")
    ap.add_argument("--processes", default="wor,iid")
    ap.add_argument("--draft-top", default="all,64",
                    help="draft truncations: 'all' (the whole row) and/or m (the top m tokens per row), comma-separated")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--no-model", action="store_true", help="skip SmolLM2 (no forward, no real trees)")
    ap.add_argument("--real-trees", type=int, default=0, help="SmolLM2-drafted trees per shape and process")
    ap.add_argument("--device", default="cpu", help="where the batched side runs (cuda: with --no-model)")
    args = ap.parse_args(argv)
    check_args(ap, args)
    device = torch.device(args.device)
    if device.type != "cpu" and not args.no_model:
        ap.error(f"--device {args.device}: SmolLM2's forward runs on the CPU, so ver/fwd would mix devices; "
                 "add --no-model")
    torch.set_num_threads(1)
    result = {"torch_threads": torch.get_num_threads(), "repeat": args.repeat,
              "memory": "rise of peak RSS (VmHWM) during one call, the heap trimmed first, MB"}
    result["device"] = str(device)
    result["alpha_star"] = alpha_star_section(args.alpha_vocab, args.repeat, device)
    if not args.json:
        a = result["alpha_star"]
        print(f"alpha*(rho) V = {a['vocab']}, k = 3: wor median {a['wor']['median_ms']:.1f} ms "
              f"(min {a['wor']['min_ms']:.1f}; torch {a['wor_torch']['median_ms']:.1f}), "
              f"iid median {a['iid']['median_ms']:.1f} ms")
        print(f"{'rows':>8} {'shape':>9} {'proc':>4} {'top':>5} {'B':>3} {'method':>6} {'batch ms':>10} {'loop ms':>10} "
              f"{'fwd ms':>9} {'ver/fwd':>8} {'loop/bat':>8} {'peak MB':>7} {'in MB':>7} {'scan ms':>8} {'loop/scan':>9}")
    target = None if args.no_model else Target()
    if target is not None and args.vocab > target.pair.vocab_size:   # the Zipf trees' tokens feed its forward
        ap.error(f"--vocab {args.vocab} exceeds the target's vocabulary {target.pair.vocab_size}: the Zipf rows' "
                 "trees are fed to its forward; lower --vocab or add --no-model")
    result["synthetic"] = synthetic_section(args, target)
    result["real"] = real_section(args, target) if target is not None and args.real_trees > 0 else []
    if args.json:
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
