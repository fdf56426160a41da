"""vLLM's rejection-sampler contract (``vllm.v1.sample.rejection_sampler.RejectionSampler``) for chain and
multi-draft verification.

Inputs, as vLLM's spec-decode path holds them (``B`` requests, ``T`` draft tokens in all, vocabulary ``V``)::

    draft_token_ids [T]          the requests' draft tokens, concatenated
    cu_num_draft_tokens [B]      cumulative draft counts (request b owns tokens cu[b−1]..cu[b]−1)
    draft_probs [T, V] or None   q(·) each draft token was drawn from; None: argmax (greedy) drafts
    target_probs [T, V]          p(·) at each draft token's position (the law it is verified against)
    bonus_token_ids [B, m]       a token drawn from p after the whole draft (vLLM's bonus sample; one per chain;
                                 [B] for one chain)

Output ``output_token_ids [B, max_spec_len + 1]`` int32: the accepted draft tokens, then the correction (or, all
accepted, the bonus) token, then :data:`PLACEHOLDER_TOKEN_ID`.

With ``num_drafts = m > 1`` each request's slice holds ``m`` chains of equal length ``L`` one after the other
(``m·L`` tokens; every chain's first row is the same ``p``/``q`` of the request's position); they form a tree
whose root has ``m`` children, each heading its chain, and ``max_spec_len`` counts one chain.  The bonus row of
chain c is ``bonus_token_ids[:, c]``.
"""
from __future__ import annotations

import numbers
from collections.abc import Mapping

import torch

from univer_theory.validation import check_choice

from ..engine import VerifyResult
from ..probs import SIMPLEX_TOL, check_generator, engine_rows
from ..tree_batch import TreeBatch, _as_long
from ..verify import validate_inputs, verify
from .sglang import check_integer_outputs, int_argument, uniform_draft_rows

#: vLLM's marker for rejected output slots.
PLACEHOLDER_TOKEN_ID = -1
#: Method → gpu method: ``sps`` is vLLM's token-level rule (RRS with one child per node), ``bv`` block
#: verification (TV on a chain); ``sps`` and ``bv`` need ``num_drafts = 1``.
METHODS = {"sps": "rrs", "bv": "tv", "rrs": "rrs", "rrsw": "rrsw", "tv": "tv", "univer": "univer"}


def draft_token_name(cu_num_draft_tokens):
    """``node_name`` of :func:`gpu.validate_inputs` in vLLM's arguments: node v ≥ 1 of request b holds
    ``draft_token_ids[t]``, t = the request's first draft position + v − 1 (:func:`tree_inputs`' slots); the offsets
    are read only when a message is formed."""
    def name(b: int, v: int) -> str:
        cu = torch.as_tensor(cu_num_draft_tokens).reshape(-1)
        return f"draft_token_ids[{(int(cu[b - 1]) if b else 0) + v - 1}]"
    return name


def tree_inputs(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids,
                num_drafts: int = 1, where: str = "vllm.tree_inputs"):
    """vLLM's tensors → ``(batch, target_rows, draft_rows, row_index, lengths, bonus)`` for :func:`gpu.verify`
    (the rows read in place), ``N = 1 +`` the largest draft count, ``lengths [B]`` the chain length L of each
    request, ``bonus [B, num_drafts]``.

    Request b's tree: slot 0 the root, chain c's i-th token at slot ``1 + c·L + i``.  Slot s reads the rows of
    the draft token drafted *from* it (a chain's first token: the root's rows, chain 0's copy).  A chain's
    last slot (and the root of a request without drafts) reads any row of its request: the engine's draw there
    is replaced by the chain's bonus token (:func:`output_tokens`).  ``draft_probs=None`` gives
    :func:`gpu.engines.sglang.uniform_draft_rows` (read only by target-only, vLLM's rule for argmax drafts).
    """
    if not torch.is_tensor(target_probs) or target_probs.ndim != 2:
        raise ValueError(f"{where}: target_probs must be a [T, V] tensor")
    if target_probs.dtype not in SIMPLEX_TOL:
        raise ValueError(f"{where}: target_probs must be float32 or float64 probabilities, got {target_probs.dtype}")
    dev = target_probs.device
    tok = _as_long(draft_token_ids, where, "draft_token_ids", dev).reshape(-1)
    T, V = tok.shape[0], target_probs.shape[1]
    if target_probs.shape[0] != T:
        raise ValueError(f"{where}: target_probs must hold one row per draft token, [T, V] = [{T}, {V}] "
                         f"(draft_token_ids holds T = {T}), got {list(target_probs.shape)}")
    cu = _as_long(cu_num_draft_tokens, where, "cu_num_draft_tokens", dev).reshape(-1)
    bonus = _as_long(bonus_token_ids, where, "bonus_token_ids", dev)
    m = int_argument(where, "num_drafts", num_drafts, 1)
    B = cu.shape[0]
    bonus = bonus[:, None] if m == 1 and bonus.shape == (B,) else bonus      # one chain: [B] as [B, 1]
    if B == 0 or bonus.shape != (B, m):
        raise ValueError(f"{where}: need cu_num_draft_tokens [B ≥ 1] and bonus_token_ids [B, num_drafts] = "
                         f"[{B}, {m}], got {list(cu.shape)} and {list(bonus.shape)}")
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    if (counts < 0).any() or int(cu[-1]) != T or (counts % m != 0).any():
        raise ValueError(f"{where}: cu_num_draft_tokens {cu.tolist()} must be non-decreasing, end at T = {T} and "
                         f"give each request a multiple of num_drafts = {m} tokens")
    if draft_probs is not None and (not torch.is_tensor(draft_probs) or draft_probs.shape != (T, V)):
        raise ValueError(f"{where}: draft_probs must be None or [T, V] = [{T}, {V}]")
    if draft_probs is None and m > 1:
        raise ValueError(f"{where}: argmax drafts (draft_probs=None) give one chain; num_drafts must be 1")
    if ((bonus < 0) | (bonus >= V)).any():
        raise ValueError(f"{where}: bonus_token_ids must lie in [0, {V})")
    L = counts // m
    N = 1 + int(counts.max())
    # every draft token t: request, chain c, position i → its slot and the slot whose rows it carries
    t = torch.arange(T, device=dev)
    req = torch.searchsorted(cu, t, right=True)
    start = cu - counts
    j = t - start[req]
    c, i = j // L[req].clamp(min=1), j % L[req].clamp(min=1)
    parent = torch.full((B * N,), -1, dtype=torch.long, device=dev)
    token = torch.full((B * N,), -1, dtype=torch.long, device=dev)
    parent[req * N + 1 + j] = torch.where(i == 0, 0, j)
    token[req * N + 1 + j] = tok
    try:
        batch = TreeBatch.from_tensors(parent.view(B, N), token.view(B, N), counts + 1, vocab_size=V)
    except ValueError:          # a token outside the vocabulary, named in the caller's positions (the batch's slots)
        bad = (tok < 0) | (tok >= V)
        if bad.any():
            at = int(bad.nonzero()[0, 0])
            raise ValueError(f"{where}: draft_token_ids[{at}] = {int(tok[at])} is outside the vocabulary "
                             f"[0, {V})") from None
        raise
    # rows: a slot reads its child's row; leaves (and padding) read the request's first row (row 0 if it has none)
    row_index = torch.where(counts > 0, start, 0)[:, None].expand(B, N + 1).contiguous()
    carries = (i > 0) | (c == 0)
    at = torch.where(carries, req * (N + 1) + torch.where(i == 0, 0, j), B * (N + 1))
    flat = torch.cat([row_index.view(-1), row_index.new_zeros(1)])
    flat[at] = t
    row_index = flat[:-1].view(B, N + 1)[:, :N]
    q = uniform_draft_rows(target_probs) if draft_probs is None else draft_probs
    return batch, target_probs, q, row_index, L, bonus


def _check_shared_heads(where: str, lengths: torch.Tensor, m: int, **rows) -> None:
    """With ``m = num_drafts > 1`` every chain's first token is drawn at the request's one position, so its
    rows must be chain 0's copy (the rows the tree's root reads, :func:`tree_inputs`): a ``ValueError`` naming the
    first request, chain and row that differ (a drafted token's ``q > 0`` is then checked on the copy read)."""
    counts = lengths * m
    start = torch.cumsum(counts, 0) - counts
    req = (lengths > 0).nonzero().squeeze(1)
    heads = start[req, None] + torch.arange(1, m, device=lengths.device) * lengths[req, None]    # [B', m − 1]
    for name, x in rows.items():
        if x is None or req.numel() == 0:
            continue
        same = (x[heads] == x[start[req]][:, None]).all(-1)
        if not bool(same.all()):
            b, c = (~same).nonzero()[0].tolist()
            raise ValueError(f"{where}: {name}[{int(heads[b, c])}] (request {int(req[b])}, chain {c + 1}'s first "
                             f"token) differs from chain 0's row {int(start[req[b]])}: with num_drafts = {m} every "
                             f"chain's first token is drawn at the request's one position, from one row")


def output_tokens(batch: TreeBatch, result: VerifyResult, lengths: torch.Tensor, bonus: torch.Tensor,
                  width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output_token_ids [B, width] int32, chain [B])``: accepted tokens, then ``Y`` — the bonus token of the
    accepted chain when the whole chain is accepted — then :data:`PLACEHOLDER_TOKEN_ID`; ``chain`` the index of
    the accepted chain (−1 when no token is accepted)."""
    B = batch.batch_size
    tau = result.num_accepted
    first = result.accepted_nodes[:, min(1, batch.max_depth)]
    chain = torch.where(tau > 0, (first - 1) // lengths.clamp(min=1), -1)
    y = torch.where(tau == lengths, bonus.gather(1, chain.clamp(min=0)[:, None]).squeeze(1), result.next_token)
    out = torch.full((B, width), PLACEHOLDER_TOKEN_ID, dtype=torch.int32, device=batch.device)
    out[:, :batch.max_depth] = result.accepted_tokens(batch).to(torch.int32)
    out.scatter_(1, tau[:, None], y[:, None].to(torch.int32))
    return out, chain


def seeded_groups(where: str, generators, batch: TreeBatch, generator: torch.Generator | None):
    """``[(requests, N, generator)]``: the requests vLLM seeds (``generators``, as ``sampling_metadata.generators``
    holds them: request index → its own ``torch.Generator``) one at a time, each on its own ``N`` slots and with
    its own generator — so its coins, and its output, do not depend on the rest of the batch —, then the others
    together on their slots with ``generator`` (``requests`` None: the whole batch, on all its slots)."""
    num_nodes = batch.num_nodes
    B, dev = num_nodes.shape[0], num_nodes.device
    if generators is not None and not isinstance(generators, Mapping):
        raise ValueError(f"{where}: generators must map request indices to torch.Generator, got "
                         f"{type(generators).__name__}")
    if not generators:
        return [(None, batch.max_nodes, generator)]
    for b, g in generators.items():
        if isinstance(b, bool) or not isinstance(b, numbers.Integral) or not 0 <= b < B:
            raise ValueError(f"{where}: generators' key {b!r} is not a request index in [0, {B})")
        check_generator(where, g, dev, f"generators[{b}]", optional=False)
    groups = [(torch.tensor([int(b)], device=dev), int(num_nodes[int(b)]), g) for b, g in sorted(generators.items())]
    rest = torch.tensor([b for b in range(B) if b not in generators], dtype=torch.long, device=dev)
    if rest.numel():
        groups.append((rest, int(num_nodes[rest].max()), generator))
    return groups


def rejection_sample(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids,
                     generator: torch.Generator | None = None, *, method: str = "sps", num_drafts: int = 1,
                     process: str | None = None, max_spec_len: int | None = None, accepted_draft=None,
                     generators=None, validate: bool = True) -> torch.Tensor:
    """``output_token_ids [B, max_spec_len + 1]`` int32 as vLLM's ``RejectionSampler`` returns them
    (module docstring for the inputs).

    Parameters
    ----------
    method : ``sps`` (vLLM's own rule; target-only for argmax drafts), ``bv`` (block verification), and for
        ``num_drafts > 1`` ``rrs`` (``process`` iid), ``rrsw`` (wor), ``tv`` or ``univer`` (either).
    process : how the ``num_drafts`` chains' first tokens were drawn (``iid`` or ``wor``); chains below the root
        have one child per node.  Default ``wor`` for ``rrsw``, ``iid`` otherwise; with one chain every node has
        one child, where the two are one law, so it is then the method's own.
    max_spec_len : output width − 1 (default: the longest chain).
    accepted_draft : optional ``[B]`` integer tensor on the inputs' device, filled in place with the chain index
        of the accepted path (−1 when no draft token is accepted).
    generators : optional ``{request index: torch.Generator}``, vLLM's ``sampling_metadata.generators`` (the
        requests with a seed): each such request is verified on its own with its own generator, so its output
        depends only on its rows and its generator's state, not on the batch it is in (vLLM's seeded requests
        are reproducible the same way); the other requests draw from ``generator``.
    validate : check the probability rows (:func:`gpu.validate_inputs`); float32 rows within the float32 rounding of
        their sum are renormalised first (:func:`gpu.probs.engine_rows`).
    """
    where = "vllm.rejection_sample"
    check_choice(method, METHODS, where, "method")
    int_argument(where, "num_drafts", num_drafts, 1)
    if method in ("sps", "bv") and num_drafts != 1:
        raise ValueError(f"{where}: method {method!r} verifies one chain; use rrs, rrsw, tv or univer for "
                         f"num_drafts = {num_drafts}")
    if draft_probs is None and method != "sps":
        raise ValueError(f"{where}: argmax drafts (draft_probs=None) are verified by 'sps' (target-only); "
                         f"{method!r} needs draft_probs")
    if process is not None:
        check_choice(process, ("iid", "wor"), where, "process")
    batch, p, q, row_index, L, bonus = tree_inputs(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs,
                                                   bonus_token_ids, num_drafts, where)
    if accepted_draft is not None:
        check_integer_outputs(where, p.device, accepted_draft=accepted_draft)
        if accepted_draft.shape != (batch.batch_size,):
            raise ValueError(f"{where}: accepted_draft must be [B] = [{batch.batch_size}], got "
                             f"{list(accepted_draft.shape)}")
    if process is None or num_drafts == 1:
        process = "wor" if METHODS[method] == "rrsw" else "iid"
    if validate:                            # an engine's float32 rows as the laws its sampler draws from
        p = engine_rows(p)
        q = q if draft_probs is None else engine_rows(q)
    if validate and num_drafts > 1:
        _check_shared_heads(where, L, num_drafts, target_probs=p, draft_probs=None if draft_probs is None else q)
    width = batch.max_depth if max_spec_len is None else int_argument(where, "max_spec_len", max_spec_len, 0)
    if width < batch.max_depth:
        raise ValueError(f"{where}: max_spec_len = {width} is shorter than a chain ({batch.max_depth} tokens)")
    B = batch.batch_size
    groups = seeded_groups(where, generators, batch, generator)
    out = torch.full((B, width + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32, device=p.device)
    out[:, 0] = bonus[:, 0].to(torch.int32)           # a request without drafts emits its bonus token
    chain = torch.full((B,), -1, dtype=torch.long, device=p.device)
    if p.shape[0]:
        gpu_method = "nss" if draft_probs is None else METHODS[method]
        if validate:
            validate_inputs(where, batch, p, q, process, row_index, node_name=draft_token_name(cu_num_draft_tokens))
        for req, N, gen in groups:
            if req is not None and N == 1:  # a seeded request without drafts draws no coin, in a batch as alone
                continue                    # (and as vLLM, whose seeded uniforms skip such requests)
            every = slice(None) if req is None else req
            sub = batch if req is None else TreeBatch(batch.parent[req, :N], batch.token[req, :N],
                                                      batch.num_nodes[req], batch.vocab_size)
            result = verify(sub, p, q, process, gpu_method, gen, False, row_index[every, :N])
            out[every], chain[every] = output_tokens(sub, result, L[every], bonus[every], width + 1)
    if accepted_draft is not None:
        accepted_draft.copy_(chain)
    return out
