"""Probability rows on the device: logits → probabilities, the one input check, and row sampling.

Probabilities are float32 (default) or float64; a bf16 / fp16 model's logits are converted by
:func:`probs_from_logits` (softmax normalised in float64, returned in float32), never used as probabilities
directly.
"""
from __future__ import annotations

import numbers

import torch

from univer_theory.validation import SIMPLEX_ATOL, check_temperature

from .tree_batch import integer_dtype

#: ``|Σ row − 1|`` tolerance per dtype.  float64 keeps the exact core's 1e-9.  A float32 row normalised in float64
#: and rounded entry by entry sums to 1 within ~6e-8 (:func:`probs_from_logits` does so); torch's own float32
#: softmax, whose sum is accumulated in float32, came 1.7e-5 short at V = 49 152 on a row with a flat tail.  1e-5
#: leaves room for rows summed by a pairwise float32 sum (~1e-6 at V ≈ 1.5·10⁵) and still rejects a forgotten
#: normalisation.
SIMPLEX_TOL = {torch.float64: SIMPLEX_ATOL, torch.float32: 1e-5}


def probs_from_logits(logits: torch.Tensor, temperature: float | torch.Tensor = 1.0, top: int | None = None,
                      support: int | None = None) -> torch.Tensor:
    """``softmax(logits / T)`` as float32 rows normalised in float64 (float64 stays float64); ``T = 0`` → one-hot
    argmax; with ``top = m`` the softmax over each row's m largest logits only (the others get probability 0).

    Parameters
    ----------
    logits : [..., V] float tensor (bf16 / fp16 / fp32 / fp64).
    temperature : ``T ≥ 0``, one number or a tensor of them aligned with ``logits.shape[:-1]`` from the left (one
        per row, or a ``[B]`` tensor of one per request, as an engine holds them; :func:`row_temperatures`): each
        row is then bit for bit the row its own T alone gives.
        At ``T = 0`` the row is the one-hot of the first maximal logit (lowest token id on ties), the same
        convention as :func:`univer_theory.apply_temperature`.
    top : None (the whole row) or ``1 ≤ m``: a draft truncated to its m most likely tokens (:func:`top_mask`:
        among logits tied at the m-th place the lowest ids).  Such a row is a draft process of
        its own — verifying against it is exact — and an iid / wor level is then planned on m + 1 columns
        instead of V (:mod:`gpu.support`).
    support : None or ``1 ≤ s ≤ min(V, top)``: every row keeps at least s tokens of positive probability
        (:func:`support_floor`), as a draft of k ≤ s distinct children needs (``wor``, ``topk``, ``greedy``).

    Returns
    -------
    [..., V] float32 (float64 for float64 logits) rows on the simplex.

    >>> probs_from_logits(torch.tensor([[0.0, 100.0, -100.0]]), 0.0).tolist()
    [[0.0, 1.0, 0.0]]
    """
    if not torch.is_tensor(logits) or not logits.dtype.is_floating_point or logits.ndim == 0:
        raise ValueError(f"probs_from_logits: logits must be a floating tensor [..., V], got "
                         f"{getattr(logits, 'dtype', type(logits).__name__)}")
    if logits.shape[-1] == 0:
        raise ValueError("probs_from_logits: logits must have a non-empty vocabulary axis, got shape "
                         f"{list(logits.shape)}")
    for name, value in (("top", top), ("support", support)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
            raise ValueError(f"probs_from_logits: {name} must be a positive int (tokens per row) or None, "
                             f"got {value!r}")
    top, support = (None if v is None else int(v) for v in (top, support))
    if support is not None and support > min(logits.shape[-1], top or logits.shape[-1]):
        raise ValueError(f"probs_from_logits: support {support} exceeds the row's {logits.shape[-1]} tokens"
                         + (f" or top {top}" if top is not None else ""))
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    x = logits.to(dtype)
    for mask, rule in ((torch.isnan(x).any(-1), "contains NaN"),
                       ((x == float("inf")).any(-1), "contains +inf (a logit must be finite or −inf)"),
                       ((x == float("-inf")).all(-1), "is −inf everywhere (no token has positive probability)")):
        if mask.any():
            i = [int(v) for v in mask.nonzero()[0]]
            raise ValueError(f"probs_from_logits: logits row {i} {rule}")
    T, greedy = row_temperatures(temperature, x)
    if bool(greedy.all()) if torch.is_tensor(greedy) else greedy:
        return _floored(_one_hot_argmax(x), x, support)
    z = x
    if top is not None and top < x.shape[-1]:
        z = torch.where(top_mask(x, top), x, float("-inf"))
    # shifted by the largest logit before the division: ``z − max z`` is exact near the top (a quotient ``z/T``
    # first rounds at ``ulp(|z|/T)``, O(1) relative at a small T), in halves, ``2·((z/2 − max z/2)/T)``: never an
    # overflow (``z − max z`` itself overflows on logits more than half the dtype's range apart: ±1e308 at
    # T = 1e308 gave a one-hot row), and elsewhere the same floats (halving and doubling are exact and commute
    # with the rounding of the subtraction and the division, but for subnormal halves); a T below the dtype's
    # range (0 there) leaves ``0/0`` only at the maxima, whose shifted logit is 0, and where the halves round to
    # one float (logits a subnormal ulp or two apart: a NaN row), so there ``z − max z``, exact, is taken.  One
    # division for a number and a tensor of temperatures alike (a tensor on the logits' device: a Python number
    # would be a reciprocal product in CUDA's kernel, another rounding)
    top_logit = z.amax(-1, keepdim=True)
    scale = (T if T.ndim == 0 else torch.where(greedy, 1.0, T)[..., None])
    half = z * 0.5 - top_logit * 0.5
    shifted = torch.where(half == 0, (z - top_logit) / scale, half / scale * 2)
    # normalised in float64 (then rounded to float32 entry by entry): torch's float32 softmax accumulates its sum
    # in float32, 1.7e-5 off at V = 49 152 on a row with a flat tail — past SIMPLEX_TOL, so its own rows were
    # refused downstream
    q = torch.softmax(torch.where(z == top_logit, 0.0, shifted), dim=-1, dtype=torch.float64).to(dtype)
    if torch.is_tensor(greedy) and bool(greedy.any()):            # greedy rows as T = 0 alone gives them: the
        q = torch.where(greedy[..., None], _one_hot_argmax(x), q)    # whole row's argmax, floored by its logits
        z = torch.where(greedy[..., None], x, z)
    return _floored(q, z, support)


def row_temperatures(temperature, logits: torch.Tensor) -> tuple[torch.Tensor, bool | torch.Tensor]:
    """``(T, greedy)`` as :func:`probs_from_logits` reads ``temperature``: one number (checked by
    :func:`univer_theory.validation.check_temperature`) as a 0-dim tensor and ``greedy = (T == 0)``; a tensor as
    one value per row ``logits.shape[:-1]``, its axes aligned from the left (a ``[B]`` tensor against ``[B, N, V]``
    logits gives request b's rows its T) and ``greedy`` per row.  Each T must be finite and ≥ 0 in its own
    precision (checked, and ``greedy`` decided, before ``T`` is cast to the logits' dtype and device); a T beyond
    the logits' dtype's range is taken at its largest finite value (cast, 1e39 was inf in float32, and −inf/inf a
    NaN row): such rows are ``softmax(z / finfo.max)``, uniform over their finite logits only where those lie well
    within the dtype's range (float32 logits [0, −3e38] at T = 1e300 give [0.707, 0.293])."""
    if not torch.is_tensor(temperature):
        t = check_temperature(temperature, "probs_from_logits")
        return torch.tensor(min(t, torch.finfo(logits.dtype).max), dtype=logits.dtype, device=logits.device), t == 0
    shape = tuple(logits.shape[:-1])
    if not (temperature.dtype.is_floating_point or integer_dtype(temperature.dtype)):
        raise ValueError(f"probs_from_logits: temperature must be real numbers, got a {temperature.dtype} tensor")
    t = temperature.to(logits.device, torch.float64)
    if t.ndim > len(shape) or any(a not in (1, b) for a, b in zip(t.shape, shape)):
        raise ValueError(f"probs_from_logits: temperature of shape {list(temperature.shape)} does not give one per "
                         f"row {list(shape)} (its axes align with the rows' from the left)")
    t = torch.broadcast_to(t.reshape(t.shape + (1,) * (len(shape) - t.ndim)), shape)
    bad = ~((t >= 0) & torch.isfinite(t))
    if bad.any():
        i = [int(v) for v in bad.nonzero()[0]]
        raise ValueError(f"probs_from_logits: temperature of row {i} must be finite and ≥ 0, got "
                         f"{float(t[tuple(i)])}")
    return t.clamp(max=torch.finfo(logits.dtype).max).to(logits.dtype), t == 0


def _floored(q: torch.Tensor, logits: torch.Tensor, support: int | None) -> torch.Tensor:
    return q if support is None else support_floor(q, logits, support)


def _one_hot_argmax(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.one_hot(x.argmax(-1), x.shape[-1]).to(x.dtype)


def top_mask(x: torch.Tensor, m: int) -> torch.Tensor:
    """``[..., V]`` bool: each row's m largest entries of ``x``, ties at the m-th place to the lowest ids (T = 0's
    argmax is the first maximum; ``torch.topk``'s choice among ties need not contain it, nor its top s lie within
    its top m: a one-hot row floored by it had s tokens of positive probability past its top m).  The set of
    :func:`univer_theory.orders.top_tokens` ``(x, m)``, found by one ``topk`` and a count of the ties at the m-th
    value rather than its stable sort of the whole row (4× its time on SmolLM2's rows at m = 1 024)."""
    last = x.topk(m, dim=-1).values[..., -1:]
    above = x > last
    tied = x == last
    return above | (tied & (tied.cumsum(-1) <= m - above.sum(-1, keepdim=True)))


def support_floor(q: torch.Tensor, logits: torch.Tensor, s: int) -> torch.Tensor:
    """Rows ``q [..., V]`` with each row's s largest ``logits`` z raised to probability at least their floor
    ``f_i = max(ε²·exp(z_i − max z), √tiny)`` (ε, tiny: the dtype's machine epsilon and smallest normal):
    ``max(q_i, f_i)``, renormalised, in the rows where some ``q_i < f_i``; every other row as it was, bit for bit.

    A draft row at a small temperature T underflows to fewer tokens than a node drafts without replacement
    (``(max z − z_i)/T`` past ~745 in float64).  The floor keeps the s most likely tokens draftable, in the
    order of their logits at temperature 1 (a −inf logit too, where a row has fewer than s finite ones), at a
    mass of at most ``ε²`` a token (~5e-32 in float64).  A draft may be any law, so a floored row is a draft
    process of its own and verifying against it stays exact, given the floored rows (what the tree was drafted
    from), as every caller here passes them.

    >>> q = support_floor(torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64),
    ...                   torch.tensor([[0.0, -1.0, -2.0]], dtype=torch.float64), 2)
    >>> bool(q[0, 1] > 0), float(q[0, 2])
    (True, 0.0)
    """
    if not torch.is_tensor(q) or q.dtype not in SIMPLEX_TOL or not torch.is_tensor(logits) or \
            logits.shape != q.shape:
        raise ValueError(f"support_floor: q must be float32 / float64 rows and logits of their shape, got "
                         f"{getattr(q, 'dtype', type(q).__name__)} {list(getattr(q, 'shape', []))} and "
                         f"{list(getattr(logits, 'shape', []))}")
    if isinstance(s, bool) or not isinstance(s, numbers.Integral) or not 1 <= s <= q.shape[-1]:
        raise ValueError(f"support_floor: s must be an int in [1, V = {q.shape[-1]}], got {s!r}")
    info = torch.finfo(q.dtype)
    z = logits.to(q.dtype)
    kept = top_mask(z, int(s))
    floor = torch.clamp(info.eps ** 2 * torch.exp(z - z.amax(-1, keepdim=True)), min=info.tiny ** 0.5)
    under = kept & (q < floor)
    low = under.any(-1, keepdim=True)
    if not bool(low.any()):
        return q
    lifted = torch.where(under, floor, q)
    return torch.where(low, lifted / lifted.sum(-1, keepdim=True), q)


def check_tensor(where: str, name: str, x) -> None:
    """Raise ValueError unless ``x`` is a dense (strided) torch tensor: a sparse one failed inside torch's row sums
    (``add(sparse, dense) is not supported``)."""
    if not torch.is_tensor(x):
        raise ValueError(f"{where}: {name} must be a torch tensor, got {type(x).__name__}")
    if x.layout != torch.strided:
        raise ValueError(f"{where}: {name} must be a dense (strided) tensor, got layout {x.layout} "
                         f"(convert it with .to_dense())")


def check_generator(where: str, generator, device: torch.device, name: str = "generator",
                    optional: bool = True) -> None:
    """Raise ValueError unless ``generator`` (called ``name``) is a ``torch.Generator`` of the rows' device type,
    or None where ``optional`` (a CPU generator cannot draw on CUDA rows, nor the reverse: torch refused inside
    the first draw)."""
    if generator is None and optional:
        return
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"{where}: {name} must be a torch.Generator{' or None' if optional else ''}, got "
                         f"{type(generator).__name__}")
    if generator.device.type != device.type:
        raise ValueError(f"{where}: {name} is on {generator.device} but the rows are on {device}")


def check_row_dtypes(where: str, target_probs, draft_probs) -> None:
    """Raise ValueError unless ``target_probs`` and ``draft_probs`` are dense tensors of one float32 / float64
    dtype — the engine's tables are per dtype, so this runs even where the rows' values are not checked."""
    for name, x in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        check_tensor(where, name, x)
    if target_probs.dtype not in SIMPLEX_TOL or draft_probs.dtype != target_probs.dtype:
        raise ValueError(f"{where}: target_probs and draft_probs must be float32 or float64 of one dtype, got "
                         f"{target_probs.dtype} and {draft_probs.dtype} (convert logits with probs_from_logits)")


def check_rows(where: str, name: str, rows: torch.Tensor, valid: torch.Tensor | None = None) -> None:
    """Raise ValueError unless every row ``[..., V]`` (where ``valid [...]`` is True) is finite, ≥ 0 and sums to
    1 within :data:`SIMPLEX_TOL` of its dtype (float32 / float64 only).

    Two row reductions and no ``[..., V]`` temporaries: a row passes iff ``|Σ − 1| ≤ tol`` and ``min ≥ 0`` (NaN
    fails both comparisons, ±inf makes the sum non-finite); only the failing rows are then classified, in the
    order NaN/inf, negative entry, sum.
    """
    check_tensor(where, name, rows)
    if rows.dtype not in SIMPLEX_TOL:
        raise ValueError(f"{where}: {name} must be float32 or float64 probabilities, got {rows.dtype} "
                         f"(convert logits with probs_from_logits)")
    if rows.ndim == 0 or rows.shape[-1] == 0:
        raise ValueError(f"{where}: {name} needs a non-empty vocabulary axis, got shape {tuple(rows.shape)}")
    tol = SIMPLEX_TOL[rows.dtype]
    bad = ~(((rows.sum(-1) - 1).abs() <= tol) & (rows.amin(-1) >= 0))
    if valid is not None:
        bad &= valid
    if not bad.any():
        return
    where_bad = bad.nonzero()
    flagged = rows[bad]                                            # the failing rows only, in row order
    for mask, rule in (((~torch.isfinite(flagged)).any(-1), "contains NaN or inf"),
                       ((flagged < 0).any(-1), "has a negative entry"),
                       (((flagged.sum(-1) - 1).abs() > tol), f"does not sum to 1 within {tol:g}")):
        if mask.any():
            i = tuple(int(v) for v in where_bad[int(mask.nonzero()[0, 0])])
            raise ValueError(f"{where}: {name} row {list(i)} {rule} (sum {float(rows[i].sum()):.9g}, "
                             f"min {float(rows[i].min()):.3g})")


#: The most a float32 row an engine hands over may miss 1 by and still be taken as a law (:func:`engine_rows`):
#: ``V·2^-24`` bounds the rounding of any float32 sum of V nonnegative terms (an engine's softmax sums in float32:
#: 1.6e-4 measured at V = 49 152 on a flat-tailed row, 1e-5–2e-5 on ordinary rows at V = 128 256), capped at 1e-3
#: so that at a large V a caller's unnormalised row (a top-p row missing 0.5% of its mass) is still refused.
ENGINE_SUM_CAP = 1e-3


def engine_rows(rows: torch.Tensor) -> torch.Tensor:
    """An inference engine's own probability rows ``[R, V]`` as the laws its sampler draws from: float64 rows, and
    float32 rows within :data:`SIMPLEX_TOL` of 1, as they are (no copy); the float32 rows that miss 1 by more, up
    to ``min(V·2^-24, ENGINE_SUM_CAP)``, divided by their float64 sum and rounded back entry by entry
    (each entry to 2^-24 relative, so the sum to 6e-8), in a copy of the rows.  Used as they were, NSS / RRS / TV
    verified against a law off by the row's defect.  Nothing is checked here: rows off by more than that (or not
    finite, or negative) are left for :func:`check_rows` to refuse.  One float32 pass over the rows."""
    if rows.dtype != torch.float32:
        return rows
    gap = (rows.sum(-1) - 1).abs()
    off = (gap > SIMPLEX_TOL[torch.float32]) & (gap <= min(rows.shape[-1] * 2.0 ** -24, ENGINE_SUM_CAP))
    if not bool(off.any()):                                     # host read: the common case copies nothing
        return rows
    at = off.nonzero().squeeze(1)
    some = rows[at].double()
    return rows.index_copy(0, at, (some / some.sum(-1, keepdim=True)).to(torch.float32))


#: Block width of the two-level inverse CDF of :func:`sample_rows`, and the chunk summed in the rows' dtype.
SAMPLE_BLOCK, SAMPLE_CHUNK = 256, 16
#: Rows of at most this many columns (levels on their drafted support) take one float64 cumsum instead: 3–5× faster
#: on 1 025 columns, where the two levels' ~20 operations cost more than the sums.
SAMPLE_DIRECT = 4096


def sample_rows(weights: torch.Tensor, generator: torch.Generator | None = None,
                num_samples: int | None = None) -> torch.Tensor:
    """Tokens from ``norm(weights)`` per row (``weights [R, V]`` ≥ 0, not necessarily normalised): ``[R]``, or
    ``[R, num_samples]`` independent draws.

    Inverse CDF in float64: a float32 uniform has resolution 2^-24 (and can be exactly 0), and a float32 cumsum
    over V ≈ 5·10⁴ entries drifts by ~V·6e-8, which would mis-weight small-probability tokens.  The CDF is
    two-level, so that one pass over the rows suffices: the masses of blocks of :data:`SAMPLE_BLOCK`
    consecutive tokens pick the block holding ``U·Σ`` (first block whose cumulative mass exceeds it), a float64
    cumsum of that block alone picks the token — the same token as a full-row inverse CDF up to rounding,
    without the row-long sequential scan.  A block mass is a float64 sum of :data:`SAMPLE_CHUNK`-token sums
    taken in the rows' dtype: sums of ``c`` nonnegative terms are exact to ``(c − 1)·ε`` relative (float32:
    ≤ 9e-7 for ``c = 16``, independent of V), so no token's probability drifts by more than that relative
    amount, and a float32 → float64 copy of the rows is avoided.  A zero-weight token is never returned for a
    row with positive mass (neither CDF rises across it; :func:`_first_above` covers ``U·Σ`` rounding up to a
    block's or the row's total).  Rows of at most :data:`SAMPLE_DIRECT` columns (a level on its drafted support)
    take their one float64 cumsum directly.  An all-zero row returns an arbitrary index.  Either path takes one
    float64 uniform a row and sample from the generator (:func:`skip_rows` takes them alone).
    """
    R, V = weights.shape
    b, c = SAMPLE_BLOCK, SAMPLE_CHUNK
    if V <= SAMPLE_DIRECT:              # a short row (a level on its drafted support): its inverse CDF directly
        cdf = weights.cumsum(-1, dtype=torch.float64)
        u = torch.rand(R, num_samples or 1, dtype=torch.float64, device=weights.device, generator=generator)
        idx = _first_above(cdf, u * cdf[:, -1:])
        return idx if num_samples else idx.squeeze(1)
    full = V // b * b
    parts = []
    if full:
        chunks = weights[:, :full].reshape(R, full // c, c).sum(-1)             # input dtype: ≤ (c−1)·ε relative
        parts.append(chunks.view(R, full // b, b // c).sum(-1, dtype=torch.float64))
    if full < V:
        parts.append(weights[:, full:].sum(-1, keepdim=True, dtype=torch.float64))
    mass = torch.cat(parts, 1) if len(parts) > 1 else parts[0]

    def read(cols):
        return weights.gather(1, cols.flatten(1)).view(cols.shape)
    return sample_blocks(mass, b, read, V, generator, num_samples)


def skip_rows(rows: int, device, generator: torch.Generator | None = None) -> None:
    """Advance ``generator`` as :func:`sample_rows` of ``rows`` rows does (one float64 uniform a row, on either of
    its paths), without rows to read: the draws of rows that no path reads, which keep the others' draws in place."""
    torch.rand(rows, 1, dtype=torch.float64, device=device, generator=generator)


def _first_above(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the first index whose cumulative mass ``cdf [..., n]`` exceeds each of ``u [..., S]`` — never past
    the last index with positive mass (``u`` rounding up to the total)."""
    return torch.minimum(torch.searchsorted(cdf, u, right=True),
                         torch.searchsorted(cdf, cdf[..., -1:].contiguous(), right=False))


def sample_blocks(mass: torch.Tensor, width: int, read, vocab: int, generator: torch.Generator | None = None,
                  num_samples: int | None = None) -> torch.Tensor:
    """The two-level inverse CDF of :func:`sample_rows` from given block masses: ``mass [R, blocks]`` (float64,
    block i = tokens ``i·width … (i+1)·width − 1`` of ``vocab``), ``read(cols [R, S, width])`` the weights at those
    token ids (clipped to ``vocab − 1``: entries past it are masked here).  Only the chosen block of each row is
    read (:mod:`gpu.support` keeps a level's undrafted block masses from its scan)."""
    R, b = mass.shape[0], width
    S = num_samples or 1
    cdf = mass.cumsum(-1)                                                    # [R, blocks]
    u = torch.rand(R, S, dtype=torch.float64, device=mass.device, generator=generator) * cdf[:, -1:]
    # not past the last positive block; a NaN row (a broken rule's residual, which the engine names) the last one
    blk = _first_above(cdf, u).clamp(max=cdf.shape[1] - 1)
    before = torch.where(blk > 0, cdf.gather(1, (blk - 1).clamp(min=0)), 0)
    chosen = cdf.gather(1, blk) - before                                     # the chosen block's mass
    cols = blk[:, :, None] * b + torch.arange(b, device=mass.device)          # [R, S, b]
    w = read(cols.clamp(max=vocab - 1))
    inner = torch.where(cols < vocab, w, 0).cumsum(-1, dtype=torch.float64)
    # the same fraction of the block's own float64 sum: its mass, a sum of chunk sums in the rows' dtype, differs from
    # that sum by up to (c − 1)·ε of it, a difference that otherwise went to (or came from) its last positive token
    at = torch.where(chosen > 0, (u - before) / torch.where(chosen > 0, chosen, 1), 0) * inner[:, :, -1]
    idx = blk * b + _first_above(inner, at[:, :, None]).squeeze(2)
    return idx if num_samples else idx.squeeze(1)


def uniform(shape, device, generator: torch.Generator | None = None) -> torch.Tensor:
    """Float64 uniforms on [0, 1) for coins ``U < prob``: with float32, ``Pr(U < prob)`` is off by up to 6e-8
    and ``U = 0`` has non-negligible probability (the vLLM rejection sampler makes the same choice)."""
    return torch.rand(shape, dtype=torch.float64, device=device, generator=generator)
