"""Online speculative decoding with the real pair, every applicable method."""
import pytest
import torch

from gpu.llm.decode import speculative_decode
from gpu.llm.tree_draft import tree_shape
from gpu.llm.verifiers import method_names
from univer_theory import VERIFIERS

pytestmark = pytest.mark.llm

#: (tree spec, process) settings; every lossless method runs once, at the first setting it supports (nss at
#: topk only; univer — batched — at binary:2 wor).
SETTINGS = [("binary:2", "wor"), ("binary:2", "iid"), ("chain:2", "wor"), ("2,1", "topk")]


def _applies(m, spec, process):
    v = VERIFIERS[m]
    return v.lossless and v.supports(tree_shape(spec), process) and (m != "nss" or process == "topk")


#: Lossless methods with no setting here: SpecHub drafts by its own process ("hub"), which the LLM pipeline does
#: not draft.
NO_SETTING = {"spechub"}


def _cases():
    for m in method_names():
        if m not in VERIFIERS:
            continue
        spec, process = next(((s, p) for s, p in SETTINGS if _applies(m, s, p)), (None, None))
        assert (spec is None) == (m in NO_SETTING), m       # every other lossless method runs once
        if spec is not None:
            yield pytest.param(spec, process, m, id=f"{m}-{process}-{spec}")


@pytest.mark.parametrize("spec,process,method", list(_cases()))
def test_two_step_decode_emits_valid_tokens(pair, prompt_ids, spec, process, method):
    shape = tree_shape(spec)
    gen = torch.Generator().manual_seed(11)
    res = speculative_decode(pair, prompt_ids, method, shape, process, 1.0, 64, gen, max_steps=2)
    assert 1 <= res.steps <= 2 and len(res.accepted) == res.steps
    assert all(0 <= tau <= shape.max_depth for tau in res.accepted)
    assert all(0 <= t < pair.vocab_size for t in res.tokens)
    stopped = res.tokens[-1] in pair.stop_ids
    assert len(res.tokens) == sum(tau + 1 for tau in res.accepted) or stopped


def test_decode_is_reproducible_from_the_seed(pair, prompt_ids):
    runs = [speculative_decode(pair, prompt_ids, "tv", tree_shape("binary:2"), "wor", 1.0, 64,
                               torch.Generator().manual_seed(seed), max_steps=2) for seed in (5, 5)]
    assert runs[0].tokens == runs[1].tokens and runs[0].accepted == runs[1].accepted


def test_hf_assisted_is_seeded_and_gives_the_callers_generator_back(pair, prompt_ids):
    """HF's generate() draws from torch's global generator: ``hf_assisted`` seeds it (two runs of one seed agree)
    and gave the caller a generator reset to that seed — the caller's own draws after it now continue as if it had
    not run."""
    from gpu.llm.speed import hf_assisted
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    runs = [hf_assisted(pair, prompt_ids, 1.0, 3, seed=5).tokens for _ in range(2)]
    assert runs[0] == runs[1]
    assert torch.equal(torch.rand(3), expected)


@torch.inference_mode()
def _greedy(model, prompt, n):
    """The first ``n`` greedy tokens after ``prompt``, one full causal forward per token (no cache)."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


def test_greedy_target_is_reproduced_exactly(pair, prompt_ids):
    """At T = 0 the target law is a point mass, so a lossless verifier must emit the greedy continuation
    whatever the draft proposes (here: wor drafts at draft temperature 1)."""
    greedy = _greedy(pair.target, prompt_ids, 6)
    res = speculative_decode(pair, prompt_ids, "tv", tree_shape("binary:2"), "wor", 0.0, 6,
                             torch.Generator().manual_seed(0))
    assert list(res.tokens) == greedy[: len(res.tokens)] and (len(res.tokens) == 6 or res.tokens[-1] in pair.stop_ids)


@pytest.mark.parametrize("method", ["univer", "rrsw"])
def test_one_hot_wor_drafts_reproduce_the_greedy_target(pair, prompt_ids, method):
    """Draft temperature 0 (one-hot draft rows; a row at a small temperature underflows the same way) could not
    draft the two distinct children of a wor node; the rows keep their two most likely tokens
    (``gpu.probs.support_floor``), and the output is still exactly the greedy target's."""
    greedy = _greedy(pair.target, prompt_ids, 6)
    res = speculative_decode(pair, prompt_ids, method, tree_shape("binary:2"), "wor", 0.0, 6,
                             torch.Generator().manual_seed(0), draft_temperature=0.0)
    assert list(res.tokens) == greedy[: len(res.tokens)] and (len(res.tokens) == 6 or res.tokens[-1] in pair.stop_ids)
    assert res.steps < len(res.tokens)          # the one-hot draft is the greedy draft: some step accepts a token


#: fp32 tolerance on logits, step forwards vs one sequential forward of the same tokens (see test_tree_models).
LOGIT_ATOL = 1e-3


@torch.inference_mode()
def _sequential(model, prompt, tokens):
    """Logits ``[len(tokens), V]`` after ``prompt · tokens[:i]``, from one causal forward."""
    seq = list(prompt) + list(tokens)
    return model(torch.tensor([seq])).logits[0, len(prompt) - 1: len(seq) - 1].float()


def _check_against_sequential(pair, prompt, res):
    t_err = float((res.target_logits - _sequential(pair.target, prompt, res.tokens)).abs().max())
    assert t_err <= LOGIT_ATOL, f"target logits of the accepted path differ from sequential decoding by {t_err:.2e}"
    fed = ~res.draft_logits[:, 0].isnan()          # an accepted leaf has no draft row
    d_err = float((res.draft_logits[fed] - _sequential(pair.draft, prompt, res.tokens)[fed]).abs().max())
    assert fed.sum() >= len(res.tokens) // 2 and d_err <= LOGIT_ATOL, (int(fed.sum()), d_err)


@pytest.mark.parametrize("method,spec", [("tv", "binary:2"), ("sps", "chain:3"),
                                         pytest.param("rrsw", "eagle:3", marks=pytest.mark.slow)])
def test_one_forward_per_step_uses_the_sequential_logits(fp32_pair, prompt_ids, method, spec):
    """The target runs once per step (root + tree; the accepted entries are moved into place, never re-fed), and
    the logits a step uses at the root and along the accepted path — the rows that decide every emitted token —
    equal sequential decoding's to fp32 round-off, for the target and the draft."""
    res = speculative_decode(fp32_pair, prompt_ids, method, tree_shape(spec), "wor", 1.0, 8,
                             torch.Generator().manual_seed(4), record_logits=True)
    assert res.target_logits.shape == (len(res.tokens), fp32_pair.vocab_size)
    assert max(res.accepted) >= 1, "no drafted token was accepted: the path part of the check did not run"
    _check_against_sequential(fp32_pair, prompt_ids, res)


@pytest.mark.slow
def test_batch_of_four_gives_every_request_its_own_target_law(fp32_pair):
    """B = 4 ragged prompts in one set of forwards: each request's step rows (target and draft) are those of
    its own context, to fp32 round-off — the verifier, a function of these rows and the coins, then has the
    same per-step law as at B = 1; requests finish at different steps (budget, stop token).  The CI version
    runs on a tiny random Llama (tests/llm/test_ragged_cache.py)."""
    from gpu.llm.decode import speculative_decode_batch
    from gpu.llm.prompts import Prompt, encode_prompt

    texts = ["Name three colours of the sea.", "Hi", "Write a haiku about autumn leaves falling slowly.", "2+2?"]
    prompts = [encode_prompt(fp32_pair.tokenizer, Prompt(str(i), "t", t)) for i, t in enumerate(texts)]
    assert len({len(p) for p in prompts}) == 4
    results = speculative_decode_batch(fp32_pair, prompts, "tv", tree_shape("binary:2"), "wor", 1.0, 6,
                                       torch.Generator().manual_seed(2), record_logits=True)
    for prompt, res in zip(prompts, results):
        assert 1 <= len(res.tokens) <= 6
        _check_against_sequential(fp32_pair, prompt, res)


def test_batched_greedy_reproduces_each_requests_greedy_continuation(pair):
    """T = 0, B = 3: every request must get exactly its own greedy continuation (a point-mass law)."""
    from gpu.llm.decode import speculative_decode_batch
    from gpu.llm.prompts import Prompt, encode_prompt

    prompts = [encode_prompt(pair.tokenizer, Prompt(str(i), "t", t)) for i, t in
               enumerate(["Say hi.", "List two fruits.", "What is a tree?"])]
    results = speculative_decode_batch(pair, prompts, "tv", tree_shape("binary:2"), "wor", 0.0, 4,
                                       torch.Generator().manual_seed(1))
    for prompt, res in zip(prompts, results):
        assert list(res.tokens) == _greedy(pair.target, prompt, len(res.tokens))
