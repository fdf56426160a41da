"""SGLang's tree-verification contract (sgl-kernel ``tree_speculative_sampling_target_only``) for every method.

Inputs, as SGLang's EAGLE worker holds them (``B`` requests, ``N`` draft-tree slots, vocabulary ``V``; integer
tensors int32 or int64, probabilities float32 / float64, all on one device)::

    candidates [B, N]            token of every slot; slot 0 is the root (the last verified token, not verified)
    retrive_index [B, N]         flat position of slot u in ``predicts`` (SGLang: b·N + u)
    retrive_next_token [B, N]    first child of u, −1 for none
    retrive_next_sibling [B, N]  next sibling of u, −1 for none (lists in drafting order; any slot order)
    target_probs [B, N, V]       p(·|s(u)): the target's next-token law after slot u
    draft_probs [B, N, V]        q(·|s(u)): the law u's children were drafted from (None: target-only only)

Outputs, filled exactly where the kernel fills them (path = accepted slots root first, τ = its drafted length,
Y = the correction or bonus token)::

    predicts [B·N] int32         predicts[retrive_index[b, path_i]] = candidates[b, path_{i+1}] (i < τ),
                                 predicts[retrive_index[b, path_τ]] = Y; every other entry untouched
    accept_index [B, S] int32    retrive_index[b, path_i] for i ≤ τ; entries beyond τ untouched
    accept_token_num [B] int32   τ

``S`` (``num_speculative_tokens``) is the width of ``accept_index``: a path holds at most ``S − 1`` drafted
tokens (the tree's depth must not exceed it).  Outputs created here start at −1, −1 and 0, as SGLang allocates
them.
"""
from __future__ import annotations

import operator
from typing import NamedTuple

import torch

from univer_theory.validation import Unsupported, check_choice
from univer_theory.verifiers import row_sums

from ..engine import VerifyResult
from ..probs import check_row_dtypes, check_rows, engine_rows
from ..tree_batch import TreeBatch, _as_long
from ..verify import undraftable, validate_inputs, verify

#: Method names; ``target-only`` is SGLang's name for ``nss``.
METHODS = ("nss", "target-only", "rrs", "rrsw", "tv", "univer")
#: Dtypes of the output buffers filled in place.
OUTPUT_DTYPES = (torch.int32, torch.int64)


class SGLangOutputs(NamedTuple):
    predicts: torch.Tensor
    accept_index: torch.Tensor
    accept_token_num: torch.Tensor


def uniform_draft_rows(target_probs: torch.Tensor) -> torch.Tensor:
    """A uniform ``q`` as a stride-0 view shaped like ``target_probs`` (no allocation of its size): stands in for
    the draft rows of a verifier that never reads them (target-only), with every token draftable."""
    V = target_probs.shape[-1]
    return torch.full((1,) * (target_probs.ndim - 1) + (V,), 1.0 / V, dtype=target_probs.dtype,
                      device=target_probs.device).expand(target_probs.shape)


def storage_rows(order: torch.Tensor) -> torch.Tensor:
    """``row_index [B, N]`` of the flat ``[B·N, V]`` rows: ``b·N + order[b, v]``, the row of storage slot
    ``order[b, v]`` (:meth:`gpu.TreeBatch.from_sglang`'s order) of request b."""
    B, N = order.shape
    return torch.arange(B, device=order.device)[:, None] * N + order


def tree_inputs(candidates, retrive_next_token, retrive_next_sibling, target_probs, draft_probs=None,
                where: str = "sglang.tree_inputs"):
    """SGLang's tensors → ``(batch, target_rows, draft_rows, row_index, order)`` for :func:`gpu.verify`: the
    trees in topological slot order (:meth:`gpu.TreeBatch.from_sglang`, ``order[b, v]`` = storage slot of slot
    v), the rows left where they are (``[B·N, V]`` views) and ``row_index[b, v] = b·N + order[b, v]``.
    ``draft_probs=None`` gives :func:`uniform_draft_rows` (for target-only)."""
    if not torch.is_tensor(target_probs) or target_probs.ndim != 3:
        raise ValueError(f"{where}: target_probs must be a [B, N, V] tensor, got "
                         f"{list(target_probs.shape) if torch.is_tensor(target_probs) else type(target_probs).__name__}")
    B, N, V = target_probs.shape
    token = _as_long(candidates, where, "candidates", target_probs.device)
    if token.shape != (B, N):
        raise ValueError(f"{where}: candidates must be [B, N] = {[B, N]}, got {list(token.shape)}")
    first = _as_long(retrive_next_token, where, "retrive_next_token", target_probs.device)
    sibling = _as_long(retrive_next_sibling, where, "retrive_next_sibling", target_probs.device)
    rooted = torch.cat([torch.full_like(token[:, :1], -1), token[:, 1:]], 1)          # slot 0: the root's −1
    try:
        batch, order = TreeBatch.from_sglang(first, sibling, rooted, vocab_size=V, return_order=True)
    except ValueError:          # a token outside the vocabulary, named in the caller's slots (the batch's reorder)
        bad = (token[:, 1:] < 0) | (token[:, 1:] >= V)
        if bad.any():
            b, u = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"{where}: candidates[{b}, {u + 1}] = {int(token[b, u + 1])} is outside the "
                             f"vocabulary [0, {V})") from None
        raise
    q = uniform_draft_rows(target_probs) if draft_probs is None else draft_probs
    if not torch.is_tensor(q) or q.shape != target_probs.shape:
        raise ValueError(f"{where}: draft_probs must be [B, N, V] = {list(target_probs.shape)}, got "
                         f"{list(q.shape) if torch.is_tensor(q) else type(q).__name__}")
    check_row_dtypes(where, target_probs, q)                                         # with validate=False too
    return batch, target_probs.reshape(B * N, V), q.reshape(B * N, V), storage_rows(order), order


def name_in_storage(where: str, batch: TreeBatch, order: torch.Tensor, target_probs, draft_probs) -> None:
    """Re-check, after :func:`gpu.verify` refused its inputs, the rows (``[B, N, V]``) and the drafted tokens in
    SGLang's own coordinates and raise the first problem found there: ``gpu.verify`` names a row of the flat
    ``[B·N, V]`` view and a node by the batch's reordered slot.  Returns when none is found (the caller then runs
    :func:`gpu.validate_inputs` naming nodes by their slots, and re-raises ``gpu.verify``'s own error if that
    passes).  Runs only on that error path."""
    check_rows(where, "target_probs", target_probs)
    check_rows(where, "draft_probs", draft_probs)
    B, N, V = draft_probs.shape
    bad, parent_row = undraftable(batch, draft_probs.reshape(B * N, V), storage_rows(order))
    if bad.any():
        b, v = (int(i) for i in bad.nonzero()[0])
        u, w, y = int(order[b, v]), int(parent_row[b, v]) - b * N, int(batch.token[b, v])
        raise ValueError(f"{where}: candidates[{b}, {u}] = {y} is drafted from slot {w}'s row, but "
                         f"draft_probs[{b}, {w}, {y}] = 0")


def int_argument(where: str, name: str, value, least: int) -> int:
    """``value`` as an int ≥ ``least`` (ints and numpy / torch integer scalars; not bools, floats or strings), else
    a ``ValueError`` naming ``name``."""
    try:
        n = operator.index(value) if not isinstance(value, bool) else least - 1
    except TypeError:
        n = least - 1
    if n < least:
        raise ValueError(f"{where}: {name} must be an int ≥ {least}, got {value!r}")
    return n


def check_integer_outputs(where: str, device: torch.device, **outputs) -> None:
    """Output buffers filled in place must be int32 / int64 tensors (the engines' own; a narrower one would wrap a
    token id or the −1 of "nothing accepted") on the inputs' ``device``, else a ``ValueError`` naming the first
    that is not."""
    for name, x in outputs.items():
        if not torch.is_tensor(x) or x.dtype not in OUTPUT_DTYPES or x.device != device:
            got = f"dtype {x.dtype} on {x.device}" if torch.is_tensor(x) else type(x).__name__
            raise ValueError(f"{where}: {name} must be an int32 or int64 tensor on {device}, got {got}")


def fill_outputs(result: VerifyResult, order: torch.Tensor, candidates, retrive_index,
                 predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor) -> None:
    """Write a verification (in the batch's slots; ``order`` maps them to storage slots) into SGLang's outputs
    in place, as the kernel does (see the module docstring)."""
    path = result.accepted_nodes
    path = torch.where(path >= 0, order.gather(1, path.clamp(min=0)), -1)
    _write(path, result.num_accepted, result.next_token, candidates, retrive_index, predicts, accept_index,
           accept_token_num)


def _write(path, tau, y, candidates, retrive_index, predicts, accept_index, accept_token_num) -> None:
    """``path [B, W]`` storage slots (−1 padded), τ, Y → the three outputs in place."""
    W = path.shape[1]
    ridx = torch.as_tensor(retrive_index, device=path.device).long()
    cand = torch.as_tensor(candidates, device=path.device).long()
    here = path >= 0
    accept_index[:, :W] = torch.where(here, ridx.gather(1, path.clamp(min=0)), accept_index[:, :W])
    # position i writes the token after path_i (i < τ) or Y (i = τ); positions past τ repeat position τ's write
    i = torch.arange(W, device=path.device)
    at = path.gather(1, torch.minimum(i[None, :], tau[:, None]))
    after = torch.cat([path[:, 1:], path[:, :1]], 1).clamp(min=0)
    val = torch.where(i[None, :] < tau[:, None], cand.gather(1, after), y[:, None])
    predicts.view(-1).scatter_(0, ridx.gather(1, at).reshape(-1), val.reshape(-1).to(predicts.dtype))
    accept_token_num.copy_(tau)


def target_only_coins(candidates, retrive_next_token, retrive_next_sibling, target_probs, uniform_samples,
                      uniform_samples_for_final_sampling, num_speculative_tokens: int):
    """SGLang's target-only procedure (thresholds 1, 1) on its own coins, in storage slots:
    ``(path [B, S], τ [B], Y [B])``.

    At node u with coin ``c = uniform_samples[b, u]`` the children y_1, y_2, … are tried in list order with
    running sum ``A_j = Σ_{l≤j} P(y_l)`` and y_j is accepted iff ``c ≤ A_j`` (or ``P(y_j) ≥ 1``); a rejected
    token's mass leaves ``P``.  The stop node's ``Y`` is the inverse CDF of ``P`` (its rejected tokens zeroed)
    at ``uniform_samples_for_final_sampling[b]·ΣP``.  With distinct siblings this is the kernel coin for coin,
    except that a child with ``P(y) = 0`` is never accepted (the kernel takes it on a coin of exactly 0, which a
    float32 ``torch.rand`` draws with probability 2^-24) and that the last untried token of positive mass is taken on
    any coin (a coin of 1 above a running sum that misses 1 by round-off); a duplicate sibling has ``P(y) = 0`` here
    too, which keeps the law target-only's (§3.1).
    """
    p = target_probs
    B, N, V = p.shape
    dev = p.device
    first, nxt = (torch.as_tensor(x, device=dev).long() for x in (retrive_next_token, retrive_next_sibling))
    cand = torch.as_tensor(candidates, device=dev).long()
    U = uniform_samples.to(torch.float64)
    rows = torch.arange(B, device=dev)

    def node(at, u):
        """``(ΣP, support size)`` of the rows ``u`` of the trees ``at`` in float64, the sum ``normalise_rows``
        divides by (:func:`~univer_theory.verifiers.row_sums`: ``p/ΣP`` are its floats): every row is read on its
        simplex row — a valid row may miss 1 by its dtype's tolerance, and a coin in (ΣP, 1] then rejected children
        covering its support and emitted token V − 1, of p = 0.  Read once per node a tree enters: no [B, N, V]
        copy, no pass over a row never reached."""
        x = p[at, u].to(torch.float64)
        return row_sums(x)[:, 0], x.sign().sum(-1)                                   # x ≥ 0 (checked rows)

    S = num_speculative_tokens
    path = torch.full((B, S), -1, dtype=torch.long, device=dev)
    path[:, 0] = 0
    cur, tau = torch.zeros(B, dtype=torch.long, device=dev), torch.zeros(B, dtype=torch.long, device=dev)
    child, coin = first[:, 0], U[:, 0]
    acc = torch.zeros(B, dtype=torch.float64, device=dev)
    tried = torch.zeros(B, V, dtype=torch.bool, device=dev)
    spent = torch.zeros(B, dtype=torch.long, device=dev)        # tried tokens of positive mass at the current node
    total, size = node(rows, cur)                                # of the current node
    live = (child >= 0) & (tau < S - 1)
    for _ in range(N - 1):          # every try is a distinct node
        c = child.clamp(min=0)
        y = torch.where(live, cand.gather(1, c[:, None]).squeeze(1), 0)     # the root's candidate is never read
        p_y = torch.where(tried[rows, y], 0, p[rows, cur, y].to(torch.float64) / total)
        acc_y = acc + p_y
        # y the last untried token of positive mass: taken on any coin (the running sum of a row on the simplex may
        # still miss 1 by its round-off, and a coin of 1 then rejected the whole support)
        last = size - spent == 1
        take = live & ((((coin <= acc_y) | last) & (p_y > 0)) | (p_y >= 1))
        drop = live & ~take
        tried[rows, y] |= drop
        tried &= ~take[:, None]
        spent = torch.where(take, 0, spent + (drop & (p_y > 0)))
        tau = tau + take
        path[rows, tau] = torch.where(take, c, path[rows, tau])
        cur = torch.where(take, c, cur)
        moved = take.nonzero().squeeze(1)                       # host read: the trees that entered a child
        if moved.shape[0]:
            total[moved], size[moved] = node(moved, cur[moved])
        coin = torch.where(take, U[rows, c], coin)
        acc = torch.where(take, 0, torch.where(drop, acc_y, acc))
        child = torch.where(take, first[rows, c], torch.where(drop, nxt[rows, c], child))
        live = live & (child >= 0) & (tau < S - 1)
    rest = torch.where(tried, 0, p[rows, cur].to(torch.float64) / total[:, None])
    cdf = rest.cumsum(-1)
    u = uniform_samples_for_final_sampling.to(torch.float64)[:, None] * cdf[:, -1:]
    y = torch.searchsorted(cdf, u, right=True).squeeze(1)
    last = torch.where(rest > 0, torch.arange(V, device=dev), -1).amax(-1)
    y = torch.where(y < V, y, torch.where(last >= 0, last, V - 1))
    return path, tau, y


def verify_tree(candidates, retrive_index, retrive_next_token, retrive_next_sibling, target_probs,
                draft_probs=None, *, method: str = "nss", process: str | None = None, uniform_samples=None,
                uniform_samples_for_final_sampling=None, generator: torch.Generator | None = None,
                num_speculative_tokens: int | None = None, predicts=None, accept_index=None,
                accept_token_num=None, validate: bool = True) -> SGLangOutputs:
    """One verification of every draft tree, with SGLang's tensors in and out (module docstring).

    Parameters
    ----------
    method : ``nss`` (= ``target-only``, SGLang's own verifier), ``rrs`` (i.i.d. children), ``rrsw`` (children
        without replacement), ``tv``, ``univer`` (either).  All but ``nss`` read ``draft_probs`` (required); ``nss``
        ignores them (SGLang passes a zero placeholder) and ``process``: it is lossless on any tree.
    process : how each node's children were drafted (``iid``, ``wor``, ``topk``, ``greedy``); default ``wor``
        for ``rrsw``, ``iid`` otherwise.
    uniform_samples [B, N], uniform_samples_for_final_sampling [B] : SGLang's coins (float32 or float64); only for
        ``nss``, without a generator, which then runs :func:`target_only_coins` (the kernel's procedure; each row
        read on its float64 simplex row, as :func:`gpu.verify` reads float32 rows: as given, a row within
        ``SIMPLEX_TOL`` of 1 moved a child's acceptance by its defect).  Otherwise the randomness comes from
        ``generator`` (a torch.Generator on the inputs' device; None: torch's default).
    num_speculative_tokens : ``S``; default ``accept_index``'s width if given, else the deepest tree + 1.
    predicts, accept_index, accept_token_num : output tensors filled in place (created if None).
    validate : check the probability rows (:func:`gpu.validate_inputs`); float32 rows within the float32 rounding of
        their sum are renormalised first (:func:`gpu.probs.engine_rows`); the links are always checked.
    """
    where = "sglang.verify_tree"
    check_choice(method, METHODS, where, "method")
    method = "nss" if method == "target-only" else method
    if method == "nss":
        draft_probs, process = None, "iid"
    elif draft_probs is None:
        raise ValueError(f"{where}: method {method!r} reads the draft rows the tree was drafted from; "
                         f"draft_probs=None (SGLang's placeholder) is verified by 'nss' (target-only) only")
    batch, p, q, row_index, order = tree_inputs(candidates, retrive_next_token, retrive_next_sibling,
                                                target_probs, draft_probs, where)
    B, N = target_probs.shape[:2]
    dev = target_probs.device
    if validate:                            # an engine's float32 rows as the laws its sampler draws from (every
        p = engine_rows(p)                  # storage slot is a node: from_sglang is given no padding)
        q = q if draft_probs is None else engine_rows(q)
    S = None if num_speculative_tokens is None else int_argument(where, "num_speculative_tokens",
                                                                 num_speculative_tokens, 1)
    if accept_index is not None:
        if not torch.is_tensor(accept_index) or accept_index.ndim != 2:
            raise ValueError(f"{where}: accept_index must be an int32 or int64 tensor [B, S], got "
                             f"{type(accept_index).__name__}")
        if S is not None and accept_index.shape[1] != S:
            raise ValueError(f"{where}: accept_index has width {accept_index.shape[1]} but num_speculative_tokens "
                             f"= {S}; they are the same S")
        S = accept_index.shape[1]
    elif S is None:
        S = batch.max_depth + 1
    if batch.max_depth > S - 1:
        raise ValueError(f"{where}: a tree has depth {batch.max_depth} but num_speculative_tokens = {S} leaves "
                         f"room for {S - 1} drafted tokens")
    predicts = torch.full((B * N,), -1, dtype=torch.int32, device=dev) if predicts is None else predicts
    accept_index = torch.full((B, S), -1, dtype=torch.int32, device=dev) if accept_index is None else accept_index
    accept_token_num = torch.zeros(B, dtype=torch.int32, device=dev) if accept_token_num is None else accept_token_num
    check_integer_outputs(where, dev, predicts=predicts, accept_index=accept_index, accept_token_num=accept_token_num)
    if predicts.ndim > 1 and not predicts.is_contiguous():
        raise ValueError(f"{where}: predicts must be 1-D or contiguous (it is written through a flat view), got a "
                         f"{list(predicts.shape)} tensor with strides {list(predicts.stride())}")
    ridx = _as_long(retrive_index, where, "retrive_index", dev)
    if accept_index.shape != (B, S) or accept_token_num.shape != (B,) or ridx.shape != (B, N):
        raise ValueError(f"{where}: accept_index must be [B, S] = [{B}, {S}], accept_token_num [B] and "
                         f"retrive_index [B, N] = [{B}, {N}], got {list(accept_index.shape)}, "
                         f"{list(accept_token_num.shape)}, {list(ridx.shape)}")
    if ((ridx < 0) | (ridx >= predicts.numel())).any():
        raise ValueError(f"{where}: retrive_index entries must lie in [0, {predicts.numel()}) (predicts' size)")
    if ridx.flatten().unique().numel() != ridx.numel():
        raise ValueError(f"{where}: retrive_index entries must be distinct (each slot writes its own predicts entry; "
                         f"SGLang's are b·N + u)")
    if uniform_samples is not None:
        if method != "nss":
            raise ValueError(f"{where}: uniform_samples drive only the target-only procedure (method 'nss'); "
                             f"pass a torch.Generator for method {method!r}")
        if generator is not None:
            raise ValueError(f"{where}: a generator and uniform_samples given: SGLang's coins draw every decision, "
                             f"so the generator would be ignored; pass one or the other")
        U, Uf = uniform_samples, uniform_samples_for_final_sampling
        if not (torch.is_tensor(U) and torch.is_tensor(Uf)) or U.shape != (B, N) or Uf.shape != (B,):
            raise ValueError(f"{where}: uniform_samples must be a [B, N] = [{B}, {N}] tensor and "
                             f"uniform_samples_for_final_sampling a [B] = [{B}] tensor")
        for name, coins in (("uniform_samples", U), ("uniform_samples_for_final_sampling", Uf)):
            if coins.dtype not in (torch.float32, torch.float64) or coins.device != dev:
                # (the kernel's own are float32; a bfloat16 / float16 coin lies on a 2^-8 / 2^-11 grid, which moves
                # a child's acceptance P(c ≤ A) off A by up to half a grid step)
                raise ValueError(f"{where}: {name} must be a float tensor (float32 or float64) on {dev}, got "
                                 f"{coins.dtype} on {coins.device}")
            if not bool(((coins >= 0) & (coins <= 1)).all()):
                raise ValueError(f"{where}: {name} has an entry outside [0, 1] (or NaN): coins are uniforms")
        if validate:                                         # (no gpu.verify on this path to check them)
            check_rows(where, "target_probs", p.reshape(B, N, -1))
        path, tau, y = target_only_coins(candidates, retrive_next_token, retrive_next_sibling, p.reshape(B, N, -1),
                                         U, Uf, S)
        _write(path, tau, y, candidates, ridx, predicts, accept_index, accept_token_num)
    else:
        if uniform_samples_for_final_sampling is not None:
            raise ValueError(f"{where}: uniform_samples_for_final_sampling given without uniform_samples: SGLang's "
                             f"coins come as a pair (method 'nss'); otherwise the generator draws every coin")
        if process is None:
            process = "wor" if method == "rrsw" else "iid"
        try:
            result = verify(batch, p, q, process, method, generator, validate, row_index)
        except ValueError as err:
            if validate and not isinstance(err, Unsupported):    # (an uncovered process is the answer, rows or not)
                name_in_storage(where, batch, order, p.reshape(B, N, -1), q.reshape(B, N, -1))
                validate_inputs(where, batch, p, q, process, row_index,            # a node's rule, by its slot
                                node_name=lambda b, v: f"candidates[{b}, {int(order[b, v])}]")
            raise
        fill_outputs(result, order, candidates, ridx, predicts, accept_index, accept_token_num)
    return SGLangOutputs(predicts, accept_index, accept_token_num)
