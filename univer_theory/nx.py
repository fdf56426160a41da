"""The array namespace of the float node rules: one formula, run on numpy or on torch.

The model is POT's backend (``ot.backend``, ``nx = get_backend(a, b)``): a rule is written once against a
small backend object and serves both callers —

* the exact core's float path, with numpy rows (one node: no batch axis, a batch of one);
* :mod:`gpu`, with torch tensors ``[R, V]`` (the R nodes of a level, batched, on any device).

Contract: float64 rows ``[..., V]``, batch axes leading, the token axis last; integer index arrays in the
backend's own type (numpy ``int64`` / torch ``long``).  Every op works along the last axis (``cumsum`` and
``concat`` along another one when asked: the token axis of the clock integral's ``[R, m, t]`` arrays).
Fraction (object) rows come here only for orders (:func:`univer_theory.orders.top_tokens`: numpy's argmax and
stable argsort, exact on Fractions); the exact core's Fraction computations are kept apart, as the independent
checkers.
Only the ops the ported rules need are here, each spelled as numpy / torch spell it; torch is imported only
when a tensor is passed.  On numpy rows ``[R, V]`` the gather, the (exclusive) prefix / suffix sums (of any
array along its last axis, as rows) and the scatter-add are compiled loops (:func:`_take_rows`,
:func:`_cumsum_rows`, :func:`_scatter_add_rows`): numpy's row gather and accumulate cost ~5× their arithmetic on the
~1 000-column rows of a level drafted from its top 1 024
tokens (each is called hundreds of times a verification), ``ufunc.at`` ~10×; the loops give numpy's values
exactly (a sequential sum per row, in order; an index out of bounds raises ``IndexError``).  And the stable
argsort of long float rows is a compiled radix sort (:func:`stable_argsort_row`): the same permutation as numpy's
stable sort, ~11× faster on the vocabulary's 49 152-entry rows.
"""
from __future__ import annotations

import math

import numba
import numpy as np

from .vexp import float_bits


@numba.njit(cache=True, inline="always", error_model="numpy")
def np_max(a, b):  # pragma: no cover - compiled
    """``np.maximum(a, b)`` of two floats inside a compiled kernel: ``a`` where ``a > b`` or a is NaN, else ``b``
    (numpy's NaN and signed-zero rules)."""
    return a if (a > b or a != a) else b


@numba.njit(cache=True, inline="always", error_model="numpy")
def np_min(a, b):  # pragma: no cover - compiled
    """``np.minimum(a, b)`` of two floats inside a compiled kernel: ``a`` where ``a < b`` or a is NaN, else ``b``."""
    return a if (a < b or a != a) else b


#: :func:`np_sum_row`'s block: numpy's pairwise summation adds up to this many terms in 8 running sums, and splits
#: longer runs in two.
PAIRWISE_BLOCK = 128


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _block(a, lo, n):  # pragma: no cover - compiled
    """numpy's pairwise sum of ``a[lo : lo + n]`` for ``n ≤`` :data:`PAIRWISE_BLOCK` (``pairwise_sum_DOUBLE``'s
    leaf): fewer than 8 terms in order from 0, else 8 interleaved running sums combined as a tree, then the rest
    in order.  Each step reads its 8 terms through a view of them (``a[i], …, a[i + 7]`` at a run-time offset kept
    LLVM from making the 8 sums one vector add: 1.8× slower over a row of 49 152)."""
    b = a[lo:lo + n]
    if n < 8:
        res = 0.0
        for i in range(n):
            res += b[i]
        return res
    r0, r1, r2, r3, r4, r5, r6, r7 = b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    m = n - n % 8
    for i in range(8, m, 8):
        c = b[i:i + 8]
        r0, r1, r2, r3 = r0 + c[0], r1 + c[1], r2 + c[2], r3 + c[3]
        r4, r5, r6, r7 = r4 + c[4], r5 + c[5], r6 + c[6], r7 + c[7]
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for i in range(m, n):
        res += b[i]
    return res


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _half(n):  # pragma: no cover - compiled
    """Where numpy's pairwise sum splits a run of ``n`` terms: half, rounded down to a multiple of 8."""
    h = n // 2
    return h - h % 8


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _pairwise_walk(n, sums, starts):  # pragma: no cover - compiled
    """The tree of numpy's pairwise sum of ``n`` terms: runs longer than :data:`PAIRWISE_BLOCK` split at
    :func:`_half`, leaves of at most that many terms, left to right.  Leaf c's start goes to ``starts[c]`` and its
    sum is taken from ``sums[c]``; each run's sum is its halves' sums added, the root's is returned.  The
    recursion is walked with an explicit stack (numba's cache does not keep recursive functions)."""
    start, size = np.empty(64, np.int64), np.empty(64, np.int64)     # the frames: a run, its stage, its left sum
    stage, left = np.zeros(64, np.int64), np.empty(64)
    sp, start[0], size[0], c = 0, 0, n, 0
    while True:
        if size[sp] > PAIRWISE_BLOCK:                  # a fresh long run: its left half first
            stage[sp] = 1
            start[sp + 1], size[sp + 1], stage[sp + 1] = start[sp], _half(size[sp]), 0
            sp += 1
            continue
        starts[c] = start[sp]
        val = sums[c]
        c += 1
        sp -= 1
        while sp >= 0:                                  # hand the sum to the frames waiting for it
            if stage[sp] == 1:                          # its left half: now its right half
                left[sp], stage[sp] = val, 2
                h = _half(size[sp])
                start[sp + 1], size[sp + 1], stage[sp + 1] = start[sp] + h, size[sp] - h, 0
                sp += 1
                break
            val = left[sp] + val                        # both halves: its sum, to its own caller
            sp -= 1
        if sp < 0:
            return val


@numba.njit(cache=True, nogil=True, error_model="numpy")
def pairwise_leaves(n):  # pragma: no cover - compiled
    """The starts ``[L + 1]`` of the leaves of numpy's pairwise sum of ``n`` terms (:func:`_pairwise_walk`), then
    ``n``: leaf c holds terms ``starts[c] … starts[c + 1] − 1``.  A split run has over 128 terms and halves of at
    least 64 − 7, so ``L ≤ n/32 + 1``."""
    starts = np.full(n // 32 + 2, n, np.int64)
    _pairwise_walk(n, np.zeros(starts.shape[0]), starts)
    L = 1                                               # (n = 0: one empty leaf)
    while starts[L] < n:
        L += 1
    return starts[:L + 1]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def pairwise_tree(sums, n):  # pragma: no cover - compiled
    """numpy's pairwise sum of ``n`` terms from its leaves' sums ``sums [L]`` (:func:`pairwise_leaves`, each leaf
    summed by :func:`_block`) — so a kernel can sum a row it forms leaf by leaf, never holding all of it."""
    return _pairwise_walk(n, sums, np.empty(sums.shape[0], np.int64))


@numba.njit(cache=True, nogil=True, error_model="numpy")
def np_sum_row(a):  # pragma: no cover - compiled
    """``a.sum(-1)`` of one row, the same float (``0 +`` numpy's pairwise sum of the whole row: numpy ≥ 2.3; before,
    numpy summed rows longer than 8192 in 8192-entry chunks — hence the project's ``numpy>=2.3``, Python ≥ 3.11)."""
    n = a.shape[0]
    if n <= PAIRWISE_BLOCK:
        return 0.0 + _block(a, 0, n)
    starts = pairwise_leaves(n)
    sums = np.empty(starts.shape[0] - 1)
    for c in range(sums.shape[0]):
        sums[c] = _block(a, starts[c], starts[c + 1] - starts[c])
    return 0.0 + pairwise_tree(sums, n)


#: :func:`padded_sum`'s leaves: this many terms, aligned at 0, each summed in 8 running sums.
PADDED_LEAF = 128


@numba.njit(cache=True, nogil=True, error_model="numpy")
def padded_leaf(a, lo, n):  # pragma: no cover - compiled
    """:func:`padded_sum`'s leaf ``a[lo : lo + n]`` (``n ≤`` :data:`PADDED_LEAF`): 8 running sums from 0, term g
    added to sum ``g mod 8`` in order, the 8 combined as ``((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))`` — terms
    past ``n`` count as zeros, which change no bit (``x + 0 = x``)."""
    b = a[lo:lo + n]
    r = np.zeros(8)
    m = n - n % 8
    for i in range(0, m, 8):
        c = b[i:i + 8]
        for lane in range(8):
            r[lane] += c[lane]
    for i in range(m, n):
        r[i - m] += b[i]
    return ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))


@numba.njit(cache=True, nogil=True, error_model="numpy")
def padded_tree(sums):  # pragma: no cover - compiled
    """:func:`padded_sum` from its leaves' sums ``sums [L]`` (:func:`padded_leaf`): adjacent pairs added, level by
    level, over the next power of two ≥ L (absent leaves 0)."""
    width = 1
    while width < sums.shape[0]:
        width *= 2
    level = np.zeros(width)
    level[:sums.shape[0]] = sums
    while width > 1:
        width //= 2
        for i in range(width):
            level[i] = level[2 * i] + level[2 * i + 1]
    return level[0]


def _lanes_tree(lanes):
    """``((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))`` of 8 running sums, an absent one (None) an exact 0."""
    pair = lambda a, b: a if b is None else b if a is None else a + b            # noqa: E731
    return pair(pair(pair(lanes[0], lanes[1]), pair(lanes[2], lanes[3])),
                pair(pair(lanes[4], lanes[5]), pair(lanes[6], lanes[7])))


def padded_sum(x):
    """``Σ x`` along the last axis (numpy or torch, any leading axes), in an order that zeros appended to the axis do
    not change: leaves of :data:`PADDED_LEAF` terms aligned at 0 (:func:`padded_leaf`), their sums added as a complete
    binary tree (:func:`padded_tree`).  ``x + 0 = x`` exactly, so a row padded to a batch's longest gives the bits
    it gives alone — numpy's pairwise sum splits a run at its half, so its leaves move with the padding.  The error
    bound is a pairwise sum's: ≤ (16 + 3 + ⌈log₂ L⌉)·ε·Σ|x| over L leaves.  The compiled kernels sum leaf by leaf
    with the two functions above; this is the array form, the same floats, whose zeros are left out where they would
    add nothing (x + 0 = x): a short axis is padded to a multiple of 8 only, a long one to whole leaves, and a level
    of the tree with an odd count carries its last sum up — so its arrays stay within 2× of ``x`` (a chunk of
    one-group blocks would otherwise pad each group to a leaf: 128×)."""
    nx = get_backend(x)
    n, lead = x.shape[-1], tuple(x.shape[:-1])
    if n == 0:
        return nx.full(lead, 0.0, x)
    if n < 8:
        return _lanes_tree([0.0 + x[..., i] if i < n else None for i in range(8)])
    L = -(-n // PADDED_LEAF)
    size = L * PADDED_LEAF if L > 1 else -(-n // 8) * 8
    if size > n:
        x = nx.concat([x, nx.full(lead + (size - n,), 0.0, x)])
    cells = x.reshape(lead + (L, size // L // 8, 8))
    lanes = 0.0 + cells[..., 0, :]
    for i in range(1, cells.shape[-2]):
        lanes = lanes + cells[..., i, :]
    level = _lanes_tree([lanes[..., lane] for lane in range(8)])                        # [..., L]
    while level.shape[-1] > 1:
        pairs = level[..., 0:level.shape[-1] - 1:2] + level[..., 1::2]
        level = nx.concat([pairs, level[..., -1:]]) if level.shape[-1] % 2 else pairs
    return level[..., 0]


@numba.njit(cache=True, nogil=True)
def _cumsum_rows(x, reverse, exclusive):  # pragma: no cover - compiled
    """Prefix sums along the last axis of ``x [R, V]`` (suffix sums, summed from the end, with ``reverse``; with
    ``exclusive`` the sums before each entry, ``Σ_{j<i}`` / ``Σ_{j>i}``, 0 at the first): each row summed
    sequentially in order, as numpy's ``cumsum`` (exclusive: numpy's cumsum of the row without its last entry,
    shifted by one) — the same floats.  The running sum stays in a register: the loop is bound by the add's
    latency, ~1 ns an entry (numpy's accumulate ~4 ns; rows interleaved through memory, before, ~2–5 ns)."""
    R, V = x.shape
    out = np.empty((R, V), x.dtype)
    if V == 0:
        return out
    lag = 1 if exclusive else 0
    n = V - lag                             # entries summed into the row's last sum (its first, reversed)
    for r in range(R):
        xr, o = x[r], out[r]
        if exclusive:
            o[V - 1 if reverse else 0] = 0
        if n == 0:
            continue
        if reverse:                         # the first sum is the first entry itself, as numpy's (−0.0 kept)
            acc = xr[V - 1]
            o[n - 1] = acc
            for j in range(n - 2, -1, -1):
                acc = acc + xr[j + lag]
                o[j] = acc
        else:
            acc = xr[0]
            o[lag] = acc
            for j in range(1, n):
                acc = acc + xr[j]
                o[j + lag] = acc
    return out


@numba.njit(cache=True, nogil=True)
def _total_rows(x):  # pragma: no cover - compiled
    """Each row's sum of ``x [R, V]`` (V ≥ 1) in order from its first entry: :func:`_cumsum_rows`' last column, the
    same floats, four rows at a time — four running sums in registers, so one row's adds overlap the others' wait
    on the add's latency, and no ``[R, V]`` is written."""
    R, V = x.shape
    out = np.empty(R, x.dtype)
    r = 0
    while r + 4 <= R:
        a0, a1, a2, a3 = x[r, 0], x[r + 1, 0], x[r + 2, 0], x[r + 3, 0]
        for j in range(1, V):
            a0 = a0 + x[r, j]
            a1 = a1 + x[r + 1, j]
            a2 = a2 + x[r + 2, j]
            a3 = a3 + x[r + 3, j]
        out[r], out[r + 1], out[r + 2], out[r + 3] = a0, a1, a2, a3
        r += 4
    while r < R:
        acc = x[r, 0]
        for j in range(1, V):
            acc = acc + x[r, j]
        out[r] = acc
        r += 1
    return out


def row_totals_numpy(x):
    """``[..., 1]``: each row's sum of float64 rows ``x [..., V]`` (V ≥ 1) in order from its first entry — the last
    prefix sum, :func:`_total_rows` (a view of C-ordered rows)."""
    return _total_rows(np.ascontiguousarray(x).reshape(-1, x.shape[-1])).reshape(x.shape[:-1] + (1,))


def shifted_cumsum(nx, x, reverse: bool, axis: int):
    """``Σ_{j<i} x_j`` (``Σ_{j>i}`` with ``reverse``) along ``axis`` on backend ``nx``: its cumulative sums of the
    array without its last (first) entry, shifted by one, 0 at the first — sums of the same terms in the same
    order as the inclusive ones."""
    at = (slice(None),) * (axis % x.ndim)
    out = nx.zeros_like(x)
    if reverse:
        out[at + (slice(None, -1),)] = nx.cumsum(x[at + (slice(1, None),)], reverse=True, axis=axis)
    else:
        out[at + (slice(1, None),)] = nx.cumsum(x[at + (slice(None, -1),)], axis=axis)
    return out


@numba.njit(cache=True, nogil=True, boundscheck=True)
def _take_rows(x, idx):  # pragma: no cover - compiled
    """``x[r, idx[r, j]]`` ``[R, M]`` for ``x [R, V]`` (negative indices from the end, as numpy's; out of bounds
    raises ``IndexError``)."""
    R, M = idx.shape
    out = np.empty((R, M), x.dtype)
    for r in range(R):
        for j in range(M):
            out[r, j] = x[r, idx[r, j]]
    return out


@numba.njit(cache=True, nogil=True, boundscheck=True)
def _scatter_add_rows(out, idx, values):  # pragma: no cover - compiled
    """In place, ``out[r, idx[r, j]] += values[r, j]`` in index order (as ``np.add.at``: the same sums); returns
    ``out``."""
    R, M = idx.shape
    for r in range(R):
        for j in range(M):
            out[r, idx[r, j]] += values[r, j]
    return out


#: The most bits per digit of :func:`stable_argsort_row`'s radix passes: ``WIDE_BITS`` on rows of at least
#: :data:`WIDE_DIGITS_MIN` entries (two passes sort high words spanning up to 2^28 values — the ratio keys of
#: SmolLM2's and Zipf rows span ~2^24: two passes of 12 bits, three of 11 before — ~25% faster there), but never
#: more than the row's length has bits (a histogram of at most ~2n buckets); else ``NARROW_BITS`` (on short rows
#: wide histograms cost more than the passes they save).
NARROW_BITS, WIDE_BITS = 8, 14
WIDE_DIGITS_MIN = 4096
#: :func:`stable_argsort_row` first tries insertion on rows longer than :data:`HIGH_RUN_MAX`, giving up once it has
#: moved more than 1/``NEAR_ORDER_SHARE`` of the row's entries (so on a row in random order it wastes ~n/8 moves).
NEAR_ORDER_SHARE = 8
#: The longest run of keys with equal high words that :func:`stable_argsort_row` finishes by insertion (a longer
#: one, and it sorts on the whole keys instead).
HIGH_RUN_MAX = 32


@numba.njit(cache=True, nogil=True)
def _order_keys(x, key, high):  # pragma: no cover - compiled
    """In place, ``key [n]`` uint64: the keys whose unsigned order is the float order of ``x [n]`` — sign bit set for
    non-negative floats, every bit flipped for negative ones; −0.0 read as 0.0 and every NaN as one NaN, last, as
    numpy's sort has them — and ``high [n]`` uint32 their high words.  Returns the least and the greatest key."""
    sign = np.uint64(1) << np.uint64(63)
    lo, hi = ~np.uint64(0), np.uint64(0)
    for i in range(x.shape[0]):
        v = x[i]
        bits = np.uint64(float_bits(0.0 if v == 0.0 else (np.nan if v != v else v)))
        k = ~bits if bits & sign else bits | sign
        key[i], high[i] = k, np.uint32(k >> np.uint64(32))
        lo, hi = min(lo, k), max(hi, k)
    return lo, hi


@numba.njit(cache=True, nogil=True)
def _radix_passes(key, idx, key2, idx2, max_bits, lo, hi):  # pragma: no cover - compiled
    """Stable least-significant-digit passes over the unsigned ints ``key`` (from ``lo`` to ``hi``), moving ``key``
    and ``idx`` together (``key2``, ``idx2``: scratch of their size; the four are overwritten).  The digits are
    those of ``key − lo`` (the same order), as few passes as its span needs, of at most ``max_bits`` bits each,
    evenly wide (a span of 24 bits: two passes of 12); a pass skipped where every key has the same digit.  Returns
    the sorted ``(key, idx)``."""
    n = key.shape[0]
    width, span = 0, np.uint64(hi - lo)
    while span:
        width, span = width + 1, span >> np.uint64(1)
    if width == 0:                                          # one key: every pass would keep the order
        return key, idx
    P = -(-width // max_bits)
    bits = -(-width // P)
    mask = np.uint64((1 << bits) - 1)
    count = np.zeros((P, (1 << bits) + 1), np.int64)
    for p in range(P):                                      # every pass's histogram, before any pass moves a key
        shift, c = np.uint64(p * bits), count[p]
        for i in range(n):
            c[np.int64((np.uint64(key[i] - lo) >> shift) & mask) + 1] += 1
    for p in range(P):
        start, shift = count[p], np.uint64(p * bits)
        if start.max() == n:                                # one digit value: the pass would keep the order
            continue
        for d in range(1 << bits):
            start[d + 1] += start[d]
        for i in range(n):
            d = np.int64((np.uint64(key[i] - lo) >> shift) & mask)
            key2[start[d]], idx2[start[d]] = key[i], idx[i]
            start[d] += 1
        key, key2, idx, idx2 = key2, key, idx2, idx
    return key, idx


@numba.njit(cache=True, nogil=True)
def _insertion_runs(high, order, key):  # pragma: no cover - compiled
    """In place, each run of equal ``high`` words of ``order`` sorted by ``key[order]`` (stable:
    :func:`_insertion_sort` on the run), in one sweep.  Returns False where a run longer than :data:`HIGH_RUN_MAX`
    holds unequal keys (a long run of one key — the zeros of a row, say — is in index order already), ``order``
    then partly sorted: the caller sorts anew."""
    n = high.shape[0]
    i = 0
    while i < n:
        j, h = i + 1, high[i]
        while j < n and high[j] == h:
            j += 1
        if j - i > HIGH_RUN_MAX:
            for t in range(i + 1, j):
                if key[order[t]] != key[order[i]]:
                    return False
        elif j - i > 1:
            _insertion_sort(key, order[i:j], 1, (j - i) ** 2)   # a short run: within it, never giving up
        i = j
    return True


@numba.njit(cache=True, nogil=True)
def _insertion_sort(key, order, start, budget):  # pragma: no cover - compiled
    """In place, ``order`` sorted by ``key[order]`` by insertion (stable), its first ``start`` entries in order
    already.  False once more than ``budget`` entries have been moved: ``order`` is then no longer a permutation
    (one entry overwritten), and the caller starts anew."""
    for s in range(start, order.shape[0]):
        t = order[s]
        u = s - 1
        while u >= 0 and key[order[u]] > key[t]:
            order[u + 1] = order[u]
            u -= 1
            budget -= 1
        if budget < 0:
            return False
        order[u + 1] = t
    return True


@numba.njit(cache=True, nogil=True)
def _argsort_into(x, out, key, high, high2, idx2):  # pragma: no cover - compiled
    """:func:`stable_argsort_row` of ``x [n]`` into ``out [n]`` int64, with scratch ``key [n]`` uint64, ``high``,
    ``high2 [n]`` uint32 and ``idx2 [n]`` int64."""
    n = x.shape[0]
    for i in range(n):
        out[i] = i
    i = 1
    while i < n and (x[i - 1] <= x[i] or x[i] != x[i]):      # in the keys' order already
        i += 1
    if i >= n:
        return
    lo, hi = _order_keys(x, key, high)
    if _insertion_sort(key, out, i, n * n if n <= HIGH_RUN_MAX else n // NEAR_ORDER_SHARE):
        return                                              # short, or nearly in order
    for t in range(n):
        out[t] = t
    bits = min(WIDE_BITS, int(math.log2(n)) + 1) if n >= WIDE_DIGITS_MIN else NARROW_BITS
    sorted_high, order = _radix_passes(high, out, high2, idx2, bits, np.uint32(lo >> np.uint64(32)),
                                       np.uint32(hi >> np.uint64(32)))
    if not _insertion_runs(sorted_high, order, key):        # a long run: the whole keys' passes instead
        for t in range(n):
            out[t] = t
        order = _radix_passes(key, out, np.empty(n, np.uint64), idx2, bits, lo, hi)[1]
    if order is not out:
        out[:] = order


@numba.njit(cache=True, nogil=True)
def stable_argsort_row(x):  # pragma: no cover - compiled
    """``np.argsort(x, kind="stable")`` of one float64 row ``x [n]`` (the same permutation), compiled: a
    least-significant-digit radix sort of keys whose unsigned order is the float order (:func:`_order_keys`) —
    passes over their 32-bit high words (sign, exponent and 20 bits of mantissa), as few as the high words' span
    needs (:func:`_radix_passes`, digits of at most :data:`WIDE_BITS` bits, ``NARROW_BITS`` on short rows), then
    each run of equal high words, in index order from the stable passes, finished by insertion on the whole keys;
    where some run is longer than :data:`HIGH_RUN_MAX` and not one key repeated (keys within ~1e-6 of each other,
    relatively), passes over the whole keys instead.  Stable, so ties keep index order; ~6× numpy's quicksort
    with its ties put in order on 49 152 ratio keys of SmolLM2 rows, on an x86-64 host whose numpy sort does not
    vectorise.  Keys already in order (every key at most the next: rule 2's density sort of a block, whose tokens
    come in ratio order and whose densities are their ratios but at a block's ends — docs/deviations.md item 68)
    give the identity after one read of x, as a stable sort does; rows of at most :data:`HIGH_RUN_MAX` entries,
    and rows nearly in order (insertion moving at most 1/:data:`NEAR_ORDER_SHARE` of them: the same density sort
    where rounding puts a few neighbours out of order — ~20 in a block of 30 000 on SmolLM2 rows, sorted in
    ~50 µs instead of the passes' ~220), are sorted by insertion (:func:`_insertion_sort`)."""
    n = x.shape[0]
    out = np.empty(n, np.int64)
    _argsort_into(x, out, np.empty(n, np.uint64), np.empty(n, np.uint32), np.empty(n, np.uint32),
                  np.empty(n, np.int64))
    return out


@numba.njit(cache=True, nogil=True)
def _stable_argsort_rows(x):  # pragma: no cover - compiled
    """:func:`stable_argsort_row` of each row of ``x [R, V]`` (one scratch for all): ``[R, V]`` int64."""
    R, n = x.shape
    out = np.empty((R, n), np.int64)
    key, idx2 = np.empty(n, np.uint64), np.empty(n, np.int64)
    high, high2 = np.empty(n, np.uint32), np.empty(n, np.uint32)
    for r in range(R):
        _argsort_into(x[r], out[r], key, high, high2, idx2)
    return out


#: Float rows from this length on are argsorted stably by :func:`_stable_float_argsort` (shorter ones by numpy's
#: stable sort, as fast there: at 1 024–2 048 entries the two match; numpy's is ~1.7× slower at 4 096, ~4× at
#: 8 192 and ~11× at 49 152 on ratio-like keys, AMD host, page faults kept out).
RADIX_SORT_MIN = 4096


def _stable_float_argsort(x):
    """``np.argsort(x, axis=-1, kind="stable")`` of float rows, the same permutation, by the compiled radix sort
    (:func:`stable_argsort_row`, a row at a time)."""
    V = x.shape[-1]
    return _stable_argsort_rows(np.ascontiguousarray(x).reshape(-1, V)).reshape(x.shape)


#: The dtypes :meth:`NumpyBackend.cumsum` accumulates in the compiled loop (numpy's result dtype is the input's).
_ROW_SUM_DTYPES = (np.dtype(np.float64), np.dtype(np.int64))


def _summed_as_rows(x, axis: int) -> bool:
    """Whether (exclusive) cumulative sums of ``x`` along ``axis`` run in :func:`_cumsum_rows`: arrays ``[..., V]``
    summed along their last axis (as rows ``[-1, V]``: α*(ρ)'s clock integral sums ``[B, nodes, V]``), in one of
    :data:`_ROW_SUM_DTYPES`."""
    return x.ndim >= 1 and axis % x.ndim == x.ndim - 1 and x.dtype in _ROW_SUM_DTYPES


def _row_sums(x, reverse: bool, exclusive: bool):
    """:func:`_cumsum_rows` on ``x [..., V]`` as rows (a view where x is C-ordered), in x's shape."""
    return _cumsum_rows(x.reshape(math.prod(x.shape[:-1]), x.shape[-1]), reverse, exclusive).reshape(x.shape)


class NumpyBackend:
    """numpy: the exact core's float path (a batch of one)."""

    name = "numpy"
    inf = np.inf

    @staticmethod
    def asarray(x, like):
        """``x`` (a scalar or an array) as a float64 array beside ``like``."""
        return np.asarray(x, dtype=np.float64)

    @staticmethod
    def index(x, like):
        """``x`` (an int or ints) as an int64 array beside ``like``."""
        return np.asarray(x, dtype=np.int64)

    @staticmethod
    def argsort(x, stable: bool = True):
        """Ascending argsort along the last axis; ``stable``: ties keep index order (else in any order).  Float
        rows of at least :data:`RADIX_SORT_MIN` entries are sorted stably by :func:`_stable_float_argsort` (a
        compiled radix sort: the stable order, ~11× faster at the vocabulary's 49 152 entries)."""
        if stable and x.dtype == np.float64 and x.shape[-1] >= RADIX_SORT_MIN:
            return _stable_float_argsort(x)
        return np.argsort(x, axis=-1, kind="stable" if stable else "quicksort")

    @staticmethod
    def bincount(x, minlength: int):
        """Occurrences of each of ``0..minlength−1`` (and beyond) in the non-negative ints ``x [n]``."""
        return np.bincount(x, minlength=minlength)

    @staticmethod
    def unique(x):
        """``(values, inverse)``: the distinct entries of the ints ``x [n]``, ascending, and each entry's index
        among them (``values[inverse] == x``)."""
        return np.unique(x, return_inverse=True)

    @staticmethod
    def row_order(rows):
        """The order that sorts the rows of a table ``[M, K]`` (ints, or floats without NaN) lexicographically
        (stable: equal rows keep index order)."""
        return np.lexsort(rows.T[::-1])

    @staticmethod
    def argmax(x):
        """``[..., 1]``: the index of the first largest entry along the last axis (the lowest index among ties)."""
        return np.argmax(x, axis=-1)[..., None]

    @staticmethod
    def top_values(x, n: int):
        """``[..., n]``: the n largest entries along the last axis, largest first (a partition, then a sort of
        those n)."""
        top = -np.partition(-x, n - 1, axis=-1)[..., :n] if n < x.shape[-1] else x
        return -np.sort(-top, axis=-1)

    @staticmethod
    def take(x, idx):
        """``x[..., idx[..., j]]`` along the last axis (``take_along_axis``; batch axes broadcast)."""
        if x.ndim == 2 and idx.ndim == 2:               # rows: a compiled gather (:func:`_take_rows`), or plain
            if x.shape[0] == idx.shape[0]:              # fancy indexing where one side broadcasts
                return _take_rows(x, idx)
            return x[np.arange(x.shape[0])[:, None], idx]
        return np.take_along_axis(x, idx, axis=-1)

    @staticmethod
    def put(x, idx, values):
        """A copy of ``x`` with ``values`` written at ``idx`` along the last axis."""
        out = np.array(x, copy=True)
        if out.ndim == 2 and idx.ndim == 2:             # rows: plain fancy indexing, as :meth:`take`
            out[np.arange(out.shape[0])[:, None], idx] = values
        else:
            np.put_along_axis(out, idx, values, axis=-1)
        return out

    @staticmethod
    def cumsum(x, reverse=False, axis=-1):
        """Prefix sums along the last axis (or ``axis``); suffix sums (``Σ_{j ≥ i}``, summed from the end) with
        ``reverse``."""
        if _summed_as_rows(x, axis):
            return _row_sums(x, reverse, False)         # rows: the compiled loop (module docstring)
        if not reverse:
            return x.cumsum(axis)
        flip = (slice(None),) * (axis % x.ndim) + (slice(None, None, -1),)
        return x[flip].cumsum(axis)[flip]

    @staticmethod
    def exclusive_cumsum(x, reverse=False, axis=-1):
        """``Σ_{j<i} x_j`` along the last axis (or ``axis``; ``Σ_{j>i}``, summed from the end, with ``reverse``):
        :func:`shifted_cumsum`, on rows the compiled loop (the same floats)."""
        if _summed_as_rows(x, axis):
            return _row_sums(x, reverse, True)
        return shifted_cumsum(NumpyBackend, x, reverse, axis)

    @staticmethod
    def sum(x, keepdims=False):
        return np.sum(x, axis=-1, keepdims=keepdims)

    @staticmethod
    def last_prefix_sum(x):
        """``[..., 1]``: each row's sum along the last axis (V ≥ 1) in order from its first entry — ``cumsum``'s
        last column, the same floats (float64 rows: :func:`row_totals_numpy`, no prefix sums written)."""
        return row_totals_numpy(x) if x.dtype == np.float64 else NumpyBackend.cumsum(x)[..., -1:]

    @staticmethod
    def amax(x, keepdims=False):
        """Largest entry along the last axis."""
        return np.amax(x, axis=-1, keepdims=keepdims)

    @staticmethod
    def amin(x, keepdims=False):
        """Smallest entry along the last axis."""
        return np.amin(x, axis=-1, keepdims=keepdims)

    @staticmethod
    def nonzero(x):
        """The indices of the non-zero entries, one index array per axis, in row-major order."""
        return np.nonzero(x)

    @staticmethod
    def concat(xs, axis=-1):
        return np.concatenate(xs, axis=axis)

    @staticmethod
    def stack(xs):
        return np.stack(xs, axis=-1)

    @staticmethod
    def searchsorted(rows, values):
        """Per row, the number of entries of the ascending ``rows [..., V]`` that are ``< values [...]``."""
        flat, v = rows.reshape(-1, rows.shape[-1]), np.broadcast_to(values, rows.shape[:-1]).reshape(-1)
        return np.array([np.searchsorted(r, x, side="left") for r, x in zip(flat, v)],
                        dtype=np.int64).reshape(rows.shape[:-1])

    where = staticmethod(np.where)
    minimum = staticmethod(np.minimum)
    maximum = staticmethod(np.maximum)
    zeros_like = staticmethod(np.zeros_like)
    exp = staticmethod(np.exp)

    @staticmethod
    def clip(x, lo=None, hi=None):
        return np.clip(x, lo, hi)

    @staticmethod
    def log(x):
        """``log x`` (``−inf`` at 0, silently)."""
        with np.errstate(divide="ignore"):
            return np.log(x)

    @staticmethod
    def arange(n, like):
        """``0..n−1`` as an int64 array beside ``like``."""
        return np.arange(n, dtype=np.int64)

    @staticmethod
    def full(shape, value, like):
        """An array of ``shape`` filled with ``value``, of ``like``'s dtype."""
        return np.full(shape, value, dtype=np.asarray(like).dtype)

    @staticmethod
    def cummin(x, reverse=False):
        """Prefix minima along the last axis; suffix minima (``min_{j ≥ i}``) with ``reverse``."""
        if reverse:
            return np.minimum.accumulate(x[..., ::-1], axis=-1)[..., ::-1]
        return np.minimum.accumulate(x, axis=-1)

    @staticmethod
    def cumprod(x, reverse=False):
        """Prefix products along the last axis; suffix products (``Π_{j ≥ i}``, from the end) with ``reverse``."""
        return np.cumprod(x[..., ::-1], axis=-1)[..., ::-1] if reverse else np.cumprod(x, axis=-1)

    @staticmethod
    def scatter_add(x, idx, values):
        """A copy of ``x`` with ``values`` (shaped as ``idx``) added at ``idx`` along the last axis, in index
        order (repeated indices accumulate)."""
        out = np.array(x, copy=True)
        values = np.broadcast_to(values, idx.shape)
        if out.ndim == 2 and idx.ndim == 2 and out.shape[0] == idx.shape[0] and values.dtype == out.dtype:
            return _scatter_add_rows(out, idx, values)  # rows: a compiled loop (``ufunc.at`` is ~10× slower)
        lead = tuple(np.broadcast_to(g[..., None], idx.shape) for g in np.indices(idx.shape[:-1], sparse=True))
        np.add.at(out, lead + (idx,), values)
        return out

    @staticmethod
    def searchsorted_each(rows, values, right=False):
        """Per row of the ascending ``rows [B, V]``, for each of ``values [n]``, the number of entries ``< value``
        (``≤`` with ``right``) → ``[B, n]``."""
        side = "right" if right else "left"
        return np.stack([np.searchsorted(r, values, side=side) for r in rows]).astype(np.int64)

    @staticmethod
    def to_numpy(x):
        """``x`` as a numpy array on the host (a host read for a tensor)."""
        return np.asarray(x)

    @staticmethod
    def astype(x, like):
        """``x`` in ``like``'s dtype (no copy when it already is)."""
        return x.astype(like.dtype, copy=False)

    @staticmethod
    def expm1(x):
        return np.expm1(x)

    @staticmethod
    def log1p(x):
        """``log(1 + x)`` (``−inf`` at −1, silently)."""
        with np.errstate(divide="ignore"):
            return np.log1p(x)


class TorchBackend:
    """torch: the batched level rules of :mod:`gpu`, on the tensors' device."""

    name = "torch"
    inf = float("inf")

    def __init__(self):
        import torch
        self.torch = torch

    def asarray(self, x, like):
        """``x`` as a float64 tensor on ``like``'s device (a read-only numpy array, e.g. a cached grid, copied:
        torch has no read-only tensors, so sharing its memory would let an in-place op write into the cache)."""
        return self.torch.as_tensor(_writable(x), dtype=self.torch.float64, device=like.device)

    def index(self, x, like):
        return self.torch.as_tensor(_writable(x), dtype=self.torch.long, device=like.device)

    def argsort(self, x, stable: bool = True):
        return self.torch.sort(x, dim=-1, stable=stable).indices

    @staticmethod
    def bincount(x, minlength: int):
        return x.bincount(minlength=minlength)

    def unique(self, x):
        return self.torch.unique(x, return_inverse=True)

    def row_order(self, rows):
        order = self.torch.arange(rows.shape[0], device=rows.device)    # stable sorts, last column first
        for j in reversed(range(rows.shape[1])):
            order = order[self.torch.sort(rows[order, j], stable=True).indices]
        return order

    def argmax(self, x):
        x = x.to(self.torch.uint8) if x.dtype == self.torch.bool else x   # (torch has no bool argmax)
        return x.argmax(-1, keepdim=True)              # the first maximal entry, as numpy

    @staticmethod
    def top_values(x, n: int):
        return x.topk(n, -1).values

    @staticmethod
    def take(x, idx):
        return x.gather(-1, idx)

    def put(self, x, idx, values):
        return x.scatter(-1, idx, values if self.torch.is_tensor(values) else self.torch.full_like(
            idx, values, dtype=x.dtype))

    @staticmethod
    def cumsum(x, reverse=False, axis=-1):
        return x.flip(axis).cumsum(axis).flip(axis) if reverse else x.cumsum(axis)

    def exclusive_cumsum(self, x, reverse=False, axis=-1):
        return shifted_cumsum(self, x, reverse, axis)

    @staticmethod
    def sum(x, keepdims=False):
        return x.sum(-1, keepdim=keepdims)

    def last_prefix_sum(self, x):
        """As :meth:`NumpyBackend.last_prefix_sum`: float64 rows on the CPU through :func:`row_totals_numpy` on a
        numpy view (numpy's floats; torch's own CPU ``cumsum`` has the same values, but +0.0 for a row of −0.0),
        elsewhere ``cumsum``'s last column."""
        if x.device.type == "cpu" and x.dtype == self.torch.float64:
            return self.torch.from_numpy(row_totals_numpy(x.detach().numpy()))
        return x.cumsum(-1)[..., -1:]

    @staticmethod
    def amax(x, keepdims=False):
        return x.amax(-1, keepdim=keepdims)

    @staticmethod
    def amin(x, keepdims=False):
        return x.amin(-1, keepdim=keepdims)

    @staticmethod
    def nonzero(x):
        return x.nonzero(as_tuple=True)

    def concat(self, xs, axis=-1):
        return self.torch.cat(xs, axis)

    def stack(self, xs):
        return self.torch.stack(xs, -1)

    def searchsorted(self, rows, values):
        lead = rows.shape[:-1]
        flat = rows.reshape(-1, rows.shape[-1])
        v = values.expand(lead).reshape(-1, 1)
        return self.torch.searchsorted(flat, v, right=False).reshape(lead)

    def where(self, cond, x, y):
        return self.torch.where(cond, x, y)

    def minimum(self, x, y):
        return self.torch.minimum(x, y) if self.torch.is_tensor(y) else x.clamp(max=y)

    def maximum(self, x, y):
        return self.torch.maximum(x, y) if self.torch.is_tensor(y) else x.clamp(min=y)

    def zeros_like(self, x):
        return self.torch.zeros_like(x)

    @staticmethod
    def clip(x, lo=None, hi=None):
        return x.clamp(lo, hi)

    @staticmethod
    def log(x):
        return x.log()

    @staticmethod
    def exp(x):
        return x.exp()

    def arange(self, n, like):
        return self.torch.arange(n, device=like.device)

    def full(self, shape, value, like):
        return self.torch.full(shape, value, dtype=like.dtype, device=like.device)

    @staticmethod
    def cummin(x, reverse=False):
        return x.flip(-1).cummin(-1).values.flip(-1) if reverse else x.cummin(-1).values

    @staticmethod
    def cumprod(x, reverse=False):
        return x.flip(-1).cumprod(-1).flip(-1) if reverse else x.cumprod(-1)

    @staticmethod
    def scatter_add(x, idx, values):
        return x.scatter_add(-1, idx, values.expand(idx.shape))

    def searchsorted_each(self, rows, values, right=False):
        return self.torch.searchsorted(rows.contiguous(), values.expand(rows.shape[0], -1).contiguous(), right=right)

    @staticmethod
    def to_numpy(x):
        return x.detach().cpu().numpy()

    @staticmethod
    def astype(x, like):
        return x.to(like.dtype)

    @staticmethod
    def expm1(x):
        return x.expm1()

    @staticmethod
    def log1p(x):
        return x.log1p()


NUMPY = NumpyBackend()
_TORCH: list = []


def _writable(x):
    """``x``, or a copy of it where it is a read-only numpy array."""
    return np.array(x) if isinstance(x, np.ndarray) and not x.flags.writeable else x


def get_backend(*arrays):
    """The backend of the arrays: torch if any is a torch tensor, numpy otherwise (scalars and numpy arrays)."""
    for a in arrays:
        if type(a).__module__.startswith("torch"):
            if not _TORCH:
                _TORCH.append(TorchBackend())
            return _TORCH[0]
    return NUMPY


def array_module(x):
    """numpy, or torch for a tensor: for rules whose ops numpy and torch spell alike as module functions
    (``einsum``, ``exp``, ``expm1``, ``log1p``, ``where``, ``amax``, ``linalg.solve``, …) and need no backend
    object (:mod:`univer_theory.plans.luce`)."""
    if type(x).__module__.startswith("torch"):
        import torch
        return torch
    return np
