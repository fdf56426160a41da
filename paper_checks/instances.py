"""Seeded random instances for the claims checked on exact toys (optimality, global gap).

A fixed grid only tests the instances somebody picked; the UniVer-vs-TV claim once held on a grid and failed
on the next seeds of the same families.  Here every instance is drawn from one seeded generator:

* vocabulary ``V`` uniform on the allowed sizes (3–5);
* a shape from the caller's list (each with its largest allowed ``V``, since the exact oracle and the LPs
  grow as ``V^{nodes}``), depth-3 asymmetric ones included;
* a row family (:data:`FAMILIES`): ``dirichlet`` (concentration 0.8), ``peaky`` (0.2), ``sparse`` (Dirichlet
  rows with target and draft zeros) — each drawn per prefix (context-dependent) or once for all prefixes
  (context-free), with a draft–target similarity uniform on [0.2, 0.8];
* the draft process, ``iid`` or ``wor``.

:func:`confident_instances` draws, from its own stream, instances of near-deterministic drafts
(:class:`univer_theory.ConfidentModel`: one token holds all but d of q, d ∈ :data:`CONFIDENT_TAILS`, down to a
subnormal 1e-310; Dirichlet, tied, zero-on-top and p = q targets) — the rows that broke UniVer's float path
before its clock integrals followed the row.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from univer_theory import ConfidentModel, Model, TreeShape
from univer_theory.models import CONFIDENT_TARGETS

#: Row families: name → Dirichlet concentration (``sparse`` also zeroes entries, see :class:`RandomRowsModel`).
FAMILIES = {"dirichlet": 0.8, "peaky": 0.2, "sparse": 1.0}
#: Vocabulary sizes drawn from.
VOCAB_SIZES = (3, 4, 5)
#: Draft tail masses d of the confident instances.
CONFIDENT_TAILS = (1e-8, 1e-12, 1e-16, 1e-300, 1e-310)
#: Smallest entry kept in a Dirichlet row (small concentrations underflow to exact zeros).
FLOOR = 1e-12


class RandomRowsModel(Model):
    """Seeded target/draft rows of one :data:`FAMILIES` family, per prefix or shared by every prefix.

    For each prefix s (its own random stream from ``seed`` and s; the empty prefix for every s when
    ``context_free``): ``p ~ Dir(c·1)``, ``n ~ Dir(c·1)``, ``q = similarity·p + (1 − similarity)·n`` with ``c``
    the family's concentration.  ``sparse``: a random subset of ``⌊V/3⌋`` tokens gets ``p = 0`` and another of
    the same size ``q = 0`` (never the drafted support below ``min_support`` tokens, so a without-replacement
    node of ``min_support`` children can still be drafted); rows are renormalised.
    """

    def __init__(self, vocab_size: int, family: str, seed: int, similarity: float, context_free: bool,
                 min_support: int = 1):
        if family not in FAMILIES:
            raise ValueError(f"RandomRowsModel: family must be one of {list(FAMILIES)}, got {family!r}")
        if not 1 <= min_support <= vocab_size:
            raise ValueError(f"RandomRowsModel: min_support must lie in [1, V = {vocab_size}], got {min_support}")
        self.vocab_size, self.family, self.seed = int(vocab_size), family, int(seed)
        self.similarity, self.context_free, self.min_support = float(similarity), bool(context_free), min_support

    def _make_rows(self, prefix: tuple):
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, len(prefix), *prefix]))
        alpha = np.full(self.vocab_size, FAMILIES[self.family])
        p = np.maximum(rng.dirichlet(alpha), FLOOR)
        q = np.maximum(self.similarity * p + (1.0 - self.similarity) * rng.dirichlet(alpha), FLOOR)
        if self.family == "sparse":
            m = min(self.vocab_size // 3, self.vocab_size - self.min_support)
            p[rng.choice(self.vocab_size, m, replace=False)] = 0.0
            q[rng.choice(self.vocab_size, m, replace=False)] = 0.0
        return p / p.sum(), q / q.sum()

    def target(self, prefix):
        return self._rows(() if self.context_free else tuple(prefix))[0]

    def draft(self, prefix):
        return self._rows(() if self.context_free else tuple(prefix))[1]


@dataclass(frozen=True)
class Instance:
    """One drawn instance: a readable name, the model, the tree shape and the draft process."""

    name: str
    model: Model
    shape: TreeShape
    process: str


def random_instances(count: int, seed: int, shapes: dict[str, int]) -> list[Instance]:
    """``count`` instances from the generator of the module docstring; ``shapes`` maps each shape (as
    :meth:`TreeShape.parse` reads it) to the largest ``V`` it is drawn with."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        text, shape, V = _shape_and_vocab(rng, shapes)
        family = list(FAMILIES)[rng.integers(len(FAMILIES))]
        context_free = bool(rng.integers(2))
        process = ("iid", "wor")[rng.integers(2)]
        similarity = float(np.round(rng.uniform(0.2, 0.8), 3))
        model_seed = int(rng.integers(2**31))
        width = shape.max_children
        model = RandomRowsModel(V, family, model_seed, similarity, context_free, min_support=width)
        name = (f"{family}{'-cf' if context_free else ''}/V{V}/sim{similarity:g}/s{model_seed}/{text}/{process}")
        out.append(Instance(name, model, shape, process))
    return out


def _shape_and_vocab(rng, shapes: dict[str, int]) -> tuple[str, TreeShape, int]:
    names = list(shapes)
    text = names[rng.integers(len(names))]
    return text, TreeShape.parse(text), int(rng.choice([v for v in VOCAB_SIZES if v <= shapes[text]]))


def confident_instances(count: int, seed: int, shapes: dict[str, int]) -> list[Instance]:
    """``count`` confident instances (module docstring) over ``shapes`` (shape → largest V), iid and wor."""
    rng = np.random.default_rng([seed, 1])
    out = []
    for _ in range(count):
        text, shape, V = _shape_and_vocab(rng, shapes)
        tail = CONFIDENT_TAILS[rng.integers(len(CONFIDENT_TAILS))]
        target = CONFIDENT_TARGETS[rng.integers(len(CONFIDENT_TARGETS))]
        process = ("iid", "wor")[rng.integers(2)]
        model_seed = int(rng.integers(2**31))
        out.append(Instance(f"confident-{target}/d{tail:g}/V{V}/s{model_seed}/{text}/{process}",
                            ConfidentModel(V, seed=model_seed, tail=tail, target=target), shape, process))
    return out
