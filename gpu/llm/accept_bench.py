"""Paired offline evaluation of verifiers on real draft trees (theory.md §2: ``E[τ] = Σ_s a(s)``).

For each prompt, a continuation ``c_0 … c_{L−1}`` is sampled from the target at ``temperature``.  At every
position i (context = prompt · c_{<i}) one tree is drafted and scored, and every method's exact
``E[τ | T]`` is computed on that same tree (:func:`.verifiers.expected_accepted`) — a paired design: the
methods differ only by their verification rule, never by the draft.  Drafting and scoring are the decoder's
step (:func:`.decode.tree_step`, one target forward per position); ``c_i`` is then drawn from that forward's
root row ``p(·|prompt · c_{<i})``, and only its root entry is kept in the caches (an empty accepted path).  ``E[τ]`` averaged over positions estimates
the number of accepted drafted tokens along the target's own trajectories; the paper's *acceptance length* is
tokens per target forward, ``E[τ] + 1`` (the correction / bonus token included), reported first.

Statistics are clustered by prompt (positions of one prompt are correlated): a method's score on a prompt is
its mean over positions; the reported mean and standard error are across prompts, and the gain of method m
over the baseline b is the ratio of sums ``Σ_p m_p / Σ_p b_p − 1`` with a delta-method standard error
``sd(m_p − (1+g) b_p) / (√n · mean b_p)`` — on ``E[τ]`` (``gain``) and on ``E[τ] + 1`` (``gain_per_forward``).

A run can log each prompt's record as it finishes (JSON lines: a header with the settings, then one record per
prompt) and resume from that log: prompts already recorded are read back instead of recomputed (the settings
must match), so a stopped long run loses at most the prompt in progress.
"""
from __future__ import annotations

import json
import math
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from univer_theory import TreeShape
from univer_theory.models import resolve_draft_temperature
from univer_theory.verifiers import BASELINE

from ..probs import probs_from_logits, sample_rows
from .decode import check_prompts, start_caches, tree_step
from .models import ModelPair
from .prompts import Prompt, encode_prompt
from .tree_draft import check_decode_shape
from .verifiers import expected_accepted


@dataclass(frozen=True)
class PromptRecord:
    """One prompt: ``expected[method][i]`` = ``E[τ | T_i]`` at position i (same tree ``T_i`` for all methods)."""

    id: str
    category: str
    prompt_tokens: int
    expected: dict[str, tuple[float, ...]]

    @property
    def positions(self) -> int:
        return len(next(iter(self.expected.values()), ()))

    def mean(self, method: str) -> float:
        vals = self.expected[method]
        return sum(vals) / len(vals)

    def as_json(self) -> dict:
        return {"id": self.id, "category": self.category, "prompt_tokens": self.prompt_tokens,
                "positions": self.positions, "expected_accepted": {m: list(v) for m, v in self.expected.items()}}

    @classmethod
    def from_json(cls, obj: dict) -> "PromptRecord":
        return cls(obj["id"], obj["category"], obj["prompt_tokens"],
                   {m: tuple(float(x) for x in v) for m, v in obj["expected_accepted"].items()})


def _mean_se(xs: list[float]) -> tuple[float, float | None]:
    n = len(xs)
    mean = sum(xs) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1) / n)


def _ratio_gain(ms: list[float], bs: list[float]) -> tuple[float, float | None]:
    n, total_b = len(ms), sum(bs)
    if total_b == 0:
        return float("nan"), None
    g = sum(ms) / total_b - 1.0
    if n < 2:
        return g, None
    d = [m - (1.0 + g) * b for m, b in zip(ms, bs)]
    return g, math.sqrt(sum(x * x for x in d) / (n - 1)) / math.sqrt(n) / (total_b / n)


@dataclass(frozen=True)
class BenchResult:
    """All records plus the run's configuration; :meth:`summary` gives the per-category statistics."""

    config: dict
    methods: tuple[str, ...]
    baseline: str | None
    records: tuple[PromptRecord, ...] = field(default_factory=tuple)

    def summary(self) -> dict:
        """``{category or "all": {method: {acceptance_length, tokens_per_step, expected_accepted, se, gain,
        gain_se, gain_per_forward, gain_per_forward_se}, "prompts", "positions"}}``: ``acceptance_length = E[τ] +
        1`` (the paper's acceptance length, tokens per target forward; its standard error is ``se``;
        ``tokens_per_step`` the same number, under the key it had first — here every step emits τ + 1 tokens, no
        stop token cuts one, unlike ``univer decode``'s key of that name), ``gain`` on ``E[τ]`` and
        ``gain_per_forward`` on ``E[τ] + 1``, relative to :attr:`baseline` (absent when the baseline was not
        run)."""
        groups: dict[str, list[PromptRecord]] = {}
        for r in self.records:
            if r.positions:
                groups.setdefault(r.category, []).append(r)
        groups["all"] = [r for rs in list(groups.values()) for r in rs]
        out = {}
        for cat, recs in groups.items():
            if not recs:
                continue
            entry: dict = {"prompts": len(recs), "positions": sum(r.positions for r in recs)}
            base = [r.mean(self.baseline) for r in recs] if self.baseline else None
            for m in self.methods:
                vals = [r.mean(m) for r in recs]
                mean, se = _mean_se(vals)
                stats = {"acceptance_length": mean + 1.0, "expected_accepted": mean, "se": se,
                         "tokens_per_step": mean + 1.0}
                if base is not None:
                    stats["gain"], stats["gain_se"] = _ratio_gain(vals, base)
                    stats["gain_per_forward"], stats["gain_per_forward_se"] = _ratio_gain(
                        [v + 1.0 for v in vals], [b + 1.0 for b in base])
                entry[m] = stats
            out[cat] = entry
        return out

    def as_json(self) -> dict:
        summary = self.summary()
        overall = summary.get("all", {})
        return {
            "config": self.config,
            "baseline": self.baseline,
            "methods": {m: overall[m] for m in self.methods if m in overall},
            "categories": {c: v for c, v in summary.items() if c != "all"},
            "prompts": [r.as_json() for r in self.records],
        }


def prompt_generator(seed: int, prompt_id: str, device="cpu") -> torch.Generator:
    """Per-prompt generator: results for a prompt do not depend on which other prompts run."""
    return torch.Generator(device).manual_seed(zlib.crc32(f"{seed}/{prompt_id}".encode()))


@torch.inference_mode()
def evaluate_prompt(pair: ModelPair, prompt: Prompt, shape: TreeShape, process: str, methods, temperature: float,
                    positions: int, seed: int, draft_temperature: float | None = None,
                    progress: bool = False, draft_top: int | None = None) -> PromptRecord:
    """Exact ``E[τ | T]`` of every method on the trees drafted along one target-sampled continuation
    (``progress``: a bar over the positions; ``draft_top``: drafts from that many top tokens per row)."""
    check_decode_shape(shape, "evaluate_prompt")
    gen = prompt_generator(seed, prompt.id, pair.device)
    dtemp = resolve_draft_temperature(temperature, draft_temperature)
    ids = encode_prompt(pair.tokenizer, prompt)
    check_prompts([ids], "evaluate_prompt", (("target", pair.target), ("draft", pair.draft)),
                  positions + shape.max_depth)            # position i feeds up to len + i + depth − 1, as decode's
    t_cache, d_cache, root, pending = start_caches(pair, [ids])
    expected: dict[str, list[float]] = {m: [] for m in methods}
    for _ in tqdm(range(positions), desc=prompt.id, unit="position", leave=False, disable=not progress):
        step = tree_step(t_cache, d_cache, root, pending, shape, process, dtemp, gen, draft_top=draft_top)
        target_probs = probs_from_logits(step.target_logits.to(step.draft_probs.device).double(), temperature)
        for m in methods:
            expected[m].append(float(expected_accepted(m, step.batch, target_probs, step.draft_probs, process)[0]))
        y = int(sample_rows(target_probs[:, 0], gen)[0])          # c_i ~ p(·|prompt · c_{<i})
        if y in pair.stop_ids:
            break
        step.commit(t_cache, d_cache, [[]])
        root, pending = [y], [[y]]
    return PromptRecord(prompt.id, prompt.category, len(ids), {m: tuple(v) for m, v in expected.items()})


def read_log(path: Path) -> tuple[dict, list[PromptRecord]]:
    """``(header, records)`` of an accept-bench log (JSON lines; a torn last line of a killed run is ignored)."""
    lines = Path(path).read_text().splitlines()
    if not lines:
        raise ValueError(f"accept_bench: log {path} is empty")
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or not isinstance(header.get("config"), dict):
        raise ValueError(f"accept_bench: log {path} does not start with an accept-bench header "
                         f"({{\"config\": …, \"methods\": …}})")
    records = []
    for i, line in enumerate(lines[1:], 2):
        try:
            records.append(PromptRecord.from_json(json.loads(line)))
        except json.JSONDecodeError:
            if i != len(lines):
                raise ValueError(f"accept_bench: log {path} line {i} is not JSON") from None
        except (KeyError, TypeError, AttributeError, ValueError) as err:
            raise ValueError(f"accept_bench: log {path} line {i} is not a prompt record ({err!r})") from None
    return header, records


def _append(path: Path, obj: dict) -> None:
    with Path(path).open("a") as fh:
        fh.write(json.dumps(obj) + "\n")


def accept_bench(pair: ModelPair, prompts: list[Prompt], shape: TreeShape, process: str, methods,
                 temperature: float = 1.0, positions: int = 32, seed: int = 0,
                 draft_temperature: float | None = None, progress: bool = True, log: Path | None = None,
                 resume: bool = False, draft_top: int | None = None) -> BenchResult:
    """Run :func:`evaluate_prompt` on every prompt; ``methods`` are names (see :mod:`.verifiers`).

    ``log``: append each prompt's record to this JSON-lines file as it finishes (a new run starts the file
    afresh with a header of the settings); ``resume``: read the records already in ``log`` instead of
    recomputing them — the header must match this run's settings (the device included: a float32 forward's last
    bits differ between devices, and so do the trees sampled from them) and every recorded prompt must be among
    ``prompts`` (ValueError otherwise).  Records are per-prompt deterministic, so a resumed run gives the
    result of an uninterrupted one.  ``draft_top``: every tree is drafted from each row's ``draft_top`` most likely
    tokens (:func:`gpu.probs.probs_from_logits`; a setting of the header when given)."""
    check_decode_shape(shape, "accept_bench")
    methods = tuple(methods)
    if not methods:
        raise ValueError("accept_bench: methods is empty")
    if positions < 1:
        raise ValueError(f"accept_bench: positions must be ≥ 1, got {positions}")
    if resume and log is None:
        raise ValueError("accept_bench: resume needs a log")
    baseline = BASELINE.get(process)
    config = {"draft": pair.draft_spec, "shape": str(shape), "nodes": shape.num_nodes, "process": process,
              "device": str(pair.device), "temperature": temperature,
              "draft_temperature": resolve_draft_temperature(temperature, draft_temperature), "positions": positions,
              "seed": seed, **({"draft_top": draft_top} if draft_top is not None else {})}
    header = {"config": config, "methods": list(methods)}
    done: dict[str, PromptRecord] = {}
    if resume and Path(log).is_file():
        old, recs = read_log(log)
        if old != header:
            was = old.get("config", {})
            diff = sorted(k for k in {**was, **config} if was.get(k) != config.get(k))
            raise ValueError(f"accept_bench: cannot resume {log}: its settings differ from this run's "
                             f"({', '.join(diff) or 'methods'}: {old} vs {header})")
        done = {r.id: r for r in recs}
        unknown = sorted(set(done) - {p.id for p in prompts})
        if unknown:
            raise ValueError(f"accept_bench: cannot resume {log}: recorded prompts {unknown} are not in this run")
        # the log as read: a killed run's torn last line dropped, so the next record starts a line of its own (it was
        # glued to the torn one, and the log could not be resumed again)
        tmp = Path(log).with_name(Path(log).name + ".tmp")            # replaced at once: a kill keeps one of the two
        tmp.write_text("".join(json.dumps(x) + "\n" for x in [old] + [r.as_json() for r in recs]))
        os.replace(tmp, log)
    elif log is not None:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).write_text(json.dumps(header) + "\n")
    records = []
    bar = tqdm(prompts, desc="accept-bench", unit="prompt", disable=not progress)
    for p in bar:
        if p.id not in done:
            done[p.id] = evaluate_prompt(pair, p, shape, process, methods, temperature, positions, seed,
                                         draft_temperature, progress, draft_top)
            if log is not None:
                _append(log, done[p.id].as_json())
        records.append(done[p.id])
    return BenchResult(config, methods, baseline if baseline in methods else None, tuple(records))
