"""Rule 1 batched: UniVer's CondOT(ρ) LP plan on small draft supports (the twin of
:func:`univer_theory.plans.lp_plan.lp_plan` for ``wor``; theory.md §4.2, §6.3 item 1).

For rows whose draft support holds s ≤ ``SMALL_SUPPORT`` tokens, every row's LP

.. math::

    \\max \\sum_{S, j} (1 + ε r(S, j))\\, π(S, j) \\quad\\text{s.t.}\\quad π ≥ 0,\\;
    \\sum_j π(S, j) ≤ Q_k(S),\\; \\sum_{(S, j):\\, S_j = y} π(S, j) ≤ ρ\\,p(y)

over the ``s!/(s−k)!`` ordered tuples of the support is solved at once by :func:`gpu.simplex.lex_simplex`.
The tie-break (:mod:`solvers.tie_break`) makes its optimum unique, so it is the exact core's plan:
``r(S, j) = frac(√P_{t·k + j})`` for the t-th tuple in the exact core's order (lexicographic in the support's
ranks; t is the tuple's Lehmer rank), ``ε = 1/(2(m + 1))``, m = tuples + s.  Rows are padded to the level's
largest support; tuples through a padded rank have no columns.  The plan is then repaired as the exact core's
(:func:`~univer_theory.plans.lp_plan.repaired_plan`): clip, rows scaled to ``Σ_j w_j ≤ 1``, tokens with
``a > ρp`` scaled down, ``a`` recomputed.  Dense tableaus of ``(n + s) × (n(k + 1) + s)`` entries, n tuples,
solved ``CONDOT_CHUNK`` entries at a time.
"""
from __future__ import annotations

import itertools

import torch

from solvers.tie_break import prime_roots, tie_eps

from .simplex import lex_simplex

#: Tableau entries solved at once (float64: 8 bytes each).
CONDOT_CHUNK = 2 ** 25


def _falling(n: torch.Tensor, r: int) -> torch.Tensor:
    """``n!/(n − r)!`` elementwise (0 when r > n)."""
    out = torch.ones_like(n)
    for i in range(r):
        out = out * (n - i).clamp(min=0)
    return out


def lehmer_rank(ranks: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Position of the distinct ranks ``d [..., k]`` (each < s) among the k-permutations of ``range(s)`` in
    lexicographic order: ``Σ_i (d_i − #{l < i : d_l < d_i}) · (s−1−i)!/(s−k)!``; ``s`` broadcasts against
    ``d[..., 0]``."""
    k = ranks.shape[-1]
    smaller = (ranks[..., None, :] < ranks[..., :, None]).tril(-1).sum(-1)          # earlier ranks below d_i
    return sum((ranks[..., i] - smaller[..., i]) * _falling(s - 1 - i, k - 1 - i) for i in range(k))


def condot_weights(c: torch.Tensor, q: torch.Tensor, children: torch.Tensor):
    """Rule 1's plan for wor rows ``c = ρp [R, V]``, ``q [R, V]`` with draft supports of at most 8 tokens (module
    docstring): ``(w, a [R, V], solved [R])`` with ``w`` shaped as ``children [R, k]`` or ``[R, T, k]``;
    ``solved`` is False where the simplex did not finish (the exact core then keeps the other plans)."""
    R, V = q.shape
    k = children.shape[-1]
    dev = q.device
    s = (q > 0).sum(1)
    s_max = int(s.max())
    sup = torch.sort(torch.where(q > 0, torch.arange(V, device=dev), V), 1).values[:, :s_max].contiguous()  # ascending
    tup = torch.tensor(list(itertools.permutations(range(s_max), k)), device=dev).view(-1, k)  # [n, k]
    n = tup.shape[0]
    rows, cols = n + s_max, n * (k + 1) + s_max
    chunk = max(1, CONDOT_CHUNK // (rows * cols))
    parts = [_solve(c[i:i + chunk], q[i:i + chunk], sup[i:i + chunk], s[i:i + chunk], tup)
             for i in range(0, R, chunk)]
    w_all, a_sup, solved = (torch.cat(x) for x in zip(*parts))
    a = torch.zeros_like(q).scatter_add(1, sup.clamp(max=V - 1), torch.where(sup < V, a_sup, 0))
    flat = children.reshape(R, -1, k)
    ranks = torch.searchsorted(sup, flat.reshape(R, -1)).view(flat.shape)
    t = lehmer_rank(ranks, torch.tensor(s_max, device=dev))
    w = w_all.gather(1, t[..., None].expand(-1, -1, k))
    return w.view(children.shape), a, solved


def _solve(c, q, sup, s, tup):
    """The LPs of one chunk: ``(w [r, n, k] repaired, a on the support [r, s_max], solved [r])``."""
    r, s_max = sup.shape
    n, k = tup.shape
    dev, dt = q.device, q.dtype
    valid = (tup[None] < s[:, None, None]).all(2)                                         # [r, n]
    safe = sup.clamp(max=q.shape[1] - 1)
    q_sup = torch.where(sup < q.shape[1], q.gather(1, safe), 0)                          # [r, s_max]
    c_sup = torch.where(sup < q.shape[1], c.gather(1, safe), 0)
    # Q_k(S) as tuple_law: pr · q(x) / (mass of the support not yet drawn, summed)
    prob = torch.ones(r, n, dtype=dt, device=dev)
    drawn = torch.zeros(r, n, s_max, dtype=torch.bool, device=dev)
    for i in range(k):
        rest = torch.where(drawn, 0, q_sup[:, None, :]).sum(2)
        prob = prob * q_sup[:, tup[:, i]] / rest
        drawn = drawn | (torch.arange(s_max, device=dev) == tup[:, i, None])[None]
    prob = torch.where(valid, prob, 0)
    # columns: π(t, j) at t·k + j, a slack per tuple, a slack per support rank
    on = valid.repeat_interleave(k, 1).to(dt)                                           # [r, n·k]
    col = torch.arange(n * k, device=dev)
    A = torch.zeros(r, n + s_max, n * (k + 1) + s_max, dtype=dt, device=dev)
    A[:, col // k, col] = on
    A[:, n + tup.reshape(-1), col] = on
    A[:, torch.arange(n + s_max), n * k + torch.arange(n + s_max)] = 1
    b = torch.cat([prob, torch.where(torch.arange(s_max, device=dev) < s[:, None], c_sup, 0)], 1)
    m = _falling(s, k) + s                                                             # the exact core's rows
    t = lehmer_rank(tup[None], s[:, None])                                              # [r, n] tuple_law order
    tie = torch.tensor(prime_roots(n * k), dtype=dt, device=dev)[(t[..., None] * k + torch.arange(k, device=dev))
                                                                  .clamp(max=n * k - 1)].flatten(1)
    cost = torch.zeros(r, A.shape[2], dtype=dt, device=dev)
    cost[:, :n * k] = torch.where(on > 0, 1 + tie * tie_eps(m)[:, None], -1)
    x, solved = lex_simplex(A, b, cost[:, None, :], (n * k + torch.arange(n + s_max, device=dev)).expand(r, -1))
    # the exact core's repair (lp_plan.repaired_plan)
    w = torch.where(valid[..., None], x[:, :n * k].view(r, n, k) / torch.where(valid, prob, 1)[..., None], 0)
    w = w.clamp(min=0)
    w = w / w.sum(2, keepdim=True).clamp(min=1.0)
    marginal = lambda w: torch.zeros(r, s_max, dtype=dt, device=dev).scatter_add(      # noqa: E731
        1, tup.reshape(1, -1).expand(r, -1), (w * prob[..., None]).flatten(1))
    a = marginal(w)
    shrink = torch.where(a > c_sup, c_sup / torch.where(a > c_sup, a, 1), 1.0)
    w = w * shrink[:, tup]
    return w, marginal(w), solved
