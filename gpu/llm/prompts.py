"""Vendored evaluation prompts (``gpu/llm/prompt_sets/``, package data: each set with its license file).

* ``mtbench``   — MT-Bench's 80 questions (FastChat, Apache-2.0), first turn, 8 categories of 10;
* ``humaneval`` — HumanEval's 164 function stubs (OpenAI, MIT), category ``humaneval``;
* ``all``       — both.

Every prompt is rendered with the tokenizer's chat template (system prompt of the template, one user turn,
generation prompt), so the target sees what an assistant would.
"""
from __future__ import annotations

import gzip
import json
from collections import defaultdict
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

#: Folder of the vendored prompt files, shipped inside the package (a wheel install reads them too).
PROMPT_DIR = Path(__file__).resolve().parent / "prompt_sets"
PROMPT_SETS = ("mtbench", "humaneval", "all")

#: Instruction wrapped around a HumanEval stub so the chat model continues the code.
HUMANEVAL_INSTRUCTION = "Complete the following Python function.\n\n```python\n{stub}```"


@dataclass(frozen=True)
class Prompt:
    """One evaluation prompt: ``id`` (e.g. ``mtbench/81``), ``category`` and the user message ``text``."""

    id: str
    category: str
    text: str


def _mtbench() -> list[Prompt]:
    rows = [json.loads(line) for line in (PROMPT_DIR / "mt_bench" / "question.jsonl").read_text().splitlines()
            if line.strip()]
    return [Prompt(f"mtbench/{r['question_id']}", r["category"], r["turns"][0]) for r in rows]


def _humaneval() -> list[Prompt]:
    with gzip.open(PROMPT_DIR / "humaneval" / "HumanEval.jsonl.gz", "rt") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [Prompt(r["task_id"], "humaneval", HUMANEVAL_INSTRUCTION.format(stub=r["prompt"])) for r in rows]


def load_prompts(name: str, limit: int | None = None) -> list[Prompt]:
    """The prompt set ``name``; with ``limit``, the first ``limit`` prompts taken round-robin over categories
    (so a short run still covers every category), in a fixed order."""
    if name not in PROMPT_SETS:
        raise ValueError(f"load_prompts: unknown prompt set {name!r}; choose one of {list(PROMPT_SETS)}")
    prompts = (_mtbench() if name != "humaneval" else []) + (_humaneval() if name != "mtbench" else [])
    if limit is None:
        return prompts
    if limit < 1:
        raise ValueError(f"load_prompts: limit must be ≥ 1, got {limit}")
    by_cat: dict[str, list[Prompt]] = defaultdict(list)
    for p in prompts:
        by_cat[p.category].append(p)
    interleaved = [p for group in zip_longest(*by_cat.values()) for p in group if p is not None]
    return interleaved[:limit]


def encode_prompt(tokenizer, prompt: Prompt) -> list[int]:
    """Token ids of ``prompt`` under the tokenizer's chat template, ending with the assistant header."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], add_generation_prompt=True,
                                        tokenize=True)
    return list(ids)
