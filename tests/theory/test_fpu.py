"""``univer_theory.fpu.flushed``: subnormal floats read and written as 0 inside the block (x86-64), the thread's
floating-point state restored afterwards — also when the block raises — and PTS's walk unchanged by it on
rows whose drafted rates are all at least ``FLUSH_MIN_RATE`` (where it is on)."""
import numpy as np
import pytest

from univer_theory import fpu
from univer_theory.plans import clocks

from .test_thinning_walk import walk_inputs, zipf_row

SUBNORMAL = np.array([1e-310])


def test_flush_inside_and_restored_after():
    assert (SUBNORMAL * 1.0)[0] == 1e-310
    with fpu.flushed(False):
        assert (SUBNORMAL * 1.0)[0] == 1e-310
    with fpu.flushed():
        inside = (SUBNORMAL * 1.0)[0]
        tiny = (np.array([1e-300]) * 1e-10)[0]         # a normal product that would be subnormal
    assert (inside, tiny) == ((0.0, 0.0) if fpu.HAS_FLUSH else (1e-310, 1e-310))
    assert (SUBNORMAL * 1.0)[0] == 1e-310
    with pytest.raises(KeyError):
        with fpu.flushed():
            raise KeyError("inside")
    assert (SUBNORMAL * 1.0)[0] == 1e-310 and (np.array([1e-300]) * 1e-10)[0] > 0


@pytest.mark.parametrize("k", [2, 3, 4])
def test_walk_is_the_same_flushed(monkeypatch, k):
    """Zipf rows at V = 3 000 (their walks pass lanes through the subnormal range at the largest times): the
    flushed walk and the unflushed one agree to 1e-300 absolute (a flushed term is below 2^-1022)."""
    cases = [walk_inputs(*zipf_row(3000, seed), k, rho) for seed, rho in ((0, 1.0), (1, 0.6))]
    qs, cs = np.stack([c[0] for c in cases]), np.stack([c[1] for c in cases])
    s, w = cases[0][2], np.stack([c[3] for c in cases])
    assert qs[qs > 0].min() >= clocks.FLUSH_MIN_RATE
    flushed = clocks.thinning_walk(qs, cs, k, s, w)
    monkeypatch.setattr(clocks, "FLUSH_MIN_RATE", np.inf)
    plain = clocks.thinning_walk(qs, cs, k, s, w)
    for a, b in zip(flushed, plain):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-300)
