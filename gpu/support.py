"""A level's rows on their drafted support: ``[R, M + 1]`` columns instead of ``[R, V]`` (theory.md §6.3).

With i.i.d. or without-replacement children, every level rule of :data:`gpu.verify.METHODS` reads a token the
node's draft cannot propose (``q(x) = 0``) only through the total target mass of such tokens:

* it is never a child, and every update of the rejection rules changes drafted tokens only (RRS, RRSw, TV and
  K-SEQ subtract draft mass, 0 there; NSS and the without-replacement updates remove a drafted child), so each
  such token keeps ``residual(x) = c·p(x)`` with one factor ``c`` per node;
* UniVer's and Global Resolution's plans give it ``a(x) = 0`` and it comes last in every ratio order (no
  minimising prefix of α*(ρ) needs it: the prefix of all drafted tokens costs less), so ``residual(x) = ρp(x)``.

So a level is planned on each row's drafted tokens, in token-id order (ties between tokens break as on the whole
row — but for float32 rows, which UniVer and GR renormalise by the compact row's sum, ulps off the whole row's:
exact p/q ties then break otherwise, and E[τ | T] of such a tree can differ from the whole rows' by O(1), each
plan lossless and α*-optimal, as docs/deviations.md's open item on exact ratio ties), padded to the widest row's
``M`` with ``p = q = 0``, plus one *undrafted* column holding ``p_rest = Σ_{q(x)=0} p(x)`` with ``q = 0``.  A
residual's undrafted column ``r`` stands for ``r·p(x)/p_rest`` on every undrafted token: a correction token drawn
from that column is drawn again from ``p·1[q = 0]``, once per tree and only when the accepted path ends on it
(:func:`draw_undrafted`).

With a draft truncated to its m most likely tokens (a draft process of its own, ``gpu.probs.probs_from_logits``
``top = m``) a node then costs one pass over its draft row (:func:`scan`; ``p_rest = 1 − Σ_drafted p``, the
target row read whole only where that is small or the row is float32) and O(m log m) after it, instead of the
rule's dozens of O(V) passes over both rows; on whole rows the scan gives up at the first row with more than
``V/2`` drafted tokens and the level is planned on all V as before.
"""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import torch
from numba.cpython.unsafe.numbers import trailing_zeros

from .probs import sample_blocks


@dataclass(frozen=True)
class Support:
    """Drafted tokens of R rows: ``cols [R, M]`` long, each row's tokens with ``q > 0`` ascending, then padding
    (the largest long); ``target`` / ``draft`` ``[R, M]`` their p and q (0 on padding, the rows' dtype);
    ``rest [R]`` float64, the undrafted column's target mass ``p_rest`` (:func:`scan`)."""

    cols: torch.Tensor
    target: torch.Tensor
    draft: torch.Tensor
    rest: torch.Tensor

    @property
    def drafted(self) -> torch.Tensor:
        """``[R, M]`` bool: column i of the row is a drafted token (not padding)."""
        return self.cols < PAD


#: Padding of :attr:`Support.cols` (sorts after every token, so ``searchsorted`` finds the children's columns).
PAD = torch.iinfo(torch.long).max


#: Tokens per block of the undrafted draw (:func:`draw_undrafted`).
SCAN_BLOCK = 128

#: Tokens per word of :func:`_scan_rows`' mask of drafted tokens (a uint64's bits).
SCAN_WORD = 64

#: ``p_rest`` is ``1 − Σ_drafted p`` at or above this value and summed over the undrafted tokens below it, per
#: dtype (:func:`scan`): the complement's relative error is ``|1 − Σ p|`` / ``p_rest``, ≤ ~1e-10 for a float64
#: softmax row (``|1 − Σ p|`` ~ 1e-16).  A float32 row is always summed: it may miss 1 by up to
#: :data:`gpu.probs.SIMPLEX_TOL` (1e-5), and the complement put that whole defect on the undrafted mass, so the
#: rules, which put float32 rows onto the simplex (``gpu.rules._decided_in_float64``), planned another row than
#: ``p/Σp`` on a drafted support (E[τ | T] 8.6e-6 off the exact core, where whole rows are 1e-7 off).
EXACT_REST_BELOW = {torch.float64: 1e-6, torch.float32: float("inf")}


@numba.njit(cache=True, nogil=True)
def _complement(p_s, lo, hi):  # pragma: no cover - compiled
    """``1 − Σ p_s[lo:hi]`` in float64, compensated (Neumaier: error ~ε, not ~(hi − lo)·ε); no fast-math, which
    would cancel the compensation."""
    s, c = 1.0, 0.0
    for x in range(lo, hi):
        v = -np.float64(p_s[x])
        t = s + v
        c += (s - t) + v if abs(s) >= abs(v) else (v - t) + s
        s = t
    return s + c


@numba.njit(cache=True, inline="always", fastmath={"reassoc"})
def _undrafted_mass(pr, qr, lo, hi):  # pragma: no cover - compiled
    """``Σ_{q(x)=0} p(x)`` over tokens ``lo ≤ x < hi`` of one row, reassociated over SIMD lanes
    (~((hi − lo)/lanes)·ε relative at worst); ``qr`` the row's q, or any mark positive exactly where q is."""
    s = 0.0
    for x in range(lo, hi):
        s += pr[x] if qr[x] <= 0 else 0.0
    return s


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _scan_rows(p, q, src, cap, exact_below):  # pragma: no cover - compiled
    """Rows ``src[i]`` of ``p``, ``q``, read in place.  Each q in one pass: per word of :data:`SCAN_WORD` tokens
    a bit mask of the drafted ones (``q > 0``, bit t for token W·j + t) and their count (a fixed trip count of
    comparisons, shifts and integer adds, vectorised, nothing else in the loop: as fast as a plain sum of the row),
    and the row's total.  Then the set bits of each word, lowest first (``trailing_zeros``; a word without one
    costs a test), and the tail (branch-free: every token read written at the next free place, which moves on only
    past a drafted one) append their tokens and q to the flat ``cols``, ``q_s`` — ``count[i]`` tokens per row,
    ascending.  Then the row's p is read at those tokens only (a loop of independent loads, so the cache misses
    overlap) into ``p_s``, and ``rest[i] = 1 − Σ_drafted p`` (:func:`_complement`) — unless that is below
    ``exact_below``, where the complement's relative error could matter (and a 0 must stay 0), and
    ``rest[i] = Σ_{q=0} p`` is summed over the row (:func:`_undrafted_mass`).  Returns ``ok`` (False as soon as a
    row drafts more than ``cap`` tokens, the rest then meaningless) and the entries laid out ``[R, M]`` (``M`` the
    widest row; padded with :data:`PAD`, 0, 0) with ``rest``: the flat outputs themselves, each row moved to its
    place, last row first (a row lies at or after its flat place, so nothing is overwritten before it is moved; no
    move at all where every row drafts M tokens, as a top-m draft's do).  (The flat outputs are sized at the first
    row for R rows like it, with room for the one place a last unmoved write takes, and grow between rows only.)"""
    R, V, W = src.shape[0], q.shape[1], SCAN_WORD
    full = V // W
    words = np.empty(full, np.uint64)
    count = np.zeros(R, np.int64)
    rest = np.zeros(R, np.float64)
    size, used = 0, 0
    cols, p_s, q_s = np.empty(0, np.int64), np.empty(0, p.dtype), np.empty(0, q.dtype)
    for i in range(R):
        pr, qr, start = p[src[i]], q[src[i]], used
        total = 0
        for j in range(full):
            bits, n = np.uint64(0), 0
            for t in range(W):
                drafted = qr[W * j + t] > 0
                bits |= np.uint64(drafted) << np.uint64(t)
                n += drafted
            words[j] = bits
            total += n
        for x in range(full * W, V):
            total += qr[x] > 0
        if total > cap:                   # a whole row, say: the level is planned on all V
            return False, cols[:0].reshape(0, 0), p_s[:0].reshape(0, 0), q_s[:0].reshape(0, 0), rest
        if i == 0:
            size = R * (total + 1)
            cols, p_s, q_s = np.empty(size, np.int64), np.empty(size, p.dtype), np.empty(size, q.dtype)
        while used + total + 1 > size:
            size *= 2
            cols, p_s, q_s = _grown(cols, size), _grown(p_s, size), _grown(q_s, size)
        for j in range(full):
            w = words[j]
            while w:
                x = W * j + trailing_zeros(w)
                cols[used], q_s[used] = x, qr[x]
                used += 1
                w &= w - np.uint64(1)         # the lowest set bit cleared
        for x in range(full * W, V):     # the tail
            cols[used], q_s[used] = x, qr[x]
            used += qr[x] > 0
        count[i] = used - start
        for e in range(start, used):
            p_s[e] = pr[cols[e]]
        r = _complement(p_s, start, used)
        rest[i] = r if r >= exact_below else _undrafted_mass(pr, qr, 0, V)
    M = count.max() if R else 0
    if R * M > size:
        cols, p_s, q_s = _grown(cols, R * M), _grown(p_s, R * M), _grown(q_s, R * M)
    for i in range(R - 1, -1, -1):        # used: row i's flat start after the subtraction
        used -= count[i]
        to = i * M
        if to != used:
            for j in range(count[i] - 1, -1, -1):
                cols[to + j], p_s[to + j], q_s[to + j] = cols[used + j], p_s[used + j], q_s[used + j]
        for e in range(to + count[i], to + M):
            cols[e], p_s[e], q_s[e] = PAD, 0, 0
    n = R * M
    return True, cols[:n].reshape(R, M), p_s[:n].reshape(R, M), q_s[:n].reshape(R, M), rest


@numba.njit(cache=True, inline="always")
def _grown(x, size):  # pragma: no cover - compiled
    """``x`` extended to ``size`` entries (its own first, the rest uninitialised)."""
    return np.concatenate((x, np.empty(size - x.shape[0], x.dtype)))


def _layout(row: torch.Tensor, count: torch.Tensor, M: int, entries) -> tuple[torch.Tensor, ...]:
    """Flat drafted entries (row-major: row ``row[e]``, each row's tokens ascending; ``count [R]`` per row) laid out
    ``[R, M]``: ``entries`` = (token ids, their p, their q), padded with :data:`PAD`, 0, 0."""
    slot = torch.arange(row.numel(), device=row.device) - (count.cumsum(0) - count)[row]
    return tuple(torch.full((count.shape[0], M), fill, dtype=x.dtype, device=x.device).index_put_((row, slot), x)
                 for x, fill in zip(entries, (PAD, 0, 0)))


@torch.compiler.disable
def _scan_host(p_rows: torch.Tensor, q_rows: torch.Tensor, src: torch.Tensor, cap: int, exact_below: float):
    """The CPU scan: compiled passes over each row in place (:func:`_scan_rows`; torch needs a gather, a
    comparison, a ``nonzero`` and a masked sum — four passes and two row copies)."""
    ok, *out = _scan_rows(p_rows.numpy(), q_rows.numpy(), src.numpy(), cap, exact_below)
    return tuple(torch.from_numpy(x) for x in out) if ok else None


def _scan_device(p_rows: torch.Tensor, q_rows: torch.Tensor, src: torch.Tensor, cap: int, exact_below: float):
    """The accelerator's scan in torch: the rows' drafted entries by ``nonzero`` (row-major, so ascending);
    ``p_rest`` as on the CPU but for the complement's sum (float64, not compensated: ~M·ε), the undrafted sum
    taken for every row (bandwidth is cheap there) and kept where the complement is below ``exact_below``."""
    q = q_rows.index_select(0, src)
    drafted = q > 0
    count = drafted.sum(1)
    M = int(count.max())                                            # host read: the compact width
    if M > cap:
        return None
    row, col = drafted.nonzero(as_tuple=True)
    cols, target, draft = _layout(row, count, M, (col, p_rows[src[row], col], q[row, col]))
    complement = 1 - target.sum(1, dtype=torch.float64)
    undrafted = undrafted_weights(p_rows.index_select(0, src), q).sum(1, dtype=torch.float64)
    return cols, target, draft, torch.where(complement < exact_below, undrafted, complement)


def scan(p_rows: torch.Tensor, q_rows: torch.Tensor, src: torch.Tensor) -> Support | None:
    """The drafted support of rows ``src [R]`` of ``p_rows``, ``q_rows`` ``[·, V]``, or None when some row drafts
    more than ``V/2`` tokens (then the level is cheaper on its whole rows).  On the CPU compiled passes
    (:func:`_scan_rows`), elsewhere torch (:func:`_scan_device`).

    ``p_rest = 1 − Σ_drafted p`` where that is at least :data:`EXACT_REST_BELOW` of the rows' dtype (never on
    float32 rows), so that only q is read whole, else ``Σ_{q=0} p`` over the row: the level then plans against
    ``p̃ = (p on drafted tokens, p_rest · p/Σ_{q=0} p on the others)``, a distribution within ``|1 − Σ p|`` of
    p in total variation (p itself for a row on the simplex) — docs/deviations.md item 47."""
    cap = q_rows.shape[1] // 2
    scanner = _scan_host if q_rows.device.type == "cpu" else _scan_device
    out = scanner(p_rows, q_rows, src, cap, EXACT_REST_BELOW[p_rows.dtype])
    return None if out is None else Support(*out)


def compact(support: Support, children: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(p_s, q_s [R, M + 1], children_s [R, K])``: the rows on their drafted columns plus the undrafted one
    (``p_rest`` in the rows' dtype, ``q = 0``), and each child's column (absent children: column 0)."""
    p_s = torch.cat([support.target, support.rest.to(support.target.dtype)[:, None]], 1)
    q_s = torch.cat([support.draft, torch.zeros_like(support.draft[:, :1])], 1)
    children_s = torch.searchsorted(support.cols, children.contiguous()).clamp(max=support.cols.shape[1] - 1)
    return p_s, q_s, children_s


def undrafted_weights(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``p·1[q = 0]`` entrywise: the law (unnormalised) of a token drawn from a residual's undrafted column."""
    return torch.where(q > 0, 0, p)


def tokens(support: Support, columns: torch.Tensor, vocab: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Token ids ``[R]`` of sampled compact ``columns [R]`` (of the support's rows ``rows [R]``; None: all); the
    undrafted column (and padding) give ``vocab``, the marker of "a token drawn from ``p·1[q = 0]``"
    (:func:`draw_undrafted`)."""
    M = support.cols.shape[1]
    cols = support.cols if rows is None else support.cols[rows]
    tok = cols.gather(1, columns.clamp(max=M - 1)[:, None]).squeeze(1)
    return torch.where((columns < M) & (tok < vocab), tok, vocab)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _undrafted_blocks_rows(p, src, cols):  # pragma: no cover - compiled
    """``mass[i, b]`` = :func:`_undrafted_mass` over block b of :data:`SCAN_BLOCK` token ids of rows ``src[i]`` of
    ``p`` (the last block the tail, possibly empty), read in place, with the row's drafted tokens ``cols[i]``
    (:attr:`Support.cols`, :data:`PAD` padded) marked in a byte mask instead of reading its draft row."""
    R, V, B = src.shape[0], p.shape[1], SCAN_BLOCK
    full = V // B
    mass = np.zeros((R, full + 1), np.float64)
    drafted = np.zeros(V, np.uint8)
    for i in range(R):
        for c in cols[i]:
            if c < V:
                drafted[c] = 1
        pr = p[src[i]]
        for b in range(full):
            mass[i, b] = _undrafted_mass(pr, drafted, b * B, b * B + B)
        mass[i, full] = _undrafted_mass(pr, drafted, full * B, V)
        for c in cols[i]:                       # cleared for the next row
            if c < V:
                drafted[c] = 0
    return mass


@torch.compiler.disable
def _undrafted_blocks_host(p_rows: torch.Tensor, src: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``[n, V // SCAN_BLOCK + 1]`` float64: the undrafted target mass ``Σ_{q=0} p`` per block of token ids of rows
    ``src [n]`` whose drafted tokens are ``cols [n, M]``, one compiled pass over the target rows in place
    (:func:`_undrafted_blocks_rows`)."""
    return torch.from_numpy(_undrafted_blocks_rows(p_rows.numpy(), src.numpy(), cols.numpy()))


def _undrafted_blocks_device(p_rows: torch.Tensor, src: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """:func:`_undrafted_blocks_host` in torch (an accelerator's)."""
    V = p_rows.shape[1]
    w = torch.nn.functional.pad(p_rows.index_select(0, src), (0, 1))         # column V: where padding points
    w = w.scatter_(1, cols.clamp(max=V), 0)[:, :V]
    w = torch.nn.functional.pad(w, (0, SCAN_BLOCK - V % SCAN_BLOCK))          # V // SCAN_BLOCK + 1 blocks
    return w.view(w.shape[0], V // SCAN_BLOCK + 1, SCAN_BLOCK).sum(2, dtype=torch.float64)


def draw_undrafted(p_rows: torch.Tensor, q_rows: torch.Tensor, src: torch.Tensor, cols: torch.Tensor,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """Tokens ``[n]`` from ``p·1[q = 0]`` of rows ``src [n]`` of ``p_rows``, ``q_rows``, whose drafted tokens are
    ``cols [n, M]`` (their levels' :attr:`Support.cols`): a correction token sampled from a level's undrafted
    column (:func:`tokens`), drawn again from the tokens it stands for, once per tree — the block by the rows'
    undrafted block masses (:func:`_undrafted_blocks_host`: one pass over the target rows), the token within it
    from its p with drafted tokens at 0 (:func:`gpu.probs.sample_blocks`; the draft rows read there only)."""
    def read(block):
        r = src[:, None, None]
        return undrafted_weights(p_rows[r, block], q_rows[r, block])
    blocks = _undrafted_blocks_host if p_rows.device.type == "cpu" else _undrafted_blocks_device
    return sample_blocks(blocks(p_rows, src, cols), SCAN_BLOCK, read, p_rows.shape[1], generator)


def cols_at(levels, slots: torch.Tensor, size: int) -> torch.Tensor:
    """``[n, M]`` (:data:`PAD` padded): the drafted tokens (:attr:`Support.cols`) of the rows at flat slots
    ``slots [n]`` of ``size`` slots, from ``levels`` = ``(at [R], cols [R, M_l])`` per level planned on its
    drafted support (each slot in at most one level; slots in none get padding only)."""
    out = torch.full((slots.shape[0], max(c.shape[1] for _, c in levels)), PAD, device=slots.device)
    for at, cols in levels:
        where = torch.full((size,), -1, device=slots.device).index_put_((at,), torch.arange(at.shape[0],
                                                                                           device=slots.device))
        idx = where[slots]
        hit = (idx >= 0).nonzero().squeeze(1)
        out[hit, :cols.shape[1]] = cols[idx[hit]]
    return out


def expand(residual_s: torch.Tensor, p_rows: torch.Tensor, q_rows: torch.Tensor, src: torch.Tensor,
           support: Support) -> torch.Tensor:
    """A compact residual ``[R, M + 1]`` back on all V tokens: drafted columns in place, the undrafted column
    ``r`` spread as ``r·p(x)/Σ_{q=0} p`` (:func:`draw_undrafted`'s law; kept only for exactness tests:
    :func:`gpu.engine.allocate` ``keep_residuals``)."""
    full = undrafted_weights(p_rows.index_select(0, src), q_rows.index_select(0, src)).to(residual_s.dtype)
    mass = full.sum(1)
    full *= torch.where(mass > 0, residual_s[:, -1] / torch.where(mass > 0, mass, 1), 0)[:, None]
    drafted = support.drafted
    return full.scatter_add_(1, torch.where(drafted, support.cols, 0), torch.where(drafted, residual_s[:, :-1], 0))
