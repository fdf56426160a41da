"""Round-to-nearest quantisation on small tensors (no model needed)."""
import pytest
import torch

from gpu.llm.quantize import PackedLinear, quantize_linear_layers, rtn_levels, rtn_quantize


def _weights(seed, shape=(6, 24)):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("bits,group", [(2, 8), (3, 4), (4, 24), (8, 6)])
def test_rtn_levels_error_and_idempotence(bits, group):
    w = _weights(bits)
    wq = rtn_quantize(w, bits, group)
    assert wq.shape == w.shape and wq.dtype == w.dtype
    for g in range(0, w.shape[1], group):
        blk, blkq = w[:, g:g + group], wq[:, g:g + group]
        for row, rowq in zip(blk, blkq):
            scale = (row.max() - row.min()) / (2 ** bits - 1)
            assert len(torch.unique(rowq)) <= 2 ** bits
            assert (rowq - row).abs().max() <= scale / 2 + 1e-6, "RTN error exceeds half a step"
            # the extremes of a group are levels 0 and 2^bits − 1, so they are reproduced
            assert torch.isclose(rowq.min(), row.min(), atol=1e-6) and torch.isclose(rowq.max(), row.max(), atol=1e-6)
    assert torch.allclose(rtn_quantize(wq, bits, group), wq, atol=1e-6), "re-quantising moved the levels"


def test_rtn_ragged_last_group_and_constant_group():
    w = _weights(1, (3, 10))
    w[1, 8:] = 0.25                                   # a constant (ragged) group is exact
    wq = rtn_quantize(w, 3, 4)                        # groups 0:4, 4:8, 8:10
    pieces = torch.cat([rtn_quantize(w[:, :8], 3, 4), rtn_quantize(w[:, 8:], 3, 2)], dim=1)
    assert torch.equal(wq, pieces)
    assert torch.equal(wq[1, 8:], w[1, 8:])


def test_rtn_group_wider_than_the_row_is_the_row():
    """A group wider than the row quantises the row as one group, without padding it out (``rtn:4:65536`` padded
    SmolLM2's 576-column head to 65 536 columns: ~38 GB)."""
    w = _weights(2, (3, 10))
    levels, lo, scale = rtn_levels(w, 4, 1 << 20)
    assert levels.shape == (3, 1, 10)
    assert torch.equal(rtn_quantize(w, 4, 1 << 20), rtn_quantize(w, 4, 10))


@pytest.mark.parametrize("kwargs,match", [
    ({"weight": torch.ones(4), "bits": 4, "group_size": 2}, "2-D"),
    ({"weight": torch.tensor([[1.0, float("nan")]]), "bits": 4, "group_size": 2}, "finite"),
    ({"weight": torch.ones(2, 2), "bits": 1, "group_size": 2}, "bits"),
    ({"weight": torch.ones(2, 2), "bits": 4, "group_size": 0}, "group_size"),
])
def test_rtn_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rtn_quantize(**kwargs)


class _Tiny(torch.nn.Module):
    """The attribute layout of a Hugging Face decoder: ``model.layers`` plus an embedding."""

    def __init__(self):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed = torch.nn.Embedding(5, 8)
        self.model.layers = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())])


def test_quantize_linear_layers_copies_and_touches_only_decoder_linears():
    torch.manual_seed(0)
    model = _Tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    draft = quantize_linear_layers(model, 2, 4)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} of the target changed"
    lin, lin_q = model.model.layers[0][0], draft.model.layers[0][0]
    assert torch.equal(lin_q.weight, rtn_quantize(lin.weight, 2, 4))
    assert torch.equal(lin_q.bias, lin.bias) and torch.equal(draft.model.embed.weight, model.model.embed.weight)
    with pytest.raises(ValueError, match="model.layers"):
        quantize_linear_layers(torch.nn.Linear(2, 2), 4, 2)


@pytest.mark.parametrize("bits,group,in_f", [(4, 128, 576), (3, 64, 192), (2, 32, 96), (4, 256, 512)])
def test_packed_linear_matches_dequantised_rtn(bits, group, in_f):
    """The int4 kernel computes ``x Ŵᵀ + b`` with ``ŵ = (level − 8)·bf16(scale) + bf16(lo + 8·scale)`` and bf16
    ``x`` (ragged last RTN group included: 576 = 4·128 + 64), which is rtn_quantize's ``lo + level·scale`` up to
    the bf16 rounding of scale and zero."""
    gen = torch.Generator().manual_seed(bits)
    w = torch.randn(48, in_f, generator=gen) * 0.05
    b = torch.randn(48, generator=gen)
    x = torch.randn(2, 3, in_f, generator=gen)
    levels, lo, scale = rtn_levels(w, bits, group)
    bf = lambda t: t.to(torch.bfloat16).float()   # noqa: E731
    w_kernel = ((levels - 8) * bf(scale) + bf(lo + 8 * scale)).reshape(48, -1)[:, :in_f]
    ref = bf(x) @ w_kernel.t() + b
    out = PackedLinear(w, b, bits, group)(x)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert (out - ref).abs().max() <= 1e-2 * ref.abs().max()      # the kernel's bf16 output rounding
    w_rtn = rtn_quantize(w, bits, group)
    assert (w_kernel - w_rtn).abs().max() <= 2 ** -7 * 9 * scale.max()    # |level − 8| ≤ 8, zero ≤ lo + 8·scale
    wrong = PackedLinear(w, b, bits, 32 if group != 32 else 64)(x)
    assert (wrong - ref).abs().max() > 10 * (out - ref).abs().max(), "the check cannot tell the group size apart"


@pytest.mark.parametrize("args,match", [((5, 128, 576), "at most 4 bits"), ((4, 48, 576), "multiples of 32"),
                                        ((4, 128, 80), "multiples of 32")])
def test_packed_linear_rejects_what_the_kernel_cannot_hold(args, match):
    bits, group, in_f = args
    with pytest.raises(ValueError, match=match):
        PackedLinear(torch.randn(16, in_f), None, bits, group)


def test_quantize_linear_layers_unties_the_head_keeping_its_bias():
    """The float RTN draft's head is its own quantised copy: a head bias is kept (not nn.Linear's random init) and
    the config says untied, so a saved and reloaded draft (an hf:DIR draft) keeps the quantised head, not the
    embedding."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = dict(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2)
    biased = LlamaForCausalLM(LlamaConfig(**config, tie_word_embeddings=False)).eval()
    head = torch.nn.Linear(64, 64, bias=True)
    with torch.no_grad():
        head.weight.copy_(biased.lm_head.weight)
    biased.lm_head = head
    assert torch.equal(quantize_linear_layers(biased, 4, 32).lm_head.bias, head.bias)
    tied = LlamaForCausalLM(LlamaConfig(**config, tie_word_embeddings=True)).eval()
    draft = quantize_linear_layers(tied, 4, 32)
    assert draft.config.tie_word_embeddings is False
    draft.tie_weights()                                     # as from_pretrained does: the quantised head stays
    assert torch.equal(draft.lm_head.weight, rtn_quantize(tied.lm_head.weight, 4, 32))
