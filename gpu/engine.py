"""The batched node-rule engine: :mod:`univer_theory.engine` vectorised over trees (theory.md §3.7, §6.1).

A *level rule* is the torch twin of a theory node rule: it decides ``R`` nodes at once (all internal nodes of
one depth, across the batch) from a :class:`LevelContext` and returns a :class:`LevelDecision`.

* **Pass 1 (top-down, one step per depth):** the rule gives every internal node its children's enter
  probabilities ``enter[j]`` and scalings ``s_j`` (the children's ``ρ``), its stop probability ``f`` and its
  residual.  A drafted leaf has ``f = ρ`` and residual ``p`` (bonus token); the root has ``f = 1`` (it never
  fails: once its children failed the traversal ends there).  When sampling, each internal
  node draws its candidate correction token ``Y_u ~ residual`` here, so no ``[B, N, V]`` residual is kept (on a
  level planned on its drafted support a candidate from the undrafted column is drawn from ``p·1[q = 0]`` after
  pass 2, only for the trees whose path ends there).
* **Pass 2 (post-order):** with independent coins ``E_c ~ Bern(enter[c])`` and ``F_u ~ Bern(f_u)`` drawn for
  every node at once, node u succeeds iff some child c (in drafting order) has ``E_c`` and succeeds, or else
  ``F_u``; the first such child is taken.  This is exactly the sequential sampler of the theory engine (coins
  it never looks at are independent of the ones it uses); the fixed point is reached after ``D + 1`` sweeps.
  The analytic ``E[τ | T]`` uses the same sweeps on the pair ``(σ, e)`` (success probability, expected
  accepted tokens below).
* **Walk** (:func:`walk`: sampling with a rule under which every reached node succeeds, ``f = 1`` and scalings 1 —
  ``gpu.verify.WALK``): pass 2 then reads the coins of the path's nodes alone, so a sample plans only the nodes
  on its path, depth by depth, one row per tree (the same law, at most ``τ + 1`` plans a tree instead of every
  internal node's); RRS(w)'s rule, given the walk's coins, decides a node's children only up to the first entered
  one and reads the node's rows only where a child is rejected.
* **Traversal** (:func:`traverse`: sampling with a rule whose nodes can fail — ``gpu.verify.TRAVERSE``, TV): pass 2
  read depth first, each tree waiting where it enters an internal node not yet planned, the waiting trees' nodes
  planned a round at a time — so a sample plans the internal nodes pass 2 enters, not every reached one.

Slots are padded with a *dump* index ``N``: tensors indexed by slot have ``N + 1`` columns so padded children
scatter harmlessly into the last one.  The engine itself reads the host inside the per-depth loops only for a
level's drafted width and entries (:func:`gpu.support.scan`, when planning on the drafted support: on an
accelerator the width's maximum and a ``nonzero``; the level structure comes
from :attr:`TreeBatch.level_nodes`, computed once per batch) and, for a rule that leaves nodes with ``ρ = 0``
unplanned (``reached_only``: UniVer's), which of a level's rows are reached (a walk: which trees still walk and
which stop; a traversal: the planned decisions, once a round, which it follows on the host), and on the CPU (where
a read costs no
sync) whether a level's whole rows are consecutive input rows, read in place then (:func:`_run_start`); the baseline
rules (:mod:`gpu.rules`) do not either, except a free check on the CPU, and RRS(w)'s on a walk's coins, which
nodes still try a child at each sibling step; UniVer's level rule reads the host for
data-dependent shapes and loop counts (row subsets, block sizes, the clock grid's length, simplex pivots,
convergence tests — README, "Host reads").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from univer_theory.nx import get_backend

from . import support
from .host import on_host
from .probs import sample_rows, skip_rows, uniform
from .tree_batch import TreeBatch


@dataclass(frozen=True)
class LevelContext:
    """What a level rule may look at (``R`` nodes, vocabulary ``V``, at most ``K`` children each).

    The engine packs a depth's internal nodes of all trees into the ``R`` rows, largest branching first (in blocks
    of rows: a method's own on every device, else :data:`CPU_BLOCK_BYTES` on the CPU), and passes ``active`` so
    rules can restrict sibling step j to the leading ``active[j]`` rows (``child_mask`` stays authoritative inside
    them).  ``target`` / ``draft`` are row copies in buffers the engine reuses for the next block once the decision
    is consumed, views of the input rows where those are consecutive (on the CPU, :func:`_run_start`), or a level's
    rows on their drafted columns (:mod:`gpu.support`: ``V`` is then ``M + 1`` and ``children`` are columns); rules
    are composed (e.g. the bug zoo reuses ``ctx.target``), so a rule never writes into a context's tensors.
    A walk may hand a rule its coins (``coins``: child j is entered iff ``coins[:, j] < enter[:, j]``, the first such
    child taken) and, on whole rows, all input rows with each node's row number (``rows``); only the rules of
    ``gpu.verify.COINS`` are given these, and may then decide less (:func:`walk`).
    """

    rho: torch.Tensor         # [R]     scaling ρ of each node
    target: torch.Tensor      # [R, V]  p(·|s(u))
    draft: torch.Tensor       # [R, V]  q(·|s(u))
    children: torch.Tensor    # [R, K]  child tokens in drafting order (0 where absent)
    child_mask: torch.Tensor  # [R, K]  bool, child j exists
    process: str
    child_shapes: torch.Tensor | None = None  # [R, K] long, child j's subtree shape as an index into shape_keys
    shape_keys: tuple[str, ...] = (".",)     # nested forms of the shapes (TreeBatch.subtree_shapes; shape/slot rules)
    active: tuple[int, ...] | None = None  # rows ≥ active[j] have no j-th child (None: no such bound)
    coins: torch.Tensor | None = None      # [R, K] float64: a walk's coins, child j entered iff coins < enter (walk)
    rows: torch.Tensor | None = None       # [R] long: target / draft are all input rows [*, V], node i's are rows[i]


@dataclass(frozen=True)
class LevelDecision:
    """Output of a level rule; ``residual`` need not be normalised (Y ~ norm(residual))."""

    enter: torch.Tensor       # [R, K]
    scale: torch.Tensor       # [R, K]
    stop: torch.Tensor        # [R]
    residual: torch.Tensor    # [R, V], or [n, V]: the rows residual_at alone
    residual_at: torch.Tensor | None = None   # [n] long, ascending: the nodes residual holds (None: all R)


LevelRule = Callable[[LevelContext], LevelDecision]


@dataclass(frozen=True)
class Allocation:
    """Pass-1 result per slot: ``rho``, ``enter`` (from the parent; 1 at the root), ``stop`` ``[B, N]``;
    ``candidate`` correction tokens of internal nodes ``[B, N]`` (sampling only; −1 elsewhere);
    ``residual [B, N, V]`` (only with ``keep_residuals``, for exactness tests; leaves hold ``p``); ``drafted``:
    ``(at [R], Support.cols [R, M])`` of each level planned on its drafted support (sampling only; ``at`` the
    flat slots ``tree·(N + 1) + slot``), for :func:`gpu.support.draw_undrafted`."""

    rho: torch.Tensor
    enter: torch.Tensor
    stop: torch.Tensor
    candidate: torch.Tensor | None = None
    residual: torch.Tensor | None = None
    drafted: tuple = ()


@dataclass(frozen=True)
class VerifyResult:
    """One verification per tree.

    ``accepted_nodes [B, D+1]``: slots of the accepted path, slot 0 = root, −1 padded beyond ``τ``;
    ``num_accepted [B]``: τ, the number of accepted drafted tokens; ``next_token [B]``: Y, the correction
    token (from a residual) or bonus token (``Y ~ p`` at a drafted leaf).
    """

    accepted_nodes: torch.Tensor
    num_accepted: torch.Tensor
    next_token: torch.Tensor

    def accepted_tokens(self, batch: TreeBatch) -> torch.Tensor:
        """``[B, D]`` drafted tokens of the accepted path (−1 padded)."""
        nodes = self.accepted_nodes[:, 1:]
        tok = batch.token.gather(1, nodes.clamp(min=0))
        return torch.where(nodes >= 0, tok, -1)


#: On the CPU a level's rows are decided in blocks of about this many bytes per ``[rows, V]`` tensor (the
#: default of ``block_bytes``), so that a rule's few working rows stay in cache across its sibling steps (and are
#: small enough for the allocator to reuse); accelerators take a whole level at once.  A rule with many whole-row
#: temporaries is given its own blocks, on every device (:data:`gpu.verify.BLOCK_BYTES`).
CPU_BLOCK_BYTES = 1 << 22


def _row_blocks(tree, slots, kids, active, step: int | None):
    """One level cut into blocks of ``step`` rows (None: whole), each with its own ``active`` bound and branching
    ``K`` trimmed to the children present in the block."""
    R = tree.shape[0]
    if step is None or R <= step:
        yield tree, slots, kids, active
        return
    for lo in range(0, R, step):
        hi = min(R, lo + step)
        sub = tuple(min(max(a - lo, 0), hi - lo) for a in active)
        k = max(1, sum(a > 0 for a in sub))
        yield tree[lo:hi], slots[lo:hi], kids[lo:hi, :k], sub[:k]


def _reached_rows(tree, slots, kids, active, live):
    """A level's rows with ``live`` (bool ``[R]``, a host read) — ``(tree, slots, kids, active)`` of those rows,
    still sorted by branching, ``active`` and the branching ``K`` recounted — and ``(R, keep, dead)``: the level's
    row count, the kept rows' positions among them and the others' ``(tree, slots, kids)``."""
    keep = live.nonzero().squeeze(1)
    before = torch.cat([live.new_zeros(1, dtype=torch.long), live.cumsum(0)]).tolist()
    active = tuple(before[a] for a in active)
    k = max(1, sum(a > 0 for a in active))
    dead = (tree[~live], slots[~live], kids[~live])
    return (tree[keep], slots[keep], kids[keep, :k], active[:k]), (tree.shape[0], keep, dead)


def _unreached(tree, slots, kids):
    """:func:`_reached_rows` of rows none of which is reached, without its reads and gathers: no rows to plan, and
    every row's ``(tree, slots, kids)`` to spread."""
    return (tree[:0], slots[:0], kids[:0, :1], (0,)), (tree.shape[0], tree.new_zeros(0), (tree, slots, kids))


def _level_units(levels, N: int, p_rows, q_rows, rows_of, drafted_support: bool, block_bytes: int | None,
                 reached=None):
    """``(tree, slots, kids, active, src, support, spread)`` per unit of work of the ``levels`` (each ``(tree, slot,
    kids, active)`` as :attr:`TreeBatch.level_nodes`' of a batch of ``N`` slots; ``src``: the units' rows of
    ``p_rows`` / ``q_rows``): a whole level on its drafted support (:mod:`gpu.support`; ``support`` not None),
    else the level's rows in blocks (``block_bytes`` per ``[rows, V]`` tensor, at least one row; None: blocks of
    :data:`CPU_BLOCK_BYTES` on the CPU, the whole level on an accelerator).

    ``reached``: None, or a function giving a level's rows' ``ρ > 0`` from their flat slots (read when the level
    is reached, after the level above wrote its ρ): rows with ``ρ = 0`` are never reached, and a rule that says
    so (:func:`allocate`'s ``reached_only``) is not run on them — a level on its drafted support is scanned and
    planned on its reached rows alone, a block of whole rows none of which is reached is not planned at all.
    ``spread`` is then ``(R, keep, (tree, slots, kids))`` — the unit's row count before, the planned rows'
    positions among them and the unreached rows — else None."""
    step = _block_step(block_bytes, p_rows)

    def live_of(unit):
        return reached(unit[0] * (N + 1) + unit[1])

    for level in levels:
        unit, spread = level, None
        if reached is not None and drafted_support:
            live = live_of(level)
            if not bool(live.all()):                    # host read
                unit, spread = _reached_rows(*level, live)
        tree, slots = unit[0], unit[1]
        src = rows_of[tree * N + slots]
        found = (support.scan(p_rows, q_rows, src) if tree.shape[0] else None) if drafted_support else None
        if found is not None or (spread is not None and tree.shape[0] == 0):
            yield unit + (src, found, spread)
            continue
        for block in _row_blocks(*level, step):         # whole rows: blocks of the level's rows, as before
            unit, spread = block, None                  # a block with a reached row is planned as a whole
            if reached is not None:
                live = live_of(block)
                if not bool(live.any()):                # host read
                    unit, spread = _unreached(*block[:3])
            yield unit + (rows_of[unit[0] * N + unit[1]], None, spread)


def row_numbers(batch: TreeBatch, row_index: torch.Tensor | None) -> torch.Tensor:
    """``[B, N]`` long: the row of ``target_probs.reshape(-1, V)`` (and of the draft rows) holding slot v of tree
    b — ``b·N + v`` for ``[B, N, V]`` rows, ``row_index`` when the rows come flat (``[R, V]``, any order)."""
    if row_index is not None:
        return row_index
    B, N = batch.parent.shape
    return torch.arange(B * N, device=batch.device).view(B, N)


def allocate(batch: TreeBatch, target_probs: torch.Tensor, draft_probs: torch.Tensor, process: str,
             rule: LevelRule, generator: torch.Generator | None = None, sample: bool = False,
             keep_residuals: bool = False, row_index: torch.Tensor | None = None,
             drafted_support: bool = False, shapes: bool = True, block_bytes: int | None = None,
             reached_only: bool = False, check_residuals: bool = True) -> Allocation:
    """Pass 1 from the root down (inputs assumed valid; see :func:`gpu.verify.verify`; ``row_index``:
    :func:`row_numbers`).  ``drafted_support``: plan each level on its rows' drafted tokens (:mod:`gpu.support`;
    only for rules that read undrafted tokens through their total mass); a candidate token equal to ``V`` then
    stands for a draw from ``p·1[q = 0]`` (:func:`sample` makes it).  ``shapes``: give each level its children's
    subtree shapes (:attr:`TreeBatch.subtree_shapes`, ``LevelContext.child_shapes``; only for rules that read
    them).  ``block_bytes``: the row blocks on whole rows, on every device (None: :data:`CPU_BLOCK_BYTES` on the
    CPU, whole levels on an accelerator); each block draws its candidates in row order, so the blocks change no
    law and not the generator's use, only the time — though not every last bit (nor so, rarely, a draw on a
    boundary): on an accelerator UniVer's rule 3 lays a side out on the block's widest side
    (``wor_pair.side_columns``: the sums over that width), and PTS's walk cuts its early nodes by the chunk's
    largest rate (``clocks.early_nodes``).  ``reached_only``: the rule decides a
    node with ``ρ = 0`` as never reached (children's scalings 0, enter 1, stop 0, residual 0: UniVer's), so such
    rows are not planned (:func:`_level_units`) and get that decision here — their candidate stays −1 (a zero
    residual's draw, which no path reads), the draws of the others are the same — unless an unreached row of a
    level on its drafted support drafts more than ``V/2`` tokens: the reached rows alone then fit the scan's cap
    (:func:`gpu.support.scan`) and the level is planned on their drafted support, where planning every row takes
    whole rows (the same law, other round-off and other draws).  ``check_residuals``: refuse a residual drawn from
    or kept with an entry negative, infinite or NaN (:func:`_residual_ok`: one more pass over those rows)."""
    plans = _Plans(batch, target_probs, draft_probs, process, rule, generator, sample, keep_residuals, row_index,
                   shapes, check_residuals)
    flat = plans.rho.view(-1)
    reached = (lambda at: flat[at] > 0) if reached_only else None
    for unit in _level_units(batch.level_nodes, batch.parent.shape[1], plans.p_rows, plans.q_rows, plans.rows_of,
                             drafted_support, block_bytes, reached):
        plans.plan(*unit)
    return plans.result()


class _Plans:
    """Pass 1's per-slot state ``[B, N + 1]`` (dump column ``N``) while its units of work are planned, in any order
    that plans a node after its parent: :func:`allocate` plans level by level, :func:`traverse` the nodes its
    depth-first pass 2 reaches.  Arguments as :func:`allocate`."""

    def __init__(self, batch: TreeBatch, target_probs: torch.Tensor, draft_probs: torch.Tensor, process: str,
                 rule: LevelRule, generator, sample: bool, keep_residuals: bool, row_index, shapes: bool,
                 check_residuals: bool = True):
        B, N = batch.parent.shape
        V = target_probs.shape[-1]
        dtype, dev = target_probs.dtype, target_probs.device
        self.batch, self.process, self.rule, self.generator, self.N, self.V = batch, process, rule, generator, N, V
        self.rho = torch.ones(B, N + 1, dtype=dtype, device=dev)
        self.enter = torch.ones(B, N + 1, dtype=dtype, device=dev)
        self.stop = torch.zeros(B, N + 1, dtype=dtype, device=dev)
        self.candidate = torch.full((B, N + 1), -1, dtype=torch.long, device=dev) if sample else None
        self.token_ext = torch.cat([batch.token.clamp(min=0), torch.zeros_like(batch.token[:, :1])], dim=1).view(-1)
        self.shapes = None
        if shapes:
            shape_ids, shape_keys = batch.subtree_shapes
            self.shapes = (torch.cat([shape_ids, torch.full_like(shape_ids[:, :1], -1)], dim=1).view(-1), shape_keys)
        self.target_probs = target_probs
        self.p_rows, self.q_rows = target_probs.reshape(-1, V), draft_probs.reshape(-1, V)   # [B·N, V] (views)
        self.rows_of = row_numbers(batch, row_index).reshape(-1)
        self.residual = self.p_rows.index_select(0, self.rows_of).view(B, N, V) if keep_residuals else None   # a copy
        self.bufs = []                               # whole-row gathers [rows, V], reused by every block
        self.drafted = []
        self.residuals = []                          # (_residual_ok, tree, slots) of each unit whose residual is read
        self.check_residuals = check_residuals and (sample or keep_residuals)

    def plan(self, tree, slots, kids, active, src, found, spread) -> None:
        """Decide one unit of work (:func:`_level_units`' tuple) and record its decisions."""
        N, V, dtype = self.N, self.V, self.rho.dtype
        flat = lambda x: x.view(-1)                  # noqa: E731  [B, N+1] state ↔ flat index tree·(N+1) + slot
        if spread is not None:                       # rows never reached: their children keep ρ = 0
            full, keep, (dead_tree, dead_slots, dead_kids) = spread
            flat(self.rho).scatter_(0, (dead_tree[:, None] * (N + 1) + dead_kids).view(-1), 0.0)
            if self.residual is not None:
                self.residual[dead_tree, dead_slots] = 0
            if tree.shape[0] == 0:
                if self.candidate is not None:       # each row's one uniform, as a zero residual's draw takes
                    skip_rows(full, self.target_probs.device, self.generator)
                return
        at, kid_at = tree * (N + 1) + slots, tree[:, None] * (N + 1) + kids      # [R], [R, K] (dump: N)
        p, q, children = _unit_rows(self.p_rows, self.q_rows, src, self.token_ext[kid_at], found, self.bufs)
        shaped = {} if self.shapes is None else {"child_shapes": self.shapes[0][kid_at], "shape_keys": self.shapes[1]}
        ctx = LevelContext(flat(self.rho)[at], p, q, children, kids < N, self.process, active=active, **shaped)
        dec = self.rule(ctx)
        flat(self.rho).scatter_(0, kid_at.view(-1), dec.scale.reshape(-1).to(dtype))
        flat(self.enter).scatter_(0, kid_at.view(-1), dec.enter.reshape(-1).to(dtype))
        flat(self.stop).scatter_(0, at, dec.stop.to(dtype))
        if self.check_residuals:
            self.residuals.append((_residual_ok(dec.residual), tree, slots))
        if self.candidate is not None:
            if spread is None:
                y = sample_rows(dec.residual, self.generator)
            else:                                    # the unreached rows draw from zero residuals, in row order
                y = sample_rows(dec.residual.new_zeros(full, dec.residual.shape[1]).index_copy_(
                    0, keep, dec.residual), self.generator)[keep]
            flat(self.candidate).scatter_(0, at, y if found is None else support.tokens(found, y, V))
            if found is not None:
                self.drafted.append((at, found.cols))
        if self.residual is not None:
            self.residual[tree, slots] = (dec.residual if found is None else
                                          support.expand(dec.residual, self.p_rows, self.q_rows, src, found)).to(dtype)

    def result(self) -> Allocation:
        """The :class:`Allocation`, its decisions checked in [0, 1] (:func:`_check_state`)."""
        N, batch, rho, enter = self.N, self.batch, self.rho, self.enter
        _check_state(self.rule, self.residuals, enter[:, :N], rho[:, :N], self.stop[:, :N])
        internal = _ext(batch.num_children > 0, False)   # exactly the nodes some level decided
        stop = torch.where(internal, self.stop, rho)     # a drafted leaf (or a lone root) succeeds w.p. ρ
        stop[:, 0] = 1                                   # the root never fails (as univer_theory.engine.allocate)
        enter[:, N] = 0                                  # the dump slot is never entered
        rho[:, N] = 0
        candidate = None if self.candidate is None else self.candidate[:, :N]
        return Allocation(rho[:, :N], enter[:, :N], stop[:, :N], candidate, self.residual, tuple(self.drafted))


#: The quantities of a :class:`LevelDecision` that are probabilities, in :func:`_unit_interval`'s order.
_DECIDED = ("enter", "scale", "stop")


def _inside(x: torch.Tensor) -> torch.Tensor:
    """Entrywise: ``x`` lies in [0, 1] (NaN does not)."""
    return (x >= 0) & (x <= 1)


def _unit_interval(dec: LevelDecision, child_mask: torch.Tensor) -> torch.Tensor:
    """``[3]`` bool, on the rows' device (no host read): whether the decision's ``enter`` and ``scale`` of every
    existing child, and its ``stop``, lie in [0, 1] (:func:`_inside`)."""
    return torch.stack([(_inside(dec.enter) | ~child_mask).all(), (_inside(dec.scale) | ~child_mask).all(),
                        _inside(dec.stop).all()])


#: What each bool of a check of :func:`_unit_interval` says when it fails, and :func:`_residual_ok`'s.
_OUTSIDE = tuple(f"{x} outside [0, 1] (or NaN)" for x in _DECIDED)
_RESIDUAL = "residual with an entry negative, infinite or NaN"


def _residual_ok(residual: torch.Tensor) -> torch.Tensor:
    """0-d bool on the rows' device (no host read): every entry of a decision's residual ``[rows, V]`` is finite
    and ≥ 0 — NaN fails (one pass, ``aminmax``, no ``[rows, V]`` temporary)."""
    if residual.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=residual.device)
    low, high = torch.aminmax(residual)
    return (low >= 0) & (high < float("inf"))


def _check_decisions(rule: LevelRule, checks: list, names: tuple[str, ...]) -> None:
    """ValueError naming the rule, the quantity and a node where a level rule decided outside [0, 1] or NaN
    (one host read for the whole call: a NaN scale would otherwise be sampled from silently); ``checks`` hold
    one bool per quantity of ``names`` (:func:`walk`'s: :func:`_unit_interval`'s and its own)."""
    if not checks:
        return
    ok = torch.stack([c for c, _, _ in checks])
    if bool(ok.all()):                                   # host read
        return
    unit, what = (int(x) for x in (~ok).nonzero()[0])
    _, tree, slots = checks[unit]
    raise ValueError(f"level rule {_rule_name(rule)}: a {names[what]} at a level of {tree.shape[0]} "
                     f"rows, first tree {int(tree[0])}, slot {int(slots[0])}")


def _check_state(rule: LevelRule, residuals: list, *decided: torch.Tensor) -> None:
    """ValueError naming the rule, the quantity and the first node (tree, slot) where a level rule decided outside
    [0, 1] or NaN, from pass 1's state ``[B, N]`` in :data:`_DECIDED`'s order — each child's enter and scaling
    (its ρ) and each node's stop, written once each by the plan of its parent (of the node itself), or left at its
    start (1, 1, 0) where no plan ran; checked as recorded, in the rows' dtype — or a residual of its
    ``residuals`` (:func:`_residual_ok` of each unit whose residual was read, with its trees and slots) held an
    entry negative, infinite or NaN.  One host read for the whole call (a NaN scale would otherwise be sampled
    from silently, a NaN residual drew token V)."""
    bad = ~_inside(torch.stack(decided))
    ok = torch.stack([r for r, _, _ in residuals]) if residuals else bad.new_ones(1)
    state_bad, residual_bad = torch.stack([bad.any(), ~ok.all()]).tolist()          # host read
    if state_bad:
        what, tree, slot = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"level rule {_rule_name(rule)}: a {_OUTSIDE[what]} at tree {tree}, slot {slot}")
    if residual_bad:
        _, tree, slots = residuals[int((~ok).nonzero()[0, 0])]
        raise ValueError(f"level rule {_rule_name(rule)}: a {_RESIDUAL} at a level of {tree.shape[0]} rows, first "
                         f"tree {int(tree[0])}, slot {int(slots[0])}")


def _rule_name(rule: LevelRule) -> str:
    fn = getattr(rule, "func", rule)                     # a functools.partial: its function's name
    return getattr(fn, "__name__", type(fn).__name__)


def _block_step(block_bytes: int | None, p_rows: torch.Tensor) -> int | None:
    """Rows per block of a level's whole rows: ``block_bytes`` per ``[rows, V]`` tensor, at least one (None:
    :data:`CPU_BLOCK_BYTES` on the CPU; the whole level, None, on an accelerator)."""
    if block_bytes is None and p_rows.device.type == "cpu":
        block_bytes = CPU_BLOCK_BYTES
    return None if block_bytes is None else max(1, block_bytes // (p_rows.shape[1] * p_rows.element_size()))


def _unit_rows(p_rows: torch.Tensor, q_rows: torch.Tensor, src: torch.Tensor, children: torch.Tensor, found,
               bufs: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(p, q, children)`` a rule reads for the input rows ``src`` of a unit of work: on their drafted support
    (``found``, :func:`gpu.support.compact`), a view of the input where the rows are consecutive (on the CPU,
    :func:`_run_start`), else copies in ``bufs`` — two whole-row buffers reused by every unit, grown in place."""
    if found is not None:
        return support.compact(found, children)
    R = src.shape[0]
    if (start := _run_start(src)) is not None:
        return p_rows[start:start + R], q_rows[start:start + R], children
    if not bufs or bufs[0].shape[0] < R:
        bufs[:] = [p_rows.new_empty(R, p_rows.shape[1]), q_rows.new_empty(R, q_rows.shape[1])]
    return (torch.index_select(p_rows, 0, src, out=bufs[0][:R]), torch.index_select(q_rows, 0, src, out=bufs[1][:R]),
            children)


def _run_start(src: torch.Tensor) -> int | None:
    """``src[0]`` where the rows ``src [R]`` are consecutive (``src[i] = src[0] + i``), else None; on the CPU only
    (a host read): there a level's whole rows are then a view of the input rows, not a copy — the copy was a write
    and a re-read of every row, ~1/8 of an RRSw or TV verification on whole rows."""
    if src.device.type != "cpu" or not bool((src[1:] - src[:-1] == 1).all()):
        return None
    return int(src[0]) if src.shape[0] else None


def _ext(x: torch.Tensor, fill) -> torch.Tensor:
    """Append the dump column ``N`` holding ``fill``."""
    return torch.cat([x, torch.full_like(x[:, :1], fill)], dim=1)


def sample(batch: TreeBatch, target_probs: torch.Tensor, draft_probs: torch.Tensor, process: str,
           rule: LevelRule, generator: torch.Generator | None = None,
           row_index: torch.Tensor | None = None, drafted_support: bool = False, shapes: bool = True,
           block_bytes: int | None = None, reached_only: bool = False, check_residuals: bool = True) -> VerifyResult:
    """Pass 1 + pass 2 with independent coins: one verification per tree.  Y is the endpoint's candidate, or
    ``Y ~ p`` at a drafted leaf, or ``Y ~ p·1[q = 0]`` where the candidate came from the undrafted column
    (:func:`gpu.support.draw_undrafted`) — rows are read whole only at the endpoint, once per tree."""
    B, N = batch.parent.shape
    dev = target_probs.device
    alloc = allocate(batch, target_probs, draft_probs, process, rule, generator, sample=True, row_index=row_index,
                     drafted_support=drafted_support, shapes=shapes, block_bytes=block_bytes,
                     reached_only=reached_only, check_residuals=check_residuals)
    entered = _ext(uniform((B, N), dev, generator) < alloc.enter.to(torch.float64), False)
    stops = uniform((B, N), dev, generator) < alloc.stop.to(torch.float64)
    end = on_host(_endpoints, entered, stops, batch.children, batch.valid, batch.max_depth)
    return _emit(batch, alloc, target_probs, draft_probs, end, row_index, generator)


def _endpoints(entered, stops, kids, valid, max_depth: int):
    """Pass 2 of :func:`sample` from its coins: ``end [B]``, each tree's endpoint.  A node succeeds when a child
    entered (``entered [B, N + 1]``, dump column ``N`` False) succeeds — the first such child in drafting order wins
    and the path goes on through it — or else on its own stop coin (``stops [B, N]``); ``max_depth + 1`` sweeps from
    the leaves settle every node (``kids [B, N, K]``, absent children ``N``; ``valid [B, N]``) and the root, whose
    stop is 1, always succeeds.  numpy or torch; on the CPU one host call on numpy views (:func:`gpu.host.on_host`:
    ~70 small tensor operations at a tree of depth 4, each dearer in torch)."""
    nx = get_backend(entered)
    B, N, K = kids.shape
    flat = kids.reshape(B, N * K)
    ok_child = nx.take(entered, flat).reshape(B, N, K)
    slot = nx.arange(N + 1, kids)[None, :] + 0 * kids[:, :1, 0]          # [B, N + 1]
    succ, end = slot < 0, slot
    for _ in range(max_depth + 1):
        wins = ok_child & nx.take(succ, flat).reshape(B, N, K)
        any_win = wins.any(-1)
        winner = nx.take(kids, nx.argmax(wins))[..., 0]                   # the first child in drafting order
        succ = nx.concat([(any_win | stops) & valid, slot[:, :1] < 0])
        end = nx.concat([nx.where(any_win, nx.take(end, winner), slot[:, :N]), slot[:, N:]])
    return end[:, 0]


def _emit(batch: TreeBatch, alloc: Allocation, target_probs: torch.Tensor, draft_probs: torch.Tensor,
          u: torch.Tensor, row_index, generator) -> VerifyResult:
    """The verifications ending at the nodes ``u [B]``: Y their candidate, or ``Y ~ p`` at a drafted leaf, or ``Y ~
    p·1[q = 0]`` where the candidate came from a level's undrafted column (:func:`gpu.support.draw_undrafted`)."""
    B, N = batch.parent.shape
    V = target_probs.shape[-1]
    row_u = row_numbers(batch, row_index).gather(1, u[:, None]).squeeze(1)
    is_leaf = batch.num_children.gather(1, u[:, None]).squeeze(1) == 0
    cand = alloc.candidate.gather(1, u[:, None]).squeeze(1)
    p_rows = target_probs.reshape(-1, V)
    leaf = is_leaf.nonzero().squeeze(1)                     # host read: the trees whose Y is drawn from p
    y = cand.index_put((leaf,), sample_rows(p_rows.index_select(0, row_u[leaf]), generator))
    if alloc.drafted:                                        # V: drawn from a level's undrafted column
        at = (~is_leaf & (cand == V)).nonzero().squeeze(1)  # host read: those drawing from p·1[q = 0]
        if at.numel():
            cols = support.cols_at(alloc.drafted, at * (N + 1) + u[at], B * (N + 1))
            y = y.index_put((at,), support.draw_undrafted(p_rows, draft_probs.reshape(-1, V), row_u[at], cols,
                                                          generator))
    return VerifyResult(*_path(batch, u), y)


def traverse(batch: TreeBatch, target_probs: torch.Tensor, draft_probs: torch.Tensor, process: str,
             rule: LevelRule, generator: torch.Generator | None = None, row_index: torch.Tensor | None = None,
             drafted_support: bool = False, shapes: bool = True, block_bytes: int | None = None,
             check_residuals: bool = True) -> VerifyResult:
    """:func:`sample` planning only the nodes its pass 2 reaches: depth first, in rounds.

    Pass 2 decides node u from its children in drafting order — the first child c with its coin ``E_c`` whose
    subtree succeeds wins, else u succeeds on its own coin ``F_u`` — and it reads a child's subtree only once every
    earlier child's failed.  So each tree walks that recursion depth first (on the host, with ``E_c`` and ``F_u``
    drawn for every node at the start), and where it enters an internal node not yet planned it waits: each round
    plans the nodes the waiting trees entered, one a tree (rows of any depth, largest branching first, in blocks as
    :func:`allocate`'s levels, or on their drafted support), and the trees go on.  A node with ``ρ = 0`` fails
    without a plan (theory.md §6.1: its plan accepts no mass, its stop ``(ρ − α)/(1 − α)`` is 0).  The same law as
    :func:`sample` (other draws), planning the internal nodes the traversal enters (TV on the benchmark's Zipf-row
    trees: 7–8 of binary:4's 15, 6.6 of the EAGLE-like tree's 14) instead of every reached one, at one host read a
    round.  Arguments as :func:`sample`."""
    B, N = batch.parent.shape
    dev = target_probs.device
    host = lambda x: x.cpu().numpy()                 # noqa: E731  (a view on the CPU)
    coin_e, coin_f = (host(uniform((B, N), dev, generator)) for _ in range(2))
    plans = _Plans(batch, target_probs, draft_probs, process, rule, generator, True, False, row_index, shapes,
                   check_residuals)
    kids, branching = host(batch.children), host(batch.num_children)
    planned = np.zeros((B, N), dtype=bool)
    frames = [[[0, 0]] for _ in range(B)]            # per tree its stack of [node, child being tried]
    end = np.zeros(B, dtype=np.int64)

    def advance(b: int, enter, stop, rho) -> int | None:
        """Tree b's traversal up to its end (None) or to an internal node it enters unplanned (returned)."""
        stack = frames[b]
        while True:
            u, j = stack[-1]
            if not planned[b, u] and branching[b, u]:
                return u
            if j < branching[b, u]:
                c = kids[b, u, j]
                if coin_e[b, c] < enter[b, c] and rho[b, c] > 0:
                    if not branching[b, c]:              # a drafted leaf succeeds on its own coin, w.p. ρ
                        if coin_f[b, c] < rho[b, c]:
                            end[b] = c
                            return None
                    else:
                        stack.append([c, 0])
                        continue
                stack[-1][1] += 1
            elif u == 0 or coin_f[b, u] < stop[b, u]:    # every child failed: u stops (the root always)
                end[b] = u
                return None
            else:
                stack.pop()
                stack[-1][1] += 1

    waiting = range(B)
    while True:
        state = [host(x) for x in (plans.enter, plans.stop, plans.rho)]
        asks = [(b, u) for b in waiting if (u := advance(b, *state)) is not None]
        if not asks:
            break
        ask = np.array(asks).reshape(-1, 2)
        ask = ask[np.lexsort((ask[:, 1], ask[:, 0], -branching[ask[:, 0], ask[:, 1]]))]   # largest branching first
        planned[ask[:, 0], ask[:, 1]] = True
        waiting = ask[:, 0].tolist()
        k = branching[ask[:, 0], ask[:, 1]]
        active = tuple(int((k > j).sum()) for j in range(int(k.max())))
        tree, slots = (torch.as_tensor(x, device=dev) for x in (ask[:, 0], ask[:, 1]))
        level = (tree, slots, batch.children[tree, slots, :len(active)], active)     # a level of rows of any depth
        for unit in _level_units([level], N, plans.p_rows, plans.q_rows, plans.rows_of, drafted_support,
                                 block_bytes):
            plans.plan(*unit)
    return _emit(batch, plans.result(), target_probs, draft_probs, torch.as_tensor(end, device=dev), row_index,
                 generator)


def _path(batch: TreeBatch, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(accepted_nodes [B, D+1], τ [B])`` of :class:`VerifyResult` for the endpoints ``u [B]`` (on the CPU one
    host call on numpy views, :func:`gpu.host.on_host`)."""
    return on_host(_path_of, batch.depth, batch.parent, u, batch.max_depth)


def _path_of(depth, parent, u, D: int):
    """:func:`_path` from the batch's ``depth``, ``parent [B, N]`` and ``D = max_depth``: the endpoints' ancestors,
    climbed one depth at a time (``-1`` past each one's own depth).  numpy or torch."""
    nx = get_backend(u)
    tau = nx.take(depth, u[:, None])[:, 0]
    cur, steps = u, []
    for t in range(D, 0, -1):
        here = tau >= t
        steps.append(nx.where(here, cur, -1))
        cur = nx.where(here, nx.take(parent, cur[:, None])[:, 0], cur)
    return nx.stack([0 * u] + steps[::-1]), tau


def walk(batch: TreeBatch, target_probs: torch.Tensor, draft_probs: torch.Tensor, process: str, rule: LevelRule,
         generator: torch.Generator | None = None, row_index: torch.Tensor | None = None,
         drafted_support: bool = False, block_bytes: int | None = None, coins: bool = False,
         check_residuals: bool = True) -> VerifyResult:
    """One verification per tree for a rule under which every node succeeds once reached (``stop = 1`` and the
    children's scalings 1 at every node: NSS, RRS, RRSw, K-SEQ, GR), planning only the nodes on the path.

    With ``f_u = 1`` everywhere, pass 2 of :func:`sample` ends at the first node none of whose children has its
    coin ``E_c``, reached from the root through the first child (in drafting order) that has it: the coins and
    candidates of the nodes off that path are drawn there but never read.  So the walk plans, depth by depth, one
    row per tree still walking — the node it stands on —, draws that node's children's coins, and moves to the first
    entered child, or draws ``Y`` from the node's residual and stops; a tree that reaches a drafted leaf draws
    ``Y ~ p`` there at the end.  The same law as :func:`sample` (other draws), with ``τ + 1`` node plans per tree
    (``τ`` where the path ends at a leaf) instead of one per internal node (15 on a binary tree of depth 4).
    Arguments as :func:`sample`.  A depth's rows are planned on their drafted support, or whole in blocks, as in
    :func:`allocate`; its coins are drawn before its blocks and its candidates in row order, so on the CPU blocks
    change neither the law nor the draws.  A
    rule deciding a stop or a scaling other than 1 is refused (ValueError, after the walk: one host read).

    ``coins``: the rule is handed the coins (``LevelContext.coins``) and, on whole rows, all input rows with each
    node's row number (``LevelContext.rows``) instead of copies of its rows, so it may decide each node's children
    only up to the first entered one and read a row only where a child is rejected (RRS(w)'s rule: at most the τ + 1
    path nodes' rejected children, ~1.4–1.9 sibling steps a tree on the benchmark's Zipf-row trees where the walk
    without coins took all 6–8 of the path nodes', and no row copied where every child is accepted); its ``residual``
    then holds the nodes that enter no child alone (``LevelDecision.residual_at``), and a depth is one unit of work.
    The same draws as without coins wherever the rule's ``enter`` rounds alike (float64 rows) and its row sums
    split alike (one CPU thread, as for blocks: with several, a step holding one long row alone sums it in pieces)."""
    B, N = batch.parent.shape
    V = target_probs.shape[-1]
    dev = target_probs.device
    p_rows, q_rows = target_probs.reshape(-1, V), draft_probs.reshape(-1, V)
    rows_of = row_numbers(batch, row_index)
    step = _block_step(block_bytes, p_rows)
    tokens, kids_of, branching = _ext(batch.token.clamp(min=0), 0), batch.children, batch.num_children
    at = torch.zeros(B, dtype=torch.long, device=dev)            # the node each tree stands on
    y = torch.full((B,), -1, dtype=torch.long, device=dev)       # Y where a tree stopped at an internal node
    walking = torch.arange(B, device=dev)
    checks, bufs = [], []
    while (walking := walking[(branching[walking, at[walking]] > 0) & (y[walking] < 0)]).shape[0]:   # host read
        R, slots = walking.shape[0], at[walking]
        kids = kids_of[walking, slots]                                                     # [R, K] (dump N)
        src, children = rows_of[walking, slots], tokens[walking[:, None], kids]
        flips = uniform(kids.shape, dev, generator)
        found = support.scan(p_rows, q_rows, src) if drafted_support else None
        whole = found is not None or step is None or (coins and p_rows.dtype == torch.float64)
        width = R if whole else step
        for lo in range(0, R, width):
            hi = min(R, lo + width)
            if coins and found is None:         # the rule reads the rows it needs, by row number
                p, q, cols, rows = p_rows, q_rows, children[lo:hi], src[lo:hi]
            else:
                (p, q, cols), rows = _unit_rows(p_rows, q_rows, src[lo:hi], children[lo:hi], found, bufs), None
            mask = kids[lo:hi] < N
            dec = rule(LevelContext(p.new_ones(hi - lo), p, q, cols, mask, process,
                                    coins=flips[lo:hi] if coins else None, rows=rows))
            entered = (flips[lo:hi] < dec.enter.to(torch.float64)) & mask
            moved = entered.any(1)
            nxt = kids[lo:hi].gather(1, entered.to(torch.int8).argmax(1, keepdim=True)).squeeze(1)
            at[walking[lo:hi]] = torch.where(moved, nxt, slots[lo:hi])
            stop = (~moved).nonzero().squeeze(1)                                  # host read
            if dec.residual_at is not None and not torch.equal(dec.residual_at, stop):
                raise ValueError(f"walk: level rule {_rule_name(rule)} held the residuals of nodes "
                                 f"{dec.residual_at.tolist()}, where nodes {stop.tolist()} entered no child")
            weights = dec.residual if dec.residual_at is not None else dec.residual[stop]     # the rows drawn from
            checks.append((torch.cat([_unit_interval(dec, mask),
                                      ((dec.stop == 1).all() & ((dec.scale == 1) | ~mask).all())[None]]
                                     + ([_residual_ok(weights)[None]] if check_residuals else [])),
                           walking[lo:hi], slots[lo:hi]))
            if stop.shape[0]:
                drawn = sample_rows(weights, generator)
                y[walking[lo + stop]] = drawn if found is None else support.tokens(found, drawn, V, lo + stop)
        if found is not None:                       # V: drawn from the undrafted column, so from p·1[q = 0]
            rest = (y[walking] == V).nonzero().squeeze(1)                         # host read
            if rest.shape[0]:
                y[walking[rest]] = support.draw_undrafted(p_rows, q_rows, src[rest], found.cols[rest], generator)
    _check_decisions(rule, checks, _OUTSIDE + ("stop or child scaling other than 1 (walk takes a rule whose "
                                               "every reached node succeeds)", _RESIDUAL))
    leaf = (y < 0).nonzero().squeeze(1)                                           # host read: Y ~ p at a leaf
    y[leaf] = sample_rows(p_rows.index_select(0, rows_of[leaf, at[leaf]]), generator)
    return VerifyResult(*_path(batch, at), y)


def _success_sweeps(batch: TreeBatch, alloc: Allocation) -> tuple[torch.Tensor, torch.Tensor]:
    """Post-order ``(σ, e)`` ``[B, N+1]`` of :func:`univer_theory.engine.tree_expected_accepted`:
    ``σ_u = Σ_j F_j a_j σ_j + F_K f_u``, ``e_u = Σ_j F_j a_j (σ_j + e_j)``, ``F_j = Π_{l<j}(1 − a_l σ_l)``."""
    B, N = alloc.stop.shape
    kids = batch.children
    K = kids.shape[2]
    enter = _ext(alloc.enter, 0)
    sigma = torch.zeros(B, N + 1, dtype=alloc.stop.dtype, device=alloc.stop.device)
    e = torch.zeros_like(sigma)
    a = [enter.gather(1, kids[:, :, j]) for j in range(K)]
    for _ in range(batch.max_depth + 1):
        fail = torch.ones_like(alloc.stop)
        s_u, e_u = torch.zeros_like(fail), torch.zeros_like(fail)
        for j in range(K):
            s_c, e_c = sigma.gather(1, kids[:, :, j]), e.gather(1, kids[:, :, j])
            s_u = s_u + fail * a[j] * s_c
            e_u = e_u + fail * a[j] * (s_c + e_c)
            fail = fail * (1 - a[j] * s_c)
        sigma, e = _ext(s_u + fail * alloc.stop, 0), _ext(e_u, 0)
    return sigma, e


def expected_accepted(batch: TreeBatch, target_probs: torch.Tensor, draft_probs: torch.Tensor, process: str,
                      rule: LevelRule, row_index: torch.Tensor | None = None,
                      drafted_support: bool = False, shapes: bool = True,
                      block_bytes: int | None = None, reached_only: bool = False) -> torch.Tensor:
    """``E[τ | T]`` per tree ``[B]``: ``e`` at the root of :func:`_success_sweeps`."""
    alloc = allocate(batch, target_probs, draft_probs, process, rule, row_index=row_index,
                     drafted_support=drafted_support, shapes=shapes, block_bytes=block_bytes,
                     reached_only=reached_only)
    return _success_sweeps(batch, alloc)[1][:, 0]


def first_token_law(batch: TreeBatch, target_probs: torch.Tensor, draft_probs: torch.Tensor, process: str,
                    rule: LevelRule, drafted_support: bool = False) -> torch.Tensor:
    """Exact law ``[B, V]`` of the first output token (the first accepted token, or Y when τ = 0) per tree:
    root child j (drafting order) wins w.p. ``F_j a_j σ_j`` and otherwise ``Y ~ norm(residual at the root)``
    w.p. ``F_K`` (the root's ``f = 1``).  A lossless rule gives ``p(·|root)`` in expectation over the draft."""
    alloc = allocate(batch, target_probs, draft_probs, process, rule, keep_residuals=True,
                     drafted_support=drafted_support)
    sigma, _ = _success_sweeps(batch, alloc)
    kids = batch.children[:, 0]                                   # [B, K] root's children (dump N)
    enter = _ext(alloc.enter, 0)
    win = torch.zeros_like(enter[:, :kids.shape[1]])
    fail = torch.ones_like(alloc.stop[:, 0])
    for j in range(kids.shape[1]):
        succ = enter.gather(1, kids[:, j:j + 1]).squeeze(1) * sigma.gather(1, kids[:, j:j + 1]).squeeze(1)
        win[:, j] = fail * succ
        fail = fail * (1 - succ)
    residual = alloc.residual[:, 0]
    mass = residual.sum(-1, keepdim=True)                        # 0 only where the children never all fail
    law = fail[:, None] * torch.where(mass > 0, residual / torch.where(mass > 0, mass, 1), 0)   # subnormal mass too
    tokens = _ext(batch.token, 0).gather(1, kids).clamp(min=0)
    return law.scatter_add(1, tokens, win.to(law.dtype))
