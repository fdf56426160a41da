"""Round-to-nearest (RTN) weight quantisation: the cheapest way to turn the target into a draft ``q``.

A weight matrix ``W [out, in]`` is cut into groups of ``group_size`` consecutive input columns; each group is
mapped affinely onto the integer levels ``0 … 2^bits − 1`` (asymmetric min/max, as GGUF's Q4_1) and rounded::

    scale = (max − min) / (2^bits − 1),   level = round((w − min) / scale),   ŵ = min + level·scale

so ``|ŵ − w| ≤ scale / 2`` and every group holds at most ``2^bits`` distinct values.  The result is returned
de-quantised (same dtype and shape): the draft is an ordinary float model whose next-token law ``q`` differs
from the target's ``p`` by the rounding.  Deterministic — no data, no randomness.
"""
from __future__ import annotations

import copy

import torch

#: Bit widths accepted by :func:`rtn_quantize` (1 bit would leave every group two-valued; 8 is near-lossless).
BITS_RANGE = (2, 8)


def rtn_quantize(weight: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """De-quantised RTN copy of ``weight [out, in]`` with ``bits`` bits per value, groups of ``group_size``
    consecutive input columns (the last group is shorter when ``group_size`` does not divide ``in``).
    A constant group is kept as is.
    """
    if weight.ndim != 2:
        raise ValueError(f"rtn_quantize: weight must be a 2-D matrix [out, in], got shape {tuple(weight.shape)}")
    if not torch.is_floating_point(weight) or not torch.isfinite(weight).all():
        raise ValueError("rtn_quantize: weight must be a finite floating-point tensor")
    if not BITS_RANGE[0] <= bits <= BITS_RANGE[1]:
        raise ValueError(f"rtn_quantize: bits must lie in [{BITS_RANGE[0]}, {BITS_RANGE[1]}], got {bits}")
    out_f, in_f = weight.shape
    if group_size < 1:
        raise ValueError(f"rtn_quantize: group_size must be ≥ 1, got {group_size}")
    pad = -in_f % group_size
    w = weight.detach().float()
    # a ragged last group is padded with copies of its own last column: its min and max are unchanged
    w = torch.cat([w, w[:, -1:].expand(out_f, pad)], dim=1).reshape(out_f, -1, group_size)
    lo = w.amin(dim=-1, keepdim=True)
    hi = w.amax(dim=-1, keepdim=True)
    scale = (hi - lo) / (2 ** bits - 1)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))   # constant group: level 0 is exact
    levels = torch.round((w - lo) / safe).clamp_(0, 2 ** bits - 1)
    return (lo + levels * scale).reshape(out_f, -1)[:, :in_f].to(weight.dtype)


def quantize_linear_layers(model: torch.nn.Module, bits: int, group_size: int) -> torch.nn.Module:
    """A deep copy of ``model`` with every ``nn.Linear`` inside its decoder layers RTN-quantised.

    Embeddings, norms and the (tied) output head are kept: the draft differs from the target only in the
    attention and MLP projections, the usual weight-only quantisation setting.
    """
    draft = copy.deepcopy(model)
    layers = getattr(getattr(draft, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"quantize_linear_layers: model {type(model).__name__} has no decoder layers "
                         "at model.layers")
    with torch.no_grad():
        for layer in layers:
            for module in layer.modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.copy_(rtn_quantize(module.weight, bits, group_size))
    return draft
