"""The token orders of the node rules, written once for numpy and torch rows ``[..., V]`` (:mod:`.nx`).

* :func:`ratio_argsort` — tokens by ``p/q`` (:func:`ratio_key`), ties by token id, ``q = 0`` last: ascending,
  its prefixes hold a minimising cut of CondOT(ρ) (α*, the wor k = 2 cut, K-SEQ's β); descending, PTS's
  priority (``num = p``) and the layout's blocks (``num = ρp``);
* :func:`top_tokens` — the m most likely draft tokens, ties to the lower id: the topk list, greedy's fixed
  list, SpecHub's hub.
"""
from __future__ import annotations

from .nx import get_backend

#: The ratio keys are ``2^-51·p/q``: scaling by a power of 2 is exact, so the order and the ties are those of
#: ``p/q``, and the key stays finite for every q > 0 (``p/q`` itself overflows once q is subnormal).
RATIO_SCALE = 2.0 ** -51


def ratio_key(num, den):
    """``RATIO_SCALE·num/den`` where ``den > 0``, ``+inf`` where ``den = 0`` — numpy arrays or torch tensors
    (the one key of every ratio order, :func:`ratio_argsort`)."""
    nx = get_backend(num, den)
    drafted = den > 0
    return nx.where(drafted, (num * RATIO_SCALE) / nx.where(drafted, den, 1.0), nx.inf)


def ratio_argsort(num, den, descending: bool = False):
    """Tokens ``[..., V]`` by ``num/den`` (:func:`ratio_key`) ascending — or descending — ties by token id, tokens
    with ``den = 0`` last; numpy arrays or torch tensors."""
    nx = get_backend(num, den)
    key = ratio_key(num, den)
    if descending:
        key = nx.where(den > 0, -key, nx.inf)
    return nx.argsort(key)


def top_tokens(q, m: int):
    """``[..., m]``: the m most likely tokens of each row ``q [..., V]``, most likely first, ties to the lower
    token id (a stable sort of ``−q``; for m = 1 the first largest entry, without the sort); numpy arrays (float or
    Fraction entries) or torch tensors."""
    nx = get_backend(q)
    return nx.argmax(q) if m == 1 else nx.argsort(-q)[..., :m]
