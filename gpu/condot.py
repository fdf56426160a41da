"""Rule 1 and the shape rule batched: UniVer's CondOT(ρ) LP plans on small draft supports (the twin of
:func:`univer_theory.plans.lp_plan.lp_plan`, ``iid`` and ``wor``; theory.md §4.2, §6.3 item 1).

For rows whose draft support holds s tokens, every row's LP

.. math::

    \\operatorname{lexmax} \\Big(\\sum_{S, j} π(S, j),\\ \\sum_{S, j} ω_j\\, π(S, j),\\ \\sum_{S, j} r(S, j)\\, π(S, j)\\Big)
    \\quad\\text{s.t.}\\quad π ≥ 0,\\; \\sum_j π(S, j) ≤ Q_k(S),\\; \\sum_{(S, j):\\, S_j = y} π(S, j) ≤ ρ\\,p(y)

over the ordered tuples of the support (``s^k`` for iid, ``s!/(s−k)!`` for wor) is solved at once by
:func:`gpu.simplex.lex_simplex` — the ω level only for the shape rule (:mod:`univer_theory.plans.shape_lp`,
``ω_j = 1 + |subtree at position j|``).  Not HiGHS, as in the exact core: HiGHS solves one LP at a time on the
host, and a level's small LPs are solved together on the device.  The tie-break (:mod:`solvers.tie_break`) makes the optimum unique, so it
is the exact core's plan (:func:`solvers.condot.condot_plan`): ``r(S, j) = frac(√P_{t·k + j})`` for the t-th
tuple in the exact core's order (lexicographic in the support's ranks: t is the tuple's rank in base s for iid,
its Lehmer rank for wor).  Rows are padded to the largest support; tuples through a padded rank have no
columns; identical rows are solved once.  The plan is then repaired by the exact core's function
(:func:`~univer_theory.plans.lp_plan.repaired_plan`, on support ranks): clip, rows scaled to ``Σ_j w_j ≤ 1``,
tokens with ``a > ρp`` scaled down, ``a`` recomputed.  Dense tableaus of ``(n + s) × (n(k + 1) + s)`` entries, n tuples,
solved ``CONDOT_CHUNK`` entries at a time.
"""
from __future__ import annotations

import itertools

import torch

from solvers.tie_break import prime_roots
from univer_theory.plans.lp_plan import repaired_plan
from univer_theory.processes import wor_tuple_probs

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


def tuple_rank(ranks: torch.Tensor, s: torch.Tensor, process: str) -> torch.Tensor:
    """Position of the tuples of support ranks ``d [..., k]`` (each < s) in the exact core's order
    (``tuple_law``): base-s digits for ``iid``, :func:`lehmer_rank` for ``wor``."""
    if process == "wor":
        return lehmer_rank(ranks, s)
    k = ranks.shape[-1]
    return sum(ranks[..., i] * s ** (k - 1 - i) for i in range(k))


def condot_weights(c: torch.Tensor, q: torch.Tensor, children: torch.Tensor, process: str,
                   position_weights: torch.Tensor | None = None):
    """The plan of the module docstring for ``iid`` / ``wor`` rows ``c = ρp [R, V]``, ``q [R, V]`` with small
    draft supports, with the shape rule's ``position_weights`` ω ``[R, k]`` when given: ``(w, a [R, V],
    solved [R])`` with ``w`` shaped as ``children [R, k]`` or ``[R, T, k]``; ``solved`` is False where the
    simplex did not finish (the exact core then keeps its other plans)."""
    R, V = q.shape
    k = children.shape[-1]
    dev = q.device
    omega = position_weights if position_weights is not None else q.new_zeros(R, 0)    # [R, 0]: no ω level
    # identical rows (one tree repeated across a batch, say) are solved once
    uniq, inverse = torch.unique(torch.cat([c, q, omega.to(q.dtype)], 1), dim=0, return_inverse=True)
    c, q, omega = uniq[:, :V], uniq[:, V:2 * V], uniq[:, 2 * V:]
    s = (q > 0).sum(1)
    s_max = int(s.max())
    sup = torch.sort(torch.where(q > 0, torch.arange(V, device=dev), V), 1).values[:, :s_max].contiguous()  # ascending
    tuples = itertools.product(range(s_max), repeat=k) if process == "iid" else itertools.permutations(range(s_max), k)
    tup = torch.tensor(list(tuples), device=dev).view(-1, k)                                   # [n, k]
    n = tup.shape[0]
    rows, cols = n + s_max, n * (k + 1) + s_max
    chunk = max(1, CONDOT_CHUNK // (rows * cols))
    parts = [_solve(c[i:i + chunk], q[i:i + chunk], sup[i:i + chunk], s[i:i + chunk], tup, process, omega[i:i + chunk])
             for i in range(0, uniq.shape[0], chunk)]
    w_all, a_sup, solved = (torch.cat(x) for x in zip(*parts))
    sup, a_sup = sup[inverse], a_sup[inverse]
    a = torch.zeros(R, V, dtype=q.dtype, device=dev).scatter_add(1, sup.clamp(max=V - 1), torch.where(sup < V, a_sup, 0))
    flat = children.reshape(R, -1, k)
    ranks = torch.searchsorted(sup, flat.reshape(R, -1)).view(flat.shape)
    t = tuple_rank(ranks, torch.tensor(s_max, device=dev), process)
    w = w_all[inverse[:, None], t]                                                      # [R, T, k]
    return w.view(children.shape), a, solved[inverse]


def _solve(c, q, sup, s, tup, process, omega):
    """The LPs of one chunk (``omega [r, k]``, or ``[r, 0]`` for rule 1): ``(w [r, n, k] repaired, a on the
    support [r, s_max], solved [r])``."""
    r, s_max = sup.shape
    n, k = tup.shape
    dev, dt = q.device, q.dtype
    valid = (tup[None] < s[:, None, None]).all(2)                                         # [r, n]
    safe = sup.clamp(max=q.shape[1] - 1)
    q_sup = torch.where(sup < q.shape[1], q.gather(1, safe), 0)                          # [r, s_max]
    c_sup = torch.where(sup < q.shape[1], c.gather(1, safe), 0)
    # Q_k(S) as tuple_law: iid Π q(y_i); wor with the support's mass outside S summed (wor_tuple_probs)
    members = q_sup[:, tup]                                                               # [r, n, k]
    if process == "wor":
        drawn = (torch.arange(s_max, device=dev) == tup[..., None]).any(1)                # [n, s_max]
        prob = wor_tuple_probs(members, torch.where(drawn, 0, q_sup[:, None, :]).sum(2))
    else:
        prob = members.prod(2)
    prob = torch.where(valid, prob, 0)
    # columns: π(t, j) at t·k + j, a slack per tuple, a slack per support rank
    on = valid.repeat_interleave(k, 1).to(dt)                                           # [r, n·k]
    col = torch.arange(n * k, device=dev)
    A = torch.zeros(r, n + s_max, n * (k + 1) + s_max, dtype=dt, device=dev)
    A[:, col // k, col] = on
    A[:, n + tup.reshape(-1), col] = on
    A[:, torch.arange(n + s_max), n * k + torch.arange(n + s_max)] = 1
    b = torch.cat([prob, torch.where(torch.arange(s_max, device=dev) < s[:, None], c_sup, 0)], 1)
    t = tuple_rank(tup[None], s[:, None], process)                                         # [r, n] tuple_law order
    tie = torch.tensor(prime_roots(n * k), dtype=dt, device=dev)[(t[..., None] * k + torch.arange(k, device=dev))
                                                                  .clamp(max=n * k - 1)].flatten(1)
    levels = [torch.where(on > 0, 1.0, -1.0).to(dt)]
    if omega.shape[1]:
        levels.append(omega.to(dt).repeat(1, n) * on)
    levels.append(tie * on)
    cost = torch.zeros(r, len(levels), A.shape[2], dtype=dt, device=dev)
    cost[:, :, :n * k] = torch.stack(levels, 1)
    x, solved = lex_simplex(A, b, cost, (n * k + torch.arange(n + s_max, device=dev)).expand(r, -1))
    carried = valid & (prob > 0)                          # a tuple whose probability underflows carries no mass
    w = torch.where(carried[..., None], x[:, :n * k].view(r, n, k) / torch.where(carried, prob, 1)[..., None], 0)
    return (*repaired_plan(w, tup.expand(r, n, k), prob, c_sup), solved)      # the exact core's repair
