"""Verify real-LLM draft trees with any method by name (theory.md §3).

A method runs on the batched torch verifier of :mod:`gpu` (:data:`gpu.METHODS`) when it has one, and otherwise
on its exact per-tree twin in :data:`univer_theory.VERIFIERS` (float64 numpy rows, one tree at a time) — e.g. the
chain-only ``sps`` / ``bv``.  Both give the same per-tree law and the same ``E[τ | T]``.
"""
from __future__ import annotations

import numpy as np
import torch

from univer_theory import VERIFIERS
from univer_theory.validation import check_choice

from ..tree_batch import TreeBatch
from ..verify import METHODS, expected_accepted_length as batched_expected, verify as batched_verify


def method_names() -> list[str]:
    """Every method either layer knows."""
    return sorted(set(METHODS) | set(VERIFIERS))


def _theory(method: str):
    check_choice(method, method_names(), "verifiers", "method")
    return VERIFIERS[method]


def expected_accepted(method: str, batch: TreeBatch, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                      process: str) -> torch.Tensor:
    """``E[τ | T_b]`` of ``method`` for every tree of ``batch`` → ``[B]`` float64 (rows ``[B, N, V]``)."""
    if method in METHODS:
        return batched_expected(batch, target_probs, draft_probs, process, method).double()
    verifier = _theory(method)
    n = batch.num_nodes.tolist()
    return torch.tensor([float(verifier.expected_accepted_length(tree, target_probs[b, :n[b]].double().cpu().numpy(),
                                                                 draft_probs[b, :n[b]].double().cpu().numpy(), process))
                         for b, tree in enumerate(batch.to_trees())], dtype=torch.float64)


def verify_batch(method: str, batch: TreeBatch, target_probs: torch.Tensor, draft_probs: torch.Tensor, process: str,
                 generator: torch.Generator | None = None) -> list[tuple[list[int], int]]:
    """One verification of every tree of ``batch``: per tree ``(accepted path's node ids, root excluded, Y)``.
    Batched methods verify all trees in one call; the exact-core ones tree by tree."""
    if method in METHODS:
        res = batched_verify(batch, target_probs, draft_probs, process, method, generator)
        nodes = res.accepted_nodes[:, 1:].tolist()
        return [([u for u in row if u >= 0], int(y)) for row, y in zip(nodes, res.next_token.tolist())]
    verifier = _theory(method)
    out = []
    for b, tree in enumerate(batch.to_trees()):
        seed = int(torch.randint(0, 2 ** 62, (1,), generator=generator,
                                 device=generator.device if generator is not None else None))
        nodes, y = verifier.sample(tree, target_probs[b].double().cpu().numpy(),
                                   draft_probs[b].double().cpu().numpy(), process, np.random.default_rng(seed))
        out.append(([int(u) for u in nodes], int(y)))
    return out
