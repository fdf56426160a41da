"""The vectorisable exponentials of :mod:`univer_theory.vexp` against the C library's (numpy's ``exp`` and
``expm1``) and against 50-digit arithmetic (mpmath) at their branch points."""
import mpmath
import numpy as np

from univer_theory.vexp import HALF_LN2, exp_array, one_minus_exp_array

TINY = np.finfo(np.float64).tiny


def ulps(got, want):
    """``|got − want|`` in units of the last place of ``want`` (0 where equal, NaNs equal; subnormal ``want``
    in the smallest subnormal's units)."""
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    with np.errstate(invalid="ignore"):
        return np.where(same, 0.0, np.abs(got - want) / np.spacing(np.maximum(np.abs(want), TINY)))


def arguments(rng):
    """Seeded arguments over exp's whole float64 range, near 0 on both sides and in log scale, and the edges: ±0,
    ±∞, NaN, the overflow and underflow thresholds, subnormal results, and the series' branch point ln 2/2."""
    edges = [0.0, -0.0, np.inf, -np.inf, np.nan, 709.782712893384, 709.79, -708.39, -708.4, -745.13, -745.14, -1e4,
             HALF_LN2, -HALF_LN2, np.nextafter(HALF_LN2, 0), np.nextafter(-HALF_LN2, 0), 1e-300, -1e-300, 5e-324]
    return np.concatenate([rng.uniform(-750.0, 710.0, 200_000), rng.uniform(-1.0, 1.0, 200_000),
                           -np.exp(rng.uniform(-40.0, 9.3, 200_000)), np.exp(rng.uniform(-40.0, 6.5, 50_000)), edges])


def test_exp_is_within_one_ulp_of_the_c_library():
    """``vexp.exp`` within 1 ulp of numpy's ``exp`` on 650 000 seeded arguments (a wrong coefficient, reduction or
    scaling is off by many); 0, ∞ and NaN where it gives them; subnormal results within one subnormal step."""
    x = arguments(np.random.default_rng(61))
    with np.errstate(over="ignore"):
        want = np.exp(x)
    got = exp_array(x)
    assert ulps(got, want).max() <= 1.0
    for special in (0.0, np.inf):
        assert np.array_equal(got == special, want == special)
    assert np.array_equal(np.isnan(got), np.isnan(x))
    assert ((want > 0) & (want < TINY)).any()


def test_one_minus_exp_is_within_two_ulp_of_expm1():
    """``vexp.one_minus_exp(y, e^{−y})`` = ``−expm1(−y)`` within 2 ulp for y ≥ 0 (the series below ln 2/2, 1 − e
    above: at most 1 ulp of e, which is ≤ 2 ulp of the result there), 0 at 0, 1 at ∞; at the branch point against
    50-digit arithmetic."""
    y = np.abs(arguments(np.random.default_rng(62)))
    want = -np.expm1(-y)
    got = one_minus_exp_array(y)
    assert ulps(got, want).max() <= 2.0
    assert got[y == 0].tolist() == [0.0] * int((y == 0).sum()) and (got[y == np.inf] == 1.0).all()
    assert np.array_equal(np.isnan(got), np.isnan(y))
    near = np.array([np.nextafter(HALF_LN2, 0), HALF_LN2, np.nextafter(HALF_LN2, 1), 1e-12, 0.1])
    mpmath.mp.dps = 50
    exact = np.array([float(-mpmath.expm1(-mpmath.mpf(v))) for v in near])
    assert ulps(one_minus_exp_array(near), exact).max() <= 2.0
