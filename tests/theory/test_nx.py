"""The numpy backend's compiled row ops (:mod:`univer_theory.nx`) against numpy's own: prefix / suffix sums equal
numpy's sequential ``cumsum`` bit for bit (float64 and int64, contiguous rows and strided views, spreads from
1e-300 to 1e300, infinities and NaN), and the row gather equals fancy indexing (negative indices from the end, an
out-of-bounds index raises ``IndexError``, broadcast rows, bool / int / float rows), and the compiled row sum is
numpy's pairwise ``sum`` bit for bit, and each row's sum in order its ``cumsum``'s last column."""
import functools
import math
import operator

import numpy as np
import pytest

from univer_theory.nx import NUMPY, shifted_cumsum


def numpy_cumsum(x, reverse):
    return x[..., ::-1].cumsum(-1)[..., ::-1] if reverse else x.cumsum(-1)


def numpy_exclusive(x, reverse):
    """``Σ_{j<i}`` (``Σ_{j>i}``) by numpy's own cumsum of the array without its last (first) entry, shifted."""
    out = np.zeros_like(x)
    if x.shape[-1]:
        if reverse:
            out[..., :-1] = numpy_cumsum(x[..., 1:], True)
        else:
            out[..., 1:] = numpy_cumsum(x[..., :-1], False)
    return out


def rows(rng, R, V):
    """Float rows of widely spread magnitudes (signs mixed), one with an infinity and a NaN when V > 2."""
    x = rng.standard_normal((R, V)) * 10.0 ** rng.uniform(-300, 300, (R, V))
    if V > 2 and R > 1:
        x[1, 1], x[-1, 2] = np.inf, np.nan
    return x


@pytest.mark.parametrize("R,V", [(1, 1), (3, 2), (8, 1025), (30, 65), (2, 0), (0, 5)])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum_is_numpys_bit_for_bit(R, V, reverse):
    """Inclusive and exclusive (``Σ_{j<i}``, 0 first; signed zeros kept) prefix / suffix sums — on rows, strided
    rows, int rows, negative zeros, and the same as ``[2, R, V]`` and ``[V]`` arrays (summed as rows too)."""
    rng = np.random.default_rng(R * 1000 + V)
    for x in (rows(rng, R, V), rows(rng, R, 2 * V + 1)[:, 1::2], rng.integers(-2**40, 2**40, (R, V)), -np.zeros((R, V)),
              np.stack([rows(rng, R, V), rows(rng, R, V)]), rows(rng, 1, V)[0]):
        got, want = NUMPY.cumsum(x, reverse=reverse), numpy_cumsum(x, reverse)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)               # NaN where numpy has NaN, else the same bits
        assert got.tobytes() == want.tobytes()
        got, want = NUMPY.exclusive_cumsum(x, reverse=reverse), numpy_exclusive(x, reverse)
        assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()
        assert shifted_cumsum(NUMPY, x, reverse, -1).tobytes() == want.tobytes()


@pytest.mark.parametrize("R,V", [(1, 1), (3, 2), (4, 7), (9, 1025), (30, 65), (0, 5)])
def test_last_prefix_sum_is_cumsums_last_column_bit_for_bit(R, V):
    """Each row's sum in order (:meth:`last_prefix_sum`, four rows at a time, no prefix sums written): numpy's
    ``cumsum`` last column bit for bit, on numpy rows and on torch CPU rows (through the numpy view; torch's own
    ``cumsum`` has the same values, but +0.0 for a row of −0.0) — spread rows with infinities and NaN, strided rows,
    negative zeros, ``[2, R, V]`` arrays; what :func:`univer_theory.verifiers.row_sums` divides by (1 for a zero
    row)."""
    import torch

    from univer_theory.nx import get_backend
    from univer_theory.verifiers import row_sums

    rng = np.random.default_rng(R * 1000 + V)
    for x in (rows(rng, R, V), rows(rng, R, 2 * V + 1)[:, 1::2], -np.zeros((R, V)),
              np.stack([rows(rng, R, V), rows(rng, R, V)]), np.abs(rows(rng, R, V))):
        want = x.cumsum(-1)[..., -1:]
        t = torch.from_numpy(x)
        for got in (NUMPY.last_prefix_sum(x), get_backend(t).last_prefix_sum(t).numpy()):
            assert got.shape == want.shape and got.tobytes() == want.tobytes()
        np.testing.assert_array_equal(t.cumsum(-1)[..., -1:].numpy(), want)   # torch's own: a zero's sign aside
        one = np.where(want > 0, want, 1.0)
        assert row_sums(x).tobytes() == one.tobytes() == row_sums(torch.from_numpy(x)).numpy().tobytes()


@pytest.mark.parametrize("R,V,M", [(1, 1, 1), (4, 9, 20), (8, 1025, 1025), (3, 5, 0)])
def test_take_is_fancy_indexing(R, V, M):
    rng = np.random.default_rng(R + V + M)
    idx = rng.integers(-V, V, (R, M))                           # negative indices count from the end
    for x in (rows(rng, R, V), rng.random((R, V)) > 0.5, rng.integers(0, 99, (R, V)), rows(rng, R, 2 * V)[:, ::2]):
        want = x[np.arange(R)[:, None], idx]
        got = NUMPY.take(x, idx)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
        for one, other in ((x[:1], idx), (x, idx[:1])):         # a broadcast side: numpy's own indexing
            np.testing.assert_array_equal(NUMPY.take(one, other),
                                          one[np.arange(one.shape[0])[:, None], other])


@pytest.mark.parametrize("bad", [5, -6])
def test_take_out_of_bounds_raises(bad):
    x, idx = np.arange(10.0).reshape(2, 5), np.zeros((2, 3), dtype=np.int64)
    idx[1, 2] = bad
    with pytest.raises(IndexError):
        NUMPY.take(x, idx)


def sort_rows(rng, V):
    """Float rows to argsort: random, few distinct values (long runs of ties), infinities, NaNs and signed zeros
    among them, all equal, and a batch axis."""
    yield rng.random((4, V))
    yield rng.integers(0, 7, (4, V)).astype(float)
    x = rng.random((3, V))
    x[:, ::3] = np.inf
    x[0, 5::7], x[1, ::5], x[2, 1::5], x[2, 2::5] = np.nan, -0.0, 0.0, -np.inf
    yield x
    yield np.ones((2, V))
    yield rng.random(V)
    yield np.where(rng.random((2, 3, V)) < 0.5, 0.25, rng.random((2, 3, V)))
    yield rng.random((3, 2 * V))[:, ::2]
    yield near_keys(rng, (2, V), "long runs")
    yield near_keys(rng, (2, V), "short runs")
    yield near_keys(rng, (2, V), "runs, then a long run")
    yield -np.exp(rng.normal(0.0, 3.0, (2, V)))


def near_keys(rng, shape, kind):
    """Keys that differ below their high 32 bits (the radix sort's first passes, ``nx.stable_argsort_row``):
    ``"long runs"`` within 2^-32 of 1 (one run of equal high words: the passes over the whole keys), ``"short runs"``
    ~4 keys to a high word, a few hundred ulps apart (each run finished by insertion on the whole keys),
    ``"runs, then a long run"`` short runs in the first half, a long run of unequal keys in the second."""
    if kind == "long runs":
        return 1.0 + rng.integers(0, 2**20, shape) * 2.0**-52
    if kind == "runs, then a long run":     # short runs sorted by insertion before the long run is met
        long = 1.5 + rng.integers(0, 2**20, shape) * 2.0**-52
        return np.where(np.arange(shape[-1]) < shape[-1] // 2, near_keys(rng, shape, "short runs"), long)
    n = shape[-1]
    return 0.5 + rng.integers(0, max(1, n // 4), shape) / max(1, n // 4) + rng.integers(0, 500, shape) * 2.0**-52


@pytest.mark.parametrize("V", [1, 127, 1025, 4095, 4096, 49152])
def test_stable_argsort_is_numpys_stable_sort(V):
    rng = np.random.default_rng(V)
    for x in sort_rows(rng, V):
        np.testing.assert_array_equal(NUMPY.argsort(x), np.argsort(x, axis=-1, kind="stable"))
        assert set(NUMPY.argsort(x, stable=False).reshape(-1, V)[0].tolist()) == set(range(V))


@pytest.mark.parametrize("R,V,M", [(1, 1, 3), (4, 9, 40), (8, 1025, 3000)])
def test_scatter_add_is_add_at(R, V, M):
    """Repeated indices accumulate in index order, as ``np.add.at`` (the same floats, widely spread terms);
    broadcast values; int rows; an out-of-bounds index raises."""
    rng = np.random.default_rng(R + V)
    idx = rng.integers(-V, V, (R, M))
    for x, values in ((rows(rng, R, V), rows(rng, R, M)), (rows(rng, R, V), rows(rng, R, 1)),
                      (rng.integers(0, 9, (R, V)), rng.integers(0, 9, (R, M)))):
        want = x.copy()
        np.add.at(want, (np.arange(R)[:, None], idx), np.broadcast_to(values, idx.shape))
        got = NUMPY.scatter_add(x, idx, values)
        assert got.tobytes() == want.tobytes() and got.dtype == want.dtype
        assert not np.shares_memory(got, x)
    with pytest.raises(IndexError):
        NUMPY.scatter_add(np.zeros((R, V)), idx + 2 * V, np.ones((R, M)))


def test_stable_argsort_row_is_numpys_stable_sort():
    """The compiled kernels' stable argsort (``nx.stable_argsort_row``: insertion on rows short or nearly in order,
    else a radix sort on the floats' bits) gives numpy's stable permutation: rows of 0–70 000 entries with runs of
    ties, ±0.0, ±∞, NaNs (last, in index order), subnormals, all-equal rows, keys spread over the whole exponent
    range or over a narrow span (ratio-like keys: digits of their distance from the least key) and keys that differ
    below their high words only (short runs of equal high words, one long run, and short runs before a long one:
    the run sort gives up part-way and the whole keys are sorted anew); rows already in order (the identity after
    one read: ties, −0.0 beside 0.0, NaNs last), such rows with one pair out of order, a NaN first or a NaN inside,
    rows nearly in order (neighbours swapped here and there: insertion) and rows in order but for their largest
    key first (insertion gives up; ties after it); lengths on both sides of the insertion-only rows (32) and of the
    wide digits (4 096).  It fails when −0.0 is not read as 0.0, when ties leave index order, when a row out of
    order (a NaN before a number) is taken for one in order, when a run of equal high words is left in index
    order, when the digits are read from the keys instead of their distance from the least key or when the radix
    passes start from a part-sorted order (an insertion or a run sort given up)."""
    from univer_theory.nx import stable_argsort_row

    rng = np.random.default_rng(66)
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 1.0]
    for n in (0, 1, 2, 7, 32, 33, 128, 1025, 4095, 4096, 70_000):
        for kind in ("spread", "ratios", "ties", "equal", "specials", "ordered", "ordered specials", "swapped",
                     "nan first", "nan inside", "long runs", "short runs", "runs, then a long run", "near order",
                     "one far"):
            if kind in ("long runs", "short runs", "runs, then a long run"):
                x = near_keys(rng, (n,), kind)
            elif kind in ("spread", "swapped", "nan first", "nan inside"):
                x = rng.standard_normal(n) * 10.0 ** rng.uniform(-300, 300, n)
            elif kind == "ratios":                  # a narrow span: passes over the digits of key − least key
                x = -np.exp(rng.normal(0.0, 3.0, n))
            elif kind in ("ties", "ordered"):
                x = rng.integers(-3, 4, n).astype(float)
            elif kind == "equal":
                x = np.full(n, 0.25)
            else:
                x = rng.choice(specials, n)
            if kind.startswith("ordered") or kind in ("swapped", "nan first", "nan inside"):
                x = np.sort(x)
                if kind == "ordered specials":          # −0.0 and 0.0 interleaved: equal keys, in index order
                    zeros = np.flatnonzero(x == 0)
                    x[zeros] = rng.choice([0.0, -0.0], zeros.size)
                if kind == "ordered":
                    assert np.array_equal(stable_argsort_row(x), np.arange(n))
            if n >= 2 and kind == "swapped":
                x[[-2, -1]] = x[[-1, -2]]
            if n >= 2 and kind == "nan first":
                x[0] = np.nan
            if n >= 3 and kind == "nan inside":
                x[n // 2] = np.nan
            if kind == "near order":                # neighbours swapped here and there: sorted by insertion
                x = np.sort(rng.standard_normal(n))
                swap = rng.choice(max(n - 1, 1), min(n // 50, max(n - 1, 0)), replace=False)
                x[swap], x[swap + 1] = x[swap + 1], x[swap].copy()
            if kind == "one far" and n:             # in order but the largest key first: insertion gives up
                x = np.roll(np.sort(rng.integers(-3, 4, n).astype(float)), 1)
            assert np.array_equal(stable_argsort_row(x), np.argsort(x, kind="stable")), (n, kind)


def test_sum_row_is_numpys_pairwise_sum_bit_for_bit():
    """``np_sum_row`` (the wor pair kernels' row sum) against ``np.sum(x, -1)`` of ``[N, K, G]`` arrays — how the
    array forms sum a row — at lengths across numpy's pairwise splits (0…300, 1 024 ± 1,
    49 152), magnitudes from 1e-300 to 1e300 with mixed signs (so the grouping shows in the bits); a sequential
    sum, numpy's grouping not kept, differs on the same rows."""
    from univer_theory.nx import np_sum_row
    rng = np.random.default_rng(71)
    lengths = [*range(0, 300), 1023, 1024, 1025, 49152]
    sequential_differs = 0
    for G in lengths:
        x = rng.standard_normal((2, 3, G)) * 10.0 ** rng.uniform(-3, 3, (2, 3, G))
        if G % 7 == 0:
            x *= 10.0 ** rng.uniform(-300, 300, (2, 3, G))
        want = np.sum(x, -1)
        got = np.array([[np_sum_row(x[i, j]) for j in range(3)] for i in range(2)])
        assert got.tobytes() == want.tobytes(), G
        sequential_differs += any(functools.reduce(operator.add, row.tolist(), 0.0) != s
                                   for row, s in zip(x.reshape(6, G), want.reshape(6)))
    assert sequential_differs > 50


def test_padded_sum_is_one_float_in_every_form_and_zero_padding_changes_no_bit():
    """``padded_sum`` (the layout's group sums) in numpy, in torch, and leaf by leaf as the compiled kernels take it
    (``padded_leaf``, ``padded_tree``): the same bits, at lengths across its leaves (0…300, 1 024 ± 1, 49 152) and
    magnitudes from 1e-300 to 1e300 with mixed signs; the same bits again with 1…2 000 zeros appended; within
    (19 + ⌈log₂ L⌉)·ε·Σ|x| of ``math.fsum``.  numpy's pairwise sum, which the group sums were before, changes its
    bits with the padding on the same rows — a tuple's shares moved with the tuples beside it (docs/deviations.md
    item 142)."""
    import torch

    from univer_theory.nx import PADDED_LEAF, padded_leaf, padded_sum, padded_tree
    rng = np.random.default_rng(72)
    numpy_moves = 0
    for G in [*range(0, 300), 1023, 1024, 1025, 49152]:
        x = rng.standard_normal((2, G)) * 10.0 ** rng.uniform(-3, 3, (2, G))
        if G % 7 == 0:
            x *= 10.0 ** rng.uniform(-300, 300, (2, G))
        got = padded_sum(x)
        assert padded_sum(torch.tensor(x)).numpy().tobytes() == got.tobytes(), G
        L = max(1, -(-G // PADDED_LEAF))
        leaves = [[padded_leaf(row, c * PADDED_LEAF, min(PADDED_LEAF, G - c * PADDED_LEAF)) for c in range(L)]
                  for row in x]
        assert np.array([padded_tree(np.array(s)) for s in leaves]).tobytes() == got.tobytes(), G
        pad = np.concatenate([x, np.zeros((2, int(rng.integers(1, 2000))))], 1)
        assert padded_sum(pad).tobytes() == got.tobytes(), G
        numpy_moves += bool((np.sum(pad, -1) != np.sum(x, -1)).any())
        for row, total in zip(x, got):
            bound = (19 + math.ceil(math.log2(L))) * np.finfo(float).eps * math.fsum(np.abs(row))
            assert abs(total - math.fsum(row)) <= bound, G
    assert numpy_moves > 50


def test_torch_asarray_copies_read_only_arrays():
    """A read-only numpy array (the exact core's cached grids) becomes a tensor that does not share its memory — so
    an in-place op cannot write into the cache — without torch's non-writable-array warning."""
    import warnings

    torch = pytest.importorskip("torch")

    from univer_theory.nx import get_backend
    nx = get_backend(torch.zeros(1))
    x = np.arange(4.0)
    x.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t, i = nx.asarray(x, torch.zeros(1)), nx.index(x.astype(np.int64), torch.zeros(1))
    t[0], i[0] = 7.0, 7
    assert x[0] == 0.0 and t.tolist() == [7.0, 1.0, 2.0, 3.0] and i.tolist() == [7, 1, 2, 3]
    w = np.arange(3.0)
    assert nx.asarray(w, torch.zeros(1)).data_ptr() == w.ctypes.data   # a writable row is still shared, not copied
