"""The ground-truth LPs never crash a command: HiGHS' re-solves, the global LP's repair into a feasible point,
the α*-face floor, and ``univer bound`` / ``univer exact`` reporting a failed LP beside every other result."""
import dataclasses
import importlib
import json
import re
from functools import partial

import numpy as np
import pytest

from solvers.cf_bound import cf_bound
from solvers.global_lp import (REPAIR_TOL, _prefix_table, _repair, enumerate_tree_arrays, global_tree_lp,
                               trie_classes)
from univer.cli import main as cli_main
from univer_theory import VERIFIERS, DirichletModel, TreeShape, context_free, evaluate
from univer_theory.tolerance import worst_of

# V = 5, shape (((..),.),.), context-independent rows (DirichletModel(5, seed=11, similarity=0.5,
# concentration=0.3) at the root): HiGHS' dual simplex answer broke a(s·y) ≤ p(y|s)·a(s) by 1.9e-7 (Q(T) spanning
# 12 decades: HiGHS dropped the matrix entries Q(T) < 1e-9); before the repair `univer bound` died with a
# RuntimeError traceback, and the repaired optimum 2.1719627578 was 3.7e-7 below the LP's 2.1719631286.
ISSUE_SHAPE = "(((..),.),.)"
ISSUE_TARGET = [0.0005309815593422848, 0.0008474112325153265, 7.138554108607107e-05, 0.9807125053570699,
                0.017837716309986467]
ISSUE_DRAFT = [0.10305019507484349, 0.000973020889139919, 0.10675784690423445, 0.7238643498632272,
               0.06535458726855498]
# p = q, near-deterministic (DirichletModel(3, seed=13, similarity=1, concentration=0.05)): HiGHS' simplex calls
# the root's α*-face LP of cf_bound (Σ π ≥ α* − 1e-10) infeasible although π = the identity coupling is on it.
PEAKY = [0.2071492383217562, 0.7928507615617841, 1.16459779945658e-10]

cf_module = importlib.import_module("solvers.cf_bound")
highs_solve = importlib.import_module("solvers.highs_lp").solve_lp
global_module = importlib.import_module("solvers.global_lp")


def issue_model():
    return context_free(np.array(ISSUE_TARGET), np.array(ISSUE_DRAFT))


def edge_violation(model, acceptance: dict) -> float:
    """max over drafted strings of a(s·y) − p(y|s)·a(s) (a(()) = 1), from the result's own a(s)."""
    worst = -np.inf
    for s, a in acceptance.items():
        parent = acceptance.get(s[:-1], 1.0) if s[:-1] else 1.0
        worst = worst_of(worst, a - model.target(s[:-1])[s[-1]] * parent)
    return worst


def test_global_lp_resolves_then_repairs_on_the_issue_instance(monkeypatch):
    m = issue_model()
    tv = float(evaluate(m, TreeShape.parse(ISSUE_SHAPE), "iid", VERIFIERS["tv"]).expected_accepted)
    r = global_tree_lp(m, ISSUE_SHAPE, "iid")
    assert r.success, r.message
    # no entry below HiGHS' small_matrix_value any more: the first answer is clean and certified to 1e-12
    assert "re-solved" not in r.message and "repaired" not in r.message
    assert r.value > 2.1719631 and 0 <= r.tolerance <= 1e-12 and r.primal_value == pytest.approx(r.value, abs=1e-12)
    assert abs(r.lp_objective - r.value) <= 1e-9 and edge_violation(m, r.acceptance) <= 1e-12
    assert r.value >= tv
    # a point off the LP is re-solved without presolve, then repaired: feasible and at most REPAIR_TOL lower;
    # the certified value comes from the duals and does not move
    def off_the_lp(*args, **kwargs):  # HiGHS' answer with every third column 1e-6 too high
        sol = highs_solve(*args, **kwargs)
        return dataclasses.replace(sol, x=sol.x * (1 + 1e-6 * (np.arange(sol.x.size) % 3 == 0)))

    monkeypatch.setattr(global_module, "solve_lp", off_the_lp)
    fixed = global_tree_lp(m, ISSUE_SHAPE, "iid")
    assert fixed.success and "re-solved without presolve" in fixed.message and "repaired" in fixed.message
    assert 0 < fixed.lp_objective - fixed.primal_value <= REPAIR_TOL and edge_violation(m, fixed.acceptance) <= 1e-12
    assert fixed.value >= tv and abs(fixed.value - r.value) <= 1e-12 and 0 < fixed.tolerance <= REPAIR_TOL


def test_global_lp_keeps_improbable_trees():
    """q(y) = 6.4e-9 (greedy, V = 3): 137 of 162 classes have Q(T) < 1e-9, 2.7e-8 of mass; as matrix entries HiGHS
    dropped them and the LP came out 5.8e-8 below UniVer's exact E[τ]."""
    p = np.array([0.0011381698651695708, 0.7694212545904864, 0.2294405755443441])
    q = np.array([0.6399473692241079, 6.418889844646599e-09, 0.36005262435700225])
    m, shape = context_free(p, q), TreeShape.parse("(((.)),((.),(.)),.)")
    r = global_tree_lp(m, shape, "greedy")
    assert r.success, r.message
    assert float(evaluate(m, shape, "greedy", VERIFIERS["univer"]).expected_accepted) <= r.value + 1e-12
    assert 0 <= r.tolerance <= 1e-12


@pytest.mark.parametrize("process", ["iid", "wor"])
def test_repair_turns_any_point_into_a_feasible_one(process):
    """A random point of [0,1]^{classes × (N−1)} breaks most rows; the repair must satisfy every one exactly
    (round-off) and only ever lower entries."""
    m = DirichletModel(3, seed=4, concentration=0.5)
    shape = TreeShape.parse("((..),.)")
    trees = enumerate_tree_arrays(m, shape, process)
    rows, weights = trie_classes(trees)
    table = _prefix_table(m, trees, trees.codes[rows], "test")
    x = np.random.default_rng(0).uniform(0, 1, (rows.size, shape.num_nodes - 1))
    y, lost = _repair(shape, table, weights, x)
    assert np.all(y <= x) and np.all(y >= 0) and lost > 0.1
    for u, kids in enumerate(shape.children):
        if kids:
            cap = 1.0 if u == 0 else y[:, u - 1]
            assert np.all(y[:, [c - 1 for c in kids]].sum(axis=1) <= cap + 1e-15)
    a = np.bincount(table.pid.ravel(), weights=(weights[:, None] * y).ravel(), minlength=table.size)
    allowed = table.p_edge * np.where(table.parent >= 0, a[table.parent], 1.0)
    assert np.all(a <= allowed + 1e-15)
    assert lost == pytest.approx(weights @ x.sum(axis=1) - weights @ y.sum(axis=1), abs=1e-12)


def test_cf_face_lp_is_resolved_on_a_peaky_p_equals_q_model(monkeypatch):
    p = np.array(PEAKY) / sum(PEAKY)
    m = context_free(p, p)
    r = cf_bound(m, "2", "iid")
    assert r.success
    assert r.value == pytest.approx(1.0, abs=1e-9) and r.alpha_root_value == pytest.approx(1.0, abs=1e-9)
    # without HiGHS' re-solves and the relaxed floors, the instance reproduces the old failure
    monkeypatch.setattr(cf_module, "solve_lp", partial(cf_module.solve_lp, retry=False))
    monkeypatch.setattr(cf_module, "FACE_SLACKS", (cf_module.ALPHA_FLOOR_SLACK,))
    with pytest.raises(RuntimeError, match="α\\*-face LP .* Infeasible"):
        cf_bound(m, "2", "iid")


def test_cf_face_lp_relaxed_floors_alone_rescue_the_peaky_model(monkeypatch):
    """docs/deviations.md item 23: the relaxed α*-face floors (``FACE_SLACKS``) rescue the peaky p = q instance
    without HiGHS' re-solves (the test above switches both off together)."""
    p = np.array(PEAKY) / sum(PEAKY)
    monkeypatch.setattr(cf_module, "solve_lp", partial(cf_module.solve_lp, retry=False))
    r = cf_bound(context_free(p, p), "2", "iid")
    assert r.success and r.alpha_root_value == pytest.approx(1.0, abs=1e-8)


def test_global_lp_fails_where_its_certified_bound_is_too_far_above_its_feasible_point(monkeypatch):
    """A dual bound more than ``REPAIR_TOL`` above the feasible point is not reported as the bound (status 4)."""
    real = global_module._solve

    def loose(*args, **kwargs):
        a, status, message, objective, bound = real(*args, **kwargs)
        return a, status, message, objective, float(a.sum()) + 10 * REPAIR_TOL

    model = DirichletModel(3, seed=0, similarity=0.5)
    assert global_tree_lp(model, "2", "iid").success
    monkeypatch.setattr(global_module, "_solve", loose)
    r = global_tree_lp(model, "2", "iid")
    assert not r.success and r.status == 4 and "the certified bound exceeds the feasible point" in r.message


def test_bound_command_on_the_issue_instance(tmp_path, capsys):
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"vocab": 5, "target": {"": ISSUE_TARGET}, "draft": {"": ISSUE_DRAFT}}))
    assert cli_main(["bound", "--model-file", str(path), "--shape", ISSUE_SHAPE, "--process", "iid", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "errors" not in out
    for name, r in out["methods"].items():
        assert r["expected_accepted"] <= out["global_bound"]["value"] + 1e-9, name
        assert r["expected_accepted"] <= out["cf_bound"]["value"] + 1e-9, name


def failing(message):
    def solve(*args, **kwargs):
        raise RuntimeError(message)
    return solve


def test_bound_command_reports_a_failed_lp_beside_the_other_results(monkeypatch, capsys):
    argv = ["bound", "--vocab", "3", "--shape", "2", "--process", "iid"]
    monkeypatch.setattr(global_module, "global_tree_lp", failing("HiGHS returned Infeasible after re-solving"))
    assert cli_main(argv) == 1
    text = capsys.readouterr().out
    assert "global tree LP  FAILED: HiGHS returned Infeasible after re-solving" in text
    assert "CF optimum      E[tau] =" in text and "univer-va" in text
    assert cli_main(argv + ["--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["global_bound"] == {"error": "HiGHS returned Infeasible after re-solving"}
    assert out["errors"] == {"global_bound": "HiGHS returned Infeasible after re-solving"}
    assert out["cf_bound"]["value"] > 0 and out["alpha_star"]["lp"] > 0 and "univer-va" in out["methods"]
    # a failed CF leaves univer-va without its value functions: both are marked, the rest is printed
    monkeypatch.setattr(cf_module.NodeProblem, "solve", failing("cf_bound: the node LP failed"))
    assert cli_main(argv) == 1
    text = capsys.readouterr().out
    assert "CF optimum      FAILED: cf_bound: the node LP failed" in text
    assert "univer-va  FAILED: needs the CF value functions" in text
    assert "tv " in text


def test_exact_command_marks_a_method_whose_solver_fails(monkeypatch, capsys):
    oracle = importlib.import_module("univer_theory.oracle")
    real = oracle.evaluate

    def evaluate(model, shape, process, verifier, *args, **kwargs):
        if verifier.name == "univer":
            raise RuntimeError("slot_rule_lp: HiGHS returned Infeasible")
        return real(model, shape, process, verifier, *args, **kwargs)

    monkeypatch.setattr("univer.commands.exact.evaluate", evaluate)
    assert cli_main(["exact", "--vocab", "3", "--shape", "2", "--process", "iid"]) == 1
    text = capsys.readouterr().out
    assert "univer    FAILED: slot_rule_lp: HiGHS returned Infeasible" in text and "tv " in text


def test_solve_lp_refuses_inputs_of_the_wrong_size_or_nan():
    """A cost vector one entry too long was truncated (success), a NaN cost gave success with objective NaN, row
    bounds of the wrong length were numpy's broadcast error."""
    import scipy.sparse as sp

    from solvers import solve_lp
    A = sp.csc_matrix(np.array([[1.0, 1.0]]))
    assert solve_lp(np.array([1.0, 2.0]), A, -np.inf, 1.0, 0.0, np.inf).objective == pytest.approx(2.0)
    for args, match in (((np.array([1.0, 2.0, 30.0]), A, -np.inf, 1.0, 0.0, np.inf), "one finite cost per column"),
                        ((np.array([np.nan, 2.0]), A, -np.inf, 1.0, 0.0, np.inf), "one finite cost"),
                        ((np.array([1.0, 2.0]), A, -np.inf, np.array([1.0, 2.0]), 0.0, np.inf), "row_upper must be"),
                        ((np.array([1.0, 2.0]), A, -np.inf, 1.0, np.nan, np.inf), "col_lower must be")):
        with pytest.raises(ValueError, match=match):
            solve_lp(*args)


def test_first_solves_in_threads_leave_stdout_open(monkeypatch, tmp_path):
    """Threads whose first LPs start together each ran the banner silencer (``lru_cache`` does not serialise a
    miss): one could save descriptor 1 while another had it on /dev/null and restore that last — stdout closed
    for good.  A slow stand-in for HiGHS' first construction forces the overlap; stdout must point where it did."""
    import os
    import threading
    import time
    highs_lp = importlib.import_module("solvers.highs_lp")
    target = tmp_path / "stdout.txt"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT)
    saved = os.dup(1)
    os.dup2(fd, 1)
    try:
        monkeypatch.setattr(highs_lp, "bindings", lambda: (None, lambda: time.sleep(0.05)))
        threads = [threading.Thread(target=highs_lp.silence_banner.__wrapped__) for _ in range(4)]
        for t in threads:
            t.start()
            time.sleep(0.01)
        for t in threads:
            t.join()
        os.write(1, b"still here\n")
        assert os.fstat(1).st_ino == os.fstat(fd).st_ino
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(fd)
    assert target.read_text() == "still here\n"


def test_a_long_solve_stops_on_ctrl_c():
    """Ctrl-C did nothing while HiGHS solved (the global LP of V = 6 ``3,2`` wor ran past 10 minutes; a SIGINT
    after 60 s left it running): large LPs run in a worker thread, and the interrupt cancels the solve and is
    raised.  Real HiGHS on the global LP of V = 5 ``3,2`` wor (~6 s to solve) in a fresh interpreter (its main
    thread takes the signal), interrupted 1 s into the solve: the KeyboardInterrupt comes at once and the worker
    has stopped — before ``HandleUserInterrupt`` was set, highspy's ``cancelSolve`` was a flag nothing read and
    the worker solved on for ~5 s."""
    import subprocess
    import sys
    code = """
import _thread, signal, threading, time
# a Ctrl-C from a terminal: a parent that ignores SIGINT (any job a non-interactive shell starts with `&` does, and
# passes that on) would hand the interpreter SIG_IGN, under which interrupt_main does nothing
signal.signal(signal.SIGINT, signal.default_int_handler)
import solvers.highs_lp as highs_lp
from univer_theory.models import DirichletModel
from univer_theory.tree import TreeShape
from solvers.global_lp import enumerate_tree_arrays, global_tree_lp

real, start = highs_lp.interruptible_run, []

def run(h):                                     # the interrupt comes 1 s into the solve itself
    start.append(time.perf_counter())
    threading.Timer(1.0, _thread.interrupt_main).start()
    return real(h)

highs_lp.interruptible_run = run
model, shape = DirichletModel(5, seed=0), TreeShape.parse("3,2")
trees = enumerate_tree_arrays(model, shape, "wor")
try:
    global_tree_lp(model, shape, "wor", trees=trees)
    print("finished")
except KeyboardInterrupt:
    raised = time.perf_counter() - start[0]
    workers = [t for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()]
    print("interrupted", raised < 3.0, not workers)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert out.split() == ["interrupted", "True", "True"], out


def test_large_lps_run_interruptibly_and_small_ones_directly(monkeypatch):
    """The wiring of the test above: an LP of INTERRUPTIBLE_NONZEROS entries goes through ``interruptible_run``
    (same optimum), a small one calls HiGHS directly."""
    import scipy.sparse as sp

    highs_lp = importlib.import_module("solvers.highs_lp")
    calls = []
    real = highs_lp.interruptible_run
    monkeypatch.setattr(highs_lp, "interruptible_run", lambda h: calls.append(1) or real(h))
    for n in (10, highs_lp.INTERRUPTIBLE_NONZEROS):
        sol = highs_lp.solve_lp(np.ones(n), sp.identity(n, format="csc"), -np.inf, np.full(n, 0.5), 0.0, np.inf)
        assert sol.success and sol.objective == 0.5 * n
    assert calls == [1]


def test_a_node_lp_past_its_tuple_budget_is_refused_before_enumerating():
    """``solve_flat(method="lp")`` on V = 32, k = 4 i.i.d. (10⁶ tuples) ran past 150 s at 3.5 GB; it is a
    ValueError pointing at the closed form, raised before the tuples are built (counts past float64's range
    too)."""
    from solvers import solve_flat
    from solvers.condot import MAX_NODE_LP_TUPLES
    q = np.full(32, 1 / 32)
    with pytest.raises(ValueError, match=re.escape(f"exceed MAX_NODE_LP_TUPLES = {MAX_NODE_LP_TUPLES:.0e}")):
        solve_flat(q, q, 4, "iid", method="lp")
    with pytest.raises(ValueError, match=re.escape("~10^301 draft tuples (k = 200")):    # was an OverflowError
        solve_flat(q, q, 200, "iid", method="lp")
    assert abs(solve_flat(q, q, 4, "iid", method="fast").value - 1.0) <= 1e-12


def test_a_nan_solver_point_is_never_a_success(monkeypatch):
    """NaN passed every ``>`` recheck: ``solve_lp(vertex=True)`` took a NaN basic solution as its vertex, and
    ``global_tree_lp`` reported success with a NaN feasible point (``primal_value`` and ``tolerance`` NaN) — each is
    now a failure naming the NaN; the unpatched solves succeed."""
    import scipy.sparse as sparse

    highs = importlib.import_module("solvers.highs_lp")
    glp = importlib.import_module("solvers.global_lp")
    A = sparse.csr_matrix([[1.0, 1.0]])
    solve = partial(highs.solve_lp, np.array([1.0, 1.0]), A, -np.inf, 1.0, 0.0, np.inf, method="simplex", vertex=True)
    model = DirichletModel(3, seed=0)
    assert solve().success and global_tree_lp(model, "2", "iid").success
    basic, solve_lp = highs._basic_solution, glp.solve_lp
    monkeypatch.setattr(highs, "_basic_solution", lambda *args: basic(*args) * np.nan)
    sol = solve()
    assert not sol.success and "breaks a bound by nan" in sol.message, sol.message
    monkeypatch.setattr(highs, "_basic_solution", basic)
    monkeypatch.setattr(glp, "solve_lp", lambda *a, **kw: dataclasses.replace(s := solve_lp(*a, **kw), x=s.x * np.nan))
    res = global_tree_lp(model, "2", "iid")
    assert not res.success and res.status == 4 and "nan" in res.message, res.message
    res = global_tree_lp(model, "2", "iid", merge_duplicates=True)   # unrepaired: the tree rows' recheck alone
    assert not res.success and "violates a tree constraint by nan" in res.message, res.message
    monkeypatch.setattr(glp, "solve_lp", solve_lp)
    repair, edge_bound = glp._repair, glp._edge_bound          # each recheck alone
    for name, broken, message in (
            ("_repair", lambda *a: (repair(*a)[0], np.nan), "repairing HiGHS' point lost nan"),
            ("_edge_bound", lambda *a: edge_bound(*a) * np.nan, "violates a(s·y) ≤ p(y|s)·a(s) by nan"),
            ("_certified_bound", lambda *a: np.nan,
             "no certified bound: the certificate at HiGHS' duals is not finite")):
        with monkeypatch.context() as patch:
            patch.setattr(glp, name, broken)
            res = global_tree_lp(model, "2", "iid")
        assert not res.success and res.status == 4 and message in res.message, (name, res.message)
