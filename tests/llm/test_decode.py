"""Online speculative decoding with the real pair, every applicable method."""
import pytest
import torch

from gpu.llm.decode import prefill, extend, speculative_decode
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


def _cases():
    for m in method_names():
        if m not in VERIFIERS:
            continue
        spec, process = next(((s, p) for s, p in SETTINGS if _applies(m, s, p)), (None, None))
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


@torch.inference_mode()
def test_greedy_target_is_reproduced_exactly(pair, prompt_ids):
    """At T = 0 the target law is a point mass, so a lossless verifier must emit the greedy continuation
    whatever the draft proposes (here: wor drafts at draft temperature 1)."""
    cache, logits = prefill(pair.target, prompt_ids)
    greedy = []
    for _ in range(6):
        greedy.append(int(logits.argmax()))
        logits = extend(pair.target, cache, [greedy[-1]])
    res = speculative_decode(pair, prompt_ids, "tv", tree_shape("binary:2"), "wor", 0.0, 6,
                             torch.Generator().manual_seed(0))
    assert list(res.tokens) == greedy[: len(res.tokens)] and (len(res.tokens) == 6 or res.tokens[-1] in pair.stop_ids)
