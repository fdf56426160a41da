"""The torch path of what the CPU runs in numpy (:func:`gpu.host.on_host`: the whole UniVer level rule — the wor
choice with rules 1, 3, 4, 5, 7, 8, α*(ρ), the layout, the slot rules —, the tree structure), of the batched simplex
and of the drafted-support scan (:func:`solvers.lex_simplex.lex_simplex`, :func:`gpu.support.scan`: compiled loops on
the CPU).  An accelerator runs them in torch, which this machine may not have; here the host branch is switched off
so that CPU tensors go through torch, and a representative set of the batched-vs-exact-core tests runs again: E[τ |
T] on wide and asymmetric trees (every wor rule, the layout, the slot LP's simplex) and on small-vocabulary wor trees
(rule 1's LPs), rule 3 and PTS by enumeration, rule 3 with its claim family against the exact core, PTS's clock fixed
point against the walk, the wor choice on confident rows and where it takes rules 7 and 8, the layout by enumeration,
in size buckets and on a confident row (its Möbius scan), and truncated drafts planned on their drafted support.
Each then compares the torch run with the exact core or the enumeration oracle at the original test's tolerance.  The
memory test runs here too: its dispatch mode sees torch tensors only, and on the host branch the same functions form
numpy arrays of the same sizes."""
import pytest
import torch

import gpu.host
import gpu.support
import solvers.lex_simplex

from . import (test_compile_memory, test_condot, test_confident_rows, test_luce, test_support, test_tree_batch,
               test_univer, test_wor_plans)
from .test_support import compacted  # noqa: F401  (a fixture)


@pytest.fixture(autouse=True)
def torch_on_cpu(monkeypatch):
    calls = []

    def direct(fn, args):
        calls.append(fn.__name__)
        return fn(*args)

    monkeypatch.setattr(gpu.host, "_numpy_call", direct)
    monkeypatch.setattr(gpu.support, "_scan_host", gpu.support._scan_device)
    host = solvers.lex_simplex._simplex_host          # the exact core's numpy LPs stay on it
    monkeypatch.setattr(solvers.lex_simplex, "_simplex_host",
                        lambda A, *args: (solvers.lex_simplex._lex_simplex if torch.is_tensor(A) else host)(A, *args))
    yield calls
    assert calls, "no formula went through gpu.host.on_host: the test exercised nothing of the torch path"


@pytest.mark.parametrize("process,walk", [("iid", "auto"), ("wor", "sequential")])
def test_wide_and_asymmetric_nodes(process, walk):
    test_univer.test_wide_and_asymmetric_nodes_are_planned_in_torch(process, walk)


@pytest.mark.parametrize("process", ["iid", "wor"])
def test_drafted_support(process, compacted):  # noqa: F811
    test_support.test_univer_rules_on_the_drafted_support(process, "((..),.)", "near", compacted)


def test_layout_by_enumeration():
    test_univer.test_layout_weights_on_tensors_are_exact_by_enumeration(5, 3, 0.6)


def test_subtree_shapes():
    test_tree_batch.test_subtree_shapes_spell_the_draft_trees_subtree_keys()


def test_layout_runs_of_chunks(monkeypatch):
    test_univer.test_tuple_weights_form_each_runs_columns_once(monkeypatch)


def test_layout_buckets(monkeypatch):
    test_univer.test_layout_blocks_bucketed_by_size_match_the_exact_plan(monkeypatch)


def test_wor_pair_and_pts_by_enumeration():
    test_wor_plans.test_wor_pair_and_pts_against_enumeration(9)


def test_wor_pair_claim_rows():
    test_wor_plans.test_wor_pair_and_pts_batch_as_a_batch_of_one(500)


def test_binary_wor_trees():
    test_wor_plans.test_binary_wor_trees_match_the_exact_core()


def test_wide_wor_node_memory():
    test_compile_memory.test_wide_wor_node_allocates_near_its_inputs()


def test_small_vocabulary_wor_trees():
    test_condot.test_small_vocabulary_wor_trees_match_the_exact_core(5, ["2,2", "3,1", "4"])


def test_pts_clock_fixed_point():
    test_confident_rows.test_pts_fixed_point_equals_the_walk(3)


def test_wor_choice_on_confident_rows():
    test_confident_rows.test_choice_realises_its_marginal_and_matches_the_core(6, 3)


def test_wor_choice_takes_rules_7_and_8():
    test_luce.test_the_batched_choice_takes_rule_7_as_the_core(3)
    test_confident_rows.test_the_batched_choice_takes_rule_8_as_the_core()


@pytest.mark.parametrize("tail", [1e-200, 1e-300])
def test_the_layout_on_a_confident_row(tail):
    test_confident_rows.test_the_layout_on_a_confident_row_emits_its_target(tail)


def test_rule_3_claim_order_where_ratios_tie():
    test_univer.test_rule_3_is_continuous_in_rho_where_ratios_tie()
