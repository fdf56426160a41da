"""Level rules: the baseline verifiers of :mod:`univer_theory.verifiers` on ``R`` nodes at once (theory.md §3).

Each rule loops over the sibling index ``j`` (children in drafting order) and updates per-node state rows
``[R, V]``, only on the leading rows that can have a j-th child (``LevelContext.active``); a node without a j-th
child keeps its state.  States are kept unnormalised with a mass per row (:class:`_Rows`) and updated in
place or between two buffers, so a sibling step costs a few passes over its rows and allocates nothing of size
``[R, V]`` (every rule here decides float32 rows on a float64 copy of them: :func:`_decided_in_float64`).
Shapes: ``ctx.target``/``ctx.draft`` ``[R, V]``, ``ctx.children``/``ctx.child_mask`` ``[R, K]``, ``ctx.rho``
``[R]``.
"""
from __future__ import annotations

import dataclasses
import functools

import numba
import torch

from univer_theory.plans.base import residual_rows
from univer_theory.verifiers import kseq_acceptance_mass, kseq_rho_star, normalise_rows

from .engine import LevelContext, LevelDecision


def _at(rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``rows[r, tokens[r]]`` → ``[R]``."""
    return rows.gather(1, tokens[:, None]).squeeze(1)


#: Lifts a row whose mass is subnormal before its power of two ``2^−e`` is formed (:meth:`_Rows.set_mass`,
#: :meth:`_Rows.step_scales`): 2^64 makes the smallest subnormal normal in float32 and float64 and keeps the largest
#: one far from overflow.
SUBNORMAL_LIFT = 2.0 ** 64


def _ratio_min1(num: torch.Tensor, den: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``min(1, num/den)`` where ``mask`` (den > 0 there: validated), 0 elsewhere."""
    return torch.where(mask, (num / torch.where(mask, den, 1)).clamp(max=1), 0)


def _copy_rows(dst: torch.Tensor, src: torch.Tensor, rows: torch.Tensor,
               src_rows: torch.Tensor | None = None) -> None:
    """``dst[i] = src[i]`` (``src[src_rows[i]]`` where ``src_rows`` is given) for the rows where ``rows [n]``
    holds, in place.  Such rows are rare (a masked child or a vanished residual mass), so on the CPU, where a host
    check is free, only they are copied; elsewhere a sync-free ``where`` pass."""
    if dst.device.type == "cpu":
        if bool(rows.any()):
            idx = rows.nonzero().squeeze(1)
            dst[idx] = src[idx if src_rows is None else src_rows[idx]]
    else:
        n = rows.shape[0]
        torch.where(rows[:, None], src[:n] if src_rows is None else src.index_select(0, src_rows[:n]), dst, out=dst)


#: Entries per piece of a sibling step's row sum on the CPU (:func:`_sibling_step_host`): summed in lanes, the pieces'
#: sums then in order, so a row of V entries carries ≲ (c/8 + V/c)·ε of relative error — 2.5e-14 at V = 49 152.
SIBLING_CHUNK = 256


@numba.njit(cache=True, inline="always", fastmath={"reassoc"})
def _sibling_piece(xr, yr, o, ar, br, lo, hi):  # pragma: no cover - compiled
    """``o[v] = [ar·xr[v] − br·yr[v]]_+`` for ``lo ≤ v < hi``; returns their sum (over SIMD lanes)."""
    part = 0.0
    for v in range(lo, hi):
        d = max(ar * xr[v] - br * yr[v], 0.0)
        o[v] = d
        part += d
    return part


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _sibling_step_host(x, x_rows, a, y, y_rows, b, out, mass):  # pragma: no cover - compiled
    """``out[r] = [a_r·x[x_rows[r]] − b_r·y[y_rows[r]]]_+`` and ``mass[r] = Σ out[r]`` for the rows of ``out``, in
    one pass over each row read (the row sum in :data:`SIBLING_CHUNK`-entry pieces, summed in order)."""
    V, c = out.shape[1], SIBLING_CHUNK
    full = V // c * c
    for r in range(out.shape[0]):
        xr, yr, o, ar, br = x[x_rows[r]], y[y_rows[r]], out[r], a[r], b[r]
        total = 0.0
        for lo in range(0, full, c):                # pieces of a fixed length: vectorised
            total += _sibling_piece(xr, yr, o, ar, br, lo, lo + c)
        mass[r] = total + _sibling_piece(xr, yr, o, ar, br, full, V)


def sibling_step(x: torch.Tensor, x_rows: torch.Tensor | None, a: torch.Tensor, y: torch.Tensor,
                 y_rows: torch.Tensor | None, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """A sibling step's ``out = [a·X̃ − b·Ỹ]_+`` on ``n = len(a)`` rows and its row masses ``Σ out`` ``[n]``:
    ``X̃ = x[x_rows]`` (``x[:n]`` where ``x_rows`` is None), ``Ỹ`` likewise.  On the CPU (float64, as the rules
    decide) one compiled pass per row, which reads the rows where they lie (:func:`_sibling_host`); elsewhere
    torch's passes on the rows gathered first (:func:`_sibling_device`) — torch has no fused gather, subtract,
    clamp and sum, and on the CPU its four passes and the gathers' copies took ~3/4 of an RRS walk on whole rows."""
    host = out.device.type == "cpu" and out.dtype == x.dtype == y.dtype == torch.float64
    return (_sibling_host if host else _sibling_device)(x, x_rows, a, y, y_rows, b, out)


@torch.compiler.disable
def _sibling_host(x, x_rows, a, y, y_rows, b, out):
    """:func:`sibling_step` by :func:`_sibling_step_host` (left out of ``torch.compile``'s graphs)."""
    n = a.shape[0]
    mass = torch.empty(n, dtype=out.dtype)
    rows = torch.arange(n)
    _sibling_step_host(x.numpy(), (rows if x_rows is None else x_rows[:n]).numpy(), a.contiguous().numpy(),
                       y.numpy(), (rows if y_rows is None else y_rows[:n]).numpy(), b.contiguous().numpy(),
                       out.numpy(), mass.numpy())
    return mass


def _sibling_device(x, x_rows, a, y, y_rows, b, out):
    """:func:`sibling_step` in torch's ops, on any device: two scales, a subtraction, a clamp and a row sum — each
    product rounded once, as the compiled pass (a fused multiply-add, ``addcmul``, left ``a·X̃``'s rounding error
    where the two products are equal, and the rules' split masses rely on that 0: :meth:`_Rows.step_scales`).
    ``b·Ỹ`` is formed in the gathered copy of ``Ỹ``, or in a temporary where the rows are read in place."""
    n = a.shape[0]
    xs = x[:n] if x_rows is None else x.index_select(0, x_rows[:n])
    ys = y[:n] * b[:, None] if y_rows is None else y.index_select(0, y_rows[:n]).mul_(b[:, None])
    torch.mul(xs, a[:, None], out=out)
    out.sub_(ys).clamp_(min=0)
    return out.sum(-1)


def _bound(ctx: LevelContext, j: int) -> int:
    """Rows that may have a j-th child: the leading ``ctx.active[j]`` (all ``R`` without the engine's bound)."""
    return ctx.children.shape[0] if ctx.active is None else ctx.active[j]


def _mantissa_and_power(mass: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(m̂, 2^−e)`` of masses ``m = m̂·2^e``, ``m̂ ∈ [1/2, 1)``: ``m̂/m`` is exactly ``2^−e``, a mass being at least
    the smallest normal float (:meth:`_Rows.set_mass`)."""
    mant = torch.frexp(mass).mantissa
    return mant, mant / mass


class _Rows:
    """Per-row state ``X = X̃/m`` of a rule's sibling loop (``X̃ [R, V]`` unnormalised, mass ``m [R]``, split as
    ``m̂·2^e`` for :meth:`subtract`'s callers: :meth:`step_scales`), so a renormalisation costs one row sum and a
    scalar per row instead of passes over ``[R, V]``.

    Row i of ``X̃`` is ``cur[sel[i]]`` (``cur[i]`` where ``sel`` is None): rows read where they lie — the context's
    rows by row number (:func:`_rejection_walk`), or the rows :meth:`keep` kept — until a step writes them.  Step j
    touches only the leading ``n`` rows (see :func:`_bound`).  Two update forms:

    * :meth:`remove` (``X ← norm(X·1[≠y])``) zeroes one entry in place — only for state that starts from a copy
      of the context's rows (``own=True``, or rows the caller already copied; selected rows are copied first);
    * :meth:`subtract` (``X̃ ← [a·X̃ − b·Ỹ]_+``, :func:`sibling_step`) writes into the other of two buffers
      allocated once (no temporaries), so the previous rows stay available for :meth:`restore`; the context's
      rows are only read.
    """

    def __init__(self, rows: torch.Tensor, own: bool = False, sel: torch.Tensor | None = None):
        self.orig = rows                                    # X̃ before any step, where sel is None
        self.cur = rows.clone() if own else rows            # X̃: current for the leading rows of the last step
        self.sel = sel
        self.prev, self.prev_sel = rows, sel
        self.mass = torch.ones(rows.shape[0] if sel is None else sel.shape[0], dtype=rows.dtype, device=rows.device)
        self.bufs: list = []
        self.writes: list = []                              # (n, buffer) of every subtract step

    @property
    def count(self) -> int:
        """Rows held (one mass each)."""
        return self.mass.shape[0]

    def step_scales(self, other: "_Rows", n: int, r: torch.Tensor | None = None):
        """``(a, b, m̂_X·m̂_Y)`` ``[n]`` of a sibling step ``[r·X − Y]_+`` on the leading rows (``Y`` of ``other``;
        r = 1 where None), the masses written ``m = m̂·2^e``, ``m̂ ∈ [1/2, 1)`` (``frexp``), so ``X = X̃·2^−e/m̂`` (a power of
        two rescales without rounding, subnormal entries aside): :meth:`subtract` with ``a = r·m̂_Y·2^−e_X`` and
        ``b = m̂_X·2^−e_Y`` forms ``m̂_X·m̂_Y·[r·X − Y]_+``.  Each side is a product rounded once (``r·m̂_Y`` once more
        where r < 1), as the exact core's ``X̃/m_X`` and ``Ỹ/m_Y`` are a quotient rounded once, so where both are 1
        (a row whose mass is one entry) the step's 0 is exact.  The reciprocals ``1/m`` of before rounded twice, and
        the 1.1e-16 they left there moved a per-tree E[τ | T] by up to 0.85 (docs/deviations.md item 141).  A compiler
        that fuses the step's multiply and subtract (an FMA) would lose that 0 again: the CPU's compiled pass does not
        (numba does not contract), torch's eager ops do not (:func:`_sibling_device`); inductor's kernels on an
        accelerator were not checked (none was lent)."""
        (mx, sx), (my, sy) = (_mantissa_and_power(rows.mass[:n]) for rows in (self, other))
        return (my * sx if r is None else r * my * sx), mx * sy, mx * my

    def at(self, tokens: torch.Tensor) -> torch.Tensor:
        """``X(y)`` of the leading ``len(tokens)`` rows: ``X̃(y)/mass``, the exact core's one division (``X̃(y)·c``
        rounded twice: where a row's mass is one entry, ``X(y)`` was 1 − 1 ulp, and TV's ``r ← R/(R + 1 − r)`` turned
        that ulp into a prefix probability 0.4% low where the R after the next child is ~1e-14 — docs/deviations.md
        item 138)."""
        n = tokens.shape[0]
        x = _at(self.cur[:n], tokens) if self.sel is None else self.cur[self.sel[:n], tokens]
        return x / self.mass[:n]

    def _own(self) -> None:
        """Selected rows copied, so that they may be written in place."""
        if self.sel is not None:
            self.orig = self.cur = self.cur.index_select(0, self.sel)
            self.sel = None

    def remove(self, tokens: torch.Tensor, mask: torch.Tensor) -> None:
        """``X ← norm(X·1[≠y])`` on the leading rows where ``mask`` (an all-zero result stays zero)."""
        self._own()
        n = tokens.shape[0]
        x = self.cur[:n]
        x.scatter_(1, tokens[:, None], torch.where(mask, 0, _at(x, tokens))[:, None])
        self.set_mass(x.sum(-1), mask)

    def set_mass(self, mass: torch.Tensor, rows: torch.Tensor) -> None:
        """``X ← X̃/mass`` on the leading ``n = len(mass)`` rows where ``rows`` holds, ``mass = ΣX̃`` of those rows
        as the last step wrote them (as :func:`univer_theory.verifiers.normalise`: an all-zero row stays zero, its mass
        held as the smallest normal float).  A subnormal mass (e.g. a confident draft row once its top token is
        removed: the rest holds ~1e-310) would overflow :meth:`step_scales`' ``2^−e``:
        those rows of X̃ are multiplied by :data:`SUBNORMAL_LIFT` first — exact, every entry of theirs being
        subnormal — and their mass with them.  On the CPU only such rows are touched (a free host check),
        elsewhere a sync-free pass over the leading rows."""
        n = mass.shape[0]
        tiny = torch.finfo(mass.dtype).tiny
        low = rows & (mass > 0) & (mass < tiny)
        if mass.device.type != "cpu" or bool(low.any()):
            lift = torch.where(low, SUBNORMAL_LIFT, 1.0).to(mass.dtype)
            self.cur[:n].mul_(lift[:, None])                # rows a step wrote: never selected
            mass = mass * lift
        self.mass[:n] = torch.where(rows, mass.clamp(min=tiny), self.mass[:n])

    def subtract(self, a: torch.Tensor, b: torch.Tensor, other: "_Rows") -> torch.Tensor:
        """``X̃ ← [a·X̃ − b·Ỹ]_+`` on the leading ``n = len(a)`` rows (``Ỹ`` of ``other``); returns the row
        masses ``Σ[·]_+``.  ``a = 1, b = 0`` copies a row exactly.  The caller sets the new masses (and restores rows
        that keep their ``X``)."""
        n = a.shape[0]
        if n < self.count:
            self._own()                                     # the rows past n stay as they are
        i = 1 if self.bufs and self.cur is self.bufs[0] else 0
        if len(self.bufs) <= i:
            self.bufs.append(self.cur.new_empty(self.count, self.cur.shape[1]))
        mass = sibling_step(self.cur, self.sel, a, other.cur, other.sel, b, self.bufs[i][:n])
        self.prev, self.prev_sel, self.cur, self.sel = self.cur, self.sel, self.bufs[i], None
        self.writes.append((n, i))
        return mass

    def keep(self, idx: torch.Tensor) -> None:
        """Only the rows ``idx`` stay, in that order (selected, not copied; the masses compacted)."""
        self.sel = idx if self.sel is None else self.sel[idx]
        self.mass = self.mass[idx]
        self.writes = []

    def restore(self, rows: torch.Tensor) -> None:
        """Undo the last :meth:`subtract` on the leading rows where ``rows [n]`` holds."""
        _copy_rows(self.cur[:rows.shape[0]], self.prev, rows, self.prev_sel)

    def rows(self) -> torch.Tensor:
        """``X̃ [R, V]``, each row from the last step that wrote it (a fresh or owned tensor unless no step
        did)."""
        if not self.writes:
            self._own()
            return self.cur
        last = self.bufs[self.writes[-1][1]]
        out = last[:self.count]
        first = self.writes[0][0]
        if first < self.count:
            out[first:].copy_(self.orig[first:self.count])
        for (n, i), lo in zip(self.writes, [n for n, _ in self.writes[1:]] + [0]):
            if lo < n and self.bufs[i] is not last:         # rows [lo, n) were last written by this step
                out[lo:n].copy_(self.bufs[i][lo:n])
        return out


def _decided_in_float64(rule):
    """``rule`` deciding float32 rows on their float64 copies put back onto the simplex (:func:`normalise_rows`, as
    UniVer's planning rows; ``ctx.rows``: those rows of the input), its decision in the rows' dtype but for a walk's
    ``enter`` (``ctx.coins`` given), which the rule compared its coins with in float64; float64 rows as given.  A
    float32 row sums to 1 within a few ulps only: on its own floats RRSw's ``[P − Q]_+`` at p ≈ q moved by 1e-3
    relative and E[τ | T] by 1.2e-5 from the exact core on the same values, where float32 rows are held to 1e-6
    (docs/deviations.md item 69)."""
    @functools.wraps(rule)
    def decide(ctx: LevelContext, *args, **kwargs) -> LevelDecision:
        if ctx.target.dtype == torch.float64:
            return rule(ctx, *args, **kwargs)
        rows = (lambda x: x) if ctx.rows is None else (lambda x: x.index_select(0, ctx.rows))
        wide = dataclasses.replace(ctx, target=normalise_rows(rows(ctx.target).double()),
                                   draft=normalise_rows(rows(ctx.draft).double()), rho=ctx.rho.double(), rows=None)
        dec = rule(wide, *args, **kwargs)
        narrow = lambda x: x.to(ctx.target.dtype)                              # noqa: E731
        return LevelDecision(dec.enter if ctx.coins is not None else narrow(dec.enter), narrow(dec.scale),
                             narrow(dec.stop), narrow(dec.residual), dec.residual_at)
    return decide


@_decided_in_float64
def nss_rule(ctx: LevelContext) -> LevelDecision:
    """Target-only (§3.1): child j entered w.p. ``P(y_j)``, then ``P ← norm(P·1[≠y_j])``; all missed:
    ``Y ~ P``."""
    R, K = ctx.children.shape
    P = _Rows(ctx.target, own=True)
    enter = torch.zeros(R, K, dtype=ctx.target.dtype, device=ctx.target.device)
    for j in range(K):
        n = _bound(ctx, j)
        y, m = ctx.children[:n, j], ctx.child_mask[:n, j]
        enter[:n, j] = torch.where(m, P.at(y).clamp(max=1), 0)   # a valid float64 row may hold 1 + 1e-9
        P.remove(y, m)
    return LevelDecision(enter, torch.ones_like(enter), torch.ones_like(ctx.rho), P.rows())


def _rejection_step(P: _Rows, Q: _Rows, y: torch.Tensor, m: torch.Tensor, without_replacement: bool) -> torch.Tensor:
    """RRS(w)'s sibling step on the leading ``n = len(y)`` rows, where child ``y`` was rejected (``m``; elsewhere P
    kept — a missing child): ``P ← norm([P − Q]_+)`` (a zero row stays zero), and without replacement
    ``Q ← norm(Q·1[≠y])``.  Returns ``[n]`` bool: where all of ``[P − Q]_+`` rounded away."""
    n = y.shape[0]
    a, b, _ = P.step_scales(Q, n)
    mass = P.subtract(a, b, Q)                      # m̂_P·m̂_Q·[P − Q]_+: its own mass is set below
    P.restore(~m)
    P.set_mass(mass, m)
    if without_replacement:
        Q.remove(y, m)
    return m & (mass == 0)


@_decided_in_float64
def _recursive_rejection(ctx: LevelContext, without_replacement: bool) -> LevelDecision:
    if ctx.coins is not None:
        return _rejection_walk(ctx, without_replacement)
    R, K = ctx.children.shape
    P, Q = _Rows(ctx.target), _Rows(ctx.draft, own=without_replacement)
    enter = torch.zeros(R, K, dtype=ctx.target.dtype, device=ctx.target.device)
    vanished = torch.zeros(R, dtype=torch.bool, device=ctx.target.device)
    for j in range(K):
        n = _bound(ctx, j)
        y, m = ctx.children[:n, j], ctx.child_mask[:n, j]
        enter[:n, j] = _ratio_min1(P.at(y), Q.at(y), m)
        vanished[:n] |= _rejection_step(P, Q, y, m, without_replacement)
    residual = P.rows()
    if P.writes:                    # all of [P − Q]_+ rounded away: Y ~ p, as the exact twin (residual_rows' fallback)
        _copy_rows(residual, ctx.target, vanished)
    return LevelDecision(enter, torch.ones_like(enter), torch.ones_like(ctx.rho), residual)


def _rejection_walk(ctx: LevelContext, without_replacement: bool) -> LevelDecision:
    """:func:`_recursive_rejection` on a walk's coins (``ctx.coins``, :func:`gpu.engine.walk`): child j's
    ``enter`` only while every earlier child was rejected (0 after the first entered one, whose coin the walk
    reads first), so a node reads its rows only where a child is rejected — the first child's
    ``min(1, p(y)/q(y))`` is two entries of its input rows (by ``ctx.rows`` where given); the residual of the nodes
    that enter no child alone (``residual_at``).  The same floats as :func:`_recursive_rejection` at every step it
    takes (each a row's own sibling step, on the rows still rejecting, read where they lie: :meth:`_Rows.keep`) on
    one CPU thread — and on several for RRS, whose CPU step sums each row alone (:func:`sibling_step`); RRSw's
    renormalised Q is torch's row sum, which on several threads sums a row of over 32 768 entries in pieces, one a
    thread, where a step holds that row alone, so a residual's floats there move by an ulp of its mass (5.6e-17 at
    V = 49 152, 2 threads)."""
    R, K = ctx.children.shape
    dev = ctx.target.device
    src = ctx.rows if ctx.rows is not None else torch.arange(R, device=dev)
    enter = torch.zeros(R, K, dtype=ctx.target.dtype, device=dev)
    live = torch.arange(R, device=dev)              # the nodes still trying children
    P = Q = None                                     # their states once a child was rejected (None: the input rows)
    vanished = torch.zeros(R, dtype=torch.bool, device=dev)     # of the live nodes
    ended = []                                       # (nodes, residual rows) of the nodes whose children all failed

    def end(done: torch.Tensor) -> None:
        done = done.nonzero().squeeze(1)
        nodes = live[done]
        if P is None:
            ended.append((nodes, ctx.target.index_select(0, src[nodes])))
        else:
            rows = P.rows().index_select(0, done)
            lost = vanished[done]                    # all of [P − Q]_+ rounded away: Y ~ p (as the full rule)
            if bool(lost.any()):                     # host read
                rows[lost] = ctx.target.index_select(0, src[nodes[lost]])
            ended.append((nodes, rows))

    for j in range(K):
        left = ctx.child_mask[live, j:].any(1)
        if not bool(left.all()):                     # host read: nodes none of whose children was entered end here
            end(~left)
        y, m = ctx.children[live, j], ctx.child_mask[live, j]
        if P is None:
            p_y, q_y = ctx.target[src[live], y], ctx.draft[src[live], y]
        else:
            p_y, q_y = P.at(y), Q.at(y)
        enter[live, j] = e = _ratio_min1(p_y, q_y, m)
        stay = (left & ~(ctx.coins[live, j] < e)).nonzero().squeeze(1)       # host read
        live, y, m = live[stay], y[stay], m[stay]
        if not live.shape[0]:
            break
        if P is None:                               # rows read where they lie (RRSw's Q copied at its first removal)
            P, Q = (_Rows(x, sel=src[live]) for x in (ctx.target, ctx.draft))
        else:
            P.keep(stay)
            Q.keep(stay)
        vanished = vanished[stay] | _rejection_step(P, Q, y, m, without_replacement)
    else:
        if live.shape[0]:
            end(torch.ones_like(live, dtype=torch.bool))
    if not ended:
        ended.append((live, ctx.target.new_zeros(0, ctx.target.shape[1])))
    nodes, rows = (torch.cat(x) for x in zip(*ended))
    nodes, order = nodes.sort()
    return LevelDecision(enter, torch.ones_like(enter), torch.ones(R, dtype=enter.dtype, device=dev),
                         rows.index_select(0, order), nodes)


def rrs_rule(ctx: LevelContext) -> LevelDecision:
    """RRS (§3.3): accept ``y`` w.p. ``min(1, P(y)/Q(y))``; on rejection ``P ← norm([P − Q]_+)``; ``Y ~ P``.
    A duplicate i.i.d. child is tried again (always rejected, residual still updated)."""
    return _recursive_rejection(ctx, without_replacement=False)


def rrsw_rule(ctx: LevelContext) -> LevelDecision:
    """RRSw (§3.4): RRS plus ``Q ← norm(Q·1[≠y])`` after each rejection."""
    return _recursive_rejection(ctx, without_replacement=True)


@_decided_in_float64
def kseq_rule(ctx: LevelContext) -> LevelDecision:
    """SpecTr K-SEQ (§3.5): accept each child w.p. ``min(1, p(y)/(ρ* q(y)))``; all rejected:
    ``Y ~ norm([p − m]_+)`` (``p`` where round-off cancels it), ``m = min(ρ* q, p)·(1 − (1−β)^k)/(ρ* β)`` the
    accepted mass (float64 rows, :func:`_decided_in_float64`; ``ρ*`` and ``m`` by the exact core's
    :func:`~univer_theory.verifiers.kseq_rho_star` and :func:`~univer_theory.verifiers.kseq_acceptance_mass` on the
    torch rows)."""
    k = ctx.child_mask.sum(1)
    p, q = ctx.target, ctx.draft
    if ctx.children.shape[1] == 1:   # k = 1 everywhere: f(1) = 0, so ρ* = 1 (token-level SpS), no search
        rho = torch.ones_like(k, dtype=torch.float64)
    else:
        rho = kseq_rho_star(p, q, k, max_k=ctx.children.shape[1], validate=False)
    residual = residual_rows(p, kseq_acceptance_mass(p, q, k, rho, validate=False), torch.ones_like(rho))
    y, m = ctx.children, ctx.child_mask
    enter = _ratio_min1(p.gather(1, y), rho[:, None] * q.gather(1, y), m)
    return LevelDecision(enter, torch.ones_like(enter), torch.ones_like(ctx.rho), residual)


@_decided_in_float64
def tv_rule(ctx: LevelContext, parent_update=None) -> LevelDecision:
    """Traversal Verification at each node (§3.7), iid or wor children.

    ``s_j = min(1, r·P(y_j)/Q(y_j))``; after child j: ``D = [rP − Q]_+``, ``R = ΣD``, ``P ← D/R``,
    ``r ← R/(R + (1 − r))`` (``R = 0 → r ← 0``, P kept; written so that ``r = 1`` stays exactly 1 at the root),
    and for wor ``Q ← norm(Q·1[≠y_j])``.  The node succeeds w.p. the final ``r`` with ``Y ~ P``.
    ``parent_update(R, r, Q(y))`` replaces the ``r`` update; it exists only for the bug zoo (§3.9 (d)).
    """
    K = ctx.children.shape[1]
    r = ctx.rho.clone()
    P, Q = _Rows(ctx.target), _Rows(ctx.draft, own=ctx.process == "wor")
    scale = torch.zeros(ctx.children.shape, dtype=ctx.target.dtype, device=ctx.target.device)
    for j in range(K):
        n = _bound(ctx, j)
        y, m, r_j = ctx.children[:n, j], ctx.child_mask[:n, j], r[:n]
        q_y = Q.at(y)
        scale[:n, j] = _ratio_min1(r_j * P.at(y), q_y, m)
        # D = [rP − Q]_+, R = ΣD.  A row with r = 0 has D = 0 (R = 0: r stays 0, P kept): it copies P instead.
        live = r_j > 0
        a, b, both = P.step_scales(Q, n, r_j)
        mass = P.subtract(torch.where(live, a, 1), torch.where(live, b, 0), Q)       # m̂_P·m̂_Q·D: R = mass/(m̂_P·m̂_Q)
        R = torch.where(live, mass / both, 0)
        if parent_update is None:
            r_new = torch.where(R > 0, R / (R + (1 - r_j)), 0)
        else:
            r_new = parent_update(R, r_j, q_y)
        moved = m & (R > 0)
        P.restore(~moved & live)
        P.set_mass(mass, moved)
        if ctx.process == "wor":
            Q.remove(y, m)
        r[:n] = torch.where(m, r_new, r_j)
    return LevelDecision(torch.ones_like(scale), scale, r, P.rows())
