"""Target/draft model families on small vocabularies.

A model maps a prefix ``s`` (tuple of token ids relative to the context; ``()`` is the root) to the target
law ``p(·|s)`` and the draft law ``q(·|s)`` (theory.md §0), both already after temperature processing.
Every family can return exact ``Fraction`` rows (numpy ``object`` arrays) for the rational mode.
"""
from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np

from .tree import DraftTree, as_int_tuple
from .validation import check_int, check_real, check_simplex, check_temperature

Prefix = tuple[int, ...]


#: A float row whose sum is further than this from 1 (but within :data:`~univer_theory.validation.SIMPLEX_ATOL`)
#: is divided by its sum where the exact core reads it: the oracle's distance is ~2–4·|Σ − 1| for every lossless
#: verifier, so a model file of 10-decimal entries (Σ = 1 − 1e-10) read as it was flagged every method lossy.
ROW_SUM_ROUNDOFF = 1e-13


def checked_rows(model: "Model", prefix: Prefix, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``(p(·|s), q(·|s))`` of ``model`` at ``prefix``, each checked to be a probability row of length
    ``model.vocab_size`` (float64, or exact ``object`` rows kept exact); ValueError naming the row otherwise.
    A float row off 1 by more than :data:`ROW_SUM_ROUNDOFF` is divided by its sum (a copy)."""
    out = []
    for name, row in (("target", model.target(prefix)), ("draft", model.draft(prefix))):
        arr = check_simplex(row, where, f"{name} row at prefix {prefix}")
        if arr.shape != (model.vocab_size,):
            raise ValueError(f"{where}: {name} row at prefix {prefix} has shape {arr.shape}, "
                             f"expected ({model.vocab_size},) = (vocab_size,)")
        if arr.dtype != object and abs(arr.sum() - 1.0) > ROW_SUM_ROUNDOFF:
            arr = arr / arr.sum()
        out.append(arr)
    return out[0], out[1]


#: Seeds lie below this: each prefix's stream is ``SeedSequence([seed, len(prefix), *prefix])``, whose words are 32-bit,
#: so a larger seed spans two words and reads as another seed's longer prefix (seed 2^32's root row was seed 0's row
#: after token 0).
SEED_LIMIT = 2 ** 32


def check_seed(seed, where: str) -> int:
    """``seed`` as an int, or a ValueError unless it is an integer in ``[0, 2^32)`` (:data:`SEED_LIMIT`)."""
    seed = check_int(seed, where, "seed")
    if seed >= SEED_LIMIT:
        raise ValueError(f"{where}: seed must be below 2^32 (one 32-bit word of each prefix's seed sequence; a larger "
                         f"one repeats another seed's rows at other prefixes), got {seed}")
    return seed


def to_fractions(row, denominator: int = 1000) -> np.ndarray:
    """Round a float probability row to an exact ``Fraction`` row with the given denominator.

    Every positive entry keeps at least ``1/denominator``; the rounding remainder goes to the largest entry,
    so the result is exactly on the simplex and has the same support.  ValueError for a row off the simplex
    (:func:`~univer_theory.validation.check_simplex`), a denominator that is not a positive int, or one too
    small to keep the support (the largest entry would give up all it has).
    """
    check_int(denominator, "to_fractions", "denominator", 1)
    row = check_simplex(np.asarray(row, dtype=np.float64), "to_fractions", "input")
    if row.ndim != 1:
        raise ValueError(f"to_fractions: the input must be one row [V], got shape {row.shape}")
    if denominator <= 2**53:            # Python ints (int64 overflowed at a denominator ≥ 2^63)
        counts = np.array([int(c) for c in np.floor(row * denominator)], dtype=object)
    else:                               # exact floors: row·denominator overflowed a float beyond 1.8e308
        counts = np.array([int(Fraction(float(x)) * denominator) for x in row], dtype=object)
    counts[(row > 0) & (counts == 0)] = 1
    top = int(np.argmax(row))
    counts[top] += denominator - int(counts.sum())
    if counts[top] < 1:
        raise ValueError(f"to_fractions: denominator {denominator} too small for a row with "
                         f"{int(np.count_nonzero(row))} positive entries: each keeps at least 1/{denominator}, and "
                         f"the largest ({row[top]:.6g}) would be left with {counts[top]}/{denominator}")
    return np.array([Fraction(int(c), int(denominator)) for c in counts], dtype=object)


class Model:
    """Base class: ``target(prefix)`` and ``draft(prefix)`` return probability rows of length ``vocab_size``."""

    vocab_size: int

    def target(self, prefix: Prefix) -> np.ndarray:
        raise NotImplementedError

    def draft(self, prefix: Prefix) -> np.ndarray:
        raise NotImplementedError

    def _rows(self, prefix: Prefix) -> tuple[np.ndarray, np.ndarray]:
        """``self._make_rows(prefix)`` (a subclass's ``(target, draft)`` rows at ``prefix``), made once and kept in a
        dict on the instance: ``lru_cache(self._make_rows)`` stored on ``self`` was a reference cycle, so a model and
        its rows outlived their last use until the cyclic GC ran (for ever under ``gc.disable()``)."""
        cache = self.__dict__.setdefault("_row_cache", {})
        if prefix not in cache:
            cache[prefix] = self._make_rows(prefix)
        return cache[prefix]

    def node_probs(self, tree: DraftTree) -> tuple[np.ndarray, np.ndarray]:
        """``(target_probs [N, V], draft_probs [N, V])`` at every node's prefix ``s(u)``."""
        p = np.stack([self.target(s) for s in tree.paths])
        q = np.stack([self.draft(s) for s in tree.paths])
        return p, q

    @property
    def exact(self) -> bool:
        return self.target(()).dtype == object


def parse_prefix(key, vocab_size: int, where: str) -> Prefix:
    """A table key as a prefix tuple: a tuple / list of token ids, or a string of comma-joined token ids
    (``""`` the root, ``"1,0"`` tokens 1 then 0; ``"10"`` is the one token 10, never (1, 0)).  Every token must
    lie in ``[0, vocab_size)``; anything else raises ValueError naming the key and the rule."""
    if isinstance(key, str):
        parts = key.split(",") if key.strip() else []
        if not all(p.strip().isascii() and p.strip().isdigit() for p in parts):     # ASCII digits only
            raise ValueError(f"{where}: prefix key {key!r} is not comma-joined token ids like '' or '1,0'")
        prefix = tuple(int(p) for p in parts)
    elif isinstance(key, (tuple, list)):
        prefix = as_int_tuple(key, where, f"prefix key {key!r}")
    else:
        raise ValueError(f"{where}: prefix key {key!r} must be a tuple of token ids or a comma-joined string, "
                         f"got {type(key).__name__}")
    bad = [t for t in prefix if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{where}: prefix key {key!r} has token {bad[0]}, outside [0, {vocab_size}) "
                         f"(keys are comma-joined token ids, e.g. '1,0')")
    return prefix


#: Largest decimal exponent a model file's entry may carry: a float64 is 0 below 1e-324 and inf above 1e308, and
#: ``Fraction("1e999999999")`` would build a 10⁹-digit integer (the file then never loads).
MAX_ENTRY_EXPONENT = 400


class _JSONNumber(str):
    """A JSON number kept as its text (read exactly by :func:`_fraction`), shown as the number in messages."""

    __repr__ = str.__str__


def _fraction(x) -> Fraction:
    """A model-file entry (a JSON number, or a string like ``"1/3"`` or ``"0.25"``) as a Fraction; a ValueError
    for anything else, or for an exponent beyond :data:`MAX_ENTRY_EXPONENT`."""
    text = str(x).strip()
    _, e, exponent = text.lower().replace("_", "").partition("e")     # Fraction reads digit separators: '1e4_00'
    if e and exponent.lstrip("+-").isdigit() and abs(int(exponent)) > MAX_ENTRY_EXPONENT:
        raise ValueError(f"exponent of {text!r} out of range")
    return Fraction(text)


def _unique_keys(pairs) -> dict:
    """A JSON object as a dict, or a ValueError for a key written twice (``json.loads`` kept the last one silently:
    a model file's repeated prefix dropped its first row)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice in one object")
        out[key] = value
    return out


class TableModel(Model):
    """Explicit tables ``{prefix: row}`` for target and draft; a missing prefix falls back to the root row.

    A context-free model is the special case with only the root rows (see :func:`context_free`).
    """

    def __init__(self, vocab_size: int, target: dict, draft: dict):
        check_int(vocab_size, "TableModel", "vocab_size", 1)
        self.vocab_size = int(vocab_size)
        self._tables = {}
        for name, table in (("target", target), ("draft", draft)):
            if not isinstance(table, dict):
                raise ValueError(f"TableModel: {name} must be a dict {{prefix: row}}, got {type(table).__name__}")
            rows = {}
            for key, row in table.items():
                prefix = parse_prefix(key, self.vocab_size, f"TableModel: {name} table")
                if prefix in rows:
                    raise ValueError(f"TableModel: {name} table has two keys for prefix {prefix} (the second is "
                                     f"{key!r}); give each prefix once")
                arr = check_simplex(row, "TableModel", f"{name} row for prefix {prefix}")
                if arr.shape != (self.vocab_size,):
                    got = f"length {arr.size}" if arr.ndim == 1 else f"shape {arr.shape}"
                    raise ValueError(f"TableModel: {name} row for prefix {prefix} has {got}, expected vocab "
                                     f"{self.vocab_size} (one entry per token)")
                rows[prefix] = arr
            if () not in rows:
                raise ValueError(f"TableModel: the {name} table needs a root row (prefix \"\" or ())")
            self._tables[name] = rows

    def _row(self, name: str, prefix: Prefix) -> np.ndarray:
        table = self._tables[name]
        return table.get(tuple(prefix), table[()])

    def target(self, prefix):
        return self._row("target", prefix)

    def draft(self, prefix):
        return self._row("draft", prefix)

    @classmethod
    def from_json(cls, path: str | Path, exact: bool = False) -> "TableModel":
        """Read ``{"vocab": V, "target": {"": [...], "0,2": [...]}, "draft": {...}}``.

        Keys are prefixes as comma-joined token ids (``""`` is the root, ``"1,0"`` tokens 1 then 0, ``"10"`` the
        single token 10; see :func:`parse_prefix`).  Entries may be numbers or strings like ``"1/3"``; with
        ``exact=True`` every entry becomes a ``Fraction``.
        """
        try:
            # JSON numbers as their text (through float64, 1e-400 became 0 and digits past the 17th were lost
            # before the exact mode's Fraction saw them)
            data = json.loads(Path(path).read_text(), parse_float=_JSONNumber, object_pairs_hook=_unique_keys)
        except (OSError, ValueError, RecursionError) as err:    # RecursionError: nested too deep
            raise ValueError(f"TableModel.from_json: cannot read {path} as JSON ({err})") from None
        if not isinstance(data, dict):
            raise ValueError(f"TableModel.from_json: {path} must hold one JSON object, got {type(data).__name__}")
        for key in ("vocab", "target", "draft"):
            if key not in data:
                raise ValueError(f"TableModel.from_json: {path} has no {key!r} field")
        extra = sorted(set(data) - {"vocab", "target", "draft"})
        if extra:
            raise ValueError(f"TableModel.from_json: {path} has unknown field(s) {extra}; the fields are 'vocab', "
                             f"'target' and 'draft'")

        def parse_row(name: str, key: str, row):
            if not isinstance(row, list):
                raise ValueError(f"TableModel.from_json: {path}: the {name} row for prefix {key!r} must be a list "
                                 f"of {data['vocab']} probabilities, got {row!r}")
            try:
                values = [_fraction(x) for x in row]
                return np.array(values, dtype=object) if exact else np.array([float(x) for x in values])
            except (ValueError, ZeroDivisionError, OverflowError):     # OverflowError: beyond a float's range
                raise ValueError(f"TableModel.from_json: {path}: the {name} row for prefix {key!r} has an entry "
                                 f"that is not a number or a fraction like '1/3' (or is beyond "
                                 f"1e±{MAX_ENTRY_EXPONENT}, or a float's range): {row!r}") from None

        for name in ("target", "draft"):
            if not isinstance(data[name], dict):
                raise ValueError(f"TableModel.from_json: {path}: {name!r} must be an object {{prefix: row}}")
        tables = {name: {k: parse_row(name, k, v) for k, v in data[name].items()} for name in ("target", "draft")}
        return cls(data["vocab"], tables["target"], tables["draft"])


class CheckedModel(Model):
    """``base`` seen through :func:`checked_rows`: every row is checked once, on first use, and every row must be of
    the root's mode (exact or float; :attr:`Model.exact` reads the root).  The exact core's entry points wrap the
    caller's model with :func:`checked_model`, so a custom :class:`Model` with a bad row is a ValueError naming the
    prefix, not a wrong number."""

    def __init__(self, base: Model, where: str):
        self.base, self.vocab_size, self.where = base, base.vocab_size, where

    def _make_rows(self, prefix: Prefix) -> tuple[np.ndarray, np.ndarray]:
        rows = checked_rows(self.base, prefix, self.where)
        exact = (rows if prefix == () else self._rows(()))[0].dtype == object
        for name, row in zip(("target", "draft"), rows):    # the exact core runs in one mode (the solvers cast)
            if (row.dtype == object) != exact:
                raise ValueError(f"{self.where}: the {name} row at prefix {prefix} is "
                                 f"{'float' if exact else 'exact (Fraction)'} but the model's root target row is "
                                 f"{'exact (Fraction)' if exact else 'float'}: one mode for every row")
        return rows

    def target(self, prefix):
        return self._rows(tuple(prefix))[0]

    def draft(self, prefix):
        return self._rows(tuple(prefix))[1]


def checked_model(model, where: str) -> Model:
    """``model`` wrapped in :class:`CheckedModel` (once); ValueError unless :func:`check_model_type` passes."""
    if isinstance(model, CheckedModel):
        return model
    check_model_type(model, where)
    return CheckedModel(model, where)


def check_model_type(model, where: str) -> None:
    """ValueError unless ``model`` is a :class:`Model` with a positive integer ``vocab_size``."""
    if not isinstance(model, Model):
        raise ValueError(f"{where}: model must be a univer_theory Model (target/draft rows per prefix), got "
                         f"{type(model).__name__}")
    check_int(getattr(model, "vocab_size", None), where, "model.vocab_size", 1)


def context_free(target_probs, draft_probs) -> TableModel:
    """Model whose ``p`` and ``q`` do not depend on the prefix (rows ``[V]``)."""
    target_probs = np.asarray(target_probs)
    if target_probs.ndim != 1 or np.ndim(draft_probs) != 1:
        raise ValueError(f"context_free: target_probs and draft_probs must be rows [V], got shapes "
                         f"{target_probs.shape} and {np.shape(draft_probs)}")
    return TableModel(target_probs.shape[-1], {(): target_probs}, {(): np.asarray(draft_probs)})


class DirichletModel(Model):
    """Context-dependent seeded Dirichlet target/draft pairs.

    For each prefix s (its own deterministic random stream derived from ``seed`` and s):
    ``p(·|s) ~ Dir(concentration·1)``, ``n ~ Dir(concentration·1)``,
    ``q(·|s) = similarity·p(·|s) + (1 − similarity)·n``, then both floored at 1e-12 and renormalised (full
    support: a small concentration's draws underflow to 0).  ``similarity ∈ [0, 1]`` is the draft–target
    similarity knob (1: q = p); a small ``concentration`` makes both laws peaky.  ``exact=True`` rounds rows to
    Fractions of denominator ``denominator``.
    """

    def __init__(self, vocab_size: int, seed: int = 0, similarity: float = 0.5, concentration: float = 1.0,
                 exact: bool = False, denominator: int = 1000):
        check_int(vocab_size, "DirichletModel", "vocab_size", 2)
        check_seed(seed, "DirichletModel")
        if not 0.0 <= check_real(similarity, "DirichletModel", "similarity") <= 1.0:
            raise ValueError(f"DirichletModel: similarity must lie in [0, 1], got {similarity}")
        if not 0 < check_real(concentration, "DirichletModel", "concentration") < math.inf:
            raise ValueError(f"DirichletModel: concentration must be finite and > 0, got {concentration}")
        if exact:
            check_int(denominator, "DirichletModel", "denominator (exact=True)", 1)
        self.vocab_size, self.seed = int(vocab_size), int(seed)
        self.similarity, self.concentration = float(similarity), float(concentration)
        self.denominator = int(denominator) if exact else None

    def _make_rows(self, prefix: Prefix):
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, len(prefix), *prefix]))
        alpha = np.full(self.vocab_size, self.concentration)
        p = rng.dirichlet(alpha)
        q = self.similarity * p + (1.0 - self.similarity) * rng.dirichlet(alpha)
        # Dirichlet draws with small concentration can underflow to exact 0; keep full support.
        p, q = (np.maximum(x, 1e-12) for x in (p, q))
        p, q = p / p.sum(), q / q.sum()
        if self.denominator:
            return to_fractions(p, self.denominator), to_fractions(q, self.denominator)
        return p, q

    def target(self, prefix):
        return self._rows(tuple(prefix))[0]

    def draft(self, prefix):
        return self._rows(tuple(prefix))[1]


def apply_temperature(row: np.ndarray, temperature: float) -> np.ndarray:
    """``norm(row^{1/T})`` of a probability row (:func:`~univer_theory.validation.check_simplex`: ValueError off
    the simplex, so ``T = 1`` returns it as it is); ``T = 0`` is the one-hot argmax (lowest token id on ties),
    exact in both modes."""
    check_temperature(temperature, "apply_temperature")
    row = check_simplex(row, "apply_temperature", "input")
    if row.ndim != 1:        # T = 0 took the argmax of the flattened rows, T ≠ 1 normalised over all of them
        raise ValueError(f"apply_temperature: the input must be one row [V], got shape {row.shape}")
    if temperature == 0:
        one = Fraction(1) if row.dtype == object else 1.0
        out = np.full(row.size, 0 * one, dtype=row.dtype)
        out[int(np.argmax(row))] = one            # the exact row's own maximum (first on ties): float64 ties
                                                  # entries that differ below its resolution
        return out
    if temperature == 1:
        return row
    x = np.asarray(row, dtype=np.float64)
    x = (x / x.max()) ** (1.0 / temperature)     # over max(row) first: at a small T every row^{1/T} underflows
    return x / x.sum()


def resolve_draft_temperature(temperature: float, override: float | None = None) -> float:
    """The draft's temperature for a target sampled at ``temperature``: ``override`` when given, else the target's
    own, except at ``T = 0`` where the draft stays at 1 (a one-hot q supports one child only)."""
    if override is not None:
        return override
    return temperature if temperature > 0 else 1.0


class TemperedModel(Model):
    """``base`` with temperature applied to the target rows and to the draft rows at ``draft_temperature``
    (default: :func:`resolve_draft_temperature`, the target's T except 1 at T = 0)."""

    def __init__(self, base: Model, temperature: float, draft_temperature: float | None = None):
        check_model_type(base, "TemperedModel")
        self.base, self.vocab_size = base, base.vocab_size
        self.temperature = check_temperature(temperature, "TemperedModel")
        if draft_temperature is not None:
            draft_temperature = check_temperature(draft_temperature, "TemperedModel", "draft_temperature")
        self.draft_temperature = resolve_draft_temperature(self.temperature, draft_temperature)
        # T ∈ {0, 1} keeps an exact row exact, any other T makes it float: one mode for both (the exact core runs
        # in one; an exact base at T = 1 with a draft at 0.5 was refused, naming rows the caller never built)
        self._float = not {self.temperature, self.draft_temperature} <= {0.0, 1.0}

    def _tempered(self, row, temperature):
        row = apply_temperature(row, temperature)
        return row.astype(np.float64) if self._float and row.dtype == object else row

    def target(self, prefix):
        return self._tempered(self.base.target(prefix), self.temperature)

    def draft(self, prefix):
        return self._tempered(self.base.draft(prefix), self.draft_temperature)


#: Target families of :class:`ConfidentModel`.
CONFIDENT_TARGETS = ("dirichlet", "ties", "zero_top", "same")


class ConfidentModel(Model):
    """Context-dependent *confident* draft rows: near-deterministic drafts whose tail is at round-off scale.

    For each prefix s (its own random stream from ``seed`` and s): a top token ``x_0(s)`` takes ``1 − d`` of the
    draft and the rest takes ``d·t``, ``t ~ Dir(concentration·1)`` (``d`` = ``tail``; 1e-8 … 1e-310, the last a
    denormal scale — a logit gap of ~30 nats gives d ≈ 1e-13).  The target is

    * ``"dirichlet"``: ``p(·|s) ~ Dir(concentration·1)`` (no relation to the draft);
    * ``"ties"``: ``p(x_0) = top_target`` and the rest flat, with the draft's tail flat too (every tail token has
      the same ratio p/q: exact ties);
    * ``"zero_top"``: Dirichlet with ``p(x_0) = 0`` (the draft's favourite is impossible for the target);
    * ``"same"``: ``p = q``.

    Such rows defeat formulas that subtract from 1 or integrate over a fixed range of clock times; the grids of
    the lossless, optimality and reductions checks include them.  Float rows only (a Fraction row of a 1e-300
    tail is of no use).
    """

    def __init__(self, vocab_size: int, seed: int = 0, tail: float = 1e-14, target: str = "dirichlet",
                 concentration: float = 1.0, top_target: float = 1e-6):
        check_int(vocab_size, "ConfidentModel", "vocab_size", 2)
        check_seed(seed, "ConfidentModel")
        if not 0.0 < check_real(tail, "ConfidentModel", "tail") < 0.5:
            raise ValueError(f"ConfidentModel: tail must lie in (0, 0.5), got {tail}")
        if target not in CONFIDENT_TARGETS:
            raise ValueError(f"ConfidentModel: unknown target {target!r}; choose one of {list(CONFIDENT_TARGETS)}")
        if not 0 < check_real(concentration, "ConfidentModel", "concentration") < math.inf:
            raise ValueError(f"ConfidentModel: concentration must be finite and > 0, got {concentration}")
        if not 0.0 <= check_real(top_target, "ConfidentModel", "top_target") <= 1.0:
            raise ValueError(f"ConfidentModel: top_target must lie in [0, 1], got {top_target}")
        self.vocab_size, self.seed, self.tail, self.kind = int(vocab_size), int(seed), float(tail), target
        self.concentration, self.top_target = float(concentration), float(top_target)

    def _make_rows(self, prefix: Prefix):
        V = self.vocab_size
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, len(prefix), *prefix]))
        top = int(rng.integers(V))
        rest = np.arange(V) != top
        flat = self.kind == "ties"
        shape = np.full(V - 1, 1.0 / (V - 1)) if flat else rng.dirichlet(np.full(V - 1, self.concentration))
        q = np.zeros(V)
        q[rest] = self.tail * shape
        q[top] = 1.0 - q[rest].sum()
        if self.kind == "same":
            return q, q
        if flat:
            p = np.full(V, (1.0 - self.top_target) / (V - 1))
            p[top] = self.top_target
            return p, q
        p = rng.dirichlet(np.full(V, self.concentration))
        p = np.maximum(p, 1e-12)                       # full support (as DirichletModel)
        if self.kind == "zero_top":
            p[top] = 0.0
        return p / p.sum(), q

    def target(self, prefix):
        return self._rows(tuple(prefix))[0]

    def draft(self, prefix):
        return self._rows(tuple(prefix))[1]
