"""Every bad command line ends in one clear message and exit status 2 — no traceback: unsupported
method/shape/process combinations, malformed model files, malformed shapes."""
import json

import pytest

from univer.cli import main


@pytest.mark.parametrize("argv, message", [
    (["--methods", "kseq", "--rational", "--process", "iid"],
     "unsupported method/shape/process combination: --methods kseq with --shape 2,2 --process iid --rational: "
     "kseq has no exact rational form"),
    (["--methods", "bv", "--shape", "2,2"], "bv is defined on chains only"),
    (["--methods", "kseq", "--process", "wor"], "kseq is defined for processes iid only, got 'wor'"),
    (["--shape", "(,,.)"], "the comma at position 1 of '(,,.)' does not separate two children"),
    (["--shape", "((),.)"], "empty '()'"),
])
def test_bad_combination_or_shape(argv, message, capsys):
    assert main(["exact", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("tables, message", [
    ({"target": {"": 0.5}, "draft": {"": [0.5, 0.5]}},
     "the target row for prefix '' must be a list of 2 probabilities, got 0.5"),
    ({"target": {"": [0.5, 0.5000001]}, "draft": {"": [0.5, 0.5]}},
     "target row for prefix () sums to 1.0000001, expected 1 (off by +1e-07, tolerance 1e-09)"),
    ({"target": {"": [0.5, 0.5], "10": [0.5, 0.5]}, "draft": {"": [0.5, 0.5]}},
     "prefix key '10' has token 10, outside [0, 2)"),
    ({"target": {"": [0.5, 0.5]}, "draft": {"": [0.5, 0.5], "1,7": [0.5, 0.5]}},
     "prefix key '1,7' has token 7, outside [0, 2)"),
    ({"target": {"": [0.5, 0.5], "1;0": [0.5, 0.5]}, "draft": {"": [0.5, 0.5]}},
     "prefix key '1;0' is not comma-joined token ids"),
    ({"target": {"": [0.5, "x"]}, "draft": {"": [0.5, 0.5]}}, "has an entry that is not a number"),
    ({"target": [[0.5, 0.5]], "draft": {"": [0.5, 0.5]}}, "'target' must be an object"),
    ({"target": {"": [0.5, 0.5], "\u0661": [0.5, 0.5]}, "draft": {"": [0.5, 0.5]}},      # a non-ASCII digit one
     "prefix key '\u0661' is not comma-joined token ids"),
    ({"target": {"": [0.5, 0.5]}, "draft": {"": [0.5, 0.5]}, "targt": {}},
     "unknown field(s) ['targt']; the fields are 'vocab', 'target' and 'draft'"),
])
def test_bad_model_file(tables, message, tmp_path, capsys):
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"vocab": 2, **tables}))
    assert main(["exact", "--model-file", str(path), "--shape", "1"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_exact_model_file_past_float_range_is_one_line(tmp_path, capsys):
    """``--rational`` on a model file with an entry of 1e400 (a Fraction past float64's range): the off-simplex
    message formatted its sum as a float — an OverflowError traceback, exit 1; one line now, as without it."""
    path = tmp_path / "model.json"
    path.write_text('{"vocab": 2, "target": {"": ["1e400", 0.5]}, "draft": {"": [0.5, 0.5]}}')
    assert main(["exact", "--model-file", str(path), "--shape", "1", "--rational"]) == 2
    err = capsys.readouterr().err
    assert "sums to beyond 1e308" in err and err.count("\n") == 1 and "Traceback" not in err


def test_unreadable_model_file(tmp_path, capsys):
    path = tmp_path / "model.json"
    path.write_text("{not json")
    assert main(["exact", "--model-file", str(path)]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["exact", "--model-file", str(tmp_path / "missing.json")]) == 2
    assert "No such file" in capsys.readouterr().err
    path.write_text("[" * 100_000 + "]" * 100_000)                   # nested past the decoder's recursion limit
    assert main(["exact", "--model-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    (["exact", "--bogus"], "univer: error: unrecognized arguments: --bogus (see 'univer -h')"),
    (["exact", "--process", "zzz"], "univer exact: error: argument --process: invalid choice: 'zzz'"),
    (["decode"], "univer decode: error: the following arguments are required: --prompt (see 'univer decode -h')"),
    (["nope"], "univer: error: argument command: invalid choice: 'nope'"),
    (["exact", "--seed", "-1"], "univer exact: error: argument --seed: must be ≥ 0, got -1"),
    (["bound", "--seed", str(2 ** 32)], "univer bound: error: argument --seed: must be below 2^32"),   # a model's
    (["exact", "--temperature", "nan"], "argument --temperature: must be a finite number ≥ 0, got 'nan'"),
    (["decode", "--prompt", "hi", "--seed", "-3"], "univer decode: error: argument --seed: must be ≥ 0, got -3"),
    (["decode", "--prompt", "hi", "--seed", str(2 ** 64)], "argument --seed: must be ≤ 2^64 − 1"),   # after loading
    (["decode", "--prompt", "hi", "--temperature", "-1"], "argument --temperature: must be a finite number ≥ 0"),
    (["accept-bench", "--draft-temperature", "nan"], "argument --draft-temperature: must be a finite number ≥ 0"),
    (["speed", "--temperature", "inf"], "argument --temperature: must be a finite number ≥ 0, got 'inf'"),
])
def test_argparse_errors_are_one_line(argv, message, capsys):
    """argparse's own errors as the commands' are: one line on stderr, exit status 2 (no usage block)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "usage" not in err


@pytest.mark.parametrize("argv, message", [
    (["exact", "--vocab", "1000000", "--shape", "2"], "is 1e+12 (prefix, child tuple) pairs to plan"),
    (["bound", "--vocab", "1000", "--shape", "3", "--process", "iid", "--methods", "univer-va"],
     "vocabulary 1000 on shape (.,.,.) (iid) is 1e+09 (prefix, child tuple) pairs"),
    # every node's tuples within bounds, but 12⁸ prefixes (sat at "0/5 methods"), or 12⁸ outputs to compare
    (["exact", "--vocab", "12", "--shape", "1,1,1,1,1,1,1,1"], "is 4.69e+08 (prefix, child tuple) pairs"),
    (["exact", "--vocab", "12", "--shape", "1,1,1,1,1,1,1", "--process", "topk"], "is 4.3e+08 outputs to compare"),
    # beyond float64's range: formatting the count was an OverflowError traceback
    (["exact", "--vocab", "100000", "--shape", "60,60,60", "--process", "iid"], "is ~10^313 (prefix, child tuple)"),
    # 8 400 pairs for the exact engine, but 1.3·10¹⁰ trees for the global LP (a 95 GiB MemoryError after 47 s;
    # V = 6 `2,2,2` i.i.d., 7.8·10¹⁰ trees, was killed for memory)
    (["bound", "--vocab", "8", "--shape", "3,3", "--process", "wor"], "above MAX_TREES = 1e+06"),
    (["bound", "--vocab", "6", "--shape", "2,2,2", "--process", "iid"], "above MAX_TREES = 1e+06"),
    (["bound", "--vocab", "6", "--shape", "3,2", "--process", "wor"], "above MAX_TREES = 1e+06"),   # ran > 10 min
    # CF's node LP over 125 000 draft tuples: HiGHS ran for tens of minutes (V = 30, 27 000 tuples: ~100 s)
    (["bound", "--vocab", "50", "--shape", "3", "--process", "iid"], "above solvers.cf_bound.MAX_CF_NODE_TUPLES = 3e+04"),
    (["bound", "--process", "hub"], "univer bound: error: unsupported method/shape/process combination: the global"),
    # found inside the first method's enumeration, its progress bars drawn, blaming a small draft temperature
    (["exact", "--vocab", "2", "--shape", "3", "--process", "wor"], "drafts 3 distinct tokens at shape (.,.,.)'s"),
    (["bound", "--vocab", "2", "--shape", "1,3", "--process", "topk"], "more than the vocabulary's 2"),
    # two runs under one label METHOD@TREE, merged by speed_compare into one entry (2n prompts' values, twice the work)
    (["speed", "--methods", "univer", "--tree", "binary:2", "--tree", "binary:2"],
     "--tree binary:2 given more than once"),
    # an empty --methods ran every method (exit 0), where ``--methods ,`` and ``speed --methods ""`` were refused
    (["exact", "--vocab", "3", "--shape", "2", "--methods", ""], "--methods '' names no method"),
    (["bound", "--vocab", "3", "--shape", "2", "--methods", ""], "--methods '' names no method"),
    (["accept-bench", "--methods", ""], "--methods '' names no method"),
    (["check", "--only", ""], "univer check: error: --only '': unknown check(s) ['']"),
    (["check", "--only", "lossless,nope"], "unknown check(s) ['nope']"),
    (["check", "--only", "reductions", "--out", "FILE"], "is a file; give a folder"),
    # an uncaught FileExistsError once the run had started (speed: after every run)
    (["check", "--only", "reductions", "--out", "LINK/run1"], "is a link to nothing, so the folder cannot be created"),
    # a traceback from Path.exists() (OSError: File name too long)
    (["check", "--only", "reductions", "--out", "x" * 300], "File name too long"),
    # an empty path counted as "not given": the synthetic model ran, exit 0
    (["exact", "--model-file", ""], "--model-file '' names no file"),
    (["bound", "--model-file", ""], "--model-file '' names no file"),
    (["exact", "--model-file", "   "], "--model-file '   ' names no file"),     # (blank: no file either)
])
def test_refused_before_any_work(argv, message, tmp_path, capsys):
    """Each ran for minutes (an enumeration over V^k tuples), started the full paper-check run (an empty --only),
    printed a traceback (--out naming a file) or named its command twice; now one line, exit 2, nothing written."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    assert main([a.replace("FILE", str(tmp_path / "file")).replace("LINK", str(tmp_path / "link")) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "link"]


def test_an_out_folder_the_system_cannot_create_is_one_line(capsys):
    """``--out`` under /proc passes the checks made before the run (the nearest existing folder is writable to
    root) and failed in ``mkdir`` with a traceback; an OSError of the run is now one line and exit status 1 (2 where
    the user may not write /proc: refused before the run)."""
    rc = main(["check", "--only", "reductions", "--out", "/proc/univer-test/x"])
    err = capsys.readouterr().err
    assert (rc, err.split(":")[1].strip()) in ((1, "failed"), (2, "error")), (rc, err)
    assert err.count("\n") == 1 and "Traceback" not in err


def test_exact_at_zero_temperature_keeps_the_draft_at_one(capsys):
    """At ``T = 0`` the draft stays at temperature 1, as in the LLM commands (a one-hot draft row cannot draft the
    default shape's two distinct children): greedy acceptance, exact in Fraction mode."""
    assert main(["exact", "--temperature", "0", "--rational", "--json", "--methods", "rrsw,tv"]) == 0
    out = json.loads(capsys.readouterr().out)["methods"]
    assert {m["distance"] for m in out.values()} == {0} and out["rrsw"]["expected_accepted"] == out["tv"][
        "expected_accepted"]
    assert main(["exact", "--temperature", "0", "--draft-temperature", "0", "--process", "iid", "--shape", "2",
                 "--json", "--methods", "rrs"]) == 0
    assert json.loads(capsys.readouterr().out)["methods"]["rrs"]["lossless"]


def test_a_reader_that_goes_away_is_no_traceback():
    """``univer exact --json | head -1``: the pipe closes before the JSON is written; the command stops quietly
    (exit 141, as a shell reports SIGPIPE) instead of printing a BrokenPipeError traceback."""
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-m", "univer.cli", "exact", "--json", "--shape", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()                       # before the child has imported anything, let alone written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and "Traceback" not in err, err


@pytest.mark.parametrize("flags", [["--vocab", "5"], ["--seed", "3", "--similarity", "0.9"], ["--concentration", "2"]])
def test_synthetic_model_options_beside_a_model_file_are_refused(flags, tmp_path, capsys):
    """They were ignored without a word (``--vocab 5`` with a file of V = 3 ran on V = 3, exit 0)."""
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"vocab": 3, "target": {"": [0.5, 0.3, 0.2]}, "draft": {"": [0.2, 0.3, 0.5]}}))
    for command in ("exact", "bound"):
        assert main([command, "--model-file", str(path), "--shape", "2", *flags]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "with --model-file the file sets the model" in err
        assert all(f in err for f in flags if f.startswith("--"))
    assert main(["exact", "--model-file", str(path), "--shape", "2", "--methods", "tv", "--json"]) == 0


def test_rational_runs_say_what_they_cannot_do_and_keep_a_baseline(capsys):
    """``bound --rational --methods univer-va`` printed ``"methods": {}`` and exit 0 (the oracle silently dropped):
    it is refused now, like ``--methods univer``.  ``exact --process greedy --rational`` found "no method" (the
    default list kept NSS for topk only, and UniVer is not rational): NSS is the greedy baseline too."""
    assert main(["bound", "--vocab", "3", "--shape", "2", "--rational", "--methods", "univer-va"]) == 2
    err = capsys.readouterr().err
    assert "univer-va with --rational" in err and "Traceback" not in err
    assert main(["exact", "--vocab", "3", "--shape", "2", "--process", "greedy", "--rational", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["methods"]) == ["nss"] and out["methods"]["nss"]["exact"]["distance"] == "0"


def test_bound_counts_each_nodes_lp_on_its_own_rows(tmp_path, capsys, monkeypatch):
    """CF's node-LP size is checked on each node's own draft rows, before any method runs.  It read the root's row at
    the widest node's k: a narrow root above wide rows ran every method (2 minutes) before ``cf_bound`` refused,
    and a wide root above narrow rows was refused although CF's largest node LP has 16 tuples."""
    import univer.commands.bound as bound
    ran = []
    real = bound.exact_results
    monkeypatch.setattr(bound, "exact_results", lambda *a, **k: (ran.append(1), real(*a, **k))[1])
    V = 14
    flat, narrow = [1 / V] * V, [0.5, 0.5] + [0.0] * (V - 2)
    for root, below, code in ((narrow, flat, 2), (flat, narrow, 0)):
        path = tmp_path / "model.json"
        path.write_text(json.dumps({"vocab": V, "target": {"": flat},
                                    "draft": {"": root, **{str(y): below for y in range(V)}}}))
        assert main(["bound", "--model-file", str(path), "--shape", "1,4", "--process", "iid", "--methods", "nss",
                     "--json"]) == code
        out = capsys.readouterr()
        if code:
            assert "CF's node LP at node 1 has 38416 draft tuples" in out.err and not ran
        else:
            assert json.loads(out.out)["cf_bound"]["value"] > 0 and ran
