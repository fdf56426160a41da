"""The ``univer`` front door: eager core re-exports, lazy solver / torch re-exports, doctests."""
import doctest

import pytest

import univer
import univer_theory


def test_core_names_are_reexported():
    for name in univer_theory.__all__:
        assert getattr(univer, name) is getattr(univer_theory, name)


def test_lazy_names_resolve():
    import gpu
    import solvers
    assert univer.global_tree_lp is solvers.global_tree_lp and univer.verify is gpu.verify


def test_unknown_name():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        univer.nope


@pytest.mark.parametrize("module", [univer, univer_theory.tree])
def test_doctests(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
