"""A level's rows on their drafted support: ``[R, M + 1]`` columns instead of ``[R, V]`` (theory.md §6.3).

With i.i.d. or without-replacement children, every level rule of :data:`gpu.verify.METHODS` reads a token the
node's draft cannot propose (``q(x) = 0``) only through the total target mass of such tokens:

* it is never a child, and every update of the rejection rules changes drafted tokens only (RRS, RRSw, TV and
  K-SEQ subtract draft mass, 0 there; NSS and the without-replacement updates remove a drafted child), so each
  such token keeps ``residual(x) = c·p(x)`` with one factor ``c`` per node;
* UniVer's and Global Resolution's plans give it ``a(x) = 0`` and it comes last in every ratio order (no
  minimising prefix of α*(ρ) needs it: the prefix of all drafted tokens costs less), so ``residual(x) = ρp(x)``.

So a level is planned on each row's drafted tokens, in token-id order (ties between tokens break as on the whole
row), padded to the widest row's ``M`` with ``p = q = 0``, plus one *undrafted* column holding
``p_rest = Σ_{q(x)=0} p(x)`` with ``q = 0``.  A residual's undrafted column ``r`` stands for
``r·p(x)/p_rest`` on every undrafted token: a correction token drawn from that column is drawn again from
``p·1[q = 0]``, once per tree and only when the accepted path ends on it (:meth:`DraftedLevels.draw_undrafted`:
by the scan's undrafted mass per block of 64 token ids, then within one block).

With a draft truncated to its m most likely tokens (a draft process of its own, ``gpu.probs.probs_from_logits``
``top = m``) a node then costs one pass over its two rows (:func:`scan`) and O(m log m) after it, instead of the
rule's dozens of O(V) passes; on whole rows the scan gives up at the first row with more than ``V/2`` drafted
tokens and the level is planned on all V as before.
"""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import torch

from .probs import sample_blocks


@dataclass(frozen=True)
class Support:
    """Drafted tokens of R rows: ``cols [R, M]`` long, each row's tokens with ``q > 0`` ascending, then padding
    (the largest long); ``target`` / ``draft`` ``[R, M]`` their p and q (0 on padding, the rows' dtype);
    ``blocks [R, V // SCAN_BLOCK + 1]`` float64, ``Σ_{q(x)=0} p(x)`` per block of :data:`SCAN_BLOCK` token ids (the
    last block the tail, possibly empty)."""

    cols: torch.Tensor
    target: torch.Tensor
    draft: torch.Tensor
    blocks: torch.Tensor

    @property
    def rest(self) -> torch.Tensor:
        """``[R]`` float64: ``p_rest = Σ_{q(x)=0} p(x)``, the undrafted column's target mass."""
        return self.blocks.sum(1)

    @property
    def drafted(self) -> torch.Tensor:
        """``[R, M]`` bool: column i of the row is a drafted token (not padding)."""
        return self.cols < PAD


#: Padding of :attr:`Support.cols` (sorts after every token, so ``searchsorted`` finds the children's columns).
PAD = torch.iinfo(torch.long).max


#: Tokens per block of :func:`_scan_rows`'s counting pass.
SCAN_BLOCK = 64


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _scan_rows(p, q, src, cap):  # pragma: no cover - compiled
    """Rows ``src[i]`` of ``p``, ``q``, read in place: a vectorised pass over blocks of :data:`SCAN_BLOCK` tokens
    counts each block's drafted tokens and sums its undrafted target mass ``blocks[i, b] = Σ_{q=0} p``
    (reassociated over SIMD lanes: the error is ~(SCAN_BLOCK/lanes)·ε at worst), then the blocks holding drafted
    tokens are read again (from cache) to append those tokens and their p, q to the flat ``cols``, ``p_s``,
    ``q_s``; ``count[i]`` tokens per row.  ``ok`` is False as soon as a row drafts more than ``cap`` tokens."""
    R, V, B = src.shape[0], q.shape[1], SCAN_BLOCK
    full = V // B
    drafted_in = np.zeros(full + 1, np.int64)
    count = np.zeros(R, np.int64)
    blocks = np.zeros((R, full + 1), np.float64)
    size, used = R * B, 0                 # flat outputs: room for B drafted tokens a row, doubled when short
    cols, p_s, q_s = np.empty(size, np.int64), np.empty(size, p.dtype), np.empty(size, q.dtype)
    for i in range(R):
        r = src[i]
        for b in range(full + 1):     # full blocks have a fixed trip count (vectorised); then the tail
            s, c = 0.0, 0
            if b < full:
                for x in range(b * B, b * B + B):
                    s += p[r, x] if q[r, x] <= 0 else 0.0
                    c += 1 if q[r, x] > 0 else 0
            else:
                for x in range(b * B, V):
                    s += p[r, x] if q[r, x] <= 0 else 0.0
                    c += 1 if q[r, x] > 0 else 0
            blocks[i, b] = s
            drafted_in[b] = c
        n = drafted_in.sum()
        if n > cap:
            return False, count, blocks, cols[:used], p_s[:used], q_s[:used]
        if used + n > size:
            size = max(2 * size, used + n)
            cols = np.concatenate((cols, np.empty(size - cols.shape[0], cols.dtype)))
            p_s = np.concatenate((p_s, np.empty(size - p_s.shape[0], p_s.dtype)))
            q_s = np.concatenate((q_s, np.empty(size - q_s.shape[0], q_s.dtype)))
        for b in range(full + 1):
            if drafted_in[b]:
                for x in range(b * B, min(b * B + B, V)):
                    if q[r, x] > 0:
                        cols[used], p_s[used], q_s[used] = x, p[r, x], q[r, x]
                        used += 1
        count[i] = n
    return True, count, blocks, cols[:used], p_s[:used], q_s[:used]


def _layout(row: torch.Tensor, count: torch.Tensor, M: int, entries) -> tuple[torch.Tensor, ...]:
    """Flat drafted entries (row-major: row ``row[e]``, each row's tokens ascending; ``count [R]`` per row) laid out
    ``[R, M]``: ``entries`` = (token ids, their p, their q), padded with :data:`PAD`, 0, 0."""
    slot = torch.arange(row.numel(), device=row.device) - (count.cumsum(0) - count)[row]
    return tuple(torch.full((count.shape[0], M), fill, dtype=x.dtype, device=x.device).index_put_((row, slot), x)
                 for x, fill in zip(entries, (PAD, 0, 0)))


@torch.compiler.disable
def _scan_host(p_rows: torch.Tensor, q_rows: torch.Tensor, src: torch.Tensor, cap: int):
    """The CPU scan: compiled passes over each row in place (:func:`_scan_rows`; torch needs a gather, a
    comparison, a ``nonzero`` and a masked sum — four passes and two row copies), then the flat drafted entries
    laid out ``[R, M]``."""
    ok, count, blocks, *flat = _scan_rows(p_rows.numpy(), q_rows.numpy(), src.numpy(), cap)
    if not ok:
        return None
    count = torch.from_numpy(count)
    row = torch.repeat_interleave(torch.arange(count.shape[0]), count)
    return (*_layout(row, count, int(count.max()), [torch.from_numpy(x) for x in flat]), torch.from_numpy(blocks))


def _scan_device(p_rows: torch.Tensor, q_rows: torch.Tensor, src: torch.Tensor, cap: int):
    """The accelerator's scan in torch: the rows' drafted entries by ``nonzero`` (row-major, so ascending)."""
    q = q_rows.index_select(0, src)
    drafted = q > 0
    count = drafted.sum(1)
    M = int(count.max())                                            # host read: the compact width
    if M > cap:
        return None
    row, col = drafted.nonzero(as_tuple=True)
    p = p_rows.index_select(0, src)
    undrafted = torch.nn.functional.pad(undrafted_weights(p, q), (0, SCAN_BLOCK - p.shape[1] % SCAN_BLOCK))
    blocks = undrafted.view(p.shape[0], -1, SCAN_BLOCK).sum(2, dtype=torch.float64)
    return (*_layout(row, count, M, (col, p[row, col], q[row, col])), blocks)


def scan(p_rows: torch.Tensor, q_rows: torch.Tensor, src: torch.Tensor) -> Support | None:
    """The drafted support of rows ``src [R]`` of ``p_rows``, ``q_rows`` ``[·, V]``, or None when some row drafts
    more than ``V/2`` tokens (then the level is cheaper on its whole rows).  On the CPU compiled passes
    (:func:`_scan_rows`), elsewhere torch (:func:`_scan_device`)."""
    cap = q_rows.shape[1] // 2
    scanner = _scan_host if q_rows.device.type == "cpu" else _scan_device
    out = scanner(p_rows, q_rows, src, cap)
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


def tokens(support: Support, columns: torch.Tensor, vocab: int) -> torch.Tensor:
    """Token ids ``[R]`` of sampled compact ``columns [R]``; the undrafted column (and padding) give ``vocab``,
    the marker of "a token drawn from ``p·1[q = 0]``" (:meth:`DraftedLevels.draw_undrafted`)."""
    M = support.cols.shape[1]
    tok = support.cols.gather(1, columns.clamp(max=M - 1)[:, None]).squeeze(1)
    return torch.where((columns < M) & (tok < vocab), tok, vocab)


class DraftedLevels:
    """The undrafted block masses of every level planned on its drafted support (:attr:`Support.blocks`), by flat
    slot ``tree·(N + 1) + slot`` (kept by :func:`gpu.engine.allocate` while sampling), so that a correction token
    drawn from an endpoint's undrafted column is drawn again from ``p·1[q = 0]`` reading one block of its rows."""

    def __init__(self, slots: int, device: torch.device):
        self.row = torch.zeros(slots, dtype=torch.long, device=device)       # the slot's row in its level
        self.level = torch.full((slots,), -1, dtype=torch.long, device=device)
        self.blocks: list[torch.Tensor] = []

    def add(self, at: torch.Tensor, support: Support) -> None:
        """Level ``len(blocks)``: flat slots ``at [R]`` with their undrafted block masses."""
        self.row[at] = torch.arange(at.shape[0], device=at.device)
        self.level[at] = len(self.blocks)
        self.blocks.append(support.blocks)

    def draw_undrafted(self, p_rows: torch.Tensor, q_rows: torch.Tensor, at: torch.Tensor, src: torch.Tensor,
                       generator: torch.Generator | None = None) -> torch.Tensor:
        """Tokens ``[n]`` from ``p·1[q = 0]`` of rows ``src [n]`` of ``p_rows``, ``q_rows`` (flat slots ``at [n]``):
        the block by the scan's undrafted masses, the token within it from its p with drafted tokens at 0
        (:func:`gpu.probs.sample_blocks`) — O(n·(V/64 + 64)), no row read whole."""
        row, level = self.row[at], self.level[at]
        mass = torch.zeros(at.shape[0], self.blocks[0].shape[1], dtype=torch.float64, device=at.device)
        for i, blocks in enumerate(self.blocks):
            mass = torch.where((level == i)[:, None], blocks.index_select(0, row.clamp(max=blocks.shape[0] - 1)), mass)

        def read(cols):
            r = src[:, None, None]
            return undrafted_weights(p_rows[r, cols], q_rows[r, cols])
        return sample_blocks(mass, SCAN_BLOCK, read, p_rows.shape[1], generator)


def expand(residual_s: torch.Tensor, p_rows: torch.Tensor, q_rows: torch.Tensor, src: torch.Tensor,
           support: Support) -> torch.Tensor:
    """A compact residual ``[R, M + 1]`` back on all V tokens: drafted columns in place, the undrafted column
    spread as ``r·p(x)/p_rest`` (kept only for exactness tests: :func:`gpu.engine.allocate` ``keep_residuals``)."""
    p, q = p_rows.index_select(0, src), q_rows.index_select(0, src)
    rest = support.rest.to(residual_s.dtype)
    factor = torch.where(rest > 0, residual_s[:, -1] / torch.where(rest > 0, rest, 1), 0)
    full = undrafted_weights(p, q).to(residual_s.dtype) * factor[:, None]
    drafted = support.drafted
    return full.scatter_add_(1, torch.where(drafted, support.cols, 0), torch.where(drafted, residual_s[:, :-1], 0))
