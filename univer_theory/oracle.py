"""The losslessness oracle: exact overall output law, distance to the target law, exact E[τ].

For a model, a tree shape, a draft process and a verifier, the overall law of (path tokens…, Y) is
``Σ_T Q(T)·law_T``.  Rule-based verifiers use the prefix recursion of :func:`engine.expected_law` (same
value, far fewer node evaluations); others enumerate trees.  Outputs are continued by target sampling to the
common length ``D + 1`` (D = shape depth) and compared with the target law in total variation:
``distance = ½ Σ_x |law(x) − p(x)|`` over ``x ∈ V^{D+1}`` — 0 exactly iff the verifier is lossless here.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from . import engine
from .models import Model, check_model_type, checked_model
from .processes import EXACT_PROCESSES, enumerate_trees, tuple_law
from .tolerance import worst_of
from .tree import TreeShape, as_shape
from .validation import Unsupported, check_choice
from .verifiers import Verifier

#: A float distance at or below this counts as lossless (the Standards' enumeration tolerance).
LOSSLESS_TOL = 1e-12


def check_inputs(where: str, model, shape, process: str, verifier) -> tuple[Model, TreeShape]:
    """The entry checks of :func:`output_law` / :func:`evaluate`: ``(model with every row checked on use, shape)``
    (a shape may be given as its text, ``"2,2"``); ValueError naming the argument and the rule otherwise."""
    model = checked_model(model, where)
    shape = as_shape(shape, where)
    check_choice(process, EXACT_PROCESSES, where, "process")
    if not isinstance(verifier, Verifier):
        raise ValueError(f"{where}: verifier must be a Verifier (e.g. VERIFIERS['tv']), got {type(verifier).__name__}")
    return model, shape


def output_law(model: Model, shape: TreeShape, process: str, verifier: Verifier, on_node=None) -> dict:
    """Exact law ``{(path tokens…, Y): prob}`` averaged over drafted trees and the verifier's coins.

    ``on_node(info)`` sees each distinct internal node's rule info (rule-based verifiers only)."""
    model, shape = check_inputs("output_law", model, shape, process, verifier)
    why = verifier.unsupported(shape, process, model.exact)
    if why:
        raise Unsupported(f"output_law: shape {shape}: {why}")
    if verifier.rule is not None:
        return engine.expected_law(model, shape, process, verifier.rule, tuple_law, on_node)
    return enumerated_output_law(model, shape, process, verifier)


def enumerated_output_law(model: Model, shape: TreeShape, process: str, verifier: Verifier) -> dict:
    """``Σ_T Q(T)·law_T`` by explicit tree enumeration (the definition; used to cross-check the recursion)."""
    out: dict = {}
    for tree, qt in enumerate_trees(model, shape, process):
        p, q = model.node_probs(tree)
        for key, v in verifier.law(tree, p, q, process).items():
            out[key] = out.get(key, 0) + qt * v
    return out


def expected_accepted(law: dict):
    """``E[τ] = Σ prob·(len(path))`` of an output law."""
    return sum((len(k) - 1) * v for k, v in law.items())


def distance_to_target(model: Model, law: dict, length: int):
    """Total-variation distance between the output law continued by target sampling to ``length`` tokens
    and the target law of ``length`` tokens (exact in Fraction mode)."""
    check_model_type(model, "distance_to_target")
    full: dict = {}

    def extend(seq, mass):
        if len(seq) == length:
            full[seq] = full.get(seq, 0) + mass
            return
        row = model.target(seq)
        for y in range(model.vocab_size):
            if row[y] != 0:
                extend(seq + (y,), mass * row[y])

    try:
        for key, v in law.items():
            if len(key) > length:
                raise ValueError(f"distance_to_target: output {key} is longer than length {length}")
            if not all(0 <= y < model.vocab_size for y in key):
                raise ValueError(f"distance_to_target: output {key} has a token outside [0, {model.vocab_size})")
            if v != 0:
                extend(key, v)
    finally:
        extend = None       # extend -> its closure cell -> extend: freed now (raised or not), not by the cyclic GC

    def target_prob(seq):
        pr = 1
        for i, y in enumerate(seq):
            pr = pr * model.target(seq[:i])[y]
        return pr

    diff, covered = 0, 0
    for seq, v in full.items():
        t = target_prob(seq)
        covered = covered + t
        diff = diff + abs(v - t)
    return (diff + max(1 - covered, 0)) / 2  # 1 − covered ≥ 0; max() only drops float round-off


def mass_balance_violation(model: Model, law: dict):
    """``max_{s,y} |c(s,y) − (a(s)·p(y|s) − a(s·y))|`` (theory §2 lemma, ``a(()) = 1``); 0 iff lossless (a law of
    another total mass, scaled, is not: ``a(())`` is 1, not the law's mass).  Exact (a Fraction) for Fraction
    laws."""
    one = next(iter(law.values())) * 0 + 1 if law else 1
    a: dict = {(): one}
    c: dict = {}
    for key, v in law.items():
        path = key[:-1]
        for i in range(1, len(path) + 1):
            a[path[:i]] = a.get(path[:i], 0) + v
        c[key] = c.get(key, 0) + v
    rows = {s: model.target(s) for s in a}
    return worst_of(*(abs(c.get(s + (y,), 0) - (a[s] * rows[s][y] - a.get(s + (y,), 0)))
                      for s in a for y in range(model.vocab_size)))


@dataclass(frozen=True)
class MethodResult:
    """One verifier on one (model, shape, process): the public JSON fields."""

    expected_accepted: object
    distance: object
    plans: dict | None = None   # UniVer-style rules: {construction: number of node plans that used it}

    @property
    def lossless(self) -> bool:
        return bool(self.distance == 0 if not isinstance(self.distance, float) else self.distance <= LOSSLESS_TOL)

    def as_json(self) -> dict:
        """Floats under the public keys; in rational mode ``exact`` adds both values as ``"p/q"`` strings."""
        out = {"expected_accepted": float(self.expected_accepted), "distance": float(self.distance),
               "lossless": bool(self.lossless)}
        if isinstance(self.expected_accepted, Fraction):
            out["exact"] = {"expected_accepted": str(self.expected_accepted), "distance": str(self.distance)}
        if self.plans is not None:
            out["plans"] = dict(self.plans)
        return out


def evaluate(model: Model, shape: TreeShape, process: str, verifier: Verifier, on_node=None) -> MethodResult:
    """Exact E[τ] and distance to the target law of one verifier (and, for rules that record a
    ``construction`` per node, how many node plans used each construction).  ``on_node(info)``: as in
    :func:`output_law` (e.g. a progress bar's tick per node evaluation)."""
    plans: dict = {}

    def count(info):
        if "construction" in info:
            plans[info["construction"]] = plans.get(info["construction"], 0) + 1
        if on_node is not None:
            on_node(info)

    model, shape = check_inputs("evaluate", model, shape, process, verifier)
    law = output_law(model, shape, process, verifier, count)
    return MethodResult(expected_accepted(law), distance_to_target(model, law, shape.max_depth + 1), plans or None)
