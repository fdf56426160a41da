"""vLLM's rejection-sampler contract (``vllm.v1.sample.rejection_sampler.RejectionSampler``) for chain and
multi-draft verification.

Inputs, as vLLM's spec-decode path holds them (``B`` requests, ``T`` draft tokens in all, vocabulary ``V``)::

    draft_token_ids [T]          the requests' draft tokens, concatenated
    cu_num_draft_tokens [B]      cumulative draft counts (request b owns tokens cu[b−1]..cu[b]−1)
    draft_probs [T, V] or None   q(·) each draft token was drawn from; None: argmax (greedy) drafts
    target_probs [T, V]          p(·) at each draft token's position (the law it is verified against)
    bonus_token_ids [B, m]       a token drawn from p after the whole draft (vLLM's bonus sample; one per chain)

Output ``output_token_ids [B, max_spec_len + 1]`` int32: the accepted draft tokens, then the correction (or, all
accepted, the bonus) token, then :data:`PLACEHOLDER_TOKEN_ID`.

With ``num_drafts = m > 1`` each request's slice holds ``m`` chains of equal length ``L`` one after the other
(``m·L`` tokens; every chain's first row is the same ``p``/``q`` of the request's position); they form a tree
whose root has ``m`` children, each heading its chain, and ``max_spec_len`` counts one chain.  The bonus row of
chain c is ``bonus_token_ids[:, c]``.
"""
from __future__ import annotations

import torch

from univer_theory.validation import check_choice

from ..engine import VerifyResult
from ..tree_batch import TreeBatch, _as_long
from ..verify import verify
from .sglang import uniform_draft_rows

#: vLLM's marker for rejected output slots.
PLACEHOLDER_TOKEN_ID = -1
#: Method → gpu method: ``sps`` is vLLM's token-level rule (RRS with one child per node), ``bv`` block
#: verification (TV on a chain); ``sps`` and ``bv`` need ``num_drafts = 1``.
METHODS = {"sps": "rrs", "bv": "tv", "rrs": "rrs", "rrsw": "rrsw", "tv": "tv", "univer": "univer"}


def tree_inputs(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids,
                num_drafts: int = 1, where: str = "vllm.tree_inputs"):
    """vLLM's tensors → ``(batch, target_probs [B, N, V], draft_probs [B, N, V], lengths [B])``, ``N = 1 + max
    draft count``, ``lengths`` the chain length L of each request.

    Request b's tree: slot 0 the root, chain c's i-th token at slot ``1 + c·L + i``.  Slot s holds the rows of
    the draft token drafted *from* it (a chain's first token: the root's rows); each chain's last slot gets a
    one-hot target row on its bonus token, so the engine's bonus draw returns vLLM's bonus sample.  With
    ``draft_probs=None`` the draft rows are :func:`gpu.engines.sglang.uniform_draft_rows` (read only by
    target-only, which is vLLM's rule for argmax drafts).
    """
    if not torch.is_tensor(target_probs) or target_probs.ndim != 2:
        raise ValueError(f"{where}: target_probs must be a [T, V] tensor")
    dev, dtype = target_probs.device, target_probs.dtype
    T, V = target_probs.shape
    tok = _as_long(draft_token_ids, where, "draft_token_ids", dev).reshape(-1)
    cu = _as_long(cu_num_draft_tokens, where, "cu_num_draft_tokens", dev).reshape(-1)
    bonus = _as_long(bonus_token_ids, where, "bonus_token_ids", dev)
    B, m = cu.shape[0], int(num_drafts)
    bonus = bonus.reshape(B, -1) if bonus.numel() == B * m else bonus
    if tok.shape != (T,) or B == 0 or bonus.shape != (B, m) or m < 1:
        raise ValueError(f"{where}: need draft_token_ids [T] = [{T}], cu_num_draft_tokens [B ≥ 1] and "
                         f"bonus_token_ids [B, num_drafts] = [{B}, {m}], got {list(tok.shape)}, {list(cu.shape)}, "
                         f"{list(bonus.shape)}")
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
    # every draft token: request, chain, position → its slot and the slot its rows belong to (the dump B·N for
    # the repeated root rows of chains c ≥ 1)
    req = torch.searchsorted(cu, torch.arange(T, device=dev), right=True)
    j = torch.arange(T, device=dev) - (cu - counts)[req]
    Lr = L[req].clamp(min=1)
    c, i = j // Lr, j % Lr
    slot = 1 + j
    row_at = torch.where(i == 0, torch.where(c == 0, req * N, B * N), req * N + slot - 1)
    parent = torch.full((B * N,), -1, dtype=torch.long, device=dev)
    token = torch.full((B * N,), -1, dtype=torch.long, device=dev)
    parent[req * N + slot] = torch.where(i == 0, 0, slot - 1)
    token[req * N + slot] = tok
    batch = TreeBatch.from_tensors(parent.view(B, N), token.view(B, N), counts + 1, vocab_size=V)
    # leaves: last slot of every chain (the root when L = 0)
    chain = torch.arange(m, device=dev)
    leaf = torch.where(L[:, None] > 0, (torch.arange(B, device=dev) * N)[:, None] + (chain + 1) * L[:, None],
                       torch.where(chain == 0, (torch.arange(B, device=dev) * N)[:, None], B * N))
    p = target_probs.new_empty(B * N + 1, V)
    p.index_copy_(0, row_at, target_probs)
    p[leaf.reshape(-1)] = 0
    p[leaf.reshape(-1), bonus.reshape(-1)] = 1
    pad = (~batch.valid).reshape(-1).nonzero().squeeze(1)
    p[pad] = 1.0 / V
    if draft_probs is None:
        q = uniform_draft_rows(p[:B * N].view(B, N, V))
    else:
        q = draft_probs.new_empty(B * N + 1, V)
        q.index_copy_(0, row_at, draft_probs.to(dtype))
        q[torch.cat([leaf.reshape(-1), pad])] = 1.0 / V
        q = q[:B * N].view(B, N, V)
    return batch, p[:B * N].view(B, N, V), q, L


def output_tokens(batch: TreeBatch, result: VerifyResult, width: int) -> torch.Tensor:
    """``[B, width]`` int32: accepted tokens, then ``Y``, then :data:`PLACEHOLDER_TOKEN_ID`."""
    B = batch.batch_size
    out = torch.full((B, width), PLACEHOLDER_TOKEN_ID, dtype=torch.int32, device=batch.device)
    D = batch.max_depth
    out[:, :D] = result.accepted_tokens(batch).to(torch.int32)
    out.scatter_(1, result.num_accepted[:, None], result.next_token[:, None].to(torch.int32))
    return out


def rejection_sample(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids,
                     generator: torch.Generator | None = None, *, method: str = "sps", num_drafts: int = 1,
                     process: str = "iid", max_spec_len: int | None = None, accepted_draft=None,
                     validate: bool = True) -> torch.Tensor:
    """``output_token_ids [B, max_spec_len + 1]`` int32 as vLLM's ``RejectionSampler`` returns them
    (module docstring for the inputs).

    Parameters
    ----------
    method : ``sps`` (vLLM's own rule; target-only for argmax drafts), ``bv`` (block verification), and for
        ``num_drafts > 1`` ``rrs`` (``process`` iid), ``rrsw`` (wor), ``tv`` or ``univer`` (either).
    process : how the ``num_drafts`` chains' first tokens were drawn (``iid`` or ``wor``); chains below the root
        have one child per node.
    max_spec_len : output width − 1 (default: the longest chain).
    accepted_draft : optional ``[B]`` integer tensor, filled in place with the chain index of the accepted path
        (−1 when no draft token is accepted).
    validate : check the probability rows (:func:`gpu.validate_inputs`).
    """
    where = "vllm.rejection_sample"
    check_choice(method, METHODS, where, "method")
    if method in ("sps", "bv") and num_drafts != 1:
        raise ValueError(f"{where}: method {method!r} verifies one chain; use rrs, rrsw, tv or univer for "
                         f"num_drafts = {num_drafts}")
    batch, p, q, L = tree_inputs(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs,
                                 bonus_token_ids, num_drafts, where)
    width = batch.max_depth if max_spec_len is None else int(max_spec_len)
    if width < batch.max_depth:
        raise ValueError(f"{where}: max_spec_len = {width} is shorter than a chain ({batch.max_depth} tokens)")
    gpu_method = METHODS[method]
    if draft_probs is None:
        if method != "sps":
            raise ValueError(f"{where}: argmax drafts (draft_probs=None) are verified by 'sps' (target-only); "
                             f"{method!r} needs draft_probs")
        gpu_method = "nss"
    result = verify(batch, p, q, process, gpu_method, generator, validate)
    if accepted_draft is not None:
        first = result.accepted_nodes[:, min(1, batch.max_depth)]
        chain = torch.where((result.num_accepted > 0) & (first > 0), (first - 1) // L.clamp(min=1), -1)
        accepted_draft.copy_(chain)
    return output_tokens(batch, result, width + 1)
