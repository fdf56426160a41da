"""Online speculative decoding of ``B`` requests at once with a real target / draft pair and any verifier.

Each request's target cache holds its context except the last token ``r`` (the previous step's ``Y``); its draft
cache holds the context except the tokens in ``pending`` (``Y``, preceded by an accepted leaf the draft never
fed).  One step, for all requests together (:class:`.ragged_cache.RaggedCache`):

1. **draft** — feed ``pending`` to the draft (its last logits are the root row ``q(·|context)``), commit it, then
   draft the tree depth by depth (:func:`.tree_draft.draft_tree_cached`);
2. **target** — one forward of ``r`` and the tree nodes under tree attention (:func:`score_trees`): the rows
   ``p(·|s(u))`` of every node (root included), theory.md §3's inputs;
3. **verify** — :func:`.verifiers.verify_batch` → accepted path ``x^τ`` and ``Y`` per request;

then the cache entries of ``r`` and of the accepted path are moved into place in the target cache (those of the
accepted internal nodes in the draft cache; :meth:`TreeStep.commit`) — nothing is fed twice: one target forward
per step.  A lossless verifier makes every request's output law that of sampling the target at ``temperature``,
whatever ``B``.  Phases 1–2 are :func:`tree_step`, which the offline benchmark (:mod:`.accept_bench`) runs too.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from univer_theory import TreeShape
from univer_theory.models import resolve_draft_temperature
from univer_theory.validation import check_int

from ..probs import probs_from_logits, sample_rows
from ..tree_batch import TreeBatch, tree_attention_mask
from .models import ModelPair
from .ragged_cache import RaggedCache
from .tree_draft import check_decode_shape, draft_tree_cached
from .verifiers import verify_batch

#: Phases of a step whose wall time :class:`DecodeResult` reports.
PHASES = ("draft", "target", "verify")


@dataclass(frozen=True)
class DecodeResult:
    """``tokens``: new token ids (stop token included if one was emitted); ``accepted``: τ per step;
    ``wall_s``: seconds for the whole loop (prefill included; shared by the requests of one batch);
    ``phase_s``: seconds spent in each of :data:`PHASES` (the batch's); ``target_logits`` / ``draft_logits``
    (only when recorded): ``[len(tokens), V]`` logits the step used for each emitted token's position — the
    target's after ``context · tokens[:i]``, the draft's likewise (NaN where the draft had no row: an accepted
    leaf)."""

    tokens: tuple[int, ...]
    accepted: tuple[int, ...]
    wall_s: float
    text: str
    phase_s: dict = field(default_factory=dict)
    target_logits: torch.Tensor | None = None
    draft_logits: torch.Tensor | None = None

    @property
    def steps(self) -> int:
        return len(self.accepted)

    @property
    def mean_accepted(self) -> float:
        """Mean accepted drafted tokens per step, the estimate of ``E[τ]``."""
        return sum(self.accepted) / max(self.steps, 1)

    @property
    def acceptance_length(self) -> float:
        """The paper's acceptance length: tokens per target forward, ``τ + 1`` (the accepted path and its
        correction or bonus token) averaged over steps — the verifier's, before a stop token or the budget cut
        a step's output (:attr:`tokens_per_step` counts what was emitted)."""
        return self.mean_accepted + 1

    @property
    def tokens_per_step(self) -> float:
        """New tokens emitted per target forward (``τ + 1`` but where a stop token or the budget cut the step)."""
        return len(self.tokens) / max(self.steps, 1)

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.wall_s if self.wall_s > 0 else float("inf")

    @property
    def share(self) -> dict[str, float]:
        """Fraction of the wall time spent in each phase (the rest is bookkeeping)."""
        return {k: self.phase_s.get(k, 0.0) / self.wall_s if self.wall_s > 0 else 0.0 for k in PHASES}

    def as_json(self) -> dict:
        return {"text": self.text, "new_tokens": len(self.tokens), "steps": self.steps,
                "tokens_per_step": self.tokens_per_step, "acceptance_length": self.acceptance_length,
                "mean_accepted": self.mean_accepted,
                "wall_s": self.wall_s, "tokens_per_s": self.tokens_per_s, "share": self.share}


class PhaseTimer:
    """Accumulates wall seconds per phase: ``with timer("draft"): …``."""

    def __init__(self):
        self.seconds = {k: 0.0 for k in PHASES}

    @contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start


def feed_sequences(cache: RaggedCache, seqs: list[list[int]], logits_to_keep: int = 0) -> torch.Tensor:
    """Feed one token sequence per request (ragged, possibly empty; right-aligned, the padding masked out)
    causally after each request's committed prefix, and commit them.  Returns the logits of the last
    ``logits_to_keep`` columns (``[B, k, V]``; column −1 is every non-empty sequence's last token), or None
    when every sequence is empty."""
    B, width = len(seqs), max(len(s) for s in seqs)
    if width == 0:
        return None
    tokens = torch.zeros(B, width, dtype=torch.long)
    positions = torch.zeros(B, width, dtype=torch.long)
    visible = torch.eye(width, dtype=torch.bool).repeat(B, 1, 1)        # padding sees itself only
    start, slots = cache.size, []
    for b, s in enumerate(seqs):
        pad = width - len(s)
        tokens[b, pad:] = torch.tensor(s, dtype=torch.long).reshape(-1)
        positions[b, pad:] = cache.lengths[b] + torch.arange(len(s))
        visible[b, pad:, pad:] = torch.ones(len(s), len(s), dtype=torch.bool).tril()
        slots.append(list(range(start + pad, start + width)))
    logits = cache.feed(tokens, positions, visible, logits_to_keep)
    cache.commit(slots)
    return logits


def score_trees(t_cache: RaggedCache, batch: TreeBatch, root: list[int]) -> torch.Tensor:
    """Target logits ``[B, N, V]`` (fp32) of every node of every tree of ``batch`` (one skeleton) in one forward:
    each request's uncommitted context token ``root[b]`` in node 0's place and the drafted nodes under tree
    attention after the committed context (row 0: ``p(·|context)``).  The fed entries stay as scratch at slots
    ``t_cache.size`` (before the call) ``+ u``; :meth:`TreeStep.commit` keeps those of an accepted path."""
    tokens = batch.token.clone()
    tokens[:, 0] = torch.tensor(root)
    return t_cache.feed(tokens.cpu(), batch.positions(t_cache.lengths.to(batch.device)).cpu(),
                        tree_attention_mask(batch).cpu())


@dataclass(frozen=True)
class TreeStep:
    """One step's trees and rows for every request (the module's phases 1–2): ``batch`` (drafted trees),
    ``draft_probs [B, N, V]`` float64 at the draft temperature, ``target_logits [B, N, V]`` fp32 (row 0 the
    root's), ``node_slot [N]`` each node's draft cache slot (−1: the root, leaves), ``target_start`` the target
    cache slot of node 0 (node u at ``target_start + u``), ``draft_logits`` (recorded, else None)."""

    batch: TreeBatch
    draft_probs: torch.Tensor
    target_logits: torch.Tensor
    node_slot: torch.Tensor
    target_start: int
    draft_logits: torch.Tensor | None = None

    def unfed(self, b: int, path: list[int]) -> list[int]:
        """Tokens of request b's ``path`` that the draft never fed (an accepted leaf): its next ``pending``."""
        return [int(self.batch.token[b, u]) for u in path if self.node_slot[u] < 0]

    def commit(self, t_cache: RaggedCache, d_cache: RaggedCache, paths: list[list[int]],
               timer: "PhaseTimer | None" = None) -> None:
        """Per request, keep the root token and the nodes of ``paths[b]`` (accepted path, root excluded) in the
        target cache, the path's fed nodes in the draft cache; drop every other scratch entry."""
        timer = timer or PhaseTimer()
        with timer("target"):
            t_cache.commit([[self.target_start] + [self.target_start + u for u in p] for p in paths])
        with timer("draft"):
            d_cache.commit([[int(self.node_slot[u]) for u in p if self.node_slot[u] >= 0] for p in paths])


def tree_step(t_cache: RaggedCache, d_cache: RaggedCache, root: list[int], pending: list[list[int]],
              shape: TreeShape, process: str, draft_temperature: float, generator: torch.Generator | None = None,
              record_logits: bool = False, timer: PhaseTimer | None = None, draft_top: int | None = None) -> TreeStep:
    """Phases 1–2 of a step for every request of the caches (see the module): feed ``pending[b]`` (non-empty)
    to the draft and commit it, draft a tree of ``shape`` after it (from each row's ``draft_top`` most likely
    tokens when given), then score every node with the target after the committed context and ``root[b]``."""
    timer = timer or PhaseTimer()
    with timer("draft"):
        d_root = feed_sequences(d_cache, pending, 1)[:, -1]
        batch, draft_probs, node_slot, d_logits = draft_tree_cached(d_cache, d_root, shape, process,
                                                                    draft_temperature, generator, record_logits,
                                                                    draft_top)
    with timer("target"):
        t_start = t_cache.size
        logits = score_trees(t_cache, batch, root)
    return TreeStep(batch, draft_probs, logits, node_slot, t_start, d_logits)


def check_prompts(prompts: list[list[int]], where: str, models=(), extra: int = 0) -> None:
    """ValueError unless ``prompts`` holds at least one prompt and none is empty, and the longest prompt with
    ``extra`` more positions (the last position a run feeds is ``len + extra − 1``) fits every model of
    ``models`` that embeds absolute positions (a config's ``max_position_embeddings`` without rotary parameters:
    a 1 024-position GPT-2 draft given 1 100 tokens failed with an IndexError; rotary models run past theirs)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError(f"{where}: prompts must hold at least one prompt and no empty one, got lengths "
                         f"{[len(p) for p in prompts]}")
    longest = max(len(p) for p in prompts)
    for name, model in models:
        config = getattr(model, "config", None)
        limit = getattr(config, "max_position_embeddings", None)
        rotary = any(getattr(config, a, None) is not None for a in ("rope_theta", "rope_parameters", "rope_scaling"))
        if limit is not None and not rotary and longest + extra - 1 > limit:
            raise ValueError(f"{where}: the longest prompt ({longest} tokens) and {extra} more positions pass the "
                             f"{name}'s {limit} (max_position_embeddings)")


def start_caches(pair: ModelPair, prompts: list[list[int]], timer: PhaseTimer | None = None):
    """``(t_cache, d_cache, root, pending)`` before the first :func:`tree_step`: the target holds each prompt
    but its last token ``root[b]``, the draft nothing (``pending[b]`` = the whole prompt)."""
    check_prompts(prompts, "start_caches")
    timer = timer or PhaseTimer()
    t_cache, d_cache = RaggedCache(pair.target, len(prompts)), RaggedCache(pair.draft, len(prompts))
    with timer("target"):
        feed_sequences(t_cache, [p[:-1] for p in prompts], 1)
    return t_cache, d_cache, [p[-1] for p in prompts], [list(p) for p in prompts]


@torch.inference_mode()
def speculative_decode_batch(pair: ModelPair, prompts: list[list[int]], method: str, shape: TreeShape, process: str,
                             temperature: float, max_new_tokens: int, generator: torch.Generator | None = None,
                             draft_temperature: float | None = None, max_steps: int | None = None,
                             progress: bool = False, record_logits: bool = False,
                             draft_top: int | None = None) -> list[DecodeResult]:
    """Decode up to ``max_new_tokens`` after every prompt of ``prompts`` in at most ``max_steps`` verification
    steps (a request stops after a stop token), all requests in the same forwards (see the module docstring).
    ``draft_temperature`` defaults to :func:`univer_theory.models.resolve_draft_temperature`; ``draft_top``: the
    draft samples from each row's ``draft_top`` most likely tokens (:func:`gpu.probs.probs_from_logits`; the
    output law is still the target's — the verifier sees the truncated rows)."""
    check_decode_shape(shape, "speculative_decode")
    check_int(max_new_tokens, "speculative_decode", "max_new_tokens", 1)
    if max_steps is not None:
        check_int(max_steps, "speculative_decode", "max_steps", 1)
    check_prompts(prompts, "speculative_decode", (("target", pair.target), ("draft", pair.draft)),
                  max_new_tokens + shape.max_depth)
    dtemp = resolve_draft_temperature(temperature, draft_temperature)
    timer = PhaseTimer()
    start = time.perf_counter()
    B = len(prompts)
    t_cache, d_cache, root, pending = start_caches(pair, prompts, timer)
    rows = list(range(B))                      # request of each cache row
    new: list[list[int]] = [[] for _ in prompts]
    accepted: list[list[int]] = [[] for _ in prompts]
    t_rec: list[list[torch.Tensor]] = [[] for _ in prompts]
    d_rec: list[list[torch.Tensor]] = [[] for _ in prompts]
    bar = tqdm(total=max_new_tokens * B, desc=f"decode {method}", unit="tok", disable=not progress, leave=False)
    while rows:
        step = tree_step(t_cache, d_cache, root, pending, shape, process, dtemp, generator, record_logits, timer,
                         draft_top)
        with timer("verify"):
            target_probs = probs_from_logits(step.target_logits.to(step.draft_probs.device).double(), temperature)
            results = verify_batch(method, step.batch, target_probs, step.draft_probs, process, generator)
        keep = []
        for r, (b, (path, y)) in enumerate(zip(rows, results)):
            accepted[b].append(len(path))
            emitted = ([int(step.batch.token[r, u]) for u in path] + [y])[: max_new_tokens - len(new[b])]
            stop = next((i for i, t in enumerate(emitted) if t in pair.stop_ids), None)
            if stop is not None:
                emitted = emitted[: stop + 1]
            new[b] += emitted
            bar.update(len(emitted))
            if record_logits:
                t_rec[b].append(step.target_logits[r, [0] + path][: len(emitted)].cpu())
                d_rec[b].append(step.draft_logits[r, [0] + path][: len(emitted)].cpu())
            if stop is None and len(new[b]) < max_new_tokens and len(accepted[b]) != max_steps:
                keep.append(r)
                root[r] = y
                pending[r] = step.unfed(r, path) + [y]
        step.commit(t_cache, d_cache, [path for path, _ in results], timer)
        if len(keep) < len(rows):
            for cache in (t_cache, d_cache):
                cache.select(keep)
            rows, root, pending = [rows[r] for r in keep], [root[r] for r in keep], [pending[r] for r in keep]
    bar.close()
    wall = time.perf_counter() - start
    return [DecodeResult(tuple(new[b]), tuple(accepted[b]), wall,
                         pair.tokenizer.decode(new[b], skip_special_tokens=True), dict(timer.seconds),
                         torch.cat(t_rec[b]) if record_logits else None,
                         torch.cat(d_rec[b]) if record_logits else None) for b in range(B)]


def speculative_decode(pair: ModelPair, prompt_ids: list[int], method: str, shape: TreeShape, process: str,
                       temperature: float, max_new_tokens: int, generator: torch.Generator | None = None,
                       draft_temperature: float | None = None, max_steps: int | None = None,
                       progress: bool = False, record_logits: bool = False,
                       draft_top: int | None = None) -> DecodeResult:
    """:func:`speculative_decode_batch` for one prompt."""
    return speculative_decode_batch(pair, [prompt_ids], method, shape, process, temperature, max_new_tokens,
                                    generator, draft_temperature, max_steps, progress, record_logits, draft_top)[0]


@torch.inference_mode()
def sample_plain_batch(pair: ModelPair, prompts: list[list[int]], temperature: float, max_new_tokens: int,
                       generator: torch.Generator | None = None, record_logits: bool = False) -> list[DecodeResult]:
    """Plain target sampling, one token per forward (the baseline speculation must beat), of every prompt in
    ``prompts`` in the same forwards (:func:`feed_sequences`; a request stops after a stop token): phases
    ``target`` (the forwards) and ``verify`` (drawing ``Y ~ p`` row by row); τ = 0 at every step;
    ``record_logits``: keep the target logits each token was drawn from (:class:`DecodeResult`)."""
    check_int(max_new_tokens, "sample_plain", "max_new_tokens", 1)
    check_prompts(prompts, "sample_plain", (("target", pair.target),), max_new_tokens)
    timer = PhaseTimer()
    start = time.perf_counter()
    cache = RaggedCache(pair.target, len(prompts))
    with timer("target"):
        logits = feed_sequences(cache, prompts, 1)[:, -1]
    rows = list(range(len(prompts)))
    new: list[list[int]] = [[] for _ in prompts]
    rec: list[list[torch.Tensor]] = [[] for _ in prompts]
    while True:
        with timer("verify"):
            ys = sample_rows(probs_from_logits(logits.double(), temperature), generator).tolist()
        keep = []
        for r, (b, y) in enumerate(zip(rows, ys)):
            new[b].append(int(y))
            if record_logits:
                rec[b].append(logits[r].cpu())
            if y not in pair.stop_ids and len(new[b]) < max_new_tokens:
                keep.append(r)
        if not keep:
            break
        with timer("target"):
            if len(keep) < len(rows):
                cache.select(keep)
                rows, ys = [rows[r] for r in keep], [ys[r] for r in keep]
            logits = feed_sequences(cache, [[int(y)] for y in ys], 1)[:, -1]
    wall = time.perf_counter() - start
    return [DecodeResult(tuple(n), (0,) * len(n), wall, pair.tokenizer.decode(n, skip_special_tokens=True),
                         dict(timer.seconds), torch.stack(r) if record_logits else None) for n, r in zip(new, rec)]


def sample_plain(pair: ModelPair, prompt_ids: list[int], temperature: float, max_new_tokens: int,
                 generator: torch.Generator | None = None) -> DecodeResult:
    """:func:`sample_plain_batch` for one prompt."""
    return sample_plain_batch(pair, [prompt_ids], temperature, max_new_tokens, generator)[0]
