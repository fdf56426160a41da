"""Draft rows that keep s tokens of positive probability (``gpu.probs.support_floor``): a row at a small or zero
temperature underflows to fewer tokens than a wor / top-k / greedy node drafts; the floored row is a draft law of
its own, so every lossless verifier stays exactly lossless on it."""
import numpy as np
import pytest
import torch

from gpu import probs_from_logits, sample_children
from gpu.probs import SIMPLEX_TOL, support_floor
from univer_theory import VERIFIERS, TreeShape, evaluate
from univer_theory.models import DirichletModel, Model, apply_temperature
from univer_theory.tolerance import worst_of

LOSSLESS_TOL = 1e-12


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_with_enough_support_are_the_softmax_bit_for_bit(dtype):
    logits = torch.randn(16, 300, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(dtype) * 3
    for T, top in ((1.0, None), (0.7, 50)):
        plain = probs_from_logits(logits, T, top)
        assert torch.equal(probs_from_logits(logits, T, top, support=8), plain)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_underflowed_rows_keep_their_s_most_likely_tokens_in_logit_order(dtype):
    logits = torch.tensor([[0.0, -3.0, -7.0, -20.0, -1000.0, -float("inf")],
                           [0.0, -0.001, -0.002, -0.003, -0.004, -0.005]], dtype=dtype)
    T = 0.001
    plain = probs_from_logits(logits, T)
    assert int((plain[0] > 0).sum()) == 1                       # what a wor node of 4 children could not draft
    q = probs_from_logits(logits, T, support=4)
    assert torch.equal(q[1], plain[1])                          # a row with enough support, untouched
    row = q[0].double()
    assert (row[:4] > 0).all() and (row[4:] == 0).all()
    assert (row[:3] > row[1:4]).all()                           # in the order of the logits
    assert abs(float(row.sum()) - 1) <= SIMPLEX_TOL[dtype]
    assert float(1 - row[0]) <= 4 * torch.finfo(dtype).eps ** 2 + torch.finfo(dtype).eps   # the mass moved is ~ε²
    one_hot = probs_from_logits(logits, 0.0, support=2)
    assert ((one_hot > 0).sum(-1) == 2).all()
    assert sample_children(one_hot.double(), 2, "wor", torch.Generator().manual_seed(0)).shape == (2, 2)
    # a −inf logit, or one too far below for ε²·exp(z − max z) to be positive, is floored at √tiny (2^-511 / 2^-63)
    far = torch.tensor([[0.0, -1000.0, -float("inf"), -float("inf")]], dtype=dtype)
    lifted = probs_from_logits(far, 1.0, support=3)
    assert int((lifted > 0).sum()) == 3 and float(lifted[0, 1]) == torch.finfo(dtype).tiny ** 0.5, lifted


def test_support_floor_marks_only_the_rows_below_their_floor():
    q = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.3, 0.2]], dtype=torch.float64)
    z = torch.tensor([[0.0, -1.0, -2.0], [0.0, -0.5, -0.9]], dtype=torch.float64)
    got = support_floor(q, z, 3)
    assert torch.equal(got[1], q[1]) and (got[0] > 0).all() and got[0, 1] > got[0, 2]
    assert support_floor(q[1:], z[1:], 3) is not None and torch.equal(support_floor(q[1:], z[1:], 3), q[1:])


@pytest.mark.parametrize("kwargs,match", [
    ({"support": 0}, "support must be a positive int"), ({"support": True}, "support must be a positive int"),
    ({"support": 2.0}, "support must be a positive int"), ({"support": 5}, "support 5 exceeds the row's 4 tokens"),
    ({"support": 3, "top": 2}, "support 3 exceeds the row's 4 tokens or top 2"),
])
def test_bad_support_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        probs_from_logits(torch.zeros(2, 4), 0.5, **kwargs)


class FlooredModel(Model):
    """``base``'s target at temperature T, its draft at T through :func:`probs_from_logits` with ``support = s``:
    at a small T most draft rows underflow to one or two tokens and are floored."""

    def __init__(self, base: Model, temperature: float, s: int):
        self.base, self.vocab_size, self.T, self.s = base, base.vocab_size, temperature, s
        self.floored = set()                    # prefixes whose softmax row had fewer than s positive tokens

    def target(self, prefix):
        return apply_temperature(self.base.target(prefix), self.T)

    def draft(self, prefix):
        logits = torch.from_numpy(np.log(self.base.draft(prefix)))
        if int((probs_from_logits(logits, self.T) > 0).sum()) < self.s:
            self.floored.add(tuple(prefix))
        return probs_from_logits(logits, self.T, support=self.s).numpy()


@pytest.mark.parametrize("shape,process", [("3", "wor"), ("(.,(.,.))", "wor"), ("2,2", "topk"), ("3,1", "greedy")])
def test_floored_drafts_are_verified_exactly_losslessly(shape, process):
    """Exact enumeration of every lossless verifier of the process on floored rows (T = 0.0005, V = 6, peaky
    Dirichlet rows, eight seeds; a row underflows where its second token is e^0.37 below its first): the law of the
    output is the target's within 1e-12, the worst instance reported."""
    tree = TreeShape.parse(shape)
    s = tree.max_children
    floored = 0
    worst = (0.0, None)
    for seed in range(8):
        model = FlooredModel(DirichletModel(6, seed=seed, concentration=0.3), 0.0005, s)
        for name, v in VERIFIERS.items():
            if v.lossless and v.supports(tree, process):
                r = evaluate(model, tree, process, v)
                worst = worst_of(worst, (r.distance, (seed, name)))
                assert np.isfinite(r.expected_accepted)
        floored += len(model.floored)
    assert floored >= 6, f"the grid must hold rows the floor lifts, got {floored}"
    assert worst[0] <= LOSSLESS_TOL, f"worst distance {worst[0]:.2e} at (seed, verifier) {worst[1]}"


def test_the_floor_and_top_m_do_not_move_with_a_constant_on_the_logits():
    """The floor is ``ε²·exp(z_i − max z)``: a constant added to every logit (real logits sit at +20…+40) leaves the
    floored row bit for bit (``exp(z_i)`` would lift a token from 1.8e-32 to 4e-15 at +40 and flatten the row at
    +100); and ``top = m`` keeps exactly the m largest logits, ``m = V − 1`` included."""
    from gpu.probs import probs_from_logits, support_floor
    q = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    z = torch.tensor([[0.0, -1.0, -2.0]], dtype=torch.float64)
    floored = support_floor(q, z, 2)
    assert float(floored[0, 0]) == 1.0 and 0 < float(floored[0, 1]) < 1e-30
    for c in (40.0, 100.0, -300.0):
        assert torch.equal(support_floor(q, z + c, 2), floored), c
    r = probs_from_logits(torch.tensor([[30.0, 29.0, 10.0, 5.0]], dtype=torch.float64), 0.0, support=2)
    assert float(r[0, 0]) == 1.0 and 0 < float(r[0, 1]) < 1e-30
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]], dtype=torch.float64)
    for m in (1, 2, 3, 4):
        row = probs_from_logits(logits, 1.0, top=m)
        assert int((row > 0).sum()) == m and torch.allclose(row[0, 4 - m:], torch.softmax(logits[0, 4 - m:], -1))


def test_a_tied_one_hot_row_keeps_its_argmax_within_its_top_m():
    """At T = 0 the row is the one-hot of the first maximum, but ``torch.topk`` chose the top m (and the floored s)
    among tied logits otherwise: a row kept s + 1 tokens of positive probability, past its top m.  Ties at the m-th
    place go to the lowest ids for both now."""
    logits = torch.zeros(4, 20, dtype=torch.float64)
    logits[1, 5:] = 1.0
    logits[2, ::3] = 2.0
    logits[3] = torch.arange(20, dtype=torch.float64) % 4
    for T in (0.0, torch.zeros(4, dtype=torch.float64)):
        for m in (1, 2, 3, 5):
            row = probs_from_logits(logits, T, top=m, support=m)
            assert ((row > 0).sum(-1) == m).all(), (m, row)
            assert (row.gather(-1, logits.argmax(-1)[:, None]) > 0.5).all(), (m, row)     # the first maximum


def test_top_mask_is_the_set_of_top_tokens():
    """``top_mask`` (one topk and a tie count) keeps the tokens ``orders.top_tokens`` (a stable sort) lists, on rows
    tied at every place, with −inf logits, and at every m."""
    from gpu.probs import top_mask
    from univer_theory.orders import top_tokens
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 4, (64, 24), generator=gen).double()
    x[::3, ::2] = float("-inf")
    for m in range(1, 25):
        want = torch.zeros_like(x, dtype=torch.bool).scatter(-1, top_tokens(x, m), True)
        assert torch.equal(top_mask(x, m), want), m


@pytest.mark.parametrize("dtype,big", [(torch.float64, 1e308), (torch.float32, 3e38), (torch.bfloat16, 3e38)])
def test_logits_half_the_dtypes_range_apart_keep_their_softmax(dtype, big):
    """``z − max z`` overflows when the logits span more than half the dtype's range: ``[big, −big]`` at T = big
    came out one-hot instead of softmax([1, −1]).  The shift is taken in halves (the same floats elsewhere)."""
    z = torch.tensor([[big, -big]], dtype=dtype)
    row = probs_from_logits(z, float(z[0, 0]))                  # T = the largest logit as the dtype holds it
    want = torch.softmax(torch.tensor([1.0, -1.0], dtype=torch.float64), -1)
    assert torch.allclose(row[0].double(), want, atol=1e-7), row
