"""Machine-checked symbolic identities behind losslessness (sympy).

Each ``prove_*`` function builds the identity with symbolic probabilities and returns the list of residual
expressions — one per case of every ``min``/``[·]_+`` split — which must all simplify to 0.  ``[z]_+`` and
``min`` are resolved by enumerating the sign pattern of their arguments (every pattern is a case), so no
assumption beyond the stated domain is used.  :func:`verify_all` runs them all.
"""
from __future__ import annotations

from itertools import product

import sympy as sp


def _cases(n: int):
    """All sign patterns of n ``min``/``max`` arguments: True means ``rP ≥ Q`` for that token."""
    return product((True, False), repeat=n)


def prove_one_stage_identity() -> list:
    """``min(rP, Q) + [rP − Q]_+ = rP`` for one token, both cases."""
    r, P, Q = sp.symbols("r P Q", nonnegative=True)
    out = []
    for ge, in _cases(1):
        mn = Q if ge else r * P
        pos = r * P - Q if ge else 0
        out.append(sp.simplify(mn + pos - r * P))
    return out


def prove_residual_update(vocab: int = 3) -> list:
    """One TV stage at a node with scaling r and a drafted leaf child (theory §3.7): the child succeeds w.p.
    ``min(1, rP(y)/Q(y))``; if it fails (prob ``1 − Σ min(rP, Q) = 1 − r + R``), the node succeeds w.p.
    ``r' = R/(R + 1 − r)`` emitting ``[rP − Q]_+/R``.  Output mass of token x must be ``r·P(x)``, given
    ``ΣP = ΣQ = 1``.  Checked for every sign pattern of ``rP − Q`` over a ``vocab``-token alphabet."""
    r = sp.symbols("r", positive=True)
    P = sp.symbols(f"P0:{vocab}", nonnegative=True)
    Q = sp.symbols(f"Q0:{vocab}", nonnegative=True)
    out = []
    for pattern in _cases(vocab):
        if all(pattern) or not any(pattern):
            # no token with rP > Q means R = 0 (no failure mass to redistribute); rP ≥ Q on every token
            # with ΣP = ΣQ = 1 forces r = 1 and P = Q, i.e. R = 0 again: the one-stage identity covers both
            continue
        pos = [r * P[x] - Q[x] if ge else 0 for x, ge in enumerate(pattern)]
        mn = [Q[x] if ge else r * P[x] for x, ge in enumerate(pattern)]
        R = sum(pos)
        fail = 1 - sum(mn)
        r_new = R / (R + 1 - r)
        for x in range(vocab):
            mass = mn[x] + fail * r_new * pos[x] / R
            expr = (mass - r * P[x]).subs({P[-1]: 1 - sum(P[:-1]), Q[-1]: 1 - sum(Q[:-1])})
            out.append(sp.simplify(expr))
    return out


def prove_block_verification_step() -> list:
    """BV's backward step keeps the through-probability: ``h + (1 − h)(w − R) = w`` with ``h = R/(R + 1 − w)``."""
    w, R = sp.symbols("w R", positive=True)
    h = R / (R + 1 - w)
    return [sp.simplify(h + (1 - h) * (w - R) - w)]


def prove_mass_balance_one_node(vocab: int = 3) -> list:
    """Mass-balance lemma (theory §2) on a one-node tree (root with one drafted child) under token-level
    verification: ``c((), y) = a(())·p(y) − a((y,))`` with ``a(()) = 1``, ``a((y,)) = q(y)·min(1, p(y)/q(y))``
    and ``c((), y) = (1 − α)·[p(y) − q(y)]_+ / Σ[p − q]_+``; every sign pattern of ``p − q``."""
    P = sp.symbols(f"p0:{vocab}", nonnegative=True)
    Q = sp.symbols(f"q0:{vocab}", positive=True)
    out = []
    for pattern in _cases(vocab):
        if all(pattern) or not any(pattern):
            continue  # with Σp = Σq = 1 a strict one-sided pattern forces p = q (no residual mass)
        pos = [P[x] - Q[x] if ge else 0 for x, ge in enumerate(pattern)]
        a_child = [Q[x] if ge else P[x] for x, ge in enumerate(pattern)]
        alpha = sum(a_child)
        R = sum(pos)
        for y in range(vocab):
            c = (1 - alpha) * pos[y] / R
            expr = (c - (P[y] - a_child[y])).subs({P[-1]: 1 - sum(P[:-1]), Q[-1]: 1 - sum(Q[:-1])})
            out.append(sp.simplify(expr))
    return out


PROOFS = {
    "one_stage_identity": prove_one_stage_identity,
    "residual_update": prove_residual_update,
    "block_verification_step": prove_block_verification_step,
    "mass_balance_one_node": prove_mass_balance_one_node,
}


def verify_all() -> dict[str, bool]:
    """``{name: every residual simplifies to 0}``."""
    return {name: all(e == 0 for e in fn()) for name, fn in PROOFS.items()}
