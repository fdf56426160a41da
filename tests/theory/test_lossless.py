"""Every lossless verifier is exactly lossless on the grid; the oracle's two paths agree."""
from fractions import Fraction as F

import numpy as np
import pytest

from univer_theory import (LOSSLESS_TOL, VERIFIERS, DirichletModel, DraftTree, Model, TemperedModel, TreeShape,
                           context_free, distance_to_target, enumerated_output_law, evaluate, mass_balance_violation,
                           output_law)

from paper_checks.base import law_distance

from .instances import grid

FLOAT_CASES = [(cid, m, s, pr, v) for cid, m, s, pr in grid(vocabs=(3, 4, 5)) for v in VERIFIERS.values()
               if v.supports(s, pr) and not (m.vocab_size == 5 and s.num_nodes > 6 and pr == "iid")]
EXACT_CASES = [(cid, m, s, pr, v) for cid, m, s, pr in grid(vocabs=(3,), exact=True) for v in VERIFIERS.values()
               if v.supports(s, pr) and v.rational]


@pytest.mark.parametrize("cid,model,shape,process,verifier", FLOAT_CASES,
                         ids=[f"{c[0]}-{c[4].name}" for c in FLOAT_CASES])
def test_lossless_float(cid, model, shape, process, verifier):
    r = evaluate(model, shape, process, verifier)
    assert r.distance <= LOSSLESS_TOL, f"{verifier.name} on {cid}: distance {r.distance}"


@pytest.mark.parametrize("cid,model,shape,process,verifier", EXACT_CASES,
                         ids=[f"{c[0]}-{c[4].name}" for c in EXACT_CASES])
def test_lossless_rational_is_exact(cid, model, shape, process, verifier):
    law = output_law(model, shape, process, verifier)
    assert sum(law.values()) == 1
    assert distance_to_target(model, law, shape.max_depth + 1) == 0
    assert mass_balance_violation(model, law) == 0


@pytest.mark.parametrize("name,process,shape", [("tv", "wor", "2,2"), ("rrs", "iid", "2,1"), ("kseq", "iid", "3,1"),
                                                ("nss", "topk", "2,2"), ("univer", "wor", "2,2"),
                                                ("univer", "iid", "(.,(..))")])
def test_prefix_recursion_equals_tree_enumeration(name, process, shape):
    """``output_law`` (prefix recursion) == ``Σ_T Q(T)·law_T`` (explicit enumeration)."""
    model = DirichletModel(3, seed=3, similarity=0.3)
    shape = TreeShape.parse(shape)
    a = output_law(model, shape, process, VERIFIERS[name])
    b = enumerated_output_law(model, shape, process, VERIFIERS[name])
    assert law_distance(a, b) < 1e-14


def test_distance_detects_a_wrong_law():
    """The distance is not blind: moving mass between two outputs is seen exactly."""
    model = DirichletModel(3, seed=1, exact=True)
    shape = TreeShape.parse("2")
    law = output_law(model, shape, "wor", VERIFIERS["tv"])
    k1, k2 = sorted(law)[:2]
    eps = min(law[k1], law[k2]) / 2
    law[k1] -= eps
    law[k2] += eps
    assert distance_to_target(model, law, 2) == eps
    assert mass_balance_violation(model, law) > 0


def test_a_nan_in_a_law_is_not_lossless():
    """A NaN entry (a rule's NaN residual) is a broken law: ``max`` kept the first finite gap and
    ``mass_balance_violation`` returned it, 0 on a law otherwise lossless; both measures must be NaN, never ≤ tol."""
    model = DirichletModel(3, seed=1)
    law = output_law(model, TreeShape.parse("2"), "wor", VERIFIERS["tv"])
    assert mass_balance_violation(model, law) <= LOSSLESS_TOL
    law[sorted(law)[-1]] = float("nan")
    assert np.isnan(mass_balance_violation(model, law)) and np.isnan(distance_to_target(model, law, 2))


def _exact(*values):
    return np.array(values, dtype=object)


THIRDS = _exact(F(1, 3), F(1, 3), F(1, 3))


@pytest.mark.parametrize("model,name,process,shape", [
    (context_free(_exact(1, 0, 0), _exact(F(1, 2), F(1, 4), F(1, 4))), "nss", "wor", "2,1"),   # int target
    (context_free(THIRDS, _exact(0, 1, 0)), "tv", "wor", "1,1"),                               # int draft
    (context_free(THIRDS, _exact(0, 1, 0)), "rrsw", "wor", "1,1"),
    (context_free(THIRDS, _exact(0, 1, 0)), "bv", "wor", "1,1"),
    (TemperedModel(context_free(_exact(F(1, 2), F(1, 4), F(1, 4)), THIRDS), 0, 1), "nss", "wor", "2"),  # T = 0
    (TemperedModel(context_free(_exact(F(1, 2), F(1, 4), F(1, 4)), THIRDS), 0, 1), "tv", "iid", "2,1"),
], ids=["int-target-nss", "int-draft-tv", "int-draft-rrsw", "int-draft-bv", "T0-nss", "T0-tv"])
def test_int_rows_and_zero_temperature_stay_exact(model, name, process, shape):
    """Exact rows written with ints, and ``T = 0`` applied to Fraction rows, are Fraction rows: the law is in
    Fractions and exactly the target's (Python's ``int / int`` is a float: such rows gave float laws, 5.6e-17 off)."""
    law = output_law(model, TreeShape.parse(shape), process, VERIFIERS[name])
    assert all(isinstance(v, F) for v in law.values())
    assert distance_to_target(model, law, TreeShape.parse(shape).max_depth + 1) == 0


@pytest.mark.parametrize("temperature, draft_temperature", [(1, 0.5), (0.5, 1), (0, 0.5), (0.5, None), (0, None)])
def test_an_exact_model_at_mixed_temperatures_is_evaluated_in_floats(temperature, draft_temperature):
    """T ∈ {0, 1} keeps a Fraction row exact and any other T makes it float: a target at T = 1 with a draft at 0.5
    was refused ("the draft row … is float but the model's root target row is exact"); both rows are float64 when
    either temperature leaves {0, 1}, and the law is the target's."""
    from univer_theory import evaluate

    model = TemperedModel(DirichletModel(3, seed=1, exact=True), temperature, draft_temperature)
    exact = {model.temperature, model.draft_temperature} <= {0.0, 1.0}
    assert (model.target(()).dtype == object) == exact == (model.draft(()).dtype == object)
    assert evaluate(model, "2,1", "wor", VERIFIERS["tv"]).distance <= LOSSLESS_TOL


@pytest.mark.parametrize("name,process", [("sps", "iid"), ("rrs", "iid"), ("tv", "iid"), ("bv", "iid"),
                                          ("sps", "wor"), ("rrsw", "wor"), ("tv", "wor"), ("bv", "wor")])
def test_per_tree_expected_length_is_a_fraction_where_every_coin_is_certain(name, process):
    """``E[τ | T]`` in exact mode is a Fraction, also where every coin is 1 (p = q: the engine's and BV's
    recursions started from the int 1 and returned the int 2)."""
    rows = np.stack([_exact(F(1, 2), F(1, 2), F(0))] * 3)
    e = VERIFIERS[name].expected_accepted_length(DraftTree.chain([0, 1]), rows, rows.copy(), process)
    assert isinstance(e, F) and e == 2
    one = VERIFIERS[name].expected_accepted_length(DraftTree.chain([0]), rows[:2], rows[:2].copy(), process)
    assert isinstance(one, F) and one == 1          # BV's one-token chain gave the int 1 (its ratio was the int 1)


def test_exact_mode_stays_in_fractions_and_mass_balance_reads_a_root_of_one():
    """``mass_balance_violation`` took a(()) as the law's own mass, so a law of mass 1/2 (uniform target, V = 2,
    {(0,): 1/4, (1,): 1/4}) gave 0 where the lemma with a(()) = 1 gives 1/4 (its distance); and exact mode leaked
    ints: topk's tuple and tree probability 1, a lossless law's violation 0, a k = 1 exact plan's w at a token of
    Q_1 = 0 divided by zero."""
    half = _exact(F(1, 2), F(1, 2))
    model = context_free(half, half.copy())
    law = {(0,): F(1, 4), (1,): F(1, 4)}
    assert mass_balance_violation(model, law) == F(1, 4) == distance_to_target(model, law, 1)
    exact = DirichletModel(3, seed=0, exact=True)
    lossless = output_law(exact, TreeShape.parse("2"), "topk", VERIFIERS["nss"])
    v = mass_balance_violation(exact, lossless)
    assert isinstance(v, F) and v == 0
    from univer_theory import enumerate_trees, tuple_law
    from univer_theory.plans.choose import single_child_plan
    assert all(isinstance(pr, F) for _, pr in tuple_law(exact.draft(()), 2, "topk"))
    assert all(isinstance(pr, F) for _, pr in enumerate_trees(exact, TreeShape.parse("2,1"), "topk"))
    plan = single_child_plan(exact.target(()), exact.draft(()), F(1), "topk")
    top = int(np.argmax(exact.draft(()).astype(float)))
    assert [plan.select((y,))[0] for y in range(3) if y != top] == [0, 0]
    for process in ("iid", "wor", "greedy"):                  # min(1, c/q) was the int 1 where ρp(y) ≥ Q_1(y)
        plan = single_child_plan(exact.target(()), exact.draft(()), F(1), process)
        assert all(isinstance(plan.select((y,))[0], F) for y in range(3)), process


@pytest.mark.parametrize("name,process", [("sps", "iid"), ("rrs", "iid"), ("rrsw", "wor"), ("bv", "iid")])
def test_a_residual_that_rounds_to_zero_keeps_the_trees_mass(name, process):
    """q = (10⁻³⁰, 1) is on the simplex in float64 and drafts token 0, where p = 0: the root rejects it surely and
    [P − Q]_+ = (0, 1 − 1) rounds to the zero row. Its law had mass 0 (``sample`` drew from NaN; the two-level
    chain's E[τ | T] read 1 from a law with no mass); the residual is p there now, as ``residual_rows``' fallback,
    so the one-level law is the exact rows' (token 1 surely) and the two-level one keeps its mass (BV's stop at the
    root reads R / (R + 1 − r) = 0 / 0 on these float rows where the exact rows' is 0 / 10⁻³⁰: item 106)."""
    p, q = np.array([[0.0, 1.0], [0.5, 0.5]]), np.array([[1e-30, 1.0], [0.5, 0.5]])
    assert VERIFIERS[name].law(DraftTree.chain([0]), p, q, process) == {(1,): 1.0}
    p2, q2 = np.vstack([[0.5, 0.5], p]), np.vstack([[0.5, 0.5], q])
    law = VERIFIERS[name].law(DraftTree.chain([0, 0]), p2, q2, process)
    assert sum(law.values()) == 1.0 and (name == "bv" or law == {(0, 1): 1.0}), law


def test_a_model_must_keep_one_mode_below_its_root():
    """Exact root rows and float rows below (or the reverse): TV's E[τ] came back a float judged by tolerance, and
    UniVer (not rational) ran on Fraction children; every row must be of the root's mode now."""
    exact, flt = _exact(F(1, 2), F(1, 4), F(1, 4)), np.array([0.25, 0.25, 0.5])

    class Mixed(DirichletModel):
        def __init__(self, root_exact):
            super().__init__(3)
            self.root_exact = root_exact

        def target(self, prefix):
            return exact if (prefix == ()) == self.root_exact else flt

        draft = target

    for root_exact, name in ((True, "tv"), (False, "tv"), (False, "univer")):   # (UniVer on an exact root: refused)
        with pytest.raises(ValueError, match="one mode for every row"):
            evaluate(Mixed(root_exact), TreeShape.parse("2,1"), "iid", VERIFIERS[name])


def test_flat_plan_cache_keeps_float_and_fraction_rows_apart():
    """SpecHub's plan cache: a float run on rows equal to Fraction rows (0.5 == F(1, 2), the same hash) does not
    hand its float plan to the exact run that follows."""
    half = _exact(F(1, 2), F(1, 2))
    spechub, shape = VERIFIERS["spechub"], TreeShape.parse("2")
    evaluate(context_free(np.array([0.5, 0.5]), np.array([0.5, 0.5])), shape, "hub", spechub)
    r = evaluate(context_free(half, half.copy()), shape, "hub", spechub)
    assert isinstance(r.expected_accepted, F) and r.distance == 0


def test_distance_counts_the_target_mass_a_law_misses():
    """Total variation over the union of both supports: a law that never emits token 1 of a uniform target is
    1/2 away (summing only over the law's own outputs gave 1/4)."""
    model = context_free(_exact(F(1, 2), F(1, 2)), _exact(F(1, 2), F(1, 2)))
    assert distance_to_target(model, {(0,): F(1)}, 1) == F(1, 2)
    assert distance_to_target(model, {(0,): F(1, 2), (1,): F(1, 2)}, 1) == 0


def test_lossless_means_within_1e_12_and_plans_are_counted_once_per_node():
    """The standard: a float law is lossless within 1e-12 (a 1e-9 loss is a loss); and ``evaluate`` counts UniVer's
    plans per internal (node, prefix, ρ), not per drafted tuple — a one-level tree has exactly one plan."""
    from univer_theory.oracle import MethodResult
    assert LOSSLESS_TOL <= 1e-12
    assert MethodResult(1.0, LOSSLESS_TOL).lossless and not MethodResult(1.0, 2 * LOSSLESS_TOL).lossless
    assert not MethodResult(1.0, 1e-9).lossless
    for process in ("iid", "wor"):
        r = evaluate(DirichletModel(3, seed=0), TreeShape.parse("2"), process, VERIFIERS["univer"])
        assert r.plans is not None and sum(r.plans.values()) == 1, (process, r.plans)
    # a node at ρ = 0 (below a token the target cannot emit) has an empty law: it was counted once per tuple
    from univer_theory.models import context_free
    model = context_free(np.array([0.0, 0.5, 0.5]), np.array([0.4, 0.3, 0.3]))
    r = evaluate(model, TreeShape.parse("1,2"), "iid", VERIFIERS["univer"])
    assert sum(r.plans.values()) == 4, r.plans           # the root, and node 1 under each of its three tokens


def test_evaluate_frees_its_model_without_the_cyclic_gc():
    """A server that calls ``gc.disable()`` kept every model ``evaluate`` saw (~0.3 MB each): the models' row caches
    (``lru_cache`` of a bound method stored on the model), the law recursion's and the distance's self-referencing
    closures were reference cycles.  With the cyclic GC off, each model is freed once its last reference goes."""
    import gc
    import weakref

    from paper_checks.instances import RandomRowsModel
    from univer_theory import ConfidentModel
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        refs = []
        for model, process in ((DirichletModel(4, seed=1), "iid"), (ConfidentModel(3, seed=2), "wor"),
                               (RandomRowsModel(4, "dirichlet", 3, 0.5, False), "wor")):
            evaluate(model, TreeShape.parse("2,1"), process, VERIFIERS["univer"])
            refs.append(weakref.ref(model))
            del model
        assert [r() for r in refs] == [None] * 3
        model = DirichletModel(3, seed=0)                # the distance raising after it extended a first output
        ref = weakref.ref(model)
        with pytest.raises(ValueError, match="has a token outside"):
            distance_to_target(model, {(0,): 0.5, (7,): 0.5}, 2)
        del model
        assert ref() is None
    finally:
        if was_enabled:
            gc.enable()


def test_a_models_rows_are_read_once_per_prefix():
    """``Model._rows`` memoises each prefix's (p, q) rows: without it every node plan and the distance re-read (and
    a ``CheckedModel`` re-checked) the user's rows, ~3× the time of the lossless tests."""
    class Counting(DirichletModel):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.reads = {}

        def _make_rows(self, prefix):
            self.reads[prefix] = self.reads.get(prefix, 0) + 1
            return super()._make_rows(prefix)

    class Plain(Model):                              # a user's model: its own target / draft, no memo
        vocab_size = 3

        def __init__(self):
            self.rows, self.reads = Counting(3, seed=4), {}

        def target(self, prefix):
            self.reads[tuple(prefix)] = self.reads.get(tuple(prefix), 0) + 1
            return self.rows.target(prefix)

        def draft(self, prefix):
            return self.rows.draft(prefix)

    for model in (Counting(3, seed=4), Plain()):    # evaluate wraps the second in a CheckedModel
        evaluate(model, TreeShape.parse("2,1"), "wor", VERIFIERS["univer"])
        assert model.reads and set(model.reads.values()) == {1}, model.reads
