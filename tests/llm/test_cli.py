"""``univer decode`` and ``univer accept-bench`` end to end (models from the session fixture)."""
import csv
import json

import pytest

from univer import cli
from univer.commands import accept_bench as accept_bench_cmd, decode as decode_cmd

pytestmark = pytest.mark.llm


def test_accept_bench_writes_json_csv_png(pair, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(accept_bench_cmd, "load_models", lambda args: pair)
    out = tmp_path / "ab"
    rc = cli.main(["accept-bench", "--fast", "--limit", "1", "--positions", "2", "--out", str(out),
                   "--methods", "rrsw,tv", "--json"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads((out / "accept_bench.json").read_text())
    assert set(saved["methods"]) == {"rrsw", "tv"} == set(printed["methods"])
    assert saved["config"]["shape"] == "((.,.),(.,.))" and saved["baseline"] == "rrsw"
    rows = list(csv.reader((out / "accept_bench.csv").open()))
    assert rows[0] == ["prompt", "category", "position", "rrsw", "tv"]
    assert len(rows) - 1 == saved["prompts"][0]["positions"]
    assert (out / "accept_bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("top", [None, 32])
def test_decode_cli_json(pair, monkeypatch, capsys, top):
    monkeypatch.setattr(decode_cmd, "load_models", lambda args: pair)
    extra = [] if top is None else ["--draft-top", str(top)]
    rc = cli.main(["decode", "--prompt", "Say hi.", "--tree", "binary:2", "--max-new-tokens", "3", "--json", *extra])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "univer" and 1 <= out["new_tokens"] <= 3 and out["steps"] >= 1
    assert out.get("draft_top") == top
    # acceptance length = tokens per target forward, τ + 1 (it was E[τ] under that name); E[τ] beside it; what the
    # budget of 3 tokens let out is tokens_per_step, at most the acceptance length
    assert out["acceptance_length"] == pytest.approx(out["mean_accepted"] + 1)
    assert out["tokens_per_step"] <= out["acceptance_length"] + 1e-12


def test_decode_cli_batch(pair, monkeypatch, capsys):
    """``--batch 2``: two samples of the prompt in shared forwards, listed under "requests", totals beside."""
    monkeypatch.setattr(decode_cmd, "load_models", lambda args: pair)
    rc = cli.main(["decode", "--prompt", "Say hi.", "--tree", "chain:1", "--max-new-tokens", "2", "--batch", "2",
                   "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["batch"] == 2 and len(out["requests"]) == 2
    steps = [r["steps"] for r in out["requests"]]
    assert out["acceptance_length"] == pytest.approx(sum(s * r["acceptance_length"] for s, r in
                                                         zip(steps, out["requests"])) / sum(steps))
    assert out["new_tokens"] == sum(r["new_tokens"] for r in out["requests"]) and out["steps"] >= 2
    assert out["tokens_per_s"] == pytest.approx(out["new_tokens"] / out["wall_s"])
    with pytest.raises(SystemExit) as exc:
        cli.main(["decode", "--prompt", "x", "--batch", "0"])
    assert exc.value.code == 2 and "must be ≥ 1" in capsys.readouterr().err


def test_decode_cli_rejects_unsupported_method(capsys):
    assert cli.main(["decode", "--prompt", "x", "--method", "rrsw", "--process", "iid"]) == 2
    assert "does not apply" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["decode", "--prompt", "x", "--draft-top", "0"])
    assert exc.value.code == 2 and "must be ≥ 1" in capsys.readouterr().err


def test_accept_bench_resume_gives_the_uninterrupted_result(pair, tmp_path, monkeypatch, capsys):
    """Each prompt's record is logged as it finishes; a run stopped after one prompt, then resumed with
    ``--resume``, computes only the other prompt and writes the same JSON (up to wall time) and CSV."""
    import importlib

    bench = importlib.import_module("gpu.llm.accept_bench")        # the module (gpu.llm exports the function)

    monkeypatch.setattr(accept_bench_cmd, "load_models", lambda args: pair)
    argv = lambda out, *extra: ["accept-bench", "--fast", "--limit", "2", "--positions", "2", "--out", str(out),
                                "--methods", "rrsw,tv", "--json", *extra]
    assert cli.main(argv(tmp_path / "whole")) == 0
    evaluate, calls = bench.evaluate_prompt, []

    def stop_after_one(*args, **kwargs):
        if len(calls) == 1:
            raise KeyboardInterrupt
        calls.append(args[1].id)
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(bench, "evaluate_prompt", stop_after_one)
    assert cli.main(argv(tmp_path / "parts")) == 130                         # Ctrl-C: one line, status 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "univer accept-bench: interrupted"
    log = (tmp_path / "parts" / "accept_bench.jsonl").read_text().splitlines()
    assert len(log) == 2 and json.loads(log[1])["id"] == calls[0]          # header + the finished prompt
    assert not (tmp_path / "parts" / "accept_bench.json").exists()
    monkeypatch.setattr(bench, "evaluate_prompt", lambda *a, **k: calls.append(a[1].id) or evaluate(*a, **k))
    assert cli.main(argv(tmp_path / "parts", "--resume")) == 0
    assert len(calls) == 2 and calls[0] != calls[1]                        # the recorded prompt is not recomputed
    whole, parts = (json.loads((tmp_path / d / "accept_bench.json").read_text()) for d in ("whole", "parts"))
    for obj in (whole, parts):
        del obj["config"]["wall_s"]
    assert parts == whole
    assert ((tmp_path / "parts" / "accept_bench.csv").read_text()
            == (tmp_path / "whole" / "accept_bench.csv").read_text())
    capsys.readouterr()
    assert cli.main([*argv(tmp_path / "parts", "--resume")[:5], "3", *argv(tmp_path / "parts", "--resume")[6:]]) == 2
    err = capsys.readouterr().err
    assert "settings differ" in err and "positions" in err
    # a run killed while appending: its torn line is dropped when resumed, and the log resumes again afterwards
    log = tmp_path / "parts" / "accept_bench.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:2]) + "\n" + lines[2][:40])
    calls.clear()
    for _ in range(2):
        assert cli.main(argv(tmp_path / "parts", "--resume")) == 0
    assert len(calls) == 1                                                  # the torn prompt, recomputed once
    assert log.read_text().splitlines() == lines
    parts = json.loads((tmp_path / "parts" / "accept_bench.json").read_text())
    del parts["config"]["wall_s"]
    assert parts == whole and whole["config"]["device"] == "cpu"


def test_speed_cli_json_csv_png(pair, tmp_path, monkeypatch, capsys):
    from univer.commands import speed as speed_cmd

    monkeypatch.setattr(speed_cmd, "load_models", lambda args: pair)
    out = tmp_path / "speed"
    rc = cli.main(["speed", "--n", "1", "--max-new-tokens", "2", "--methods", "plain,hf-assisted,sps,tv",
                   "--tree", "binary:2", "--tree", "chain:2", "--chain", "chain:2", "--out", str(out), "--json"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    names = ["plain", "hf-assisted", "sps", "tv@binary:2", "tv@chain:2"]
    assert list(printed["methods"]) == names
    for m in printed["methods"].values():
        assert m["tokens_per_s"] > 0 and m["tokens_per_step"] >= 1 and 1 <= m["new_tokens"] <= 2
        assert set(m["share"]) == {"draft", "target", "verify"} and 0.5 <= sum(m["share"].values()) <= 1 + 1e-9
    assert printed["methods"]["plain"]["share"]["draft"] == 0 and printed["methods"]["plain"]["speedup_vs_plain"] == 1
    assert json.loads((out / "speed.json").read_text())["methods"].keys() == printed["methods"].keys()
    rows = list(csv.reader((out / "speed.csv").open()))
    assert rows[0][:3] == ["method", "tokens_per_s", "speedup_vs_plain"] and [r[0] for r in rows[1:]] == names
    assert [float(r[rows[0].index("acceptance_length")]) for r in rows[1:]] == pytest.approx(
        [m["acceptance_length"] for m in printed["methods"].values()], abs=1e-4)
    assert (out / "speed.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_speed_cli_batch(pair, tmp_path, monkeypatch, capsys):
    """``--batch 2`` over 2 prompts: one group per method decoded in shared forwards; hf-assisted, which cannot
    batch, is left out of the default methods (said on stderr); ``--draft-top`` and ``--draft-temperature`` (which
    speed dropped) are recorded in the config, and each method reports its acceptance length."""
    from univer.commands import speed as speed_cmd

    monkeypatch.setattr(speed_cmd, "load_models", lambda args: pair)
    rc = cli.main(["speed", "--n", "2", "--batch", "2", "--max-new-tokens", "2", "--tree", "chain:1",
                   "--chain", "chain:1", "--out", str(tmp_path / "speed"), "--json", "--draft-top", "16",
                   "--draft-temperature", "0.5"])
    assert rc == 0
    out, err = capsys.readouterr()
    printed = json.loads(out)
    assert list(printed["methods"]) == ["plain", "sps", "rrsw", "tv", "univer"] and "hf-assisted" in err
    assert printed["config"]["batch"] == 2 and printed["config"]["draft_top"] == 16
    assert printed["config"]["draft_temperature"] == 0.5
    for name, m in printed["methods"].items():
        assert 2 <= m["new_tokens"] <= 4 and len(printed["per_prompt_tokens_per_s"][name]) == 1
        assert m["acceptance_length"] >= m["tokens_per_step"] >= 1


@pytest.mark.parametrize("argv,match", [(["--methods", "plain,warp"], "unknown method(s) ['warp']"),
                                        (["--methods", " , "], "names no method"),
                                        (["--tree", "binary:x"], "positive depth"),
                                        (["--methods", "sps", "--chain", "binary:2"], "does not apply"),
                                        (["--n", "2", "--batch", "3"], "exceeds the number of prompts"),
                                        (["--n", "2", "--batch", "2", "--methods", "plain,hf-assisted"],
                                         "cannot batch"),
                                        # ran with exit 0, recording the unused tree in its config
                                        (["--methods", "plain", "--tree", "binary:2"], "none of the methods"),
                                        (["--methods", "sps", "--tree", "binary:2"], "sps drafts --chain")])
def test_speed_cli_rejects_bad_values_before_loading(argv, match, capsys):
    assert cli.main(["speed", *argv]) == 2
    assert match in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["speed", "--n", "0"], ["speed", "--batch", "0"], ["accept-bench", "--limit", "0"],
                                  ["accept-bench", "--positions", "0"], ["accept-bench", "--positions", "-2"]])
def test_llm_commands_reject_non_positive_counts(argv, tmp_path, capsys):
    """accept-bench's ``--positions 0`` was refused only once both models had loaded (~34 s), after creating its
    ``--out`` folder."""
    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, "--out", str(tmp_path / "out")])
    assert exc.value.code == 2 and "must be ≥ 1" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_decode_refuses_a_non_positive_budget_before_loading(monkeypatch, capsys):
    """``decode --max-new-tokens 0`` (or −3) was refused by the decoder, once both models had loaded (~7 s)."""
    import gpu.llm.models

    monkeypatch.setattr(gpu.llm.models, "load_target", lambda *a, **k: pytest.fail("loaded the target"))
    for budget in ("0", "-3"):
        with pytest.raises(SystemExit) as exc:
            cli.main(["decode", "--prompt", "hi", "--max-new-tokens", budget])
        assert exc.value.code == 2 and "must be ≥ 1" in capsys.readouterr().err


@pytest.mark.parametrize("argv,match", [
    (["accept-bench", "--methods", "spechub"], "--methods spechub with --tree"),           # read args.shape
    # refused by the tree's process, though decode's list of methods offered it and its --process cannot be 'hub'
    (["decode", "--prompt", "hi", "--method", "spechub"], "drafts with process 'hub', which only univer exact"),
    (["accept-bench", "--methods", "sps", "--tree", "binary:2"], "--methods sps with --tree binary:2"),
    (["decode", "--prompt", "hi", "--device", "foo"], "--device foo:"),                     # a RuntimeError, exit 1
    (["accept-bench", "--methods", "sps", "--tree", "chain:1", "--out", "FILE"], "is a file; give a folder"),
    (["speed", "--n", "1", "--methods", "plain", "--out", "FILE"], "is a file; give a folder"),   # after every run
    # a NotADirectoryError traceback once the whole run had finished
    (["speed", "--n", "1", "--methods", "plain", "--out", "FILE/sub"], "is a file, so the folder cannot be created"),
    (["accept-bench", "--methods", "sps", "--tree", "chain:1", "--out", "FILE/sub/x"], "cannot be created"),
    (["decode", "--prompt", "hi", "--tree", "binary:2", "--draft-top", "1"], "--draft-top 1 keeps fewer tokens"),
    (["decode", "--prompt", "hi", "--draft", "rtn:4"], "--draft: spec 'rtn:4' must read rtn:BITS:GROUP"),
    (["decode", "--prompt", "hi", "--draft", "hf:/no/such"], "'/no/such' has no config.json"),
    (["decode", "--prompt", "hi", "--tree", "64,64,64"], "beyond the 1024 a decoding tree may have"),
    (["decode", "--prompt", "hi", "--device", "meta"], "--device meta: meta tensors hold no values"),  # loaded, then
])                                                                                             # a RuntimeError
def test_llm_commands_refuse_bad_values_in_one_line_before_loading(argv, match, tmp_path, capsys):
    """Each was a traceback with exit 1 (an AttributeError, a RuntimeError, a FileExistsError — the last one only
    after the whole speed run) or, for a draft that cannot draft the tree's widest node, an error once both models
    had loaded; all are one line and exit 2 now, before any model is loaded."""
    (tmp_path / "file").write_text("x")
    assert cli.main([a.replace("FILE", str(tmp_path / "file")) if a.startswith("FILE") else a for a in argv]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1 and "Traceback" not in err


def test_accept_bench_log_that_is_not_one_is_refused(tmp_path):
    """A log whose first line is JSON but not the header (e.g. ``[1, 2]``) raised an AttributeError on resume."""
    from gpu.llm.accept_bench import read_log

    path = tmp_path / "accept_bench.jsonl"
    for text in ("[1, 2]\n", "not json\n", '{"config": 3}\n'):
        path.write_text(text)
        with pytest.raises(ValueError, match="does not start with an accept-bench header"):
            read_log(path)
    path.write_text('{"config": {}, "methods": []}\n{"id": 1}\n{"id"')
    with pytest.raises(ValueError, match="line 2 is not a prompt record"):
        read_log(path)


def test_speed_json_draws_no_bars_and_a_missing_plain_is_no_nan(pair, tmp_path, monkeypatch, capsys):
    """``speed --json`` drew its progress bars on stderr (decode and accept-bench do not in --json); without
    ``plain`` the table and CSV printed ``nan`` under "× plain"."""
    from univer.commands import speed as speed_cmd

    monkeypatch.setattr(speed_cmd, "load_models", lambda args: pair)
    argv = ["speed", "--n", "1", "--max-new-tokens", "2", "--methods", "tv", "--tree", "chain:1",
            "--out", str(tmp_path / "speed")]
    assert cli.main([*argv, "--json"]) == 0
    out, err = capsys.readouterr()
    assert "speedup_vs_plain" not in json.loads(out)["methods"]["tv"] and "it/s" not in err and "tok/s" not in err
    assert cli.main(argv) == 0
    table = capsys.readouterr().out
    assert "nan" not in table and "nan" not in (tmp_path / "speed" / "speed.csv").read_text()


def test_draft_top_above_the_vocabulary_is_refused(pair, monkeypatch, capsys):
    """``--draft-top 999999`` (V = 49 152) truncated nothing and the summary said "draft top 999999"."""
    import gpu.llm.models

    monkeypatch.setattr(gpu.llm.models, "load_pair", lambda *a, **k: pair)
    assert cli.main(["decode", "--prompt", "hi", "--max-new-tokens", "2", "--draft-top", "999999"]) == 2
    assert f"exceeds the vocabulary ({pair.vocab_size} tokens)" in capsys.readouterr().err
