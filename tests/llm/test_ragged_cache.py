"""RaggedCache and batched speculative decoding on a tiny random Llama (no download, fast): ragged requests fed
through masks and accepted entries moved into place give the logits of sequential decoding, request by request."""
import pytest
import torch

from gpu.llm.decode import feed_sequences, speculative_decode_batch
from gpu.llm.models import ModelPair
from gpu.llm.ragged_cache import RaggedCache
from gpu.llm.tree_draft import tree_shape
from univer_theory import TreeShape

#: fp32 round-off of a 2-layer, width-32 model: different reduction orders move logits by ~1e-7.
ATOL = 1e-5


def _tiny_llama(seed: int, layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval()


class _Ids:
    """Tokenizer stand-in: decodes ids to their decimal strings."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


@pytest.fixture(scope="module")
def tiny_pair():
    target = _tiny_llama(0)
    target.config.eos_token_id = 47
    return ModelPair(target, _tiny_llama(1, layers=1), _Ids(), "tiny")


@torch.inference_mode()
def _sequential(model, seq):
    return model(torch.tensor([seq])).logits[0].float()


def test_ragged_feed_commit_equals_sequential(tiny_pair):
    model = tiny_pair.target
    seqs = [[3, 5, 7, 9, 11], [4], [6, 8, 10]]
    cache = RaggedCache(model, 3)
    last = feed_sequences(cache, seqs, 1)[:, -1]
    for b, s in enumerate(seqs):
        assert torch.allclose(last[b], _sequential(model, s)[-1], atol=ATOL)
    # a chain of two scratch tokens per request; keep only the first for requests 0 and 2, both for request 1
    start = cache.size
    tokens = torch.tensor([[20, 21], [22, 23], [24, 25]])
    positions = cache.lengths[:, None] + torch.arange(2)
    logits = cache.feed(tokens, positions, torch.ones(3, 2, 2, dtype=torch.bool).tril())
    for b, s in enumerate(seqs):
        ref = _sequential(model, s + tokens[b].tolist())[-2:]
        assert torch.allclose(logits[b], ref, atol=ATOL)
    cache.commit([[start], [start, start + 1], [start]])
    assert cache.lengths.tolist() == [6, 3, 4] and cache.size == 6
    nxt = feed_sequences(cache, [[30], [31], [32]], 1)[:, -1]
    kept = [s + t for s, t in zip(seqs, ([20], [22, 23], [24]))]
    for b in range(3):
        assert torch.allclose(nxt[b], _sequential(model, kept[b] + [30 + b])[-1], atol=ATOL)
    cache.select([2, 0])
    out = feed_sequences(cache, [[40], [41]], 1)[:, -1]
    assert torch.allclose(out[0], _sequential(model, kept[2] + [32, 40])[-1], atol=ATOL)
    assert torch.allclose(out[1], _sequential(model, kept[0] + [30, 41])[-1], atol=ATOL)


def test_commit_rejects_bad_slots(tiny_pair):
    cache = RaggedCache(tiny_pair.target, 2)
    feed_sequences(cache, [[1, 2], [3]], 1)
    with pytest.raises(ValueError, match="ascend"):
        cache.commit([[1], []])           # slot 1 is request 0's committed prefix
    with pytest.raises(ValueError, match="one slot list per request"):
        cache.commit([[]])


@pytest.mark.parametrize("method,spec,process", [("tv", "binary:2", "wor"), ("sps", "chain:3", "wor"),
                                                 ("rrs", "2,2", "iid"), ("univer", "chain:2", "wor")])
def test_batched_steps_use_each_requests_sequential_rows(tiny_pair, method, spec, process):
    """B = 4 ragged prompts decoded together, 20 tokens each: at every emitted position, the target and draft
    logits the step used equal sequential decoding of that request alone — so every request's per-step law
    (the verifier's law given these rows) is the one of B = 1."""
    prompts = [[1, 2, 3, 4, 5, 6], [7], [8, 9], [10, 11, 12, 13]]
    results = speculative_decode_batch(tiny_pair, prompts, method, tree_shape(spec), process, 1.0, 20,
                                       torch.Generator().manual_seed(0), record_logits=True)
    assert sum(sum(r.accepted) for r in results) > 0
    for prompt, res in zip(prompts, results):
        seq = prompt + list(res.tokens)
        n = len(res.tokens)
        assert torch.allclose(res.target_logits, _sequential(tiny_pair.target, seq)[len(prompt) - 1: -1], atol=ATOL)
        fed = ~res.draft_logits[:, 0].isnan()
        ref = _sequential(tiny_pair.draft, seq)[len(prompt) - 1: -1]
        assert fed.sum() >= n // 2 and torch.allclose(res.draft_logits[fed], ref[fed], atol=ATOL)
        assert n == 20 or res.tokens[-1] == 47



def test_batched_plain_sampling_uses_each_requests_sequential_rows(tiny_pair):
    """Plain sampling of B = 3 ragged prompts in shared forwards: every token is drawn from the target row of
    its own request's context (sequential decoding to fp32 round-off), so each request's law is that of B = 1;
    requests stop at their own stop token or the budget."""
    from gpu.llm.decode import sample_plain_batch

    prompts = [[1, 2, 3, 4, 5], [6], [7, 8]]
    results = sample_plain_batch(tiny_pair, prompts, 1.0, 12, torch.Generator().manual_seed(3), record_logits=True)
    for prompt, res in zip(prompts, results):
        seq = prompt + list(res.tokens)
        assert res.accepted == (0,) * len(res.tokens) and res.target_logits.shape[0] == len(res.tokens)
        assert torch.allclose(res.target_logits, _sequential(tiny_pair.target, seq)[len(prompt) - 1: -1], atol=ATOL)
        assert len(res.tokens) == 12 or res.tokens[-1] == 47
    assert len({r.wall_s for r in results}) == 1                        # one shared loop


@pytest.mark.parametrize("prompts", [[], [[1, 2], []]])
def test_batched_decoders_reject_missing_or_empty_prompts(tiny_pair, prompts):
    from gpu.llm.decode import sample_plain_batch

    with pytest.raises(ValueError, match="speculative_decode: prompts must hold"):
        speculative_decode_batch(tiny_pair, prompts, "tv", tree_shape("binary:2"), "wor", 1.0, 2)
    with pytest.raises(ValueError, match="sample_plain: prompts must hold"):
        sample_plain_batch(tiny_pair, prompts, 1.0, 2)


def test_speed_compare_batches_groups_and_counts_every_request(tiny_pair, monkeypatch):
    """``batch = 2`` over 3 prompts: groups of 2 and 1, each group's wall counted once, tokens and steps summed
    over requests, after one untimed warm-up run per method (not counted); hf-assisted cannot batch, and a batch
    outside [1, #prompts] is refused; the largest seed runs every group."""
    import gpu.llm.speed as speed
    from gpu.llm.speed import SpeedMethod, speed_compare

    calls = []
    real = speed.run_method
    monkeypatch.setattr(speed, "run_method", lambda *a: calls.append((a[1].name, len(a[2]), a[5])) or real(*a))
    prompts = [[1, 2, 3], [4], [5, 6]]
    methods = [SpeedMethod("plain", "plain"), SpeedMethod("tv", "tv", tree_shape("binary:2"))]
    report = speed_compare(tiny_pair, prompts, methods, "wor", 1.0, 5, seed=0, progress=False, batch=2)
    warm = [(m.name, 2, speed.WARMUP_TOKENS) for m in methods]
    assert calls == warm + [(m.name, n, 5) for n in (2, 1) for m in methods]
    for name, m in report["methods"].items():
        assert len(report["per_prompt"][name]) == 2
        assert 3 <= m["new_tokens"] <= 15
        assert m["steps"] == m["new_tokens"] if name == "plain" else 3 <= m["steps"] <= m["new_tokens"]
        assert m["tokens_per_s"] == pytest.approx(m["new_tokens"] / m["wall_s"])
        assert 0 < sum(m["share"].values()) <= 1 + 1e-9
    calls.clear()                           # the largest seed: seed + i wraps (it overflowed after the first group)
    speed_compare(tiny_pair, prompts, methods[:1], "wor", 1.0, 2, seed=2 ** 64 - 1, progress=False, batch=2)
    assert len(calls) == 3
    with pytest.raises(ValueError, match="cannot batch"):
        speed_compare(tiny_pair, prompts, [SpeedMethod("hf-assisted", "hf-assisted")], "wor", 1.0, 2, batch=2)
    for batch in (0, 4):
        with pytest.raises(ValueError, match="batch must be in"):
            speed_compare(tiny_pair, prompts, methods, "wor", 1.0, 2, batch=batch)


def test_speed_reports_the_acceptance_length_and_drafts_at_the_draft_temperature(monkeypatch):
    """A draft equal to the target (q = p: every drafted token is accepted, τ = 4 on ``chain:4``) and a budget of
    8 tokens with no stop token: each request takes 2 steps, 5 tokens then 3 (the budget cuts the second), so the
    acceptance length τ + 1 is 5 where the emitted tokens per step are 4 (speed called 4 the acceptance length);
    ``draft_temperature`` reaches the decoder (``univer speed`` accepted it and drafted at the target's)."""
    import gpu.llm.speed as speed
    from gpu.llm.speed import SpeedMethod, speed_compare

    target, draft = _tiny_llama(0), _tiny_llama(0)
    target.config.eos_token_id = draft.config.eos_token_id = None
    pair = ModelPair(target, draft, _Ids(), "same")
    seen, real = [], speed.speculative_decode_batch
    monkeypatch.setattr(speed, "speculative_decode_batch", lambda *a, **kw: seen.append(a[8]) or real(*a, **kw))
    method = [SpeedMethod("tv", "tv", tree_shape("chain:4"))]
    report = speed_compare(pair, [[1, 2, 3], [4, 5]], method, "wor", 1.0, 8, progress=False)["methods"]["tv"]
    assert (report["steps"], report["new_tokens"]) == (4, 16)
    assert report["acceptance_length"] == 5 and report["tokens_per_step"] == 4
    seen.clear()
    speed_compare(pair, [[1, 2, 3]], method, "wor", 1.0, 2, progress=False, draft_temperature=0.5)
    assert seen == [0.5, 0.5]                                               # the warm-up run and the timed one


def test_a_pair_and_its_decoding_are_checked_before_any_forward(tiny_pair, tmp_path, monkeypatch):
    """An inference engineer's own pair: a draft of another vocabulary was an IndexError after the prefill (now a
    ValueError building the pair); ``max_steps = 0`` decoded 9 steps anyway; a prompt past the positions of a
    model that embeds them (GPT-2) was an IndexError inside its embedding — refused up front, to the position
    (27 + 4 new + depth 2 − 1 = 32 of 32 runs, 28 not), while rotary models, which run past their
    ``max_position_embeddings``, are not held to it; ``hf:~/dir`` was not expanded; the 1 024-node bound held for
    text specs only, not for a TreeShape given to ``speculative_decode_batch``; ``accept_bench`` ran a prompt
    past a draft's learned positions into an IndexError (it now runs the decoder's check, to the position:
    28 + 3 positions + depth 2 − 1 = 32 of 32 runs, 4 positions not); ``chain:D`` built its D levels before
    its size was checked (10¹² levels: out of memory)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from gpu.llm.accept_bench import accept_bench
    from gpu.llm.models import parse_draft_spec
    from gpu.llm.prompts import Prompt
    from gpu.llm.tree_draft import MAX_DECODE_NODES

    wide = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2)).eval()
    with pytest.raises(ValueError, match="must score one vocabulary .*target 48, draft 50"):
        ModelPair(tiny_pair.target, wide, tiny_pair.tokenizer, "wide")
    torch.manual_seed(2)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=48, n_positions=32, n_embd=32, n_layer=1, n_head=4)).eval()
    absolute = ModelPair(tiny_pair.target, gpt2, tiny_pair.tokenizer, "gpt2")
    shape, gen = tree_shape("binary:2"), torch.Generator().manual_seed(0)
    decode = lambda prompts, pair=tiny_pair, **kw: speculative_decode_batch(  # noqa: E731
        pair, prompts, "tv", shape, "wor", 1.0, kw.pop("new", 4), gen, **kw)
    class Chat(type(tiny_pair.tokenizer)):
        """A chat template of 28 tokens."""

        def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
            return [3] * 28

    chat = ModelPair(tiny_pair.target, gpt2, Chat(), "gpt2")
    prompt = [Prompt("p", "c", "x")]
    bench = lambda n: accept_bench(chat, prompt, shape, "wor", ["tv"], positions=n, progress=False)  # noqa: E731
    for bad, match in ((lambda: decode([[3, 4]], max_steps=0), "max_steps must be an integer ≥ 1, got 0"),
                       (lambda: bench(4), r"evaluate_prompt: the longest prompt \(28 tokens\) and 6 more positions"),
                       (lambda: tree_shape("chain:1000000000000"), "beyond the 1048576 a shape may have"),
                       (lambda: decode([[3, 4]], new=0), "max_new_tokens must be an integer ≥ 1, got 0"),
                       (lambda: decode([[3] * 28], absolute), r"\(28 tokens\) and 6 more positions pass the draft.s"),
                       (lambda: tree_shape("64,64,64"), f"beyond the {MAX_DECODE_NODES} a decoding tree"),
                       (lambda: speculative_decode_batch(tiny_pair, [[3, 4]], "tv", TreeShape.uniform([40, 40]), "wor",
                                                         1.0, 4, gen), "shape has 1641 nodes, beyond the 1024"),
                       (lambda: speculative_decode_batch(tiny_pair, [[3, 4]], "tv", "2,2", "wor", 1.0, 4, gen),
                        "shape must be a TreeShape, got str"),
                       (lambda: accept_bench(tiny_pair, [], TreeShape.uniform([40, 40]), "wor", ["tv"]),
                        "accept_bench: shape has 1641 nodes, beyond the 1024"),     # as the decoder refuses it
                       (lambda: accept_bench(tiny_pair, [], "2,2", "wor", ["tv"]),
                        "shape must be a TreeShape, got str")):
        with pytest.raises(ValueError, match=match):
            bad()
    tiny_pair.target.config.eos_token_id = None                            # every run spends its whole budget
    try:
        assert len(decode([[3] * 27], absolute)[0].tokens) == 4               # the last position, 31, is fed
        assert len(decode([[3] * 130], new=2)[0].tokens) == 2                 # rotary: past its 128 positions
    finally:
        tiny_pair.target.config.eos_token_id = 47
    assert len(decode([[3, 4]], new=8, max_steps=1)[0].accepted) == 1
    assert bench(3).records[0].positions == 3
    assert tree_shape("binary:9").num_nodes == 1023
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text("{}")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert parse_draft_spec("hf:~/d") == ("hf", tmp_path / "d")
    for bad in ("hf:", "hf:~/missing", "rtn:4", "rtn:0:32", "early:x", "lora:1"):
        with pytest.raises(ValueError, match="load_pair: (spec|unknown draft kind)"):
            parse_draft_spec(bad, "load_pair")
