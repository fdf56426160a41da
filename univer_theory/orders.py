"""The token orders of the node rules, written once for numpy and torch rows ``[..., V]`` (:mod:`.nx`).

* :func:`ratio_argsort` — tokens by ``p/q`` (:func:`ratio_key`), ties by token id, ``q = 0`` last: ascending,
  its prefixes hold a minimising cut of CondOT(ρ) (α*, the wor k = 2 cut, K-SEQ's β); descending, PTS's
  priority (``num = p``) and the layout's blocks (``num = ρp``); :func:`descending_ratio_order` turns the
  ascending order into the descending one in O(V), :func:`order_ranks` inverts an order;
* :func:`top_tokens` — the m most likely draft tokens, ties to the lower id: the topk list, greedy's fixed
  list, SpecHub's hub.
"""
from __future__ import annotations

from .nx import get_backend

#: The ratio keys are ``2^-51·p/q``: the key stays finite for every q > 0 (``p/q`` itself overflows once q is
#: subnormal), and scaling by a power of 2 is exact while ``2^-51·p`` is normal (p ≥ 2^-971 ≈ 5e-293), so the order
#: and the ties there are those of the rounded quotient p/q.  Below, the key loses bits with p: tokens of mass
#: < 5e-293 may tie with (or, under ~2^-1023, sort before) tokens of a lower ratio — a mass far below every tolerance.
RATIO_SCALE = 2.0 ** -51


def ratio_key(num, den, sign: float = 1.0):
    """``sign·RATIO_SCALE·num/den`` where ``den > 0``, ``+inf`` where ``den = 0`` — numpy arrays or torch tensors
    (the one key of every ratio order, :func:`ratio_argsort`; ``sign = −1``: the descending order's keys, the
    ascending ones negated exactly — IEEE products and quotients are symmetric in sign)."""
    nx = get_backend(num, den)
    drafted = den > 0
    return nx.where(drafted, (num * (sign * RATIO_SCALE)) / nx.where(drafted, den, 1.0), nx.inf)


def ratio_argsort(num, den, descending: bool = False):
    """Tokens ``[..., V]`` by ``num/den`` (:func:`ratio_key`) ascending — or descending — ties by token id, tokens
    with ``den = 0`` last; numpy arrays or torch tensors."""
    return get_backend(num, den).argsort(ratio_key(num, den, -1.0 if descending else 1.0))


def descending_ratio_order(order, num, den):
    """``ratio_argsort(num, den, descending=True)`` from the ascending ``order = ratio_argsort(num, den)`` in O(V),
    without a second sort.  Ascending, the drafted tokens (``den > 0``, finite keys) come first, ties by id, the
    undrafted ones last by id; descending keeps the undrafted tail and reverses the drafted part run by run: a run
    of tied keys occupying ascending positions ``a..b`` of a row with m drafted tokens moves to positions
    ``m − 1 − b ..`` and keeps its id order (ties still go to the lower id)."""
    nx = get_backend(num, den)
    key = nx.take(ratio_key(num, den), order)
    V = key.shape[-1]
    j = nx.arange(V, key) + 0 * order
    m = nx.sum(den > 0, keepdims=True)
    change = key[..., 1:] != key[..., :-1]
    first = nx.concat([change[..., :1] | True, change])                   # a run starts here
    last = nx.concat([change, change[..., :1] | True])                    # a run ends here
    start = -nx.cummin(nx.where(first, -j, 0))                            # running max of the run starts
    end = nx.cummin(nx.where(last, j, V), reverse=True)
    rank = nx.where(j < m, (m - 1 - end) + (j - start), j)
    return nx.put(order, rank, order)


def order_ranks(order):
    """The inverse permutation of ``order [..., V]`` (a permutation of ``0..V−1`` per row): ``rank[order[j]] = j``,
    each token's position in the order; numpy arrays or torch tensors."""
    nx = get_backend(order)
    return nx.put(order, order, nx.arange(order.shape[-1], order) + 0 * order)


def top_tokens(q, m: int):
    """``[..., m]``: the m most likely tokens of each row ``q [..., V]``, most likely first, ties to the lower
    token id (a stable sort of ``−q``; for m = 1 the first largest entry, without the sort); numpy arrays (float or
    Fraction entries) or torch tensors."""
    nx = get_backend(q)
    return nx.argmax(q) if m == 1 else nx.argsort(-q)[..., :m]
