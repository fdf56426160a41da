"""Input checks shared by every layer of the exact core.

Every check raises :class:`ValueError` whose message names the function, the argument, the rule that is
broken and the offending value, e.g. ``"law: draft_probs row 4 sums to 0.93, expected 1"``.
Float rows are accepted within :data:`SIMPLEX_ATOL`; ``Fraction`` rows (numpy ``object`` arrays) must be
exactly on the simplex.
"""
from __future__ import annotations

import math
import numbers
from fractions import Fraction

import numpy as np


class Unsupported(NotImplementedError, ValueError):
    """A method, process, shape, k or row mode outside what a function covers (a verifier defined for other draft
    processes, an irrational quantity asked for in Fractions): a NotImplementedError by what it is, and a
    ValueError by the input rule — a caller handing a verifier a combination it does not cover gave bad input, and
    ``except ValueError`` catches it as it catches every other refusal."""


#: Tolerance on ``|Σ row − 1|`` for float probability rows.  Rows are produced by softmax / division, so
#: 1e-9 is loose enough for float64 round-off on V = 10⁵ and tight enough to catch a forgotten normalisation.
SIMPLEX_ATOL = 1e-9


def check_temperature(value, where: str, name: str = "temperature") -> float:
    """``value`` as a float, or a ValueError unless it is one real number (not a bool, a string or a tensor — a
    per-row temperature is refused, not read as its first entry) that is finite and ≥ 0 (NaN and inf make no
    law)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        got = f"of shape {list(value.shape)}" if hasattr(value, "shape") else repr(value)
        raise ValueError(f"{where}: {name} must be one real number, got {type(value).__name__} {got}")
    t = float(value)
    if not 0 <= t < float("inf"):
        raise ValueError(f"{where}: {name} must be finite and ≥ 0, got {t}")
    return t


def check_real(value, where: str, name: str) -> float:
    """``value`` as a float, or a ValueError unless it is one real number (not a bool or a string; NaN passes, for
    the caller's range check to name)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{where}: {name} must be a real number, got {value!r} ({type(value).__name__})")
    return float(value)


def check_int(value, where: str, name: str, low: int = 0) -> int:
    """``value`` as an int, or a ValueError unless it is one integer (not a bool, a float or a string) ≥ ``low``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{where}: {name} must be an integer ≥ {low}, got {value!r}")
    return int(value)


def count_text(count) -> str:
    """A count (an int of any size) for an error message: ``f"{count:.3g}"``, or ``~10^d`` beyond float64's range
    (``:.3g`` of such an int is an OverflowError)."""
    return f"{count:.3g}" if count < 1e300 else f"~10^{int(math.log10(count))}"


def as_prob_array(values, where: str, name: str) -> np.ndarray:
    """Convert ``values`` to float64, or to an exact ``object`` array of Fractions if it is an object array of
    Fractions / ints (ints there become Fractions: Python's ``int / int`` is a float, and an int beside Fractions
    would leave the exact mode without a word).  Plain ints (an int array, a list of ints alone) are read as float64:
    pass Fractions for the exact mode.  Ragged rows are a ValueError naming ``name``."""
    try:
        arr = np.asarray(values)
    except ValueError:
        raise ValueError(f"{where}: {name} must be rows of one length (a rectangular array)") from None
    if arr.dtype == object:
        for v in arr.flat:
            if not isinstance(v, (Fraction, int)) or isinstance(v, bool):
                raise ValueError(f"{where}: {name} holds a {type(v).__name__} value {v!r} among objects: the exact "
                                 f"mode takes Fractions (and ints), the float mode a float array")
        if all(isinstance(v, Fraction) for v in arr.flat):
            return arr.copy()      # not the caller's buffer: cached plans keep rows, and callers may reuse it
        out = np.empty(arr.shape, dtype=object)
        out.flat[:] = [Fraction(v) for v in arr.flat]
        return out
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(f"{where}: {name} must be real numbers, got dtype {arr.dtype}")
    return arr.astype(np.float64)


def check_simplex(rows: np.ndarray, where: str, name: str) -> np.ndarray:
    """Check that every row of ``rows`` (shape ``[..., V]``) is a probability vector.

    Rejects NaN / inf, negative entries and rows whose sum differs from 1 (by more than
    :data:`SIMPLEX_ATOL` in float mode, at all in exact mode).  Returns the array (float64 or exact).
    """
    arr = as_prob_array(rows, where, name)
    if arr.ndim == 0 or arr.shape[-1] == 0:
        raise ValueError(f"{where}: {name} must have a non-empty last (vocabulary) axis, got shape {arr.shape}")
    flat = arr.reshape(-1, arr.shape[-1])
    exact = arr.dtype == object

    def row(r: int) -> str:                 # the row's index in ``rows`` (none for a single row [V])
        index = tuple(int(i) for i in np.unravel_index(r, arr.shape[:-1]))
        return "" if not index else f" row {index[0] if len(index) == 1 else index}"

    if not exact:
        bad = ~np.isfinite(flat)
        if bad.any():
            r = int(np.argwhere(bad)[0][0])
            raise ValueError(f"{where}: {name}{row(r)} contains NaN or inf")
    neg = flat < 0
    if np.any(neg):
        r, c = (int(i) for i in np.argwhere(neg)[0])
        raise ValueError(f"{where}: {name}{row(r)} has a negative entry {flat[r, c]} at token {c}")
    sums = flat.sum(axis=1)
    for r, s in enumerate(sums):
        if (s != 1) if exact else (abs(s - 1.0) > SIMPLEX_ATOL):
            off = _float_text(s - 1, "+.3g") + (", exact mode: the sum must be 1 exactly" if exact else
                                                 f", tolerance {SIMPLEX_ATOL:g}")
            raise ValueError(f"{where}: {name}{row(r)} sums to {_float_text(s, '.12g')}, expected 1 (off by {off})")
    return arr


def _float_text(x, spec: str) -> str:
    """``x`` (a float, or an exact number) in a message as a float with format ``spec``, or "beyond 1e308" where it
    is past float64's range (an exact entry of 1e400 was an OverflowError here)."""
    try:
        return format(float(x), spec)
    except OverflowError:
        return "beyond 1e308"


def check_one_mode(target_probs, draft_probs, where: str) -> bool:
    """Whether the rows are exact (Fraction, ``object`` dtype); a ValueError naming ``where`` when one is exact and
    the other float (neither mode: the plans and laws would mix Fractions and floats)."""
    exact = np.asarray(target_probs).dtype == object
    if (np.asarray(draft_probs).dtype == object) != exact:
        raise ValueError(f"{where}: target_probs and draft_probs must both be exact (Fraction) or both float")
    return exact


def check_choice(value, choices, where: str, name: str):
    """Raise a ValueError listing the valid choices when ``value`` is not one of them."""
    try:
        known = value in choices
    except TypeError:                   # an unhashable value against a dict or set of choices
        known = False
    if not known:
        raise ValueError(f"{where}: unknown {name} {value!r}; choose one of {sorted(choices)}")
    return value
