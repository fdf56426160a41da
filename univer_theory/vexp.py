"""``e^x`` and ``1 − e^{−y}`` as straight-line float64 arithmetic that a compiled loop vectorises.

numpy's ``exp`` and ``expm1`` call the C library once per element on a machine without AVX-512 (~10 ns each),
and numba's ``math.exp`` does the same: PTS's clock factors (three such calls per (position, node) of the walk,
:func:`univer_theory.plans.clocks._clock_factors`) were about half of a UniVer verification on whole rows.
:func:`exp` is the textbook reduction, with no table and no branch a loop cannot turn into a select:

.. math::  e^x = 2^n·e^r,\\quad n = \\mathrm{round}(x/\\ln 2),\\quad r = (x − n·ℓ_{hi}) − n·ℓ_{lo},\\ |r| ≤ \\ln 2/2,

``ℓ_hi + ℓ_lo = ln 2`` split so that ``n·ℓ_hi`` is exact (Cody–Waite, fdlibm's constants), ``e^r`` by its Taylor
polynomial to degree 13 (remainder below 1e-17 relative), ``2^n`` built from its bits in two factors (so that
every ``n`` of a result between the smallest subnormal and the largest float is two normal powers of 2: one
rounding of ``e^r``, or a second into the subnormal range).  :func:`one_minus_exp` (``−expm1(−y)``, y ≥ 0) is
``y·Σ_{j≤13} (−y)^j/(j+1)!`` for ``y < ln 2/2`` (relative accuracy near 0) and ``1 − e^{−y}`` elsewhere (no
cancellation there: ``1 − e^{−y} ≥ 0.29``).  Against the C library on 650 000 seeded points over the whole
range and at the branch points (``tests/theory/test_vexp.py``): :func:`exp` within 1 ulp, :func:`one_minus_exp`
within 2; 0 and ∞ where it gives them, NaN kept.  No fused multiply-adds (numba does not contract), so the
floats are the same on every x86-64 machine.
"""
from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

#: Cody–Waite split of ln 2 (fdlibm's ``ln2_hi``, whose low 32 bits are 0, and ``ln2_lo``).
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
INV_LN2 = 1.44269504088896338700e+00
#: ``1.5·2^52``: adding it rounds a float below 2^51 in size to the nearest integer (ties to even).
ROUND_SHIFT = 6755399441055744.0
#: ``y`` below this (``ln 2/2``) takes :func:`one_minus_exp`'s series.
HALF_LN2 = 0.5 * math.log(2.0)
#: Arguments are clamped to ``[X_MIN, X_MAX]`` first: e^x is 0 below −745.2 and ∞ above 709.8, and ``n`` stays
#: where its two halves are normal powers of 2.
X_MIN, X_MAX = -1400.0, 710.0
#: ``1/j!`` for j = 0…14 (the Taylor coefficients of both polynomials).
INV_FACT = tuple(1.0 / math.factorial(j) for j in range(15))


@intrinsic
def _bits_to_float(typingctx, bits):
    """The float64 whose bit pattern is the int64 ``bits`` (a register move)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


@intrinsic
def float_bits(typingctx, x):
    """The bit pattern of the float64 ``x`` as an int64 (a register move)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return types.int64(types.float64), codegen


#: The bits of :data:`ROUND_SHIFT`: ``bits(m + ROUND_SHIFT) − SHIFT_BITS = m`` for an integer ``|m| < 2^51``.
SHIFT_BITS = int(np.float64(ROUND_SHIFT).view(np.int64))


@numba.njit(cache=True, inline="always")
def _pow2(shifted):  # pragma: no cover - compiled
    """``2^m`` from ``shifted = m + ROUND_SHIFT`` for an integer ``m`` in ``[−1022, 1023]``: m read from the low
    bits of ``shifted`` and written into an exponent field (64-bit integer adds and a left shift, which a loop
    vectorises without AVX-512's float-to-int64 conversion)."""
    return _bits_to_float((float_bits(shifted) - SHIFT_BITS + 1023) << 52)


@numba.njit(cache=True, inline="always")
def _series(x, first):  # pragma: no cover - compiled
    """``Σ_{j≤13} x^j/(j + first)!`` by Horner's rule: ``e^x`` for ``first = 0``, ``(e^x − 1)/x`` for 1."""
    acc = INV_FACT[13 + first]
    for j in range(12, -1, -1):
        acc = INV_FACT[j + first] + x * acc
    return acc


@numba.njit(cache=True, inline="always")
def exp(x):  # pragma: no cover - compiled
    """``e^x`` (module docstring); NaN for NaN."""
    x = X_MIN if x < X_MIN else (X_MAX if x > X_MAX else x)        # a NaN fails both tests and stays
    n = (x * INV_LN2 + ROUND_SHIFT) - ROUND_SHIFT                   # round(x/ln 2), as a float
    r = (x - n * LN2_HI) - n * LN2_LO
    half = (n * 0.5 - 0.25) + ROUND_SHIFT                           # ⌊n/2⌋ + ROUND_SHIFT: n/2 − 1/4 rounds to it
    return _series(r, 0) * _pow2(half) * _pow2((n - (half - ROUND_SHIFT)) + ROUND_SHIFT)


@numba.njit(cache=True, inline="always")
def one_minus_exp(y, e):  # pragma: no cover - compiled
    """``1 − e^{−y}`` for ``y ≥ 0`` given ``e = e^{−y}`` (module docstring: the series below ``ln 2/2``, else
    ``1 − e``); NaN for NaN."""
    return y * _series(-y, 1) if y < HALF_LN2 else 1.0 - e


@numba.njit(cache=True, nogil=True)
def exp_array(x):  # pragma: no cover - compiled
    """:func:`exp` of every entry of a flat array (the tests' entry point)."""
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = exp(x[i])
    return out


@numba.njit(cache=True, nogil=True)
def one_minus_exp_array(y):  # pragma: no cover - compiled
    """:func:`one_minus_exp` of every entry of a flat array (the tests' entry point)."""
    out = np.empty_like(y)
    for i in range(y.shape[0]):
        out[i] = one_minus_exp(y[i], exp(-y[i]))
    return out
