"""Online speculative decoding with a real target / draft pair and any verifier.

One step: draft a tree after the context (:func:`.tree_draft.draft_tree`), score it with the target in one
forward (:func:`.tree_score.score_tree`), verify (:func:`.verifiers.verify_one`) → accepted path ``x^τ`` plus
``Y``; the ``τ + 1`` new tokens are appended and fed to both models, whose KV caches always hold exactly the
context.  A lossless verifier makes the output law that of sampling the target at ``temperature``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

from univer_theory import TreeShape
from univer_theory.models import resolve_draft_temperature

from ..probs import probs_from_logits
from .models import ModelPair
from .tree_draft import draft_tree
from .tree_score import score_tree
from .verifiers import verify_one


@dataclass(frozen=True)
class DecodeResult:
    """``tokens``: new token ids (stop token included if one was emitted); ``accepted``: τ per step;
    ``wall_s``: seconds for the whole loop (prefill included)."""

    tokens: tuple[int, ...]
    accepted: tuple[int, ...]
    wall_s: float
    text: str

    @property
    def steps(self) -> int:
        return len(self.accepted)

    @property
    def acceptance_length(self) -> float:
        """Mean accepted drafted tokens per step, ``E[τ]``."""
        return sum(self.accepted) / max(self.steps, 1)

    @property
    def tokens_per_step(self) -> float:
        """New tokens per target forward (``τ + 1`` before truncation at a stop token / the budget)."""
        return len(self.tokens) / max(self.steps, 1)

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.wall_s if self.wall_s > 0 else float("inf")

    def as_json(self) -> dict:
        return {"text": self.text, "new_tokens": len(self.tokens), "steps": self.steps,
                "acceptance_length": self.acceptance_length, "tokens_per_step": self.tokens_per_step,
                "wall_s": self.wall_s, "tokens_per_s": self.tokens_per_s}


@torch.inference_mode()
def prefill(model, ids: list[int]):
    """``(cache, last logits [V])`` of ``model`` after ``ids``."""
    device = next(model.parameters()).device
    out = model(torch.tensor([ids], device=device), use_cache=True, logits_to_keep=1)
    return out.past_key_values, out.logits[0, -1]


@torch.inference_mode()
def extend(model, cache, ids: list[int]) -> torch.Tensor:
    """Append ``ids`` to ``cache`` (positions continue the cache); returns the last logits ``[V]``."""
    device = next(model.parameters()).device
    return model(torch.tensor([ids], device=device), past_key_values=cache, use_cache=True,
                 logits_to_keep=1).logits[0, -1]


def speculative_decode(pair: ModelPair, prompt_ids: list[int], method: str, shape: TreeShape, process: str,
                       temperature: float, max_new_tokens: int, generator: torch.Generator | None = None,
                       draft_temperature: float | None = None, max_steps: int | None = None,
                       progress: bool = False) -> DecodeResult:
    """Decode up to ``max_new_tokens`` after ``prompt_ids`` in at most ``max_steps`` verification steps (stops
    after a stop token).  ``draft_temperature`` defaults to :func:`univer_theory.models.resolve_draft_temperature`."""
    if max_new_tokens < 1:
        raise ValueError(f"speculative_decode: max_new_tokens must be ≥ 1, got {max_new_tokens}")
    if not prompt_ids:
        raise ValueError("speculative_decode: prompt_ids is empty")
    dtemp = resolve_draft_temperature(temperature, draft_temperature)
    start = time.perf_counter()
    ctx = list(prompt_ids)
    t_cache, t_logits = prefill(pair.target, ctx)
    d_cache, d_logits = prefill(pair.draft, ctx)
    new: list[int] = []
    accepted: list[int] = []
    bar = tqdm(total=max_new_tokens, desc=f"decode {method}", unit="tok", disable=not progress, leave=False)
    while len(new) < max_new_tokens:
        batch, draft_probs = draft_tree(pair.draft, d_cache, len(ctx), d_logits, shape, process, dtemp, generator)
        logits = score_tree(pair.target, t_cache, batch, len(ctx), t_logits)
        target_probs = probs_from_logits(logits.double(), temperature)[None]
        path, y = verify_one(method, batch, target_probs, draft_probs, process, generator)
        accepted.append(len(path))
        emitted = (path + [y])[: max_new_tokens - len(new)]
        stop = next((i for i, t in enumerate(emitted) if t in pair.stop_ids), None)
        if stop is not None:
            emitted = emitted[: stop + 1]
        new += emitted
        ctx += emitted
        bar.update(len(emitted))
        if stop is not None or len(new) >= max_new_tokens or len(accepted) == max_steps:
            break
        t_logits = extend(pair.target, t_cache, emitted)
        d_logits = extend(pair.draft, d_cache, emitted)
    bar.close()
    wall = time.perf_counter() - start
    return DecodeResult(tuple(new), tuple(accepted), wall, pair.tokenizer.decode(new, skip_special_tokens=True))
