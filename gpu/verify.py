"""Public batched verifiers: validate once, then run the level rules (theory.md §3).

.. math::

    \\text{verify}(T_b, p, q) \\sim \\text{law}_{T_b}(\\text{path}, Y) \\quad\\text{independently for } b = 1..B

with the same per-tree law as ``univer_theory.get_verifier(method).law`` (up to float round-off: on a tree where a
residual ``[rP − Q]_+`` cancels to within an ulp at r = 1 (TV, RRS(w)), or a node's α lies within round-off of its
ρ ≈ 1 (UniVer, whose stop ``(ρ − α)/(1 − α)`` is then ill-conditioned), the per-tree E[τ | T] may differ by O(1) — on
trees of probability ≤ 1e-17 where found, so the law moved by at most that; docs/deviations.md item 108; TV on wor
children, where a child's ``r`` one ulp below 1 is divided by a rejected token's draft mass δ: ~1e-16/δ on a tree of
probability ~δ, 9.7e-10 at 4e-12 where item 117 found it, while the rows' reads and sibling steps rounded through the
reciprocal ``1/mass`` (items 138 and 141 removed that; 400 trees of that kind, V = 4, one-hot targets, show no gap
before or after them, so it was not re-found); and RRS(w), TV and UniVer on trees that draft tokens of draft
probability ≤ ~1e-10, items 140–142), and ``expected_accepted_length`` equal to
``Verifier.expected_accepted_length`` per tree (K-SEQ: up to its ρ*'s conditioning where p ≈ q,
:func:`univer_theory.verifiers.kseq_rho_star`).
"""
from __future__ import annotations

import torch

from univer_theory import PROCESSES, VERIFIERS
from univer_theory.orders import top_tokens
from univer_theory.validation import Unsupported, check_choice

from . import engine
from .engine import VerifyResult
from .probs import check_generator, check_row_dtypes, check_rows
from .multidraft_rule import gr_rule
from .rules import kseq_rule, nss_rule, rrs_rule, rrsw_rule, tv_rule
from .tree_batch import TreeBatch
from .univer_rule import univer_rule

#: Method name → level rule; the draft processes each supports are those of the exact twin in
#: :data:`univer_theory.VERIFIERS`.
METHODS = {"nss": nss_rule, "rrs": rrs_rule, "rrsw": rrsw_rule, "kseq": kseq_rule, "tv": tv_rule,
           "univer": univer_rule, "gr": gr_rule}

#: Methods whose level rule reads the children's subtree shapes (``LevelContext.child_shapes``); the others'
#: calls skip building them.
SHAPE_METHODS = ("univer",)

#: Methods whose level rule decides a node with ρ = 0 as never reached (children's scalings 0, enter 1, stop 0,
#: residual 0), so the engine leaves such rows unplanned (``reached_only`` of :func:`gpu.engine.allocate`: the same
#: law, and the same floats and draws but where it says): UniVer routes no ρ to the child of a pair that meets both
#: sides of the cut, and 4–13 of the 14–15 internal nodes of the benchmark's SmolLM2-drafted and Zipf-row trees at
#: top 1 024 are unreached.
REACHED_ONLY = ("univer",)

#: Methods whose level rule succeeds at every node it reaches (stop 1, children's scalings 1): a sample walks down
#: the path and plans only the nodes on it (:func:`gpu.engine.walk`: the same law, other draws), where
#: :func:`gpu.engine.sample` plans every internal node — on whole rows an RRSw verification of a binary depth-4
#: tree was 15 node plans, most of its time.
WALK = ("nss", "rrs", "rrsw", "kseq", "gr")

#: Walked methods whose level rule takes the walk's coins (``coins`` of :func:`gpu.engine.walk`): RRS(w) decides a
#: node's children only up to the first entered one and reads a row only where a child is rejected.
COINS = ("rrs", "rrsw")

#: Methods whose sample plans only the internal nodes its depth-first pass 2 enters (:func:`gpu.engine.traverse`: the
#: same law, other draws), where :func:`gpu.engine.sample` plans every reached one: TV, whose nodes can fail (on the
#: benchmark's Zipf-row trees 7–8 of a binary:4 tree's 15 internal nodes entered, 6.6 of the EAGLE-like tree's 14).
#: UniVer's pass 1 already leaves its unreached nodes unplanned (:data:`REACHED_ONLY`): traversed, its Zipf-row
#: verifications took 0.75–1.16× their time (B = 1 and 16, whole rows and top 1 024), the wor EAGLE-like tree at
#: top 1 024 and B = 1 — the one on the goal's line — 1.05×, so it keeps :func:`gpu.engine.sample`.
TRAVERSE = ("tv",)

#: Method → its row blocks on whole rows, on every device (``block_bytes`` of :func:`gpu.engine.allocate`; the
#: others take the engine's default: :data:`gpu.engine.CPU_BLOCK_BYTES` on the CPU, a whole level on an
#: accelerator).  UniVer's node plans hold ~20 whole-row temporaries and sort and walk each row, so at V = 49 152 a
#: block of one row runs whole-row verifications up to 30% faster than blocks of ten on the CPU, whose temporaries
#: outgrow the caches (docs/deviations.md item 53), and keeps an accelerator's memory near the rows' (on an H200 a
#: Zipf-row binary:4 wor tree's whole levels rose 89 MB over its 23 MB of rows, its one-row blocks 17 MB, item 69);
#: RRSw's and TV's rules stream their rows and lose 5–15% to a call a row.
BLOCK_BYTES = {"univer": 1 << 19}

#: Draft processes whose levels every method plans on the drafted tokens (:mod:`gpu.support`): with i.i.d. or
#: without-replacement children each rule reads an undrafted token only through their total target mass.
DRAFTED_SUPPORT = ("iid", "wor")


def undraftable(batch: TreeBatch, draft_rows: torch.Tensor,
                rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(bad, parent_row)``, both ``[B, N]``: ``bad`` marks the drafted nodes v whose token has draft probability
    0 in their parent's row, q(token_v | s(parent_v)) = 0 (a tuple the draft process never drafts);
    ``parent_row[b, v]`` is that row's number in ``draft_rows [R, V]``.  ``rows [B, N]``: the row of each node
    (:func:`gpu.engine.row_numbers`; tokens already checked to lie in ``[0, V)``)."""
    parent_row = rows.gather(1, batch.parent.clamp(min=0))
    q_tok = draft_rows[parent_row, batch.token.clamp(min=0)]                  # q(token | s(parent)) [B, N]
    return (batch.parent >= 0) & (q_tok == 0), parent_row


def validate_inputs(where: str, batch: TreeBatch, target_probs, draft_probs, process: str,
                    row_index: torch.Tensor | None = None, *, node_name=None) -> None:
    """Every per-batch input rule, each with its own ValueError (function, argument, rule, value).

    Shapes ``[B, N, V]`` agreeing with the batch (or ``[R, V]`` with ``row_index [B, N]`` in ``[0, R)`` on valid
    slots, every row then checked); float32 / float64, same dtype and device; V the batch's ``vocab_size`` when it
    declares one; valid rows on the simplex (:data:`gpu.probs.SIMPLEX_TOL`); token ids in ``[0, V)``;
    ``q(parent)[token] > 0`` for every drafted node (:func:`undraftable`); no duplicate siblings unless iid; topk /
    greedy children begin with the top-k / top-(k−1) draft tokens, most likely first (ties to the lower id).
    Padded slots' rows are ignored.  ``node_name(b, v)`` names node v of tree b in the messages (default
    ``tree b node v``): an engine adapter names it in its caller's arguments (``candidates[b, u]``).
    """
    label = node_name or (lambda b, v: f"tree {b} node {v}")
    if not isinstance(batch, TreeBatch):
        raise ValueError(f"{where}: batch must be a TreeBatch, got {type(batch).__name__}")
    check_choice(process, PROCESSES, where, "process")
    if row_index is not None:
        if not torch.is_tensor(row_index) or row_index.shape != batch.parent.shape or row_index.dtype != torch.long:
            raise ValueError(f"{where}: row_index must be a long tensor [B, N] = {list(batch.parent.shape)}")
    for name, x in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        if row_index is not None:
            if not torch.is_tensor(x) or x.ndim != 2:
                raise ValueError(f"{where}: with row_index, {name} must be [R, V] rows, got "
                                 f"{list(x.shape) if torch.is_tensor(x) else type(x).__name__}")
        elif not torch.is_tensor(x) or x.ndim != 3 or x.shape[:2] != batch.parent.shape:
            raise ValueError(f"{where}: {name} must be [B, N, V] with [B, N] = {list(batch.parent.shape)}, got "
                             f"{list(x.shape) if torch.is_tensor(x) else type(x).__name__}")
        if x.device != batch.device:
            raise ValueError(f"{where}: {name} is on {x.device} but the batch is on {batch.device}")
    if row_index is not None:
        R = target_probs.shape[0]
        if draft_probs.shape[0] != R:
            raise ValueError(f"{where}: with row_index, target_probs and draft_probs must hold the same rows, got "
                             f"{R} and {draft_probs.shape[0]}")
        bad = batch.valid & ((row_index < 0) | (row_index >= R))
        if bad.any():
            b, v = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"{where}: row_index[{b}, {v}] = {int(row_index[b, v])} is outside the {R} rows")
    if target_probs.shape != draft_probs.shape:
        raise ValueError(f"{where}: target_probs {list(target_probs.shape)} and draft_probs "
                         f"{list(draft_probs.shape)} disagree (vocab or nodes)")
    check_row_dtypes(where, target_probs, draft_probs)
    V = target_probs.shape[-1]
    if batch.vocab_size is not None and V != batch.vocab_size:
        raise ValueError(f"{where}: the batch declares vocab_size {batch.vocab_size} but the rows have V = {V}")
    valid = batch.valid if row_index is None else None
    check_rows(where, "target_probs", target_probs, valid)
    check_rows(where, "draft_probs", draft_probs, valid)
    q_flat = draft_probs.reshape(-1, V)
    rows = engine.row_numbers(batch, row_index).clamp(min=0)
    drafted = batch.parent >= 0
    bad = drafted & (batch.token >= V)
    if bad.any():
        b, v = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{where}: {label(b, v)} has token {int(batch.token[b, v])}, outside [0, {V})")
    par, tok = batch.parent.clamp(min=0), batch.token.clamp(min=0)
    bad, parent_row = undraftable(batch, q_flat, rows)
    if bad.any():
        b, v = (int(i) for i in bad.nonzero()[0])
        at = (f"{b}, {int(batch.parent[b, v])}" if row_index is None else f"{int(parent_row[b, v])}")
        raise ValueError(f"{where}: {label(b, v)} drafts token {int(batch.token[b, v])} but its parent's "
                         f"draft_probs[{at}, {int(batch.token[b, v])}] = 0")
    if process != "iid":
        same = ((batch.parent[:, :, None] == batch.parent[:, None, :])
                & (batch.token[:, :, None] == batch.token[:, None, :]))
        dup = (same & drafted[:, :, None]).triu(1).any(-1)
        if dup.any():
            b, v = (int(i) for i in dup.nonzero()[0])
            raise ValueError(f"{where}: {label(b, v)} has a sibling with the same token "
                             f"{int(batch.token[b, v])}, impossible under process {process!r}")
    if process in ("topk", "greedy"):
        k = batch.num_children.gather(1, par)
        m = k if process == "topk" else k - 1
        # child j < m must be the parent's j-th most likely draft token (ties to the lower id): the process drafts
        # them in that order, and any other order of the tuple has probability 0
        M = max(1, int(m.max()))
        top = top_tokens(q_flat, M)[parent_row]                              # [B, N, M]
        want = top.gather(-1, batch.sibling_rank.clamp(0, M - 1)[..., None])[..., 0]
        bad = drafted & (batch.sibling_rank < m) & (tok != want)
        if bad.any():
            b, v = (int(i) for i in bad.nonzero()[0])
            order = top_tokens(q_flat[parent_row[b, v]], V)
            rank = int((order == batch.token[b, v]).nonzero()[0, 0])
            j = int(batch.sibling_rank[b, v])
            raise ValueError(f"{where}: {label(b, v)} is child {j} of its parent with token "
                             f"{int(batch.token[b, v])} (draft rank {rank}), but process {process!r} drafts the "
                             f"top-{int(m[b, v])} draft tokens most likely first (ties to the lower id): child {j} "
                             f"must be token {int(want[b, v])}")


def _rule(where: str, method: str, process: str):
    check_choice(method, METHODS, where, "method")
    check_choice(process, PROCESSES, where, "process")
    if method not in VERIFIERS:
        raise ValueError(f"{where}: method {method!r} has a level rule in gpu.METHODS but no exact twin in "
                         f"univer_theory.VERIFIERS (register one: its processes and the tests' oracle come from it)")
    supported = VERIFIERS[method].processes
    if process not in supported:
        raise Unsupported(f"{where}: {method} is defined for processes {supported}, got {process!r}")
    return METHODS[method]


def engine_options(method: str, process: str) -> dict:
    """The engine's per-call settings for a method and process: plan on the drafted support
    (:data:`DRAFTED_SUPPORT`), build the subtree shapes (:data:`SHAPE_METHODS`), the row blocks
    (:data:`BLOCK_BYTES`), leave the unreached rows unplanned (:data:`REACHED_ONLY`)."""
    return {"drafted_support": process in DRAFTED_SUPPORT, "shapes": method in SHAPE_METHODS,
            "block_bytes": BLOCK_BYTES.get(method), "reached_only": method in REACHED_ONLY}


def _engine_inputs(where: str, target_probs, draft_probs) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows as the engine reads them: float32 / float64 of one dtype (checked with ``validate=False`` too),
    detached — a verification is a sampler, no gradient flows through it."""
    check_row_dtypes(where, target_probs, draft_probs)
    return target_probs.detach(), draft_probs.detach()


def verify(batch: TreeBatch, target_probs: torch.Tensor, draft_probs: torch.Tensor, process: str,
           method: str, generator: torch.Generator | None = None, validate: bool = True,
           row_index: torch.Tensor | None = None) -> VerifyResult:
    """One verification of every tree of ``batch``.

    Parameters
    ----------
    batch : TreeBatch with ``B`` trees of at most ``N`` nodes.
    target_probs, draft_probs : ``[B, N, V]`` float32 / float64; row u of tree b is ``p(·|s(u))`` /
        ``q(·|s(u))`` (padded rows ignored).  Leaves' draft rows are checked but unused.  A draft row with few
        positive entries (a truncated draft, :func:`gpu.probs.probs_from_logits` ``top=m``) makes an iid / wor level
        cost one pass over its draft rows and then O(m log m) per node instead of O(V log V) (:mod:`gpu.support`;
        the target's undrafted mass is then ``1 − Σ_drafted p`` unless that is small, and summed on a float32 row, so
        the law is exact for the row renormalised through its undrafted tokens: within ``|1 − Σ p|`` of p).
    process : draft process of the children (``iid``, ``wor``, ``topk``, ``greedy``).
    method : one of :data:`METHODS`; its processes are those of the exact twin in ``univer_theory``.
    generator : torch.Generator on the inputs' device (None: torch's default generator).
    validate : run :func:`validate_inputs` and check each residual the level rule hands back before drawing from it
        (finite, ≥ 0: a plugin rule's NaN residual drew token V) — skip only for inputs already checked and a rule
        already trusted (a serving loop: one pass over the drawn rows less); the dtypes are checked either way, and
        rows that require grad are read detached (no gradient flows through a verification).
    row_index : optional ``[B, N]`` long; then ``target_probs`` / ``draft_probs`` are ``[R, V]`` rows in any
        order and slot v of tree b reads row ``row_index[b, v]`` (so rows stored in another layout, e.g. a
        serving engine's, are read in place instead of copied into ``[B, N, V]``).

    Returns
    -------
    VerifyResult: ``accepted_nodes [B, D+1]`` (slot 0 = root, −1 padded), ``num_accepted [B]`` (τ),
    ``next_token [B]`` (Y).

    >>> from univer_theory import DraftTree
    >>> b = TreeBatch.from_trees([DraftTree.chain([1])])
    >>> p = torch.tensor([[[0.0, 1.0], [0.5, 0.5]]])
    >>> verify(b, p, p, "iid", "tv", torch.Generator().manual_seed(0)).num_accepted.tolist()
    [1]
    """
    rule = _rule("verify", method, process)
    target_probs, draft_probs = _engine_inputs("verify", target_probs, draft_probs)
    check_generator("verify", generator, target_probs.device)
    if validate:
        validate_inputs("verify", batch, target_probs, draft_probs, process, row_index)
    options = engine_options(method, process)
    if method in WALK:
        return engine.walk(batch, target_probs, draft_probs, process, rule, generator, row_index,
                           drafted_support=options["drafted_support"], block_bytes=options["block_bytes"],
                           coins=method in COINS, check_residuals=validate)
    if method in TRAVERSE:
        return engine.traverse(batch, target_probs, draft_probs, process, rule, generator, row_index,
                               drafted_support=options["drafted_support"], shapes=options["shapes"],
                               block_bytes=options["block_bytes"], check_residuals=validate)
    return engine.sample(batch, target_probs, draft_probs, process, rule, generator, row_index, **options,
                         check_residuals=validate)


def expected_accepted_length(batch: TreeBatch, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                             process: str, method: str, validate: bool = True,
                             row_index: torch.Tensor | None = None) -> torch.Tensor:
    """``E[τ | T_b]`` per tree ``[B]`` (analytic, no sampling; dtype of the inputs); arguments as :func:`verify`."""
    rule = _rule("expected_accepted_length", method, process)
    target_probs, draft_probs = _engine_inputs("expected_accepted_length", target_probs, draft_probs)
    if validate:
        validate_inputs("expected_accepted_length", batch, target_probs, draft_probs, process, row_index)
    return engine.expected_accepted(batch, target_probs, draft_probs, process, rule, row_index,
                                    **engine_options(method, process))
