"""The suite's Monte Carlo budget cannot drift: the registry of accepting G-tests matches the source and the
collected cases, the per-test level is the budget split over them, and the hypothesis profiles are as stated."""
import ast
import importlib
import math
import os
from pathlib import Path

import pytest
from hypothesis import settings

from .conftest import PROFILES, hypothesis_profile
from .stats import ACCEPTING, FAMILY_FALSE_ALARM, LEVEL, POWER, assert_accepts

TESTS = Path(__file__).parent
#: The suite's test files, this one (which calls the guard on purpose) excepted.
SOURCES = [p for p in TESTS.rglob("test_*.py") if p.name != Path(__file__).name]
GOF = {"g_test", "g_test_counts"}
VERDICTS = {"assert_accepts", "assert_rejects"}


def _called(node) -> set[str]:
    """Names of the functions called anywhere inside ``node``."""
    return {c.func.id for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}


def _accepting_functions(path: Path) -> set[str]:
    """Test functions of a file that run an accepting G-test, directly, through the file's own helpers or through
    :func:`tests.stats.assert_fits`."""
    funcs = {f.name: f for f in ast.parse(path.read_text()).body if isinstance(f, ast.FunctionDef)}
    accepting = {"assert_accepts", "assert_fits"}
    while True:
        more = {name for name, f in funcs.items() if _called(f) & accepting} - accepting
        if not more:
            return {name for name in accepting if name.startswith("test_")}
        accepting |= more


def _cases(key: str) -> int:
    """Parametrised cases pytest collects for a registered test function (product over its parametrize marks)."""
    path, name = key.split("::")
    fn = getattr(importlib.import_module("tests." + path.removesuffix(".py").replace("/", ".")), name)
    return math.prod(len(m.args[1]) for m in getattr(fn, "pytestmark", []) if m.name == "parametrize")


def test_registry_lists_exactly_the_accepting_tests_of_the_source():
    found = {f"{p.relative_to(TESTS).as_posix()}::{name}" for p in SOURCES
             for name in _accepting_functions(p)}
    assert found == set(ACCEPTING), (f"unregistered: {sorted(found - set(ACCEPTING))}; "
                                     f"registered but absent: {sorted(set(ACCEPTING) - found)}")


@pytest.mark.parametrize("key", sorted(ACCEPTING))
def test_registered_case_counts_match_collection(key):
    assert _cases(key) == ACCEPTING[key]


def test_every_goodness_of_fit_verdict_goes_through_the_budget():
    """No test compares a G-test p-value to a level of its own: every ``g_test`` / ``g_test_counts`` call is the
    argument of ``assert_accepts`` or ``assert_rejects``."""
    loose = []
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        wrapped = {id(arg) for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                   and c.func.id in VERDICTS for arg in c.args}
        loose += [f"{path.name}:{c.lineno}" for c in ast.walk(tree) if isinstance(c, ast.Call)
                  and isinstance(c.func, ast.Name) and c.func.id in GOF and id(c) not in wrapped]
    assert not loose, loose


def test_level_is_the_family_budget_split_over_the_accepting_tests():
    assert FAMILY_FALSE_ALARM <= 1e-3 and POWER >= 0.99
    assert LEVEL == FAMILY_FALSE_ALARM / sum(ACCEPTING.values())
    assert LEVEL * sum(ACCEPTING.values()) <= FAMILY_FALSE_ALARM * (1 + 1e-12)      # Bonferroni: P(any) ≤ budget


@pytest.mark.parametrize("kind", ["gauss", "zipf"])
def test_the_accepting_g_test_holds_its_size_on_many_small_cells(kind):
    """The Bonferroni split assumes each accepting G-test rejects a correct sampler at most at its level.  On
    the V = 1 000 root rows of ``gpu/test_lossless_large`` at its ``N_TREES`` first tokens, G's χ² tail was
    anti-conservative with cells pooled below 5 expected and no correction (92–130 cells): 1.7–3× ``LEVEL``, and
    P(p < 1e-3) = 1.4–2.0e-3 under the null.  Pooled below :data:`tests.stats.MIN_EXPECTED` with Williams'
    correction it is ~1e-3 there.  2·10⁵ seeded draws of the exact law (on its cells pooled below 5 expected,
    which any pooling at ≥ 5 merges as it would the whole row): P(p < 1e-3) ≤ 1.25e-3."""
    import numpy as np

    from .gpu.test_lossless_large import N_TREES, V, llm_like_rows
    from .stats import MIN_EXPECTED, g_test_pvalues

    assert MIN_EXPECTED >= 5
    p = llm_like_rows(kind, 0)[0][V].double().numpy()
    small = p * N_TREES < 5
    cells = np.append(p[~small], p[small].sum())
    counts = np.random.default_rng(0).multinomial(N_TREES, cells / cells.sum(), size=200_000)
    assert np.mean(g_test_pvalues(counts, cells) < 1e-3) <= 1.25e-3


def test_an_unregistered_accepting_test_fails():
    with pytest.raises(AssertionError, match="unregistered"):
        assert_accepts(1.0, "this test is not registered")


def test_hypothesis_profiles():
    """``slow`` runs ≥ 200 examples per property; CI (``CI=true``) loads the derandomised twin; the default run
    keeps its 25 examples."""
    assert settings.get_profile("slow").max_examples >= 200
    assert settings.get_profile("standard").max_examples == PROFILES["standard"] == 25
    for name in PROFILES:
        assert settings.get_profile(f"{name}-ci").derandomize
        assert settings.get_profile(f"{name}-ci").max_examples == PROFILES[name]
    assert hypothesis_profile({}) == "standard"
    assert hypothesis_profile({"CI": "true"}) == "standard-ci"
    assert hypothesis_profile({"CI": "true", "HYPOTHESIS_PROFILE": "slow"}) == "slow-ci"
    assert hypothesis_profile({"HYPOTHESIS_PROFILE": "slow"}) == "slow"
    assert settings.default.max_examples == PROFILES[hypothesis_profile(os.environ).removesuffix("-ci")]


#: The hypothesis properties of losslessness (exact law = target, per random instance or tree).
LOSSLESS_PROPERTIES = ("theory/test_hypothesis.py::test_random_instances_are_lossless",
                       "theory/test_hypothesis.py::test_random_trees_expected_length_matches_law",
                       "theory/test_univer.py::test_lossless_drawn_distributions",
                       "theory/test_wor_plans.py::test_hypothesis_instances_with_zeros",
                       "theory/test_layout.py::test_marginal_is_exact_and_alpha_star")


@pytest.mark.slow
def test_lossless_properties_under_the_slow_profile():
    """``python3 -m pytest -m slow``: every lossless property passes ≥ 200 examples (the ``slow`` profile;
    derandomised under CI), counted from hypothesis' own statistics (~1 min on 2 cores)."""
    import re
    import subprocess
    import sys

    env = {**os.environ, "HYPOTHESIS_PROFILE": "slow"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-show-statistics",
           *(f"tests/{k}" for k in LOSSLESS_PROPERTIES)]
    run = subprocess.run(cmd, cwd=TESTS.parent, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:]
    passing = [int(n) for n in re.findall(r"- (\d+) passing examples", run.stdout)]
    assert len(passing) == len(LOSSLESS_PROPERTIES) and min(passing) >= 200, passing
