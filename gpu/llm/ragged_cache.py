"""A KV cache of ``B`` requests with ragged committed lengths, fed through explicit attention masks.

Request b's **committed** sequence occupies cache slots ``0 … L_b − 1`` (``L_b = lengths[b]``, position id =
slot).  The cache holds ``S = max_b L_b`` slots or more: slots ``≥ L_b`` of request b are scratch (another
request's tokens' room, or tokens fed in the current step).  A feed appends ``Q`` tokens per request at slots
``S … S + Q − 1`` with a ``[B, 1, Q, S + Q]`` additive mask: query i of request b sees its committed slots
``< L_b`` and the scratch slots ``visible[b, i]`` the caller names (its tree ancestors fed in this step and
itself) — so its logits are the model's next-token logits after ``committed · ancestors · token``, those of
sequential decoding up to float round-off.

:meth:`RaggedCache.commit` then moves the scratch slots of the tokens that stay (an accepted path) right after
``L_b`` — their keys already carry their true positions, so nothing is recomputed — and crops the cache to the
new ``max_b L_b``.  One step thus costs one forward for the target, and no token is fed twice.
"""
from __future__ import annotations

import torch


class RaggedCache:
    """A Hugging Face ``DynamicCache`` for ``batch_size`` requests plus their committed lengths (see module)."""

    def __init__(self, model, batch_size: int):
        from transformers import DynamicCache

        self.model = model
        self.device = next(model.parameters()).device
        self.cache = DynamicCache()
        self.lengths = torch.zeros(batch_size, dtype=torch.long)

    @property
    def size(self) -> int:
        """Slots held, committed or scratch (``≥ max_b L_b``)."""
        return self.cache.get_seq_length()

    @torch.inference_mode()
    def feed(self, tokens: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
             logits_to_keep: int = 0) -> torch.Tensor:
        """Append ``tokens [B, Q]`` at ``positions [B, Q]`` (slots ``size … size + Q − 1``); ``visible [B, Q, K]``
        bool over the slots ``≥ K0 = size + Q − K`` that each query may see besides its committed prefix (the
        new slots are the last Q columns).  Returns fp32 logits ``[B, Q, V]`` (or of the last ``logits_to_keep``
        queries)."""
        B, Q = tokens.shape
        start = self.size
        kv_len = start + Q
        if visible.shape[:2] != (B, Q) or visible.shape[2] > kv_len:
            raise ValueError(f"RaggedCache.feed: visible must be [B, Q, ≤ {kv_len}] with [B, Q] = [{B}, {Q}], "
                             f"got {list(visible.shape)}")
        allowed = torch.arange(kv_len)[None, None, :] < self.lengths[:, None, None]
        allowed = allowed.expand(B, Q, kv_len).clone()
        allowed[:, :, kv_len - visible.shape[2]:] |= visible
        if not allowed.any(-1).all():
            raise ValueError("RaggedCache.feed: a query sees no slot at all")
        bias = torch.zeros(B, 1, Q, kv_len, dtype=torch.float32)
        bias.masked_fill_(~allowed[:, None], torch.finfo(torch.float32).min)
        out = self.model(input_ids=tokens.to(self.device), position_ids=positions.to(self.device),
                         attention_mask=bias.to(self.device), past_key_values=self.cache, use_cache=True,
                         logits_to_keep=logits_to_keep)
        return out.logits.float()

    @torch.inference_mode()
    def commit(self, slots: list[list[int]]) -> None:
        """Append the tokens at scratch ``slots[b]`` (ascending, each ``≥ L_b``) to request b's committed
        sequence, in that order; then crop the cache to ``max_b L_b``."""
        if len(slots) != len(self.lengths):
            raise ValueError(f"RaggedCache.commit: need one slot list per request ({len(self.lengths)}), "
                             f"got {len(slots)}")
        rows, src, dst = [], [], []
        for b, s in enumerate(slots):
            start = int(self.lengths[b])
            if any(x < start or x >= self.size for x in s) or sorted(set(s)) != list(s):
                raise ValueError(f"RaggedCache.commit: request {b} commits slots {s}, which must ascend within "
                                 f"[{start}, {self.size})")
            rows += [b] * len(s)
            src += s
            dst += range(start, start + len(s))
            self.lengths[b] = start + len(s)
        moved = [i for i, (a, c) in enumerate(zip(src, dst)) if a != c]
        if moved:
            r, a, c = (torch.tensor([x[i] for i in moved], device=self.device) for x in (rows, src, dst))
            for layer in self.cache.layers:
                for t in (layer.keys, layer.values):          # [B, H, S, D]; the right side is gathered first
                    t[r, :, c] = t[r, :, a]
        self.cache.crop(int(self.lengths.max()))

    @torch.inference_mode()
    def select(self, keep: list[int]) -> None:
        """Keep only the requests ``keep`` (in that order), e.g. once the others are finished."""
        idx = torch.tensor(keep, dtype=torch.long)
        self.lengths = self.lengths[idx]
        if self.size:
            self.cache.batch_select_indices(idx.to(self.device))
        self.cache.crop(int(self.lengths.max()) if len(keep) else 0)
