"""Every lossless verifier is exactly lossless on the grid; the oracle's two paths agree."""
import pytest

from univer_theory import (LOSSLESS_TOL, VERIFIERS, DirichletModel, TreeShape, distance_to_target,
                           enumerated_output_law, evaluate, mass_balance_violation, output_law)

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
                                                ("nss", "topk", "2,2")])
def test_prefix_recursion_equals_tree_enumeration(name, process, shape):
    """``output_law`` (prefix recursion) == ``Σ_T Q(T)·law_T`` (explicit enumeration)."""
    model = DirichletModel(3, seed=3, similarity=0.3)
    shape = TreeShape.parse(shape)
    a = output_law(model, shape, process, VERIFIERS[name])
    b = enumerated_output_law(model, shape, process, VERIFIERS[name])
    assert max(abs(a.get(k, 0) - b.get(k, 0)) for k in a.keys() | b.keys()) < 1e-14


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
