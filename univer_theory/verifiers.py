"""Every baseline verifier as an exact per-tree law and a sampler (theory.md §3.1–3.7).

One signature for all::

    verifier.law(tree, target_probs, draft_probs, process) -> {(path tokens…, Y): prob}
    verifier.sample(tree, target_probs, draft_probs, process, rng) -> (accepted node ids, Y)
    verifier.expected_accepted_length(tree, target_probs, draft_probs, process) -> E[τ | T]

``target_probs`` / ``draft_probs`` are ``[N, V]``: row u is ``p(·|s(u))`` / ``q(·|s(u))``.  Rows may be float64
or exact ``Fraction`` (numpy ``object``) arrays; the verifiers marked ``rational`` in ``VERIFIERS`` (all but
K-SEQ, UniVer and Global Resolution, whose plans solve equations in floats) keep Fractions, so their laws are exact.

Glossary: the *accepted path* is root → u (τ = depth(u) accepted tokens); ``Y`` is the *correction* token
(drawn from a residual when u is internal) or the *bonus* token (``Y ~ p(·|s(u))`` when u is a drafted
leaf).  The *scaling* ``ρ`` handed to a node is its prefix acceptance probability (§2).
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from . import engine
from .engine import NodeContext, NodeDecision, NodeRule
from .nx import get_backend
from .orders import RATIO_SCALE, ratio_argsort, ratio_key, top_tokens
from .processes import EXACT_PROCESSES, HUB, check_rng, hub_token
from .tree import DraftTree, as_shape
from .validation import Unsupported, check_choice, check_one_mode, check_simplex

_ALL = ("iid", "wor", "topk", "greedy")


def normalise(x: np.ndarray) -> np.ndarray:
    """``norm(x) = x / Σx``; the zero vector stays zero (it only appears on probability-0 branches)."""
    s = x.sum()
    return x / s if s != 0 else x


def positive_part(x: np.ndarray) -> np.ndarray:
    """``[x]_+`` elementwise, exact for Fraction arrays."""
    return np.maximum(x, 0)


def _without(rest, y):
    """``(norm(rest·1[≠y]), rest·1[≠y])``: the draft without its drawn tokens, renormalised from the row's own
    entries in one division, as the wor tuple law's ``q(x)/R`` is (renormalising the last renormalised row rounded a
    subnormal rest again at every step: 5e-324 / 0.56 gave 1e-323, and the output law was 2e-4 from the target)."""
    rest = rest.copy()
    rest[y] = 0
    return normalise(rest), rest


def _ratio_min1(num, den):
    """``min(1, num/den)`` for a drafted token (den > 0 is guaranteed by validation); the ratio is formed only
    below 1, so a subnormal ``den`` does not overflow it (exact for Fractions too: the 1 is of num's type, so a
    Fraction stays a Fraction where every ratio is 1)."""
    return num * 0 + 1 if num >= den else num / den


# --------------------------------------------------------------------------------------------------------
# Node rules
# --------------------------------------------------------------------------------------------------------
def nss_rule(ctx: NodeContext) -> NodeDecision:
    """Target-only (§3.1): draw ``Y ~ p``; if Y equals a child, descend into it (the first copy), else stop.

    Sequential form: child j is entered w.p. ``P(y_j)`` with ``P ← norm(P·1[≠y_j])`` after each miss; ``P(y_j)``
    clamped at 1, as the batched twin's (a valid float row may hold 1 + 5e-10: ``check_simplex``'s tolerance).
    """
    P = ctx.target
    enter = []
    for y in ctx.children:
        enter.append(min(P[y], 1))
        P = P.copy()
        P[y] = 0
        P = normalise(P)
    return NodeDecision(tuple(enter), (1,) * len(enter), 1, P)


def recursive_rejection_rule(ctx: NodeContext, without_replacement: bool) -> NodeDecision:
    """RRS (§3.3) / RRSw (§3.4): accept child x w.p. ``min(1, P(x)/Q(x))``; on rejection
    ``P ← norm([P − Q]_+)`` (and, without replacement, ``Q ← norm(Q·1[≠x])``).  All rejected: ``Y ~ P``.

    A duplicate i.i.d. child is tried again: it is always rejected, but the residual update still happens.
    """
    P, Q, rest = ctx.target, ctx.draft, ctx.draft
    enter = []
    for y in ctx.children:
        enter.append(_ratio_min1(P[y], Q[y]))
        P = normalise(positive_part(P - Q))
        if without_replacement:
            Q, rest = _without(rest, y)
    # all of [P − Q]_+ rounded away (float rows a few ulps off each other): Y ~ p, as residual_rows' fallback (the
    # zero row lost the law's mass; exact rows reach it only on an event of probability 0)
    return NodeDecision(tuple(enter), (1,) * len(enter), 1, P if P.sum() != 0 else ctx.target)


def rrs_rule(ctx):
    return recursive_rejection_rule(ctx, without_replacement=False)


def rrsw_rule(ctx):
    return recursive_rejection_rule(ctx, without_replacement=True)


def kseq_bisection_steps(max_k: int) -> int:
    """Halvings that take K-SEQ's bracket ``[1, k]`` (k ≤ ``max_k``) to adjacent float64 values: floats in
    ``[1, k]`` are spaced at least ``2^-52`` apart, so ``52 + ⌈log₂(k − 1)⌉`` halvings of the width ``k − 1``
    leave ``lo`` and ``hi`` adjacent (or equal): bisection to float64 resolution, a fixed count (no host sync)."""
    return 52 + max(int(max_k) - 1, 1).bit_length()


def normalise_rows(x):
    """Float rows ``[..., V]`` divided by their sums (a zero row kept): :func:`normalise` on a batch, numpy or torch
    (K-SEQ's ρ*, UniVer's float32 rows planned in float64).  The sums are :func:`row_sums`."""
    return x / row_sums(x)


def row_sums(x):
    """``[..., 1]``: the divisor :func:`normalise_rows` uses — each row's sum, sequential (the last prefix sum: the
    same floats in numpy and torch; K-SEQ's ρ* on rows with p ≈ q moves by ~1e-6 with one ulp of a row's sum), 1
    for a zero row."""
    nx = get_backend(x)
    total = nx.last_prefix_sum(x) if x.shape[-1] else nx.sum(x, keepdims=True)
    return nx.where(total > 0, total, 1.0)


def _check_kseq_inputs(nx, target_probs, draft_probs, k, where: str = "kseq_rho_star") -> tuple:
    """:func:`kseq_rho_star`'s input rules (on host copies): both row sets on the simplex and of one shape, k an
    integer ≥ 1 or such integers per row; ValueError naming ``where``, the argument and the rule.  Returns the rows'
    leading shape."""
    p, q = (check_simplex(nx.to_numpy(x), where, name) for x, name in ((target_probs, "target_probs"),
                                                                         (draft_probs, "draft_probs")))
    if p.shape != q.shape:
        raise ValueError(f"{where}: target_probs {p.shape} and draft_probs {q.shape} differ (vocabulary or rows)")
    kk = np.asarray(k.detach().cpu() if hasattr(k, "detach") else k)
    if kk.dtype.kind not in "iu" or kk.size == 0 or kk.min() < 1:
        raise ValueError(f"{where}: k must be an integer ≥ 1 (or one per row), got {k!r}")
    try:
        np.broadcast_to(kk, p.shape[:-1])
    except ValueError:
        raise ValueError(f"{where}: k of shape {kk.shape} does not broadcast to the rows {p.shape[:-1]}") from None
    return p.shape[:-1]


def kseq_rho_star(target_probs, draft_probs, k, max_k: int | None = None, validate: bool = True):
    """SpecTr K-SEQ's ``ρ* ∈ [1, k]``: root of ``f(ρ) = 1 − (1 − β(ρ))^k − ρ·β(ρ)``,
    ``β(ρ) = Σ_x min(q(x), p(x)/ρ)`` (§3.5); ``ρ* = 1`` when ``f(1) ≤ 0``.  Rows ``[..., V]`` (numpy or torch,
    :mod:`univer_theory.nx`), ``k`` an int or per row; one row gives a float.  ``max_k`` bounds k (default:
    its maximum — pass it for torch rows, to keep the step count off the device).  ``validate``: the input rules
    of :func:`_check_kseq_inputs` first (a copy to the host); the level rules, whose rows are checked where they
    enter, pass False.

    ``f`` is evaluated through the rejected mass ``1 − β(ρ) = r(ρ) = Σ_x [q − p/ρ]_+ = Σ_{p/q<ρ} q −
    (1/ρ)·Σ_{p/q<ρ} p`` (Σq = 1): ``f(ρ) = 1 − r^k − ρ(1 − r)``, read off prefix sums of the rows in
    :func:`~univer_theory.alpha_star.ratio_argsort` order (one search per step).  The rows are put on the simplex
    first, and ``r`` is a sum over the tokens below ρ only: with β summed over the whole row instead, the root moved
    by ``~|Σ − 1|^{1/k}`` with a row's round-off (at ``p = q``, ``f(ρ) = ε − (1 − (1 − ε)/ρ)^k`` for rows ε short
    of 1, so ``ρ* ≈ 1 + ε^{1/k}``: a float32 row 1.5e-8 short gave ρ* = 1.011 and E[τ] 1.989 for 2; a float64 row
    two ulps short ρ* = 1.00011); now ``r(1) = 0`` there exactly and round-off moves f linearly.  ρ* itself stays
    ill-conditioned where p ≈ q (f is flat near its root): one ulp of Σp can move it by ~3e-5, so a level of the
    batched layer planned on its drafted support (whose undrafted mass is ``1 − Σ_drafted p``, :mod:`gpu.support`)
    can take another ρ* than its whole row — another lossless plan (docs/deviations.md item 104).  The bisection
    runs :func:`kseq_bisection_steps` halvings and returns the *upper* end of the bracket, so ``f(ρ*) ≤ 0`` holds in
    floats and the acceptance masses (:func:`kseq_acceptance_mass`, the same r) exceed ``min(p, ρ*·q)`` by at most
    the rounding of their scale ``(1 − r^k)/(ρ*(1 − r)) ≤ 1`` (an ulp; the residual ``[p − m]_+`` is clipped).
    """
    nx = get_backend(target_probs, draft_probs)
    if validate:
        _check_kseq_inputs(nx, target_probs, draft_probs, k)
    p, q = (normalise_rows(nx.asarray(x, x)) for x in (target_probs, draft_probs))
    order = ratio_argsort(p, q)
    key = nx.take(ratio_key(p, q), order)                               # ascending, q = 0 (inf) last
    zero = nx.zeros_like(p[..., :1])
    p_below, q_below = (nx.concat([zero, nx.cumsum(nx.take(x, order))]) for x in (p, q))    # Σ_{l<m}
    kf = nx.asarray(k, p) + nx.zeros_like(p[..., 0])
    if max_k is None:
        max_k = int(kf.max())

    def f(rho):
        m = nx.searchsorted(key, rho * RATIO_SCALE)[..., None]          # tokens with p/q < ρ
        r = nx.maximum(nx.take(q_below, m)[..., 0] - nx.take(p_below, m)[..., 0] / rho, 0.0)
        return 1.0 - r ** kf - rho * (1.0 - r)

    lo, hi = nx.zeros_like(kf) + 1.0, kf
    for _ in range(kseq_bisection_steps(max_k)):
        mid = 0.5 * (lo + hi)
        up = f(mid) > 0
        lo, hi = nx.where(up, mid, lo), nx.where(up, hi, mid)
    rho = nx.where(f(nx.zeros_like(kf) + 1.0) <= 0, 1.0, hi)
    return float(rho) if nx.name == "numpy" and rho.ndim == 0 else rho


def kseq_acceptance_mass(target_probs, draft_probs, k, rho, validate: bool = True):
    """Per-token accepted mass of K-SEQ at ``ρ``: ``min(ρq, p)·(1 − r^k)/(ρ(1 − r))`` with the rejected mass
    ``r = 1 − β = Σ [q − p/ρ]_+`` (:func:`kseq_rho_star`; 0 where β = 0), on the rows put on the simplex; Σ = α.
    Rows ``[..., V]`` (numpy or torch), ``k`` and ``ρ`` scalars or per row.  ``validate``: the rows and k as
    :func:`kseq_rho_star` checks them, and ``ρ`` finite and > 0 (ValueError); the level rules pass False."""
    nx = get_backend(target_probs, draft_probs, rho)
    if validate:
        where = "kseq_acceptance_mass"
        rows = _check_kseq_inputs(nx, target_probs, draft_probs, k, where)
        raw = np.asarray(rho.detach().cpu() if hasattr(rho, "detach") else rho)
        if raw.dtype.kind not in "iuf" or raw.size == 0 or not np.all(np.isfinite(raw) & (raw > 0)):
            raise ValueError(f"{where}: rho must be a finite number > 0 (ρ* ∈ [1, k]) or one per row, got {rho!r}")
        try:
            np.broadcast_to(raw, rows)
        except ValueError:
            raise ValueError(f"{where}: rho of shape {raw.shape} does not broadcast to the rows {rows}") from None
    p, q = (normalise_rows(nx.asarray(x, x)) for x in (target_probs, draft_probs))
    r = nx.asarray(rho, p)[..., None]
    miss = nx.minimum(nx.sum(nx.maximum(q - p / r, 0.0)), 1.0)
    r = r[..., 0]
    beta = 1.0 - miss
    scale = nx.where(beta > 0, (1.0 - miss ** k) / (r * nx.where(beta > 0, beta, 1.0)), 0.0)
    return nx.minimum(r[..., None] * q, p) * scale[..., None]


def kseq_rule(ctx: NodeContext) -> NodeDecision:
    """SpecTr K-SEQ (§3.5): accept each child w.p. ``min(1, p(x)/(ρ* q(x)))``; all rejected:
    ``Y ~ norm(p − m)`` with ``m`` the accepted mass (= ``[p − ρ* q]_+`` at the exact root; ``p`` itself where
    round-off cancels all of it, :func:`~univer_theory.plans.base.residual_rows`)."""
    if ctx.target.dtype == object:
        raise Unsupported("kseq: ρ* is irrational in general; pass float64 rows, not Fractions")
    from .plans.base import residual_rows      # plans import this module (TV's plan)
    k = len(ctx.children)
    rho = kseq_rho_star(ctx.target, ctx.draft, k, validate=False)      # rows checked by validate_inputs
    enter = tuple(float(_ratio_min1(ctx.target[y], rho * ctx.draft[y])) for y in ctx.children)
    resid = normalise(residual_rows(ctx.target, kseq_acceptance_mass(ctx.target, ctx.draft, k, rho, False),
                                    np.float64(1.0)))
    return NodeDecision(enter, (1.0,) * k, 1.0, resid, {"rho_star": rho})


def tv_prefix_update(R, r):
    """TV's prefix scaling after a rejection: ``r ← R/(R + (1 − r))`` (0 when R = 0); ``(1 − r)`` first, since
    ``R + 1 − 1`` at r = 1 loses a tiny R."""
    return R / (R + (1 - r)) if R != 0 else 0 * R


def tv_residual_step(r, P, Q):
    """TV's residual after a rejected child: ``(R, P')`` with ``D = [rP − Q]_+``, ``R = ΣD`` and ``P' = D/R`` (``P``
    kept when ``R = 0``); exact for Fraction arrays."""
    D = positive_part(r * P - Q)
    R = D.sum()
    return R, (D / R if R != 0 else P)


def traversal_rule(ctx: NodeContext, parent_update=None, internal_residual=True) -> NodeDecision:
    """Traversal Verification at one node (§3.7), for iid or wor children.

    ``s_j = min(1, r·P(y_j)/Q(y_j))``; after child j fails: ``R = Σ[rP − Q]_+``, ``P ← [rP − Q]_+/R``,
    ``r ← R/(R + 1 − r)`` (``R = 0 → r ← 0``), and for wor ``Q ← norm(Q·1[≠y_j])``.  The node itself
    succeeds w.p. the final ``r`` and emits ``Y ~ P``.  ``parent_update`` / ``internal_residual`` exist only
    for the bug zoo (lossy variants (c), (d) of §3.9).
    """
    r, P, Q, rest = ctx.rho, ctx.target, ctx.draft, ctx.draft
    scale = []
    for y in ctx.children:
        scale.append(_ratio_min1(r * P[y], Q[y]))
        R, P_next = tv_residual_step(r, P, Q)
        r = tv_prefix_update(R, r) if parent_update is None else parent_update(R, r, Q[y])
        P = P_next
        if ctx.process == "wor":
            Q, rest = _without(rest, y)
    return NodeDecision((1,) * len(scale), tuple(scale), r, P if internal_residual else ctx.target)


# --------------------------------------------------------------------------------------------------------
# Verifier objects
# --------------------------------------------------------------------------------------------------------
def validate_inputs(where: str, tree: DraftTree, target_probs, draft_probs, process: str):
    """Shared input checks; returns ``(target_probs, draft_probs)`` as float64 or exact arrays."""
    if not isinstance(tree, DraftTree):
        raise ValueError(f"{where}: tree must be a DraftTree, got {type(tree).__name__}")
    check_choice(process, EXACT_PROCESSES, where, "process")
    p = check_simplex(target_probs, where, "target_probs")
    q = check_simplex(draft_probs, where, "draft_probs")
    if p.ndim != 2 or q.ndim != 2:
        raise ValueError(f"{where}: target_probs and draft_probs must be [N, V], got {p.shape} and {q.shape}")
    if p.shape != q.shape:
        raise ValueError(f"{where}: target_probs {p.shape} and draft_probs {q.shape} disagree (vocab or nodes)")
    if p.shape[0] != tree.num_nodes:
        raise ValueError(f"{where}: tree has {tree.num_nodes} nodes but target_probs has {p.shape[0]} rows")
    check_one_mode(p, q, where)
    tree.check_vocab(p.shape[1], where)
    for u in range(tree.num_nodes):
        S = tree.child_tokens(u)
        for c, y in zip(tree.children[u], S):
            if q[u, y] == 0:
                raise ValueError(f"{where}: node {c} drafts token {y} but its parent's draft_probs[{u}, {y}] = 0")
        if process != "iid" and len(set(S)) != len(S):
            raise ValueError(f"{where}: node {u} has duplicate children {S}, impossible under process {process!r}")
        if process == HUB and S and (len(S) != 2 or S[0] == S[1] or hub_token(q[u]) not in S):
            raise ValueError(f"{where}: node {u} children {S} are not a pair of distinct tokens containing the hub "
                             f"{hub_token(q[u])} (argmax of its draft row), as process 'hub' requires")
        if process in ("topk", "greedy") and S:
            m = len(S) if process == "topk" else len(S) - 1
            top = tuple(top_tokens(q[u], m).tolist()) if m else ()
            if tuple(S[:m]) != top:     # drafted most likely first: any other order has probability 0
                raise ValueError(f"{where}: node {u} children {S} do not begin with the top-{m} draft tokens "
                                 f"{top}, most likely first (ties to the lower id), as process {process!r} drafts "
                                 f"them")
    return p, q


@dataclass(frozen=True)
class Verifier:
    """A verifier given by a node rule (see :mod:`univer_theory.engine`).

    ``processes``: draft processes for which it is lossless; ``chain_only``: defined on chains only;
    ``widths``: the numbers of children an internal node may have (None: any); ``rational``: exact in Fraction
    mode; ``lossless``: False only for the bug zoo.
    """

    name: str
    rule: NodeRule
    processes: tuple[str, ...]
    description: str
    chain_only: bool = False
    rational: bool = True
    lossless: bool = True
    widths: tuple[int, ...] | None = None

    def _widths_ok(self, children) -> bool:
        return self.widths is None or all(len(c) in self.widths for c in children if c)

    def supports(self, shape, process: str) -> bool:
        return self.unsupported(shape, process) is None

    def unsupported(self, shape, process: str, exact: bool = False) -> str | None:
        """Why this verifier cannot run on ``shape`` (a shape or tree) with ``process`` (and Fraction rows when
        ``exact``), or None when it can."""
        if isinstance(shape, str):
            shape = as_shape(shape, f"{self.name}.unsupported")
        if process not in self.processes:
            return f"{self.name} is defined for processes {', '.join(self.processes)} only, got {process!r}"
        if self.chain_only and not shape.is_chain:
            return f"{self.name} is defined on chains only (every node ≤ 1 child)"
        if not self._widths_ok(shape.children):
            return f"{self.name} is defined for internal nodes with {self.widths} children only"
        if exact and not self.rational:
            return f"{self.name} has no exact rational form; pass float64 rows"
        return None

    def _check(self, tree, target_probs, draft_probs, process):
        where = f"{self.name}.verify"
        p, q = validate_inputs(where, tree, target_probs, draft_probs, process)
        why = self.unsupported(tree, process, p.dtype == object)
        if why:
            raise Unsupported(f"{where}: {why}")
        return p, q

    def law(self, tree, target_probs, draft_probs, process) -> dict:
        p, q = self._check(tree, target_probs, draft_probs, process)
        return engine.tree_law(tree, p, q, process, self.rule)

    def sample(self, tree, target_probs, draft_probs, process, rng: np.random.Generator):
        p, q = self._check(tree, target_probs, draft_probs, process)
        check_rng(rng, f"{self.name}.sample")
        return engine.tree_sample(tree, p, q, process, self.rule, rng)

    def expected_accepted_length(self, tree, target_probs, draft_probs, process):
        p, q = self._check(tree, target_probs, draft_probs, process)
        return engine.tree_expected_accepted(tree, p, q, process, self.rule)

    def trace(self, tree, target_probs, draft_probs, process) -> list[dict]:
        """Per node: ``ρ`` handed down and the rule's ``info`` (e.g. UniVer's α, construction and slot rule)."""
        p, q = self._check(tree, target_probs, draft_probs, process)
        rho, dec = engine.allocate(tree, p, q, process, self.rule)
        return [{"node": u, "rho": rho[u], **dec[u].info} for u in range(tree.num_nodes)]


class BlockVerifier(Verifier):
    """Block Verification on a chain ``x_1..x_γ`` (§3.6), implemented in its own backward form.

    ``w_0 = 1``, ``w_i = min(1, w_{i−1}·p(x_i|x^{i−1})/q(x_i|x^{i−1}))``, ``r_i = Σ_y [w_i p(y|x^i) − q(y|x^i)]_+``,
    ``h_i = r_i/(r_i + 1 − w_i)`` (i < γ), ``h_γ = w_γ``; going back from i = γ, accept ``x^i`` w.p. ``h_i``.
    ``Y ~ norm([w_τ p(·|x^τ) − q(·|x^τ)]_+)`` for τ < γ, ``p(·|x^γ)`` for τ = γ.  Not built on the engine,
    so that "TV == BV on chains" is a real cross-check.
    """

    def _stops(self, tree, p, q):
        gamma = tree.num_nodes - 1
        w = [Fraction(1) if p.dtype == object else 1.0]
        for i in range(1, gamma + 1):
            x = tree.token[i]
            w.append(_ratio_min1(w[i - 1] * p[i - 1, x], q[i - 1, x]))
        h, resid = [], []
        for i in range(gamma + 1):
            if i == gamma:
                h.append(w[i])
                resid.append(p[i])
                continue
            D = positive_part(w[i] * p[i] - q[i])
            r = D.sum()
            h.append(1 if i == 0 else (r / (r + (1 - w[i])) if r != 0 else 0 * r))
            resid.append(normalise(D) if r != 0 else p[i])    # all of D rounded away: Y ~ p (it lost the mass)
        probs, survive = [None] * (gamma + 1), 1
        for i in range(gamma, -1, -1):
            probs[i] = survive * h[i]
            survive = survive * (1 - h[i])
        return probs, resid

    def law(self, tree, target_probs, draft_probs, process):
        p, q = self._check(tree, target_probs, draft_probs, process)
        probs, resid = self._stops(tree, p, q)
        out = {}
        for tau, pr in enumerate(probs):
            if pr != 0:
                for y in np.flatnonzero(resid[tau] != 0):
                    out[tree.path(tau) + (int(y),)] = pr * resid[tau][y]
        return out

    def sample(self, tree, target_probs, draft_probs, process, rng):
        p, q = self._check(tree, target_probs, draft_probs, process)
        check_rng(rng, f"{self.name}.sample")
        probs, resid = self._stops(tree, p, q)
        tau = int(rng.choice(len(probs), p=np.asarray(probs, dtype=np.float64)))
        res = np.asarray(resid[tau], dtype=np.float64)
        return tuple(range(1, tau + 1)), int(rng.choice(res.size, p=res / res.sum()))

    def expected_accepted_length(self, tree, target_probs, draft_probs, process):
        p, q = self._check(tree, target_probs, draft_probs, process)
        probs, _ = self._stops(tree, p, q)
        return sum(i * pr for i, pr in enumerate(probs))


NSS = Verifier("nss", nss_rule, _ALL, "target-only: sample Y ~ p, descend if Y is a child (§3.1)")
SPS = Verifier("sps", rrs_rule, ("iid", "wor"), "token-level speculative sampling on a chain (§3.2)",
               chain_only=True)
RRS = Verifier("rrs", rrs_rule, ("iid",), "recursive rejection sampling, i.i.d. children (§3.3)")
RRSW = Verifier("rrsw", rrsw_rule, ("wor",), "recursive rejection sampling without replacement (§3.4)")
KSEQ = Verifier("kseq", kseq_rule, ("iid",), "SpecTr K-SEQ per node (§3.5)", rational=False)
BV = BlockVerifier("bv", None, ("iid", "wor"), "block verification on a chain (§3.6)", chain_only=True)
TV = Verifier("tv", traversal_rule, ("iid", "wor"), "traversal verification, any tree (§3.7)")

#: Every lossless baseline by its public (CLI / JSON) name.
VERIFIERS: dict[str, Verifier] = {v.name: v for v in (NSS, SPS, RRS, RRSW, KSEQ, BV, TV)}
#: Reference method of each draft process (the paper's baseline is RRSw for without-replacement drafts).
BASELINE = {"iid": "rrs", "wor": "rrsw", "topk": "nss", "greedy": "nss"}


#: The name of ``univer bound``'s value-aware oracle (:mod:`solvers.value_aware`), outside :data:`VERIFIERS`.
VALUE_AWARE = "univer-va"
#: Method names the CLI gives to verifiers outside :data:`VERIFIERS`: a registered verifier of the same name would
#: answer to it in ``univer exact`` and not in ``univer bound``.
RESERVED_NAMES = {VALUE_AWARE: "univer bound's value-aware oracle (solvers.value_aware)"}


def register(verifier: Verifier, replace: bool = False) -> Verifier:
    """Add ``verifier`` to :data:`VERIFIERS` under its name: how this package adds UniVer (the default
    :func:`make_univer_verifier`, not its variants), SpecHub and GR, and how a user adds a rule of their own — the CLI
    then takes its name in ``--methods`` (``univer --plugin FILE_OR_MODULE``, README "Adding a verifier").  A name
    already taken is a ValueError unless ``replace``: a silent replacement would change what a built-in name means
    in the exact core and not in :mod:`gpu`, whose methods are its own level rules.  So are the names in
    :data:`RESERVED_NAMES` and a name ``--methods`` could not select (empty, with a comma or surrounding spaces)."""
    if not isinstance(verifier, Verifier):
        raise ValueError(f"register: expected a Verifier, got {type(verifier).__name__}")
    name = verifier.name
    if not isinstance(name, str) or not name or name != name.strip() or "," in name:
        raise ValueError(f"register: a verifier's name must be a non-empty string without commas or surrounding "
                         f"spaces (--methods splits on commas and strips), got {name!r}")
    if name in RESERVED_NAMES:
        raise ValueError(f"register: {name!r} is {RESERVED_NAMES[name]}; pick another name")
    if name in VERIFIERS and not replace and VERIFIERS[name] is not verifier:
        raise ValueError(f"register: a verifier named {name!r} exists already; pick another name, or pass "
                         f"replace=True to replace it in the exact core (gpu.verify keeps its own {name!r})")
    VERIFIERS[name] = verifier
    return verifier


def get_verifier(name: str) -> Verifier:
    check_choice(name, VERIFIERS, "get_verifier", "method")
    return VERIFIERS[name]
