"""Paired offline evaluation on real trees: reproducibility and the orderings theory guarantees per tree."""
import json
import math

import pytest

import torch

from gpu import probs_from_logits
from gpu.llm.accept_bench import accept_bench
from gpu.llm.prompts import load_prompts
from gpu.llm.decode import start_caches, tree_step
from gpu.llm.tree_draft import tree_shape
from univer_theory import VERIFIERS

pytestmark = pytest.mark.llm


@pytest.fixture(scope="module")
def two_prompts():
    return load_prompts("mtbench", 2)


@pytest.fixture(scope="module")
def binary_run(pair, two_prompts):
    return accept_bench(pair, two_prompts, tree_shape("binary:2"), "wor", ["rrsw", "tv"], 1.0, 2, seed=7,
                        progress=False)


def test_paired_evaluation_is_reproducible_per_prompt(pair, two_prompts, binary_run):
    """Same seed → same continuation, trees and E[τ]; a prompt's result does not depend on the others."""
    alone = accept_bench(pair, two_prompts[1:], tree_shape("binary:2"), "wor", ["rrsw", "tv"], 1.0, 2, seed=7,
                         progress=False)
    assert alone.records[0] == binary_run.records[1]
    for r in binary_run.records:
        assert 1 <= r.positions <= 2
        for vals in r.expected.values():
            assert all(0.0 <= v <= 2.0 for v in vals)      # 0 ≤ E[τ | T] ≤ depth


def test_summary_statistics_are_prompt_clustered(binary_run):
    recs = binary_run.records
    summary = binary_run.summary()["all"]
    tv = [sum(r.expected["tv"]) / r.positions for r in recs]
    rrsw = [sum(r.expected["rrsw"]) / r.positions for r in recs]
    assert summary["tv"]["expected_accepted"] == pytest.approx(sum(tv) / len(tv), abs=1e-12)
    assert summary["tv"]["gain"] == pytest.approx(sum(tv) / sum(rrsw) - 1, abs=1e-12)
    assert summary["rrsw"]["gain"] == 0.0 and summary["rrsw"]["gain_se"] == 0.0
    tv_stats = summary["tv"]
    assert tv_stats["tokens_per_step"] == tv_stats["acceptance_length"] == pytest.approx(tv_stats["expected_accepted"] + 1)
    n = len(recs)                                  # the paper's convention: gain on tokens per forward E[τ] + 1
    assert summary["tv"]["gain_per_forward"] == pytest.approx((sum(tv) + n) / (sum(rrsw) + n) - 1, abs=1e-12)
    assert binary_run.baseline == "rrsw" and summary["positions"] == sum(r.positions for r in recs)
    assert math.isfinite(summary["tv"]["se"])


def test_chain_identities_and_full_acceptance_ordering(pair, two_prompts):
    """Per realised chain the theory guarantees identities — TV's law equals BV's, RRSw's equals token-level
    SpS's (one child per node) — and that BV accepts the whole chain at least as often as SpS:
    ``Pr_BV(τ = γ | x^γ) = w_γ ≥ Π_i min(1, p/q) = Pr_SpS(τ = γ | x^γ)``.  (``E[τ | chain]`` itself is *not*
    ordered per chain: BV ≥ SpS holds only on average over the draft — e.g. p = (1/3, 2/3), q = (2/3, 1/3),
    chain (0, 0): SpS 3/4, BV 1/2.)  sps / bv run on the exact core, rrsw / tv on the batched verifier."""
    from gpu.llm.accept_bench import evaluate_prompt
    from gpu.llm.prompts import encode_prompt

    shape = tree_shape("chain:3")
    rec = evaluate_prompt(pair, two_prompts[0], shape, "wor", ["sps", "rrsw", "bv", "tv"], 1.0, 2, seed=1)
    for i in range(rec.positions):
        assert rec.expected["tv"][i] == pytest.approx(rec.expected["bv"][i], abs=1e-9)
        assert rec.expected["rrsw"][i] == pytest.approx(rec.expected["sps"][i], abs=1e-9)
    # full-acceptance ordering on one real chain, from the exact per-tree laws
    ids = encode_prompt(pair.tokenizer, two_prompts[0])
    step = tree_step(*start_caches(pair, [ids]), shape, "wor", 1.0, torch.Generator().manual_seed(2))
    p = probs_from_logits(step.target_logits[0].double(), 1.0)
    tree = step.batch.to_trees()[0]
    full = {m: sum(v for k, v in VERIFIERS[m].law(tree, p.numpy(), step.draft_probs[0].numpy(), "wor").items()
                   if len(k) == 4)
            for m in ("sps", "bv")}
    assert full["bv"] >= full["sps"] - 1e-12, full


@pytest.mark.parametrize("spec,steps,top", [("binary:2", 2, None), ("eagle:4", 1, None), ("eagle:4", 1, 64)])
def test_batched_univer_equals_the_exact_core_on_real_trees(pair, two_prompts, spec, steps, top):
    """On real SmolLM2 wor trees (V = 49 152) UniVer's nodes use rule 3, PTS (k ≥ 3: θ by the walk on the CPU) or the iid coupling
    (:mod:`gpu.wor_plans`), and on the EAGLE-like tree the slot rule for k = 2, 3, 4 — and the batched
    E[τ | T] equals the exact core's (1e-10; real rows hold dominant-token nodes, where rule 3 is solved to
    ~1e-11).  With a draft truncated to its top 64 tokens every drafted row has 64 tokens and the batched rule
    plans on those columns (:mod:`gpu.support`), the exact core on all V."""
    from gpu import expected_accepted_length
    from gpu.llm.prompts import encode_prompt

    ids = encode_prompt(pair.tokenizer, two_prompts[1])
    t_cache, d_cache, root, pending = start_caches(pair, [ids])
    gen = torch.Generator().manual_seed(5)
    shape = tree_shape(spec)
    for i in range(steps):
        step = tree_step(t_cache, d_cache, root, pending, shape, "wor", 1.0, gen, draft_top=top)
        p, q = probs_from_logits(step.target_logits.double(), 1.0), step.draft_probs
        internal = step.batch.parent[0][step.batch.parent[0] >= 0].unique()
        assert ((q[0, internal] > 0).sum(-1) == (top or q.shape[-1])).all()
        got = float(expected_accepted_length(step.batch, p, q, "wor", "univer")[0])
        want = VERIFIERS["univer"].expected_accepted_length(step.batch.to_trees()[0], p[0].numpy(), q[0].numpy(),
                                                            "wor")
        assert got == pytest.approx(want, abs=1e-10), i
        step.commit(t_cache, d_cache, [[]])           # continue the context with the first drafted token
        root = [int(step.batch.token[0, 1])]
        pending = [root]


def test_log_reading_ignores_only_a_torn_last_line(tmp_path):
    """A run killed while appending leaves a torn last line, which is dropped; a bad line elsewhere is an error."""
    from gpu.llm.accept_bench import PromptRecord, read_log

    rec = PromptRecord("p1", "writing", 12, {"rrsw": (0.5, 0.25), "tv": (0.75, 1.0)})
    header = {"config": {"positions": 2}, "methods": ["rrsw", "tv"]}
    log = tmp_path / "accept_bench.jsonl"
    log.write_text("\n".join([json.dumps(header), json.dumps(rec.as_json()), '{"id": "p2", "cat']))
    assert read_log(log) == (header, [rec])
    log.write_text("\n".join([json.dumps(header), "{torn", json.dumps(rec.as_json())]))
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        read_log(log)
