"""Losslessness at LLM scale: V = 1000, depth 3, trees drafted by the batched draft processes.

For each method, ``N_TREES`` = 4000 independent (tree, verification) draws; the *first output token* (the first
accepted token, or Y when τ = 0) must follow the target's root row ``p(·|())`` (theory.md §2: losslessness
implies this marginal).  G-test, cells with expected count < 20 pooled, level ``tests.stats.LEVEL``.  Power:
the alternative is the lossy zoo variant (c) (TV with the correction token from the original p) on the *same*
drafted trees — its exact first-token law per tree (:func:`gpu.engine.first_token_law`) averaged over them
(for topk trees, whose children are distinct, the wor rule) — and each test requires power ≥
``tests.stats.POWER`` against it; samples of that variant must be rejected.
Models: row of a node = function of its last token, target ``softmax(2·N(0,1))`` or Zipf(1.1) logits, draft =
target logits + N(0, 0.8²) noise (LLM-like: peaked, long tail), float32.
"""
import pytest
import torch

from gpu import draft_tree, verify
from gpu.engine import first_token_law, sample
from univer_theory import TreeShape

from ..stats import assert_accepts, assert_power, assert_rejects, g_test_counts
from .helpers import TORCH_ZOO

V, N_TREES, SHAPE = 1000, 4000, TreeShape.parse("2,1,1")


def llm_like_rows(kind, seed):
    """``(target, draft)`` tables ``[V+1, V]``: row t = law after last token t, row V = the root."""
    g = torch.Generator().manual_seed(seed)
    if kind == "gauss":
        logits = 2.0 * torch.randn(V + 1, V, generator=g)
    else:
        ranks = torch.stack([torch.randperm(V, generator=g) for _ in range(V + 1)]) + 1
        logits = -1.1 * torch.log(ranks.double()).float()
    draft = logits + 0.8 * torch.randn(V + 1, V, generator=g)
    return torch.softmax(logits, -1), torch.softmax(draft, -1)


def drafted(kind, process, seed=0):
    """``(batch, target_probs, draft_probs, root row of the target, generator)`` of ``N_TREES`` drafted trees."""
    target, draft = llm_like_rows(kind, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    last = lambda token, nodes: torch.where(token[:, nodes] >= 0, token[:, nodes], V)
    batch, q = draft_tree(SHAPE, lambda token, nodes: draft[last(token, nodes)], process, N_TREES, gen)
    p = target[torch.where(batch.token >= 0, batch.token, V)]
    return batch, p, q, target[V].double().numpy(), gen


def first_token_counts(batch, res):
    """Counts ``[V]`` of the first output token of verifications ``res``."""
    first = torch.where(res.num_accepted > 0, batch.token.gather(1, res.accepted_nodes[:, 1:2].clamp(min=0)).squeeze(1),
                        res.next_token)
    return torch.bincount(first, minlength=V).double().numpy()


def assert_power_against_lossy(batch, p, q, process, p_root):
    """Power ≥ POWER against the first-token law of zoo variant (c) on these trees (module docstring)."""
    rule_process = "wor" if process == "topk" else process
    lossy = first_token_law(batch, p.double(), q.double(), rule_process, TORCH_ZOO["tv-original-p"]).mean(0)
    as_law = lambda x: dict(enumerate(map(float, x)))
    assert_power(as_law(p_root), {"tv-original-p": as_law(lossy)}, N_TREES)


CASES = [("gauss", "nss", "topk"), ("gauss", "rrs", "iid"), ("zipf", "rrsw", "wor"), ("gauss", "kseq", "iid"),
         ("zipf", "tv", "iid"), ("gauss", "tv", "wor")]


@pytest.mark.parametrize("kind, method, process", CASES, ids=["-".join(c) for c in CASES])
def test_first_token_marginal_is_target(kind, method, process):
    batch, p, q, p_root, gen = drafted(kind, process)
    assert_power_against_lossy(batch, p, q, process, p_root)
    counts = first_token_counts(batch, verify(batch, p, q, process, method, gen))
    assert_accepts(g_test_counts(counts, p_root), f"{kind} {method}-{process}: first token")


def test_lossy_variant_is_rejected_at_scale():
    batch, p, q, p_root, gen = drafted("gauss", "iid")
    assert_power_against_lossy(batch, p, q, "iid", p_root)
    counts = first_token_counts(batch, sample(batch, p, q, "iid", TORCH_ZOO["tv-original-p"], gen))
    assert_rejects(g_test_counts(counts, p_root), "tv-original-p at V = 1000")
