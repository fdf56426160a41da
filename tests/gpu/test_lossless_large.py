"""Losslessness at LLM scale: V = 1000, depth 3, trees drafted by the batched draft processes.

For each method, ``N_TREES`` = 4000 independent (tree, verification) draws; the *first output token* (the first
accepted token, or Y when τ = 0) must follow the target's root row ``p(·|())`` (theory.md §2: losslessness
implies this marginal).  G-test, cells with expected count < 5 pooled, false alarm 1e-3.  Power: the test
computes the χ²-distance it detects with probability 0.99 and refuses the run if that is above 0.05; the lossy
zoo variant (c) (root correction token from p) must be rejected.
Models: row of a node = function of its last token, target ``softmax(2·N(0,1))`` or Zipf(1.1) logits, draft =
target logits + N(0, 0.8²) noise (LLM-like: peaked, long tail), float32.
"""
import pytest
import torch

from gpu import draft_tree, verify
from gpu.engine import sample
from univer_theory import TreeShape

from ..conftest import TEST_FAILURE_RATE
from ..stats import detectable_distance, g_test_counts
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


def first_token_counts(kind, method, process, rule=None, seed=0):
    target, draft = llm_like_rows(kind, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    last = lambda token, nodes: torch.where(token[:, nodes] >= 0, token[:, nodes], V)
    batch, q = draft_tree(SHAPE, lambda token, nodes: draft[last(token, nodes)], process, N_TREES, gen)
    p = target[torch.where(batch.token >= 0, batch.token, V)]
    if rule is None:
        res = verify(batch, p, q, process, method, gen)
    else:
        res = sample(batch, p, q, process, rule, gen)
    first = torch.where(res.num_accepted > 0, batch.token.gather(1, res.accepted_nodes[:, 1:2].clamp(min=0)).squeeze(1),
                        res.next_token)
    return torch.bincount(first, minlength=V).double().numpy(), target[V].double().numpy()


CASES = [("gauss", "nss", "topk"), ("gauss", "rrs", "iid"), ("zipf", "rrsw", "wor"), ("gauss", "kseq", "iid"),
         ("zipf", "tv", "iid"), ("gauss", "tv", "wor")]


@pytest.mark.parametrize("kind, method, process", CASES, ids=["-".join(c) for c in CASES])
def test_first_token_marginal_is_target(kind, method, process):
    counts, p_root = first_token_counts(kind, method, process)
    pval, detectable = g_test_counts(counts, p_root), detectable_distance(p_root, counts.sum(), TEST_FAILURE_RATE)
    assert detectable <= 0.05, f"underpowered: detects only χ²-distance {detectable:.3f}"
    assert pval >= TEST_FAILURE_RATE, f"{kind} {method}-{process}: first-token G-test p = {pval:.3g}"


def test_lossy_variant_is_rejected_at_scale():
    counts, p_root = first_token_counts("gauss", None, "iid", rule=TORCH_ZOO["tv-original-p"])
    pval = g_test_counts(counts, p_root)
    assert pval < TEST_FAILURE_RATE
