"""``univer decode``: online speculative decoding with the real SmolLM2 target and a derived draft."""
from __future__ import annotations

from univer_theory import PROCESSES, VERIFIERS

from .common import positive_int, print_json, seed_int, temperature


def add_llm_options(p, threads: int | None = None) -> None:
    """Options shared by ``decode``, ``speed`` and ``accept-bench`` (model pair, process, temperature, device);
    ``threads`` is the default of ``--threads`` (None: torch's choice)."""
    p.add_argument("--draft", default=None,
                   help="draft spec: rtn:BITS:GROUP (RTN re-quantised target), early:L (first L layers) or "
                        "hf:DIR (local HF causal LM with the same vocabulary); default rtn:4:32")
    p.add_argument("--process", default="wor", choices=PROCESSES, help="draft process (default wor)")
    p.add_argument("--temperature", type=temperature, default=1.0, help="target temperature T (default 1.0)")
    p.add_argument("--draft-temperature", type=temperature, default=None,
                   help="draft temperature (default: T, or 1.0 when T = 0)")
    p.add_argument("--draft-top", type=positive_int, default=None,
                   help="draft from the M most likely tokens of each draft row only (a truncated draft: lossless, "
                        "and UniVer's node plans then cost O(M log M) instead of O(V log V)); default: the whole row")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of drafting, sampling and verification coins")
    p.add_argument("--device", default="cpu", help="torch device of both models (default cpu)")
    p.add_argument("--threads", type=int, default=threads,
                   help=f"torch CPU threads (default: {threads or 'torch' + chr(39) + 's choice'})")
    p.add_argument("--json", action="store_true", help="print the JSON object instead of the table")


def check_draftable(shape, args, spec: str) -> None:
    """A ValueError, before any model loads, where the draft can never draft ``shape``'s widest node: every
    process but ``iid`` drafts k distinct tokens, which a draft truncated to ``--draft-top M < k`` does not have.
    (A small or zero draft temperature underflows a row to fewer tokens too; the drafted rows keep k tokens of
    positive probability for that: :func:`gpu.probs.support_floor`.)"""
    k = shape.max_children
    if args.process == "iid" or k < 2:
        return
    if args.draft_top is not None and args.draft_top < k:
        raise ValueError(f"--draft-top {args.draft_top} keeps fewer tokens than the {k} distinct children process "
                         f"{args.process!r} drafts at tree {spec}'s widest node; use --draft-top ≥ {k} or --process iid")


def load_models(args):
    """Set the thread count and load the (target, draft) pair the options name; a ``--draft-top`` above the
    vocabulary (known once the pair is loaded) is a ValueError — it would truncate nothing."""
    import torch

    from gpu.llm.models import DEFAULT_DRAFT, check_device, load_pair, parse_draft_spec

    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be ≥ 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    check_device(args.device, "--device")
    parse_draft_spec(args.draft or DEFAULT_DRAFT, "--draft")
    pair = load_pair(args.draft or DEFAULT_DRAFT, device=args.device)
    if args.draft_top is not None and args.draft_top > pair.vocab_size:
        raise ValueError(f"--draft-top {args.draft_top} exceeds the vocabulary ({pair.vocab_size} tokens) and would "
                         f"truncate nothing; leave it out to draft from whole rows")
    return pair


def add_parser(sub) -> None:
    p = sub.add_parser("decode", help="speculative decoding with a real LLM pair (SmolLM2-135M)")
    p.add_argument("--prompt", required=True, help="user message (the chat template is applied)")
    p.add_argument("--method", default="univer", help="verifier (default univer)")
    p.add_argument("--tree", default="binary:3", help="tree shape: binary:D, chain:D, eagle[:W] or a TreeShape string (default binary:3)")
    p.add_argument("--max-new-tokens", type=positive_int, default=64, help="token budget (default 64)")
    p.add_argument("--batch", type=positive_int, default=1,
                   help="independent samples of the prompt decoded together in shared forwards; prints each "
                        "sample, then totals over all of them (tokens/s: all samples' tokens over the shared wall "
                        "time); the JSON adds the samples under 'requests' (default 1)")
    add_llm_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from gpu.llm.decode import speculative_decode_batch
    from gpu.llm.prompts import Prompt, encode_prompt
    from gpu.llm.speed import summarise
    from gpu.llm.tree_draft import tree_shape
    from gpu.llm.verifiers import method_names

    method = args.method
    here = [m for m in method_names() if m not in VERIFIERS or set(VERIFIERS[m].processes) & set(PROCESSES)]
    if method not in here:
        exact_only = (f" ({method!r} drafts with process {VERIFIERS[method].processes[0]!r}, which only univer "
                      f"exact and bound draft)" if method in VERIFIERS else "")
        raise ValueError(f"unknown method {method!r} for decode{exact_only}; choose from {here}")
    shape = tree_shape(args.tree)
    check_draftable(shape, args, args.tree)
    if method in VERIFIERS and not VERIFIERS[method].supports(shape, args.process):
        raise ValueError(f"method {method!r} does not apply to tree {args.tree} with process {args.process!r} "
                         f"(processes {VERIFIERS[method].processes}"
                         f"{', chains only' if VERIFIERS[method].chain_only else ''})")
    pair = load_models(args)
    ids = encode_prompt(pair.tokenizer, Prompt("cli", "cli", args.prompt))
    gen = torch.Generator(pair.device).manual_seed(args.seed)
    results = speculative_decode_batch(pair, [ids] * args.batch, method, shape, args.process, args.temperature,
                                       args.max_new_tokens, gen, args.draft_temperature, progress=not args.json,
                                       draft_top=args.draft_top)
    res = results[0]
    total = summarise([results])              # all samples: the wall and phase times are shared
    total["mean_accepted"] = sum(sum(r.accepted) for r in results) / max(total["steps"], 1)   # E[τ]
    total["acceptance_length"] = total["mean_accepted"] + 1                 # tokens per target forward, τ + 1
    if args.json:
        head = {"method": method, "tree": str(shape), "process": args.process,
                **({"draft_top": args.draft_top} if args.draft_top else {})}
        if args.batch == 1:
            print_json({**head, **res.as_json()})
        else:
            keys = ("new_tokens", "steps", "tokens_per_step", "acceptance_length", "mean_accepted", "wall_s",
                    "tokens_per_s", "share")
            print_json({**head, "batch": args.batch, **{k: total[k] for k in keys},
                        "requests": [r.as_json() for r in results]})
        return 0
    for i, r in enumerate(results):
        print(r.text if args.batch == 1 else f"--- sample {i + 1} of {args.batch} ---\n{r.text}")
    print(f"\n[{method}, tree {shape} ({shape.num_nodes} nodes), {args.process}, T={args.temperature}"
          f"{f', draft top {args.draft_top}' if args.draft_top else ''}"
          f"{f', {args.batch} samples' if args.batch > 1 else ''}] {total['new_tokens']} tokens in {total['steps']} "
          f"steps: acceptance length (τ + 1 per target forward, before the budget or a stop token cut a step) "
          f"{total['acceptance_length']:.3f}, E[τ] "
          f"{total['mean_accepted']:.3f}, emitted tokens/step {total['tokens_per_step']:.3f}, "
          f"{total['wall_s']:.2f} s, {total['tokens_per_s']:.2f} tokens/s (draft {total['share']['draft']:.0%}, "
          f"target {total['share']['target']:.0%}, verify {total['share']['verify']:.0%})")
    return 0
