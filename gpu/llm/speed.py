"""Wall-clock decoding speed of plain sampling, Hugging Face assisted generation and speculative decoding with
each verifier, on the same prompts, seeds and model pair.

Every method decodes the same prompts with a generator seeded by ``(seed, prompt)``; the methods run
interleaved prompt by prompt (a slow phase of a shared machine hits them alike).  Per method: tokens per second
(total new tokens / total wall, prefill included), tokens per step (per target forward that verifies: the
paper's acceptance length, bonus included) and the share of the wall time spent in the draft's forwards, the
target's forwards and verification (sampling ``Y`` for plain; for Hugging Face, everything outside the two
models' forwards).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

from univer_theory import TreeShape

from .decode import PHASES, DecodeResult, sample_plain, speculative_decode_batch
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
    torch.manual_seed(seed)                                  # generate() draws from torch's global generator
    clocks = {"target": ForwardClock(pair.target), "draft": ForwardClock(pair.draft)}
    sample = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else \
        {"do_sample": False}
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


def run_method(pair: ModelPair, method: SpeedMethod, prompt_ids: list[int], process: str, temperature: float,
               max_new_tokens: int, seed: int) -> DecodeResult:
    """One prompt decoded by ``method`` with the generator seeded by ``seed``."""
    gen = torch.Generator(pair.device).manual_seed(seed)
    if method.kind == "plain":
        return sample_plain(pair, prompt_ids, temperature, max_new_tokens, gen)
    if method.kind == "hf-assisted":
        return hf_assisted(pair, prompt_ids, temperature, max_new_tokens, seed)
    return speculative_decode_batch(pair, [prompt_ids], method.kind, method.shape, process, temperature,
                                    max_new_tokens, gen)[0]


def summarise(results: list[DecodeResult]) -> dict:
    """Totals over prompts: tokens/s (total tokens / total wall), min and median of the per-prompt tokens/s,
    tokens per step, and each phase's share of the total wall time."""
    tokens = sum(len(r.tokens) for r in results)
    wall = sum(r.wall_s for r in results)
    steps = sum(r.steps for r in results)
    per_prompt = [r.tokens_per_s for r in results]
    return {"tokens_per_s": tokens / wall, "tokens_per_s_min": min(per_prompt),
            "tokens_per_s_median": statistics.median(per_prompt), "tokens_per_step": tokens / max(steps, 1),
            "share": {k: sum(r.phase_s.get(k, 0.0) for r in results) / wall for k in PHASES},
            "new_tokens": tokens, "steps": steps, "wall_s": wall}


def speed_compare(pair: ModelPair, prompts: list[list[int]], methods: list[SpeedMethod], process: str,
                  temperature: float, max_new_tokens: int, seed: int = 0, progress: bool = True) -> dict:
    """``{"methods": {name: summary}, "per_prompt": {name: [tokens/s …]}}``, methods interleaved per prompt."""
    if not methods:
        raise ValueError("speed_compare: no method to run")
    runs: dict[str, list[DecodeResult]] = {m.name: [] for m in methods}
    with tqdm(total=len(prompts) * len(methods), desc="speed", unit="run", disable=not progress) as bar:
        for i, ids in enumerate(prompts):
            for m in methods:
                bar.set_postfix_str(m.name)
                runs[m.name].append(run_method(pair, m, ids, process, temperature, max_new_tokens, seed + i))
                bar.update(1)
    return {"methods": {name: summarise(rs) for name, rs in runs.items()},
            "per_prompt": {name: [r.tokens_per_s for r in rs] for name, rs in runs.items()}}
