"""Round-to-nearest (RTN) weight quantisation: the cheapest way to turn the target into a draft ``q``.

A weight matrix ``W [out, in]`` is cut into groups of ``group_size`` consecutive input columns; each group is
mapped affinely onto the integer levels ``0 … 2^bits − 1`` (asymmetric min/max, as GGUF's Q4_1) and rounded::

    scale = (max − min) / (2^bits − 1),   level = round((w − min) / scale),   ŵ = min + level·scale

so ``|ŵ − w| ≤ scale / 2`` and every group holds at most ``2^bits`` distinct values.  Two forms of the draft:

* :func:`packed_rtn_draft` — the levels packed 2 per byte and run by torch's own int4 CPU matmul
  (:class:`PackedLinear`, bf16 activations), the output head included: a draft forward costs a fraction of
  the target's.  Needs the CPU, ``bits ≤ 4`` and a group size that is a multiple of 32.
* :func:`quantize_linear_layers` — de-quantised float weights (every other case), the head included as in the
  packed form: the same ``q`` up to the packed form's bf16 rounding, but as costly per forward as the target.

The target was de-quantised from a Q4_1 GGUF (4-bit min/max groups of 32 columns), so ``rtn:4:32`` leaves its
decoder projections bit for bit as they are: that draft differs from the target by its quantised head (and the
packed form's bf16 rounding) only.

Either way the draft's next-token law ``q`` is whatever the draft model computes; it differs from the
target's ``p`` by the rounding.  Deterministic — no data, no randomness.
"""
from __future__ import annotations

import copy

import torch

#: Bit widths accepted by :func:`rtn_quantize` (1 bit would leave every group two-valued; 8 is near-lossless).
BITS_RANGE = (2, 8)
#: What torch's packed int4 CPU kernel holds: levels below 16, groups of these sizes (an RTN group size must
#: be a multiple of the smallest).
PACKED_MAX_BITS, PACKED_GROUPS = 4, (32, 64, 128, 256)


def rtn_levels(weight: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RTN of ``weight [out, in]``: ``(levels, lo, scale)`` with ``levels [out, G, group_size]`` (long, in
    ``0 … 2^bits − 1``) and ``lo``, ``scale [out, G, 1]`` (float32) for the ``G = ⌈in / group_size⌉`` groups of
    consecutive input columns, so that ``ŵ = lo + levels·scale``.  A ragged last group is padded with copies of
    its own last column (its min and max are unchanged); a group wider than the row is the row (``G = 1``; it was
    padded to the full width, 38 GB for ``rtn:4:65536`` on SmolLM2's head); a constant group gets scale 0 and
    level 0 (exact).
    """
    if weight.ndim != 2:
        raise ValueError(f"rtn_quantize: weight must be a 2-D matrix [out, in], got shape {tuple(weight.shape)}")
    if not torch.is_floating_point(weight) or not torch.isfinite(weight).all():
        raise ValueError("rtn_quantize: weight must be a finite floating-point tensor")
    if not BITS_RANGE[0] <= bits <= BITS_RANGE[1]:
        raise ValueError(f"rtn_quantize: bits must lie in [{BITS_RANGE[0]}, {BITS_RANGE[1]}], got {bits}")
    if group_size < 1:
        raise ValueError(f"rtn_quantize: group_size must be ≥ 1, got {group_size}")
    out_f, in_f = weight.shape
    group_size = min(group_size, in_f)
    w = weight.detach().float()
    w = torch.cat([w, w[:, -1:].expand(out_f, -in_f % group_size)], dim=1).reshape(out_f, -1, group_size)
    lo = w.amin(dim=-1, keepdim=True)
    scale = (w.amax(dim=-1, keepdim=True) - lo) / (2 ** bits - 1)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    levels = torch.round((w - lo) / safe).clamp_(0, 2 ** bits - 1).long()
    return levels, lo, scale


def rtn_quantize(weight: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """De-quantised RTN copy of ``weight [out, in]`` with ``bits`` bits per value, groups of ``group_size``
    consecutive input columns (the last group is shorter when ``group_size`` does not divide ``in``).
    A constant group is kept as is.
    """
    levels, lo, scale = rtn_levels(weight, bits, group_size)
    out_f, in_f = weight.shape
    return (lo + levels * scale).reshape(out_f, -1)[:, :in_f].to(weight.dtype)


class PackedLinear(torch.nn.Module):
    """``y = x Ŵᵀ (+ b)`` with the RTN weight ``Ŵ`` stored as packed int4 levels and run by torch's own CPU
    kernel ``aten._weight_int4pack_mm_for_cpu`` (bf16 activations, bf16 per-group scale and zero).

    The kernel computes ``ŵ = (level − 8)·scale + zero`` per group, so ``zero = lo + 8·scale`` reproduces
    :func:`rtn_quantize`'s ``lo + level·scale`` (up to the bf16 rounding of scale, zero and ``x``).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, bits: int, group_size: int):
        super().__init__()
        out_f, in_f = weight.shape
        if bits > PACKED_MAX_BITS:
            raise ValueError(f"PackedLinear: the int4 kernel holds at most {PACKED_MAX_BITS} bits, got {bits}")
        # the kernel's group: the largest size it knows dividing both group_size and in_f; an RTN group is then
        # several kernel groups sharing one scale and zero, and a ragged last RTN group whole kernel groups
        kernel = [g for g in PACKED_GROUPS if group_size % g == 0 and in_f % g == 0]
        if not kernel:
            raise ValueError(f"PackedLinear: group_size {group_size} and in_features {in_f} must both be multiples "
                             f"of {PACKED_GROUPS[0]} for the int4 kernel")
        if out_f % 16:
            raise ValueError(f"PackedLinear: the int4 kernel needs out_features divisible by 16, got {out_f}")
        levels, lo, scale = rtn_levels(weight, bits, group_size)
        self.in_features, self.out_features, self.kernel_group = in_f, out_f, kernel[-1]
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            levels.reshape(out_f, -1)[:, :in_f].to(torch.int32).cpu().contiguous(), 1))
        repeat = group_size // self.kernel_group
        per_kernel_group = [x.reshape(out_f, -1).repeat_interleave(repeat, dim=1)[:, :in_f // self.kernel_group].t()
                            for x in (scale, lo + 8 * scale)]
        self.register_buffer("scales_zeros", torch.stack(per_kernel_group, dim=-1).contiguous().to(torch.bfloat16))
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, self.in_features).to(torch.bfloat16),
                                                        self.packed, self.kernel_group, self.scales_zeros)
        y = y.to(x.dtype).reshape(*lead, self.out_features)
        return y if self.bias is None else y + self.bias


def packed_rtn_draft(model: torch.nn.Module, bits: int, group_size: int) -> torch.nn.Module:
    """A copy of ``model`` whose every decoder ``nn.Linear`` and output head run as :class:`PackedLinear`.

    The embedding and norms stay float (the head gets its own packed copy of a tied embedding): a draft forward
    reads about an eighth of the target's weight bytes.  CPU only (the packed kernel is a CPU kernel).
    """
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"packed_rtn_draft: model {type(model).__name__} has no decoder layers at model.layers")
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("packed_rtn_draft: the packed int4 kernel runs on the CPU; use --device cpu or an "
                         "early:L / hf:DIR draft")
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"packed_rtn_draft: model {type(model).__name__} has no output head")
    embed = model.get_input_embeddings()
    # copy everything but the decoder layers, the embedding and the head (shared, never modified, or replaced)
    draft = copy.deepcopy(model, {id(m): m for m in (layers, embed, head)})
    draft.model.layers = torch.nn.ModuleList(_packed_copy(layer, bits, group_size) for layer in layers)
    draft.set_output_embeddings(PackedLinear(head.weight, head.bias, bits, group_size))
    draft.config = copy.deepcopy(model.config)
    draft.config.tie_word_embeddings = False
    return draft.eval()


def _packed_copy(layer: torch.nn.Module, bits: int, group_size: int) -> torch.nn.Module:
    """Deep copy of one decoder layer with its ``nn.Linear`` children replaced by :class:`PackedLinear`."""
    layer = copy.deepcopy(layer)
    for module in list(layer.modules()):
        for name, child in module.named_children():
            if isinstance(child, torch.nn.Linear):
                setattr(module, name, PackedLinear(child.weight, child.bias, bits, group_size))
    return layer


def quantize_linear_layers(model: torch.nn.Module, bits: int, group_size: int) -> torch.nn.Module:
    """A deep copy of ``model`` with every ``nn.Linear`` inside its decoder layers and its output head
    RTN-quantised (the head untied from the embedding, as :func:`packed_rtn_draft` does).

    Embeddings and norms are kept: the draft differs from the target in the attention and MLP projections and
    the head, the law :func:`packed_rtn_draft` computes up to its bf16 rounding.
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
        head = draft.get_output_embeddings() if hasattr(draft, "get_output_embeddings") else None
        if isinstance(head, torch.nn.Linear):
            untied = torch.nn.Linear(head.in_features, head.out_features, bias=head.bias is not None,
                                     device=head.weight.device, dtype=head.weight.dtype)
            untied.weight.copy_(rtn_quantize(head.weight, bits, group_size))
            if head.bias is not None:
                untied.bias.copy_(head.bias)
            draft.set_output_embeddings(untied)
            draft.config.tie_word_embeddings = False
    return draft
