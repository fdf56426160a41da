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


def test_decode_cli_json(pair, monkeypatch, capsys):
    monkeypatch.setattr(decode_cmd, "load_models", lambda args: pair)
    rc = cli.main(["decode", "--prompt", "Say hi.", "--tree", "binary:2", "--max-new-tokens", "3", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "univer" and 1 <= out["new_tokens"] <= 3 and out["steps"] >= 1


def test_decode_cli_rejects_unsupported_method(capsys):
    assert cli.main(["decode", "--prompt", "x", "--method", "rrsw", "--process", "iid"]) == 2
    assert "does not apply" in capsys.readouterr().err
