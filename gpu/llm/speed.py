"""Wall-clock decoding speed of plain sampling, Hugging Face assisted generation and speculative decoding with
each verifier, on the same prompts, seeds and model pair.

Every method decodes the same prompts with a generator seeded by ``(seed, prompt)``; the methods run
interleaved prompt by prompt (a slow phase of a shared machine hits them alike).  With ``batch = B > 1`` the
prompts go in groups of B consecutive prompts (the last group may be smaller), each group decoded in shared
forwards (:func:`.decode.speculative_decode_batch`, :func:`.decode.sample_plain_batch`; one generator per group,
seeded by ``(seed, first prompt)``; each request's law is that of B = 1, its coins differ); Hugging Face
assisted generation takes one request at a time and cannot run batched.  Per method: tokens per second (total
new tokens of all requests / total wall, prefill included), tokens per step (new tokens emitted per request and
target forward that verifies: τ + 1 but where the budget or a stop token cut a step), the paper's acceptance
length (τ + 1 averaged over those steps, bonus included: :attr:`.decode.DecodeResult.acceptance_length`) and the
share of the wall time spent in the draft's forwards, the target's forwards and verification (sampling ``Y`` for
plain; for Hugging Face, everything outside the two models' forwards).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

from univer_theory import TreeShape

from .decode import PHASES, DecodeResult, sample_plain_batch, speculative_decode_batch
from .models import ModelPair


@dataclass(frozen=True)
class SpeedMethod:
    """One row of the comparison: ``kind`` is ``plain``, ``hf-assisted`` or a verifier name (then ``shape``)."""

    name: str
    kind: str
    shape: TreeShape | None = None


class ForwardClock:
    """Wall seconds and calls of a module's forwards, through forward hooks (for code we do not own)."""

    def __init__(self, module: torch.nn.Module):
        self.seconds, self.calls, self._t0 = 0.0, 0, 0.0
        self._hooks = [module.register_forward_pre_hook(self._pre), module.register_forward_hook(self._post)]

    def _pre(self, *_):
        self._t0 = time.perf_counter()

    def _post(self, *_):
        self.seconds += time.perf_counter() - self._t0
        self.calls += 1

    def close(self):
        for h in self._hooks:
            h.remove()


@torch.inference_mode()
def hf_assisted(pair: ModelPair, prompt_ids: list[int], temperature: float, max_new_tokens: int,
                seed: int) -> DecodeResult:
    """``target.generate(assistant_model=draft, do_sample=True)`` (greedy at T = 0), full-vocabulary sampling
    (top-k / top-p off), stopping at the pair's stop tokens; its steps are the target's forwards."""
    device = pair.device
    ids = torch.tensor([prompt_ids], device=device)
    clocks = {"target": ForwardClock(pair.target), "draft": ForwardClock(pair.draft)}
    sample = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else \
        {"do_sample": False}
    # generate() draws from torch's global generator: seeded here, the caller's state given back afterwards
    cuda = range(torch.cuda.device_count()) if torch.cuda.is_initialized() else []   # manual_seed reseeds them all
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        start = time.perf_counter()
        try:
            out = pair.target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=pair.draft,
                                       max_new_tokens=max_new_tokens, eos_token_id=sorted(pair.stop_ids),
                                       pad_token_id=pair.tokenizer.eos_token_id, **sample)
        finally:
            for c in clocks.values():
                c.close()
        wall = time.perf_counter() - start
    new = [int(t) for t in out[0, len(prompt_ids):]]
    stop = next((i for i, t in enumerate(new) if t in pair.stop_ids), None)
    new = new if stop is None else new[: stop + 1]
    steps = max(clocks["target"].calls, 1)
    phase = {"target": clocks["target"].seconds, "draft": clocks["draft"].seconds}
    phase["verify"] = max(wall - phase["target"] - phase["draft"], 0.0)
    # HF does not expose τ per step, only the total: spread it evenly (exact mean τ and tokens per step)
    total = max(len(new) - steps, 0)
    accepted = tuple(total // steps + (i < total % steps) for i in range(steps))
    return DecodeResult(tuple(new), accepted, wall, pair.tokenizer.decode(new, skip_special_tokens=True), phase)


#: Method kinds that cannot decode several requests in shared forwards, and why.
UNBATCHED = {"hf-assisted": "transformers' assisted generation takes one request at a time"}


def run_method(pair: ModelPair, method: SpeedMethod, prompts: list[list[int]], process: str, temperature: float,
               max_new_tokens: int, seed: int, progress: bool = False,
               draft_top: int | None = None, draft_temperature: float | None = None) -> list[DecodeResult]:
    """The prompts of one group decoded together by ``method`` with one generator seeded by ``seed``
    (``progress``: a bar over the tokens of a speculative run — UniVer on a wide tree can take minutes per
    prompt; ``draft_top``: the speculative methods draft from that many top tokens per row, as
    :func:`.decode.speculative_decode_batch`, and at ``draft_temperature`` (default
    :func:`univer_theory.models.resolve_draft_temperature`); Hugging Face's assisted generation drafts its own way)."""
    gen = torch.Generator(pair.device).manual_seed(seed)
    if method.kind == "plain":
        return sample_plain_batch(pair, prompts, temperature, max_new_tokens, gen)
    if method.kind == "hf-assisted":          # one request: speed_compare never groups it
        return [hf_assisted(pair, prompts[0], temperature, max_new_tokens, seed)]
    return speculative_decode_batch(pair, prompts, method.kind, method.shape, process, temperature,
                                    max_new_tokens, gen, draft_temperature, progress=progress, draft_top=draft_top)


def group_tokens_per_s(group: list[DecodeResult]) -> float:
    """New tokens of all requests of a group decoded together / the group's (shared) wall seconds."""
    return sum(len(r.tokens) for r in group) / group[0].wall_s


def summarise(groups: list[list[DecodeResult]]) -> dict:
    """Totals over groups of requests decoded together (one request each without batching): tokens/s (total
    tokens / total wall — a group's wall and phase times are shared by its requests, counted once), min and
    median of the per-group tokens/s, tokens per step (emitted, per request and verification), the acceptance length
    (τ + 1 per request and verification, before a budget or stop token cut a step) and each phase's share of the
    total wall time."""
    tokens = sum(len(r.tokens) for g in groups for r in g)
    wall = sum(g[0].wall_s for g in groups)
    steps = sum(r.steps for g in groups for r in g)
    per_group = [group_tokens_per_s(g) for g in groups]
    return {"tokens_per_s": tokens / wall, "tokens_per_s_min": min(per_group),
            "tokens_per_s_median": statistics.median(per_group), "tokens_per_step": tokens / max(steps, 1),
            "acceptance_length": sum(r.acceptance_length * r.steps for g in groups for r in g) / max(steps, 1),
            "share": {k: sum(g[0].phase_s.get(k, 0.0) for g in groups) / wall for k in PHASES},
            "new_tokens": tokens, "steps": steps, "wall_s": wall}


#: Tokens of each method's untimed warm-up run in :func:`speed_compare` (a compiled kernel's first call loads its
#: cache, ~0.4 s, which would otherwise land on whichever method verifies first).
WARMUP_TOKENS = 2


def speed_compare(pair: ModelPair, prompts: list[list[int]], methods: list[SpeedMethod], process: str,
                  temperature: float, max_new_tokens: int, seed: int = 0, progress: bool = True,
                  batch: int = 1, draft_top: int | None = None, draft_temperature: float | None = None) -> dict:
    """``{"methods": {name: summary}, "per_prompt": {name: [tokens/s …]}}`` (per group of ``batch`` prompts),
    methods interleaved per group, after one untimed run of each method on the first group
    (:data:`WARMUP_TOKENS` tokens); ``draft_top``, ``draft_temperature``: :func:`run_method`."""
    if not methods:
        raise ValueError("speed_compare: no method to run")
    if not 1 <= batch <= len(prompts):
        raise ValueError(f"speed_compare: batch must be in [1, {len(prompts)}] (the number of prompts), got {batch}")
    if batch > 1:
        bad = {m.name: UNBATCHED[m.kind] for m in methods if m.kind in UNBATCHED}
        if bad:
            raise ValueError(f"speed_compare: method(s) {list(bad)} cannot batch requests ({'; '.join(bad.values())})"
                             "; leave them out or use batch 1")
    for m in methods:                   # untimed: one-time costs (compiled kernels' caches, lazy imports) land here
        run_method(pair, m, prompts[:batch], process, temperature, min(WARMUP_TOKENS, max_new_tokens), seed, False,
                   draft_top, draft_temperature)
    runs: dict[str, list[list[DecodeResult]]] = {m.name: [] for m in methods}
    starts = range(0, len(prompts), batch)
    with tqdm(total=len(starts) * len(methods), desc="speed", unit="run", disable=not progress) as bar:
        for i in starts:
            for m in methods:
                bar.set_postfix_str(m.name)
                runs[m.name].append(run_method(pair, m, prompts[i: i + batch], process, temperature,
                                               max_new_tokens, (seed + i) % 2 ** 64, progress, draft_top,
                                               draft_temperature))
                bar.update(1)
    return {"methods": {name: summarise(gs) for name, gs in runs.items()},
            "per_prompt": {name: [group_tokens_per_s(g) for g in gs] for name, gs in runs.items()}}
