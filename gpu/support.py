"""A level's rows on their drafted support: ``[R, M + 1]`` columns instead of ``[R, V]`` (theory.md §6.3).

With i.i.d. or without-replacement children, every level rule of :data:`gpu.verify.METHODS` reads a token the
node's draft cannot propose (``q(x) = 0``) only through the total target mass of such tokens:

* it is never a child, and every update of the rejection rules (RRS, RRSw, NSS, TV, K-SEQ) subtracts a draft
  mass that is 0 there, so each such token keeps ``residual(x) = c·p(x)`` with one factor ``c`` per node;
* UniVer's and Global Resolution's plans give it ``a(x) = 0`` and it comes last in every ratio order (no
  minimising prefix of α*(ρ) needs it: the prefix of all drafted tokens costs less), so ``residual(x) = ρp(x)``.

So a level is planned on each row's drafted tokens, in token-id order (ties between tokens break as on the whole
row), padded to the widest row's ``M`` with ``p = q = 0``, plus one *undrafted* column holding
``p_rest = Σ_{q(x)=0} p(x)`` with ``q = 0``.  A residual's undrafted column ``r`` stands for
``r·p(x)/p_rest`` on every undrafted token: a correction token drawn from that column is drawn again from
``p·1[q = 0]``, once per tree and only when the accepted path ends on it (:func:`undrafted_weights`).

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


@dataclass(frozen=True)
class Support:
    """Drafted tokens of R rows: ``cols [R, M]`` long, each row's tokens with ``q > 0`` ascending, then ``V``;
    ``rest [R]`` float64, ``Σ_{q(x)=0} p(x)``."""

    cols: torch.Tensor
    rest: torch.Tensor

    @property
    def drafted(self) -> torch.Tensor:
        """``[R, M]`` bool: column i of the row is a drafted token (not padding)."""
        return self.cols < torch.iinfo(self.cols.dtype).max


@numba.njit(cache=True, nogil=True)
def _scan_rows(p, q, src, cols, count, rest):  # pragma: no cover - compiled
    """Row ``src[i]`` of ``p``, ``q`` in one pass: its drafted tokens into ``cols[i]``, their number into
    ``count[i]``, ``Σ_{q=0} p`` into ``rest[i]`` (blocks of 256 terms, so the sum's error stays ~(256 + V/256)·ε).
    False as soon as a row drafts more than ``cols.shape[1]`` tokens."""
    V, cap = q.shape[1], cols.shape[1]
    for i in range(src.shape[0]):
        r, n, total, part = src[i], 0, 0.0, 0.0
        for x in range(V):
            if q[r, x] > 0:
                if n == cap:
                    return False
                cols[i, n] = x
                n += 1
            else:
                part += p[r, x]
            if x & 255 == 255:
                total += part
                part = 0.0
        count[i] = n
        rest[i] = total + part
    return True


@torch.compiler.disable
def _scan_host(p_rows: torch.Tensor, q_rows: torch.Tensor, src: torch.Tensor, cap: int):
    """The CPU scan: one compiled pass over each row in place (torch needs a gather, a comparison, a ``nonzero``
    and a masked sum — four passes and two row copies).  ``cols`` is allocated ``[R, cap]`` but only its first
    ``M`` columns are ever written."""
    R = src.shape[0]
    cols, count, rest = np.empty((R, cap), np.int64), np.empty(R, np.int64), np.empty(R, np.float64)
    if not _scan_rows(p_rows.numpy(), q_rows.numpy(), src.numpy(), cols, count, rest):
        return None
    M = int(count.max())
    out = np.full((R, M), np.iinfo(np.int64).max, np.int64)
    filled = np.arange(M) < count[:, None]
    out[filled] = cols[:, :M][filled]
    return torch.from_numpy(out), torch.from_numpy(rest)


def _scan_device(p_rows: torch.Tensor, q_rows: torch.Tensor, src: torch.Tensor, cap: int):
    """The accelerator's scan in torch: the rows' drafted entries by ``nonzero`` (row-major, so ascending)."""
    q = q_rows.index_select(0, src)
    drafted = q > 0
    count = drafted.sum(1)
    M = int(count.max())                                            # host read: the compact width
    if M > cap:
        return None
    row, col = drafted.nonzero(as_tuple=True)
    slot = torch.arange(row.numel(), device=q.device) - (count.cumsum(0) - count)[row]
    cols = torch.full((q.shape[0], M), torch.iinfo(torch.long).max, dtype=torch.long, device=q.device)
    rest = torch.where(drafted, 0, p_rows.index_select(0, src)).sum(1, dtype=torch.float64)
    return cols.index_put_((row, slot), col), rest


def scan(p_rows: torch.Tensor, q_rows: torch.Tensor, src: torch.Tensor) -> Support | None:
    """The drafted support of rows ``src [R]`` of ``p_rows``, ``q_rows`` ``[·, V]``, or None when some row drafts
    more than ``V/2`` tokens (then the level is cheaper on its whole rows).  On the CPU one compiled pass
    (:func:`_scan_rows`), elsewhere torch (:func:`_scan_device`)."""
    cap = q_rows.shape[1] // 2
    scanner = _scan_host if q_rows.device.type == "cpu" else _scan_device
    out = scanner(p_rows, q_rows, src, cap)
    return None if out is None else Support(*out)


def compact(p_rows: torch.Tensor, q_rows: torch.Tensor, src: torch.Tensor, support: Support,
            children: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(p_s, q_s [R, M + 1], children_s [R, K])``: the rows on their drafted columns plus the undrafted one
    (``p_rest`` in the rows' dtype, ``q = 0``), and each child's column (absent children: column 0)."""
    drafted = support.drafted
    at = torch.where(drafted, support.cols, 0)
    rows = src[:, None]
    p_s = torch.cat([torch.where(drafted, p_rows[rows, at], 0), support.rest.to(p_rows.dtype)[:, None]], 1)
    q_s = torch.cat([torch.where(drafted, q_rows[rows, at], 0), torch.zeros_like(p_s[:, :1])], 1)
    children_s = torch.searchsorted(support.cols, children.contiguous()).clamp(max=support.cols.shape[1] - 1)
    return p_s, q_s, children_s


def tokens(support: Support, columns: torch.Tensor, vocab: int) -> torch.Tensor:
    """Token ids ``[R]`` of sampled compact ``columns [R]``; the undrafted column (and padding) give ``vocab``,
    the marker of "a token drawn from ``p·1[q = 0]``" (:func:`undrafted_weights`)."""
    M = support.cols.shape[1]
    tok = support.cols.gather(1, columns.clamp(max=M - 1)[:, None]).squeeze(1)
    return torch.where((columns < M) & (tok < vocab), tok, vocab)


def undrafted_weights(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``p·1[q = 0]`` per row: the law of a token drawn from a residual's undrafted column."""
    return torch.where(q > 0, 0, p)


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
