"""The ``univer`` CLI: the JSON contract and the user's own model tables."""
import json
import subprocess
import sys

import pytest

from univer.cli import main


def run_json(capsys, *argv):
    assert main(list(argv) + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_exact_json_contract(capsys):
    out = run_json(capsys, "exact", "--vocab", "3", "--shape", "2,2", "--process", "wor", "--seed", "0")
    methods = out["methods"]
    assert {"rrsw", "tv"} <= set(methods)
    assert "rrs" not in methods and "sps" not in methods and "nss" not in methods
    for row in methods.values():
        assert set(row) >= {"expected_accepted", "distance", "lossless"}
        assert row["lossless"] is True and row["distance"] <= 1e-12
    # UniVer reports which node-plan constructions it used: 1 root plan + one per distinct (child prefix, ρ)
    plans = methods["univer"]["plans"]
    assert set(plans) <= {"layout", "lp", "tv", "wor_pair", "pts", "iid_coupling", "single", "unreached"}
    assert sum(plans.values()) >= 1 + 3
    assert "plans" not in methods["tv"]


def test_exact_chain_lists_sps_and_bv(capsys):
    methods = run_json(capsys, "exact", "--vocab", "3", "--shape", "1,1", "--process", "iid")["methods"]
    assert {"sps", "bv", "tv", "rrs", "kseq"} <= set(methods)
    assert methods["bv"]["expected_accepted"] >= methods["sps"]["expected_accepted"]


def test_exact_and_bound_read_the_llm_commands_tree_names(capsys):
    """``--tree`` is ``--shape`` (as the LLM commands spell it), and both read binary:D, chain:D and eagle[:W]."""
    for cmd in ("exact", "bound"):
        named = run_json(capsys, cmd, "--vocab", "3", "--tree", "chain:2", "--process", "iid")["methods"]
        assert named == run_json(capsys, cmd, "--vocab", "3", "--shape", "1,1", "--process", "iid")["methods"]


def test_exact_topk_lists_nss(capsys):
    methods = run_json(capsys, "exact", "--vocab", "3", "--shape", "2,1", "--process", "topk")["methods"]
    assert "nss" in methods


def test_model_file_context_free_toy(tmp_path, capsys):
    """The BV toy example through --model-file: 10/9 (sps) and 11/9 (bv)."""
    f = tmp_path / "toy.json"
    f.write_text(json.dumps({"vocab": 2, "target": {"": ["1/3", "2/3"]}, "draft": {"": ["2/3", "1/3"]}}))
    methods = run_json(capsys, "exact", "--model-file", str(f), "--shape", "1,1", "--process", "iid",
                       "--rational", "--methods", "sps,bv")["methods"]
    assert abs(methods["sps"]["expected_accepted"] - 10 / 9) < 1e-15
    assert abs(methods["bv"]["expected_accepted"] - 11 / 9) < 1e-15
    assert methods["sps"]["exact"] == {"expected_accepted": "10/9", "distance": "0"}      # rational mode adds them
    assert methods["bv"]["exact"] == {"expected_accepted": "11/9", "distance": "0"}


def test_model_file_bad_row_is_a_clear_error(tmp_path, capsys):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps({"vocab": 2, "target": {"": [0.5, 0.6]}, "draft": {"": [0.5, 0.5]}}))
    assert main(["exact", "--model-file", str(f), "--shape", "1"]) == 2
    assert "sums to 1.1" in capsys.readouterr().err


def test_table_output_and_console_script():
    """The installed ``univer`` entry point prints the table with a ✓ per lossless method."""
    out = subprocess.run([sys.executable, "-m", "univer.cli", "exact", "--vocab", "3", "--shape", "2",
                          "--process", "iid"], capture_output=True, text=True, check=True).stdout
    assert "tv" in out and "✓" in out and "✗" not in out


def test_unknown_method(capsys):
    assert main(["exact", "--methods", "nope", "--shape", "1"]) == 2
    assert "unknown method" in capsys.readouterr().err


def test_a_methods_list_naming_no_method_is_refused(capsys):
    """``--methods ,`` ran no method and exited 0 (``speed`` refused it; exact, bound and speed now parse it with
    one function)."""
    assert main(["exact", "--methods", ",", "--shape", "1"]) == 2
    assert "names no method" in capsys.readouterr().err
    assert main(["bound", "--methods", " , ", "--vocab", "3", "--shape", "1"]) == 2
    assert "names no method" in capsys.readouterr().err
    assert main(["bound", "--methods", "nope", "--vocab", "3", "--shape", "1"]) == 2
    assert "'univer-va'" in capsys.readouterr().err          # bound's own method is among the choices it names


def test_bound_prints_round_off_gaps_as_zero(tmp_path, capsys):
    """Target and draft of disjoint supports: every E[τ] is 0 and both bounds are round-off above it (within their
    stated tolerance and margin) — printed as 0.00%, not as a 100.00% gap (a relative gap of round-off)."""
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"vocab": 3, "target": {"": [1, 0, 0]}, "draft": {"": [0, 0.5, 0.5]}}))
    assert main(["bound", "--model-file", str(path), "--shape", "2", "--process", "wor"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.split()[:1] in (["tv"], ["univer"])]
    assert rows and all("100.00%" not in r and "0.00%" in r for r in rows), rows


def test_exact_lists_gr_on_iid_and_spechub_on_its_hub_process(capsys):
    iid = run_json(capsys, "exact", "--vocab", "3", "--shape", "2", "--process", "iid")["methods"]
    assert "gr" in iid and "spechub" not in iid
    assert abs(iid["gr"]["expected_accepted"] - iid["univer"]["expected_accepted"]) < 1e-12    # both α* at depth 1
    hub = run_json(capsys, "exact", "--vocab", "4", "--shape", "2,2", "--process", "hub")["methods"]
    assert set(hub) == {"spechub"} and hub["spechub"]["lossless"] is True


def test_exact_with_no_applicable_method_is_an_error(capsys):
    assert main(["exact", "--vocab", "4", "--shape", "3", "--process", "hub"]) == 2
    assert "no method applies" in capsys.readouterr().err



def test_bound_refuses_the_value_aware_oracle_in_rational_mode(capsys):
    """Its node LPs are solved in floats: an unsupported combination (exit status 2, the CLI's message for one)."""
    assert main(["bound", "--vocab", "3", "--shape", "2", "--process", "iid", "--methods", "univer-va",
                 "--rational"]) == 2
    assert "unsupported method/shape/process combination: --methods univer-va with --rational" in \
        capsys.readouterr().err

def test_bound_refuses_the_hub_process():
    import pytest

    from univer.cli import build_parser
    from univer.commands.bound import bound_results
    from univer_theory.validation import Unsupported

    args = build_parser().parse_args(["bound", "--vocab", "3", "--shape", "2", "--process", "hub"])
    with pytest.raises(Unsupported, match="`univer exact` only"):
        bound_results(args, progress=False)


PLUGIN = '''
from univer_theory import Verifier, register
from univer_theory.engine import NodeDecision
from univer_theory.verifiers import normalise, positive_part


def naive_rule(ctx):
    p, q = ctx.target, ctx.draft
    enter = tuple(min(1, p[y] / q[y]) for y in ctx.children)
    return NodeDecision(enter, (1,) * len(enter), 1, normalise(positive_part(p - q)))


register(Verifier("naive", naive_rule, ("iid",), "per-token rejection, residual never updated"))
'''


def test_a_plugins_verifier_is_a_method_of_the_command_line(tmp_path, capsys, monkeypatch):
    """``--plugin FILE`` imports a user's file that registers a verifier; the command then runs it by name beside
    the built-in ones, and the oracle refutes it (lossy with two children).  A module name works as well, two
    files of one name in two folders are two plugins, a missing file or module is one line and exit status 2, and
    a registered name cannot be taken silently."""
    import solvers
    from univer_theory import VERIFIERS, Verifier, register
    for name in ("solvers", "naive_module"):           # a file named like a package of this project shadows nothing
        (tmp_path / f"{name}.py").write_text(PLUGIN)
    (tmp_path / "broken.py").write_text("raise RuntimeError('half-way')\n")
    (tmp_path / "needs_more.py").write_text("import no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        file = str(tmp_path / "solvers.py")
        methods = run_json(capsys, "--plugin", file, "--plugin", file, "bound", "--methods", "naive,rrs",
                           "--vocab", "4", "--shape", "2", "--process", "iid")["methods"]      # twice: imported once
        assert methods["naive"]["lossless"] is False and methods["naive"]["distance"] > 1e-3
        assert methods["rrs"]["lossless"] is True and sys.modules["solvers"] is solvers
        with pytest.raises(ValueError, match="a verifier named 'naive' exists already"):
            register(Verifier("naive", VERIFIERS["rrs"].rule, ("iid",), "a second naive"))
        assert register(VERIFIERS["naive"]) is VERIFIERS["naive"]         # the same object again: a no-op
        second = Verifier("naive", VERIFIERS["rrs"].rule, ("iid",), "replaced on purpose")
        assert register(second, replace=True) is VERIFIERS["naive"] is second
        # names --methods cannot select (split on commas, stripped), and univer bound's own oracle's name, which
        # would have answered to the plugin in exact and to the oracle in bound
        for bad, message in (("a,b", "without commas"), ("", "non-empty"), (" naive2", "surrounding spaces"),
                             ("naive2 ", "surrounding spaces"), (5, "non-empty string .* got 5"),
                             ("univer-va", "value-aware oracle")):
            with pytest.raises(ValueError, match=message):
                register(Verifier(bad, VERIFIERS["rrs"].rule, ("iid",), "unreachable"))
        del VERIFIERS["naive"]
        assert "naive" in run_json(capsys, "--plugin", "naive_module", "exact", "--methods", "naive", "--vocab", "3",
                                   "--shape", "2", "--process", "iid")["methods"]
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        for folder in ("a", "b"):                       # one file name in two folders: two plugins (was: b skipped)
            (tmp_path / folder / "rule.py").write_text(PLUGIN.replace('"naive"', f'"naive-{folder}"'))
        methods = run_json(capsys, "--plugin", str(tmp_path / "a" / "rule.py"), "--plugin",
                           str(tmp_path / "b" / "rule.py"), "exact", "--methods", "naive-a,naive-b", "--vocab", "3",
                           "--shape", "2", "--process", "iid")["methods"]
        assert set(methods) == {"naive-a", "naive-b"}
    finally:
        for name in ("naive", "naive-a", "naive-b"):
            VERIFIERS.pop(name, None)
        for name in [m for m in sys.modules if m.startswith("univer_plugin_")] + ["naive_module"]:
            sys.modules.pop(name, None)
    for plugin, message in ((str(tmp_path / "missing.py"), "missing.py: no such file"),
                            ("no_such_plugin", "no module named 'no_such_plugin'"),
                            (str(tmp_path / "broken.py"), "broken.py: importing it raised RuntimeError: half-way"),
                            ("needs_more", "needs_more: importing it raised ModuleNotFoundError: No module named "
                                           "'no_such_dependency'")):
        assert main(["--plugin", plugin, "exact", "--vocab", "3", "--shape", "2"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("univer: error: --plugin ") and message in err, err


def test_ctrl_c_is_one_line_and_status_130(monkeypatch, capsys):
    """Ctrl-C during ``univer exact`` printed a 15-frame KeyboardInterrupt traceback."""
    import univer.commands.exact as exact

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(exact, "evaluate", interrupted)
    assert main(["exact", "--vocab", "3", "--shape", "2", "--methods", "tv"]) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "univer exact: interrupted" and "Traceback" not in err
    import univer.cli
    monkeypatch.setattr(univer.cli, "load_plugin", interrupted)          # while a --plugin loads
    assert main(["--plugin", "p.py", "exact", "--vocab", "3", "--shape", "2"]) == 130
    assert capsys.readouterr().err.strip() == "univer: interrupted"


def test_evaluate_reports_each_node_evaluation():
    """``univer exact`` showed one bar over methods that sat at 0/1 for a 217 s UniVer run; ``evaluate``'s
    ``on_node`` ticks once per distinct (node, prefix, ρ) evaluation (a bar per method), the result unchanged."""
    from univer_theory import VERIFIERS, DirichletModel, evaluate
    model = DirichletModel(3, seed=2)
    ticks = []
    with_bar = evaluate(model, "2,1", "wor", VERIFIERS["univer"], ticks.append)
    assert with_bar == evaluate(model, "2,1", "wor", VERIFIERS["univer"])
    assert len(ticks) == sum(with_bar.plans.values()) >= 3 and all("construction" in t for t in ticks)
