"""The tolerance test and running worst that every recheck uses: a NaN error fails, wherever it comes."""
from fractions import Fraction

from univer_theory.tolerance import exceeds, worst_of

nan, inf = float("nan"), float("inf")


def test_exceeds_is_true_for_nan():
    """``nan > tol`` is False, so a NaN passed ``if err > tol: fail``."""
    assert exceeds(nan, 1.0) and exceeds(2.0, 1.0) and exceeds(inf, 1.0)
    assert not exceeds(1.0, 1.0) and not exceeds(0.5, 1.0) and not exceeds(Fraction(1, 3), Fraction(1, 3))


def test_worst_of_keeps_a_nan_wherever_it_comes():
    """``max(0.0, nan)`` is 0.0 and ``max(inf, nan)`` is inf: a NaN error wins over every number, inf included."""
    for values in ([0.0, nan, 1.0], [nan, 0.0], [0.0, nan], [inf, nan], [nan, inf], [-inf, nan, inf]):
        assert worst_of(*values) != worst_of(*values), values
    assert worst_of(*(x for x in (0.5, 2.0, 1.0))) == 2.0 and worst_of(1.0, inf, 2.0) == inf
    assert worst_of(Fraction(1, 3), 0.25, Fraction(1, 2)) == Fraction(1, 2)          # exact errors keep their type
    assert worst_of((0.5, "a"), (nan, "b"), (2.0, "c"))[1] == "b" and worst_of((0.5, "a"), (2.0, "c"))[1] == "c"
    assert worst_of((inf, "a"), (nan, "b"))[1] == "b" and worst_of((2.0, "a"), (2.0, "b"))[1] == "a"
