"""Rule 7 batched: the Luce plan on each row's draft support (:mod:`univer_theory.plans.luce`, whose
:func:`~univer_theory.plans.luce.luce_fit` and :func:`~univer_theory.plans.luce.luce_weights` run here on torch
tensors — one implementation).  Rows are gathered onto their drafted tokens in token-id order (the exact core's
support order) and padded with undrafted tokens (q = 0: no set through them has mass, and they are never live)
to the largest support among the rows; that size is read on the host, since it sets the enumerated sets.
Identical rows (a level's siblings under one parent, the same context across a batch of trees) are fitted once.
"""
from __future__ import annotations

import torch

from univer_theory.plans.luce import LUCE_FLOOR, luce_fit, luce_weights


def luce_rows_weights(c: torch.Tensor, q: torch.Tensor, children: torch.Tensor):
    """``(w, a [R, V])``: the Luce plan of rows ``c = ρp``, ``q [R, V]`` on ``children [R, k]`` or ``[R, T, k]``
    (``w`` shaped as ``children``)."""
    V = q.shape[1]
    rows, inverse = torch.unique(torch.cat([c, q], 1), dim=0, return_inverse=True)   # identical rows fit once
    c_u, q_u = rows[:, :V], rows[:, V:]
    drafted = q_u > 0
    m = int(drafted.sum(1).max())
    key = torch.where(drafted, 0, V) + torch.arange(V, device=q.device)
    idx = key.argsort(1)[:, :m]                                        # drafted tokens by id, then padding
    valid = drafted.gather(1, idx)
    phi_s, tau_s, a_s = luce_fit(torch.where(valid, c_u.gather(1, idx), 0),
                                 torch.where(valid, q_u.gather(1, idx), 0), children.shape[-1])
    phi = torch.full_like(q_u, LUCE_FLOOR).scatter(1, idx, phi_s)[inverse]
    tau = torch.zeros_like(q_u).scatter(1, idx, tau_s)[inverse]
    flat = children.flatten(1)
    w = luce_weights(phi.gather(1, flat).view(children.shape), tau.gather(1, flat).view(children.shape))
    return w, torch.zeros_like(q_u).scatter(1, idx, a_s)[inverse]
