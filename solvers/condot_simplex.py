"""Rule 1 and the shape rule: UniVer's CondOT(ρ) LP plans on small draft supports, for a batch of rows, by the
lexicographic simplex (theory.md §4.2, §6.3 item 1; ``iid`` and ``wor``) — the one float implementation both
layers run: the exact core on its node as a batch of one (:func:`univer_theory.plans.lp_plan.lp_plan`), a level
of :mod:`gpu` on all its nodes at once (:func:`gpu.condot.condot_weights`).

For rows whose draft support holds s tokens, every row's LP

.. math::

    \\operatorname{lexmax} \\Big(\\sum_{S, j} π(S, j),\\ \\sum_{S, j} ω_j\\, π(S, j),\\ \\sum_{S, j} r(S, j)\\, π(S, j)\\Big)
    \\quad\\text{s.t.}\\quad π ≥ 0,\\; \\sum_j π(S, j) ≤ Q_k(S),\\; \\sum_{(S, j):\\, S_j = y} π(S, j) ≤ ρ\\,p(y)

over the ordered tuples of the support (``s^k`` for iid, ``s!/(s−k)!`` for wor) is solved at once by
:func:`solvers.lex_simplex.lex_simplex` — the ω level only for the shape rule
(:mod:`univer_theory.plans.shape_lp`, ``ω_j = 1 + |subtree at position j|``).  The tie-break
(:mod:`solvers.tie_break`) makes the optimum unique, so it is also HiGHS' plan (:func:`solvers.condot.condot_plan`,
the tests' oracle): ``r(S, j) = frac(√P_{t·k + j})`` for the t-th tuple in ``tuple_law``'s order (lexicographic
in the support's ranks: t is the tuple's rank in base s for iid, its Lehmer rank for wor).  Rows are padded to the
largest support; tuples through a padded rank have no columns.  The plan is then repaired
(:func:`~univer_theory.plans.lp_plan.repaired_plan`, on support ranks): clip, rows scaled to ``Σ_j w_j ≤ 1``,
tokens with ``a > ρp`` scaled down, ``a`` recomputed.  Dense tableaus of ``(n + s) × (n(k + 1) + s)`` entries,
n tuples, solved ``CONDOT_CHUNK`` entries at a time.  Written against :mod:`univer_theory.nx` (numpy or torch).
"""
from __future__ import annotations

import itertools

from univer_theory.nx import array_module, get_backend
from univer_theory.plans.lp_plan import plan_weights, repaired_plan
from univer_theory.processes import falling, wor_tuple_probs
from univer_theory.validation import check_choice, check_int, count_text

from .lex_simplex import lex_simplex
from .tie_break import prime_roots

#: Tableau entries solved at once (float64: 8 bytes each); a single row's LP beyond it is refused
#: (:func:`tableau_entries`; rule 1 and the shape rule stay far below it, ``choose.MAX_LP_TUPLES``).
CONDOT_CHUNK = 2 ** 25


def tableau_entries(s: int, k: int, process: str) -> int:
    """Entries of one row's dense tableau, ``(n + s) × (n(k + 1) + s)`` for its n ordered tuples of s drafted
    tokens (``s^k`` iid, ``s!/(s−k)!`` wor), as a Python int."""
    n = s ** k if process == "iid" else falling(s, k)
    return (n + s) * (n * (k + 1) + s)


def lehmer_rank(ranks, s):
    """Position of the distinct ranks ``d [..., k]`` (each < s) among the k-permutations of ``range(s)`` in
    lexicographic order: ``Σ_i (d_i − #{l < i : d_l < d_i}) · (s−1−i)!/(s−k)!``; ``s`` broadcasts against
    ``d[..., 0]``.  numpy or torch."""
    k = ranks.shape[-1]
    smaller = array_module(ranks).tril(ranks[..., None, :] < ranks[..., :, None], -1).sum(-1)   # earlier, below d_i
    return sum((ranks[..., i] - smaller[..., i]) * falling(s - 1 - i, k - 1 - i) for i in range(k))


def tuple_rank(ranks, s, process: str):
    """Position of the tuples of support ranks ``d [..., k]`` (each < s) in the exact core's order
    (``tuple_law``): base-s digits for ``iid``, :func:`lehmer_rank` for ``wor``.  numpy or torch."""
    if process == "wor":
        return lehmer_rank(ranks, s)
    k = ranks.shape[-1]
    return sum(ranks[..., i] * s ** (k - 1 - i) for i in range(k))


def condot_table(c, q, k: int, process: str, position_weights=None):
    """The plan of the module docstring on every tuple of each row's support, for ``iid`` / ``wor`` rows
    ``c = ρp [R, V]``, ``q [R, V]``, with the shape rule's position weights ω ``[R, k]`` when given (None or
    ``[R, 0]``: rule 1).

    Returns ``(sup [R, s], tup [n, k], w [R, n, k], a [R, V], solved [R])``: row r's support ascending in
    ``sup[r]`` (s the largest support; V pads), the tuples of support ranks in ``tuple_law``'s order (``sup[r,
    tup[t]]`` are the tokens of tuple t; a rank at or past row r's support names no tuple), their weights
    ``w_j(S) = min(1, π(S, j)/Q_k(S))`` repaired, the marginal, and whether the simplex finished (where it did
    not, the caller keeps its other plans).  numpy or torch."""
    check_choice(process, ("iid", "wor"), "condot_table", "process")
    check_int(k, "condot_table", "k", 1)
    nx = get_backend(c, q)
    R, V = q.shape
    omega = nx.full((R, 0), 0.0, q) if position_weights is None else nx.asarray(position_weights, q)
    s = (q > 0).sum(-1)
    s_max = int(s.max())
    entries = tableau_entries(s_max, k, process)
    if entries > CONDOT_CHUNK:                                  # before the tuples are listed
        raise ValueError(f"condot_table: k = {k} {process} children on {s_max} drafted tokens make a dense tableau "
                         f"of {count_text(entries)} entries, beyond CONDOT_CHUNK = 2^25 (256 MB); "
                         f"solvers.condot_lp solves such a node sparsely")
    token = nx.where(q > 0, nx.arange(V, q), V)
    sup = nx.take(token, nx.argsort(token))[:, :s_max]                   # the support, ascending (V: padding)
    tuples = itertools.product(range(s_max), repeat=k) if process == "iid" else itertools.permutations(range(s_max), k)
    tup = nx.index(list(tuples), q).reshape(-1, k)                                            # [n, k]
    n = tup.shape[0]
    rows, cols = n + s_max, n * (k + 1) + s_max
    chunk = max(1, CONDOT_CHUNK // (rows * cols))
    parts = [_solve(c[i:i + chunk], q[i:i + chunk], sup[i:i + chunk], s[i:i + chunk], tup, process, omega[i:i + chunk])
             for i in range(0, R, chunk)]
    w, a_sup, solved = (nx.concat(list(x), axis=0) for x in zip(*parts))
    a = nx.scatter_add(nx.zeros_like(q), nx.minimum(sup, V - 1), nx.where(sup < V, a_sup, 0.0))
    return sup, tup, w, a, solved


def _solve(c, q, sup, s, tup, process, omega):
    """The LPs of one chunk (``omega [r, k]``, or ``[r, 0]`` for rule 1): ``(w [r, n, k] repaired, a on the
    support [r, s_max], solved [r])``."""
    nx, xp = get_backend(c, q), array_module(q)
    r, s_max = sup.shape
    n, k = tup.shape
    V = q.shape[1]
    valid = (tup[None] < s[:, None, None]).all(2)                                         # [r, n]
    safe = nx.minimum(sup, V - 1)
    q_sup = nx.where(sup < V, nx.take(q, safe), 0.0)                                      # [r, s_max]
    c_sup = nx.where(sup < V, nx.take(c, safe), 0.0)
    # Q_k(S) as tuple_law: iid Π q(y_i); wor with the support's mass outside S summed (wor_tuple_probs)
    members = q_sup[:, tup]                                                               # [r, n, k]
    if process == "wor":
        drawn = (nx.arange(s_max, q) == tup[..., None]).any(1)                            # [n, s_max]
        prob = wor_tuple_probs(members, nx.where(drawn, 0.0, q_sup[:, None, :]).sum(2))
    else:
        prob = members.prod(2)
    prob = nx.where(valid, prob, 0.0)
    # columns: π(t, j) at t·k + j, a slack per tuple, a slack per support rank
    on = nx.asarray(xp.broadcast_to(valid[..., None], (r, n, k)).reshape(r, n * k), q)    # [r, n·k]
    col = nx.arange(n * k, q)
    A = nx.full((r, n + s_max, n * (k + 1) + s_max), 0.0, q)
    A[:, col // k, col] = on
    A[:, n + tup.reshape(-1), col] = on
    A[:, nx.arange(n + s_max, q), n * k + nx.arange(n + s_max, q)] = 1.0
    b = nx.concat([prob, nx.where(nx.arange(s_max, q) < s[:, None], c_sup, 0.0)])
    t = tuple_rank(tup[None], s[:, None], process)                                       # [r, n] tuple_law order
    tie = nx.asarray(prime_roots(n * k), q)[nx.minimum(t[..., None] * k + nx.arange(k, q), n * k - 1)].reshape(r, -1)
    levels = [2.0 * on - 1.0]
    if omega.shape[1]:
        levels.append(xp.broadcast_to(omega[:, None, :], (r, n, k)).reshape(r, n * k) * on)
    levels.append(tie * on)
    cost = nx.full((r, len(levels), A.shape[2]), 0.0, q)
    cost[:, :, :n * k] = xp.stack(levels, 1)
    basis = xp.broadcast_to((n * k + nx.arange(n + s_max, q))[None], (r, n + s_max))
    x, solved = lex_simplex(A, b, cost, basis, check_basis=False)                   # built as unit columns above
    w = plan_weights(x[:, :n * k].reshape(r, n, k), nx.where(valid, prob, 0.0))   # min(1, π/Q_k), the core's
    return (*repaired_plan(w, xp.broadcast_to(tup[None], (r, n, k)), prob, c_sup), solved)   # the exact core's repair
