"""The engines' own fixed test cases, as data, through the adapters.

SGLang: sgl-kernel's test of ``tree_speculative_sampling_target_only`` (thresholds 1, 1): two trees of six slots,
the second stored out of topological order (the root's first child is slot 4, whose next sibling is slot 1);
target rows are softmaxes at temperature 0.01 of logits 1 with one logit 10, i.e. one-hot in float32.
vLLM: the greedy cases of ``tests/v1/sample/test_rejection_sampler.py``: target rows one-hot on the target's
argmax token at every draft position, ``draft_probs=None``, the bonus token given.

A one-hot target fixes the output of every lossless verifier (the accepted path is the target's argmax path
for as long as the draft follows it, then the target's token), so each method must reproduce the engines'
expected outputs, with any draft rows that make the drafted tokens possible (uniform here) and any coins.
"""
import pytest
import torch

from gpu.engines import PLACEHOLDER_TOKEN_ID as PH
from gpu.engines import sglang_verify_tree, vllm_rejection_sample

#: The adapters run on the inputs' device: every available one is checked.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

# ---------------------------------------------------------------------------------------------------------
# SGLang
# ---------------------------------------------------------------------------------------------------------
SGL = {
    "candidates": [[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]],
    "retrive_index": [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]],
    "retrive_next_token": [[1, 2, -1, 4, 5, -1], [4, 2, 3, -1, 5, -1]],
    "retrive_next_sibling": [[-1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 1, -1]],
    # (tree, slot) → the token with logit 10; every other row has it on token 18
    "peaks": {(0, 0): 3, (0, 3): 4, (0, 4): 5, (1, 0): 11, (1, 4): 12},
    "vocab": 20, "num_speculative_tokens": 4,
    "predicts": [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18],
    "accept_index": [[0, 3, 4, 5], [6, 10, 11, -1]],
    "accept_token_num": [3, 2],
}


def sglang_inputs(dtype=torch.int64):
    logits = torch.ones(2, 6, SGL["vocab"])
    logits[:, :, 18] = 10
    for (b, u), tok in SGL["peaks"].items():
        logits[b, u, 18], logits[b, u, tok] = 1, 10
    p = torch.softmax(logits / 0.01, -1)
    ints = {k: torch.tensor(SGL[k], dtype=dtype) for k in
            ("candidates", "retrive_index", "retrive_next_token", "retrive_next_sibling")}
    return ints, p


def outputs(S):
    return dict(predicts=torch.full((12,), -1, dtype=torch.int32),
                accept_index=torch.full((2, S), -1, dtype=torch.int32),
                accept_token_num=torch.zeros(2, dtype=torch.int32))


def check_sglang(out):
    out = type(out)(*(x.cpu() for x in out))
    assert out.predicts.tolist() == SGL["predicts"]
    assert out.accept_index.tolist() == SGL["accept_index"]
    assert out.accept_token_num.tolist() == SGL["accept_token_num"]
    assert out.predicts.dtype == out.accept_index.dtype == out.accept_token_num.dtype == torch.int32


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("seed", range(3))
def test_sglang_target_only_on_its_coins(dtype, seed):
    ints, p = sglang_inputs(dtype)
    g = torch.Generator().manual_seed(seed)
    out = sglang_verify_tree(**ints, target_probs=p, draft_probs=torch.zeros_like(p), method="target-only",
                             uniform_samples=torch.rand(2, 6, generator=g),
                             uniform_samples_for_final_sampling=torch.rand(2, generator=g), **outputs(4))
    check_sglang(out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method, process", [("nss", None), ("rrs", "iid"), ("rrsw", "wor"), ("tv", "iid"),
                                             ("tv", "wor"), ("univer", "iid"), ("univer", "wor")])
def test_sglang_case_every_method(method, process, device):
    ints, p = sglang_inputs()
    ints, p = {k: v.to(device) for k, v in ints.items()}, p.to(device)
    q = None if method == "nss" else torch.full_like(p, 1 / p.shape[-1])
    for seed in range(3):
        out = sglang_verify_tree(**ints, target_probs=p, draft_probs=q, method=method, process=process,
                                 generator=torch.Generator(device).manual_seed(seed), num_speculative_tokens=4)
        assert out.predicts.device == p.device
        check_sglang(out)


def test_sglang_outputs_created_with_sglang_shapes():
    """Outputs allocated as SGLang does; target-only ignores SGLang's zero draft_probs placeholder."""
    ints, p = sglang_inputs()
    out = sglang_verify_tree(**ints, target_probs=p, draft_probs=torch.zeros_like(p),
                             generator=torch.Generator().manual_seed(0))
    assert out.predicts.shape == (12,) and out.accept_index.shape == (2, 4)    # S = deepest tree + 1
    check_sglang(out)


# ---------------------------------------------------------------------------------------------------------
# vLLM (greedy): draft tokens per request, the target's argmax at each draft position then the bonus token,
# and the expected output_token_ids.
# ---------------------------------------------------------------------------------------------------------
VLLM = {
    "perfect match": ([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]]),
    "early mismatch": ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, PH, PH]]),
    "multiple sequences": ([[1, 2], [3]], [[1, 2, 5], [3, 4]], [[1, 2, 5], [3, 4, PH]]),
    "single token": ([[1]], [[1, 2]], [[1, 2]]),
    "empty": ([[]], [[5]], [[5]]),
    "multiple mismatches": ([[1, 2, 3], [4, 5, 6]], [[1, 2, 7, 6], [4, 8, 6, 9]],
                            [[1, 2, 7, PH], [4, 8, PH, PH]]),
    "greedy perfect match with bonus": ([[1, 2]], [[1, 2, 3]], [[1, 2, 3]]),
    "greedy first mismatch": ([[1]], [[2, 3]], [[2, PH]]),
    "greedy mixed matches": ([[1, 2], [3, 4]], [[1, 5, 6], [3, 4, 7]], [[1, 5, PH], [3, 4, 7]]),
}


def vllm_inputs(spec, target, vocab=100):
    ids = torch.tensor([t for s in spec for t in s], dtype=torch.int32)
    cu = torch.tensor(spec and [sum(len(s) for s in spec[:i + 1]) for i in range(len(spec))], dtype=torch.int32)
    argmax = [t for row in target for t in row[:-1]]
    p = torch.nn.functional.one_hot(torch.tensor(argmax, dtype=torch.long), vocab).float().reshape(-1, vocab)
    bonus = torch.tensor([[row[-1]] for row in target], dtype=torch.int64)
    return ids, cu, p, bonus


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(VLLM))
def test_vllm_greedy_cases(case, device):
    spec, target, expected = VLLM[case]
    ids, cu, p, bonus = (x.to(device) for x in vllm_inputs(spec, target))
    out = vllm_rejection_sample(ids, cu, None, p, bonus, torch.Generator(device).manual_seed(0))
    assert out.dtype == torch.int32 and out.device == p.device and out.tolist() == expected


@pytest.mark.parametrize("method", ["sps", "bv"])
@pytest.mark.parametrize("case", sorted(VLLM))
def test_vllm_cases_with_draft_probs(case, method):
    """The same cases with (uniform) draft rows given, for vLLM's rule and block verification."""
    spec, target, expected = VLLM[case]
    ids, cu, p, bonus = vllm_inputs(spec, target)
    q = torch.full_like(p, 1 / p.shape[-1])
    for seed in range(3):
        out = vllm_rejection_sample(ids, cu, q, p, bonus, torch.Generator().manual_seed(seed), method=method)
        assert out.tolist() == expected


@pytest.mark.parametrize("method, process", [("rrs", "iid"), ("rrsw", "wor"), ("tv", "iid"), ("univer", "iid"),
                                             ("univer", "wor")])
def test_vllm_two_drafts_follow_the_matching_chain(method, process):
    """Two chains per request: the output is the chain that follows the target's argmax path, with that chain's
    bonus when it is accepted whole; ``accepted_draft`` names the chain."""
    V = 10
    # request 0: chains (1, 2) and (3, 4), target argmax path 3, 4 then bonus of chain 1 (= 8)
    # request 1: chains (5, 6) and (7, 1), target argmax 5 then 9 (chain 0 rejected at its 2nd token)
    ids = torch.tensor([1, 2, 3, 4, 5, 6, 7, 1])
    cu = torch.tensor([4, 8])
    argmax = [3, 2, 3, 4, 5, 9, 5, 0]      # each row: the target's argmax at that draft position
    p = torch.nn.functional.one_hot(torch.tensor(argmax), V).double()
    q = torch.full_like(p, 1 / V)
    bonus = torch.tensor([[0, 8], [0, 0]])
    chain = torch.zeros(2, dtype=torch.long)
    out = vllm_rejection_sample(ids, cu, q, p, bonus, torch.Generator().manual_seed(0), method=method,
                                num_drafts=2, process=process, accepted_draft=chain)
    assert out.tolist() == [[3, 4, 8], [5, 9, PH]]
    assert chain.tolist() == [1, 0]
    # request 2: the target's argmax 6 heads neither chain — nothing accepted, accepted_draft −1 (not chain 0)
    chain = torch.zeros(3, dtype=torch.long)
    p3 = torch.cat([p, torch.nn.functional.one_hot(torch.tensor([6, 0, 6, 0]), V).double()])
    out = vllm_rejection_sample(torch.cat([ids, ids[:4]]), torch.tensor([4, 8, 12]), torch.full_like(p3, 1 / V), p3,
                                torch.cat([bonus, bonus[:1]]), torch.Generator().manual_seed(0), method=method,
                                num_drafts=2, process=process, accepted_draft=chain)
    assert out.tolist() == [[3, 4, 8], [5, 9, PH], [6, PH, PH]]
    assert chain.tolist() == [1, 0, -1]
