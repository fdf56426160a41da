"""Every benchmark script runs end to end on tiny sizes (they print ratios; nothing here is timed)."""
import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNS = {
    "bench_alpha_star.py": ["--repeats", "1", "--large", "2000"],
    "bench_node_plans.py": ["--vocab", "100", "--k", "2", "--support", "4", "6"],
    "bench_univer_plans.py": ["--vocab", "2000"],
    "bench_drafts.py": ["--drafts", "early:2", "rtn:4:32", "--prompts", "1", "--tokens", "2", "--repeat", "1",
                        "--q", "1"],
    "bench_gpu.py": ["--vocab", "200", "--process", "iid", "--shape", "2,2", "--methods", "tv,univer", "--repeat", "1"],
    "bench_engines.py": ["--batch", "4", "--nodes", "6", "--vocab", "300", "--repeat", "2"],
    "bench_verify.py": ["--vocab", "200", "--alpha-vocab", "500", "--batches", "1,2", "--repeat", "1",
                        "--shapes", "binary:2", "--no-model"],
}


@pytest.mark.parametrize("script", sorted(RUNS))
def test_benchmark_runs_on_tiny_sizes(script):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *RUNS[script]], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("\n") >= 5


def _script(name: str):
    """The module of ``benchmarks/<name>.py``, imported as its script runs (benchmarks/ on the path)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def _refuses(script: str, argv: list, match: str, capsys) -> None:
    """``main(argv)`` of ``script`` exits 2 with ``match`` in a one-line argparse error, no traceback."""
    with pytest.raises(SystemExit) as exc:
        _script(script).main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and match in err and "Traceback" not in err, err


@pytest.mark.parametrize("bad,match", [
    (["--draft-top", "0"], "--draft-top: expected 'all' or a positive int"), (["--repeat", "0"], "--repeat must be"),
    (["--shapes", "bogus"], "cannot read shape 'bogus'"), (["--methods", "foo"], "--methods: unknown ['foo']"),
    (["--batches", "x"], "--batches: expected positive ints"), (["--device", "foo"], "--device foo:"),
    (["--alpha-vocab", "0"], "--alpha-vocab must be"), (["--processes", "topk"], "--processes: unknown"),
    # each a traceback after the α* section was timed: k = 3 wor on 2 tokens, a wor node of 2 (4) children drafted
    # from 1 (3) tokens
    (["--alpha-vocab", "2"], "--alpha-vocab must be ≥ 3, got 2"),
    (["--draft-top", "1", "--processes", "wor", "--shapes", "binary:2"], "--draft-top must be ≥ 2, got 1"),
    (["--vocab", "3", "--shapes", "eagle"], "--vocab must be ≥ 4, got 3"),
    # timed untruncated rows under a "top 64" label (decode, speed and accept-bench refused it)
    (["--vocab", "8", "--draft-top", "64"], "--draft-top 64 exceeds --vocab 8 and would truncate nothing"),
    (["--vocab", "8", "--draft-top", "9"], "--draft-top 9 exceeds --vocab 8 and would truncate nothing"),
    # a device torch parses but cannot compute on: a traceback after the α* section
    (["--device", "meta"], "--device meta: meta tensors hold no values"),
])
def test_bench_verify_refuses_bad_arguments_in_one_line(bad, match, capsys):
    """Each was a traceback, several only after the α* section had been timed."""
    _refuses("bench_verify", ["--no-model", *bad], match, capsys)


@pytest.mark.parametrize("script,bad,match", [
    ("bench_alpha_star", ["--repeats", "0"], "--repeats must be ≥ 1, got 0"),
    ("bench_alpha_star", ["--large", "128", "2"], "--large must be ≥ 3, got 2"),
    ("bench_drafts", ["--drafts", "rtn:4"], "--drafts: cannot read ['rtn:4']; expected rtn:BITS:GROUP"),
    ("bench_drafts", ["--q", "1", "0"], "--q must be ≥ 1, got 0"),
    ("bench_engines", ["--vllm-methods", "sps,rrs"], "--vllm-methods: unknown ['rrs']; choose from sps, bv"),
    ("bench_engines", ["--nodes", "6", "--vocab", "3"], "--vocab must be ≥ 5, got 3"),
    ("bench_global_lp", ["--seed", "-1"], "--seed must lie in [0, 4294967296) (DirichletModel's), got -1"),
    ("bench_global_lp", ["--seed", str(2 ** 32)], "--seed must lie in [0, 4294967296)"),    # after the table began
    ("bench_univer_plans", ["--seed", str(2 ** 64)], "--seed must lie in [0, 18446744073709551616)"),
    ("bench_gpu", ["--shape", ""], "--shape: "),                           # '' ran the random-shape grid, exit 0
    ("bench_gpu", ["--device", "meta"], "--device meta: meta tensors hold no values"),
    ("bench_global_lp", ["--out", "scaling.xyz"], "argument --out: 'scaling.xyz' is not an image file name"),
    ("bench_gpu", ["--methods", ""], "--methods: unknown ['']"),
    ("bench_gpu", ["--shape", "bogus"], "--shape: TreeShape.parse: cannot read shape 'bogus'"),
    ("bench_node_plans", ["--k", "2", "3", "--support", "4", "2"], "--support must be ≥ 3, got 2"),
    ("bench_node_plans", ["--rho", "1.5"], "--rho must lie in [0, 1], got 1.5"),
    ("bench_node_plans", ["--k", "5", "--support", "14"], "tableau exceeds CONDOT_CHUNK = 2^25 entries at (m, k) = "
                                                         "(14, 5)"),     # asked lp_plan for 12.6 TiB mid-run
    ("bench_univer_plans", ["--vocab", "1"], "--vocab must be ≥ 2, got 1"),
    ("verify_table", ["run.json", "--plot", "cost.xyz"], "argument --plot: 'cost.xyz' is not an image file name"),
])
def test_benchmarks_refuse_bad_arguments_in_one_line(script, bad, match, capsys):
    """Each was a traceback, most only after timing had started (bench_drafts': after loading SmolLM2)."""
    _refuses(script, bad, match, capsys)



def test_bench_drafts_refuses_a_spec_before_loading_the_target(monkeypatch, capsys):
    """``rtn:99:32`` was a traceback once SmolLM2 had loaded; it is refused before the load now.  ``early:99``
    (beyond the target's 30 layers) is known only once it has loaded, and is one line too."""
    bd = _script("bench_drafts")
    load = bd.load_target
    monkeypatch.setattr(bd, "load_target", lambda: pytest.fail("SmolLM2 loaded before the spec was refused"))
    _refuses("bench_drafts", ["--drafts", "rtn:99:32"], "needs BITS in [2, 8]", capsys)
    monkeypatch.setattr(bd, "load_target", load)
    _refuses("bench_drafts", ["--drafts", "early:99"], "early:L with 1 ≤ L < 30", capsys)

@pytest.mark.parametrize("script,flag", [("bench_engines", "--json"), ("bench_drafts", "--json"),
                                         ("bench_global_lp", "--out")])
def test_benchmarks_refuse_an_output_under_a_file(script, flag, tmp_path, capsys):
    """bench_engines' ``--json`` in a missing folder and bench_global_lp's ``--out`` under a file failed only after
    the timing (FileNotFoundError, FileExistsError): a path under a file is refused first (missing folders are
    made when the script writes)."""
    (tmp_path / "f").write_text("x")
    name = "plot.png" if flag == "--out" else "cells.json"
    _refuses(script, [flag, str(tmp_path / "f" / name)], "is a file, not a folder", capsys)
    # a folder the system will not create (a FileNotFoundError traceback after the run, as root too)
    _refuses(script, [flag, f"/proc/univer-test/{name}"], "cannot be written", capsys)


def _run_row(rows, shape, process, top, method, ratio, tree=None):
    """One ``bench_verify.py --json`` row with a forward (the fields ``verify_table.py`` reads)."""
    row = {"rows": rows, "shape": shape, "nodes": 31, "process": process, "draft_top": top, "B": 1, "method": method,
           "forward": {"min_ms": 150.0, "median_ms": 200.0}, "verify_over_forward": ratio, "peak_mb_batched": 0.5}
    return row if tree is None else {**row, "tree": tree}


def _run(ratios: dict, forward_ms: float) -> dict:
    """A run whose SmolLM2-drafted wor trees 0 and 1 have ``ratios[(top, method)] = (tree 0, tree 1)`` and one
    Zipf-row case without a forward (B = 8: no ``verify_over_forward``, so not in the table)."""
    real = [{**_run_row("smollm2", "binary:4", "wor", top, m, r, tree), "forward": {"median_ms": forward_ms}}
            for (top, m), pair in ratios.items() for tree, r in enumerate(pair)]
    zipf = {k: v for k, v in _run_row("zipf", "binary:4", "wor", None, "univer", 0.0).items()
            if k not in ("forward", "verify_over_forward")}
    alpha = {"vocab": 128000, "wor": {"median_ms": 300.0}, "iid": {"median_ms": 10.0}}
    return {"alpha_star": alpha, "synthetic": [{**zipf, "B": 8}], "real": real}


def test_verify_table_gives_each_cell_its_range_over_runs_and_trees(tmp_path):
    """The README's table from two runs: each cell is min–max over both runs and both trees, bold only where the
    maximum meets 0.10; the whole row before the truncations (larger m first), rrs in rrsw's column; the image."""
    runs = [_run({(None, "univer"): (1.5, 1.2), (64, "univer"): (0.04, 0.05), (1024, "univer"): (0.09, 0.08),
                  (None, "rrsw"): (0.05, 0.06)}, 180.0),
            _run({(None, "univer"): (1.9, 1.1), (64, "univer"): (0.06, 0.03), (1024, "univer"): (0.11, 0.07),
                  (None, "rrs"): (0.07, 0.04)}, 250.0)]
    paths = []
    for i, run in enumerate(runs):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps(run))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "verify_table.py"), *map(str, paths),
                          "--plot", str(tmp_path / "cost.png")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert "2 runs; target forward 180–250 ms (medians)" in lines
    body = [line for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert body == ["| SmolLM2-drafted binary:4 (31 nodes), 2 trees | wor | all | 1.10–1.90 | **0.040–0.070** "
                    "| - |",
                    "|  |  | top 1024 | 0.070–0.110 | - | - |",
                    "|  |  | top 64 | **0.030–0.060** | - | - |"]
    assert (tmp_path / "cost.png").stat().st_size > 1000


def test_verify_table_refuses_runs_of_different_settings(tmp_path):
    """Runs whose times alone differ make one table; runs measured with another --repeat, --vocab, --batches or
    --methods are refused, naming the setting and both files."""
    verify_table = _script("verify_table")
    settings = {"torch_threads": 1, "repeat": 5, "device": "cpu"}
    first = {**_run({(None, "univer"): (1.5, 1.2)}, 180.0), **settings}
    zipf = first["synthetic"][0]

    def write(*runs):
        paths = [str(tmp_path / f"run{i}.json") for i in range(len(runs))]
        for path, run in zip(paths, runs):
            Path(path).write_text(json.dumps(run))
        return paths

    assert len(verify_table.load(write(first, {**_run({(None, "univer"): (1.9, 1.1)}, 250.0), **settings}))) == 2
    changes = (("repeat", {"repeat": 3}), ("vocab", {"synthetic": [{**zipf, "vocab": 1000}]}),
               # another --batches draws other Zipf trees (one generator); another --methods puts another first
               ("batches", {"synthetic": [{**zipf, "B": 64}]}), ("methods", {"synthetic": [{**zipf, "method": "tv"}]}))
    for setting, change in changes:
        paths = write(first, {**first, **change})
        with pytest.raises(ValueError, match=f"different settings: {setting} is") as exc:
            verify_table.load(paths)
        assert paths[0] in str(exc.value) and paths[1] in str(exc.value)


def test_verify_table_says_what_is_missing(tmp_path):
    """Runs without a forward (``--no-model``), or a file that is not bench_verify.py output: a clear error naming
    the file — rows that are not objects or name no method were an AttributeError / KeyError traceback, a binary
    file an error without its name."""
    script = str(ROOT / "benchmarks" / "verify_table.py")
    no_model = tmp_path / "no_model.json"
    no_model.write_text(json.dumps({**_run({}, 200.0), "real": []}))
    files = {"other": "[1, 2]", "lists": '{"synthetic": [], "real": [], "alpha_star": []}',
             "rows": '{"synthetic": [{"x": 1}], "real": [], "alpha_star": {}}',
             "not_rows": '{"synthetic": [], "real": {}, "alpha_star": {}}',
             "not_objects": '{"synthetic": ["method"], "real": [], "alpha_star": {}}'}
    for name, text in files.items():
        (tmp_path / f"{name}.json").write_text(text)
    (tmp_path / "binary.json").write_bytes(bytes(range(128, 256)))
    nan_run = _run({(None, "univer"): (0.05, 0.06)}, 200.0)          # a NaN ratio: its range and bold hung on the
    nan_run["real"][1]["verify_over_forward"] = float("nan")           # order of the runs (min/max drop a later NaN)
    (tmp_path / "nan.json").write_text(json.dumps(nan_run))
    nan_run["real"][1]["verify_over_forward"] = 0.06
    (tmp_path / "huge.json").write_text(json.dumps(nan_run).replace("0.06", "1e999"))   # a float that overflows
    (tmp_path / "long.json").write_text(json.dumps(nan_run).replace("0.06", "1" + "0" * 400))      # an int too
    cases = [(no_model, "without --no-model"), (tmp_path / "binary.json", "binary.json: not a JSON object"),
             (tmp_path / "nan.json", "nan.json: not a JSON object from bench_verify.py --json (it holds NaN"),
             (tmp_path / "huge.json", "huge.json: not a JSON object from bench_verify.py --json (it holds 1e999"),
             (tmp_path / "long.json", "long.json: not a JSON object from bench_verify.py --json (it holds 1000")]
    cases += [(tmp_path / f"{name}.json", f"{name}.json: expected bench_verify.py --json output") for name in files]
    for path, message in cases:
        out = subprocess.run([sys.executable, script, str(path)], capture_output=True, text=True, timeout=300)
        assert out.returncode == 2 and message in out.stderr, out.stderr


def test_verify_table_batched_gives_each_batch_size_its_table(tmp_path):
    """``--batched``: one table per B of ``batched_over_loop`` per Zipf-row case and method, each cell the range over
    the runs and the batched call's time range, bold only at B = 64 where the lowest ratio meets 5; rrs in rrsw's
    column (one figure where both ends round alike), a method never run a dash (B = 8: not bold,
    though ≥ 5).  ``--plot`` is refused with it, and runs without a loop say so."""
    def row(B, method, ratio, ms, top=None, process="wor"):
        return {"rows": "zipf", "shape": "eagle", "nodes": 24, "process": process, "draft_top": top, "B": B,
                "method": method, "batched": {"median_ms": ms}, "batched_over_loop": ratio}

    alpha = {"vocab": 128000, "wor": {"median_ms": 300.0}, "iid": {"median_ms": 10.0}}
    runs = [[row(8, "univer", 5.5, 40.0), row(64, "univer", 5.2, 250.0), row(64, "rrs", 7.5, 20.0, 1024, "iid")],
            [row(8, "univer", 6.1, 30.0), row(64, "univer", 4.9, 260.0), row(64, "rrs", 7.504, 19.5, 1024, "iid")]]
    paths = []
    for i, synthetic in enumerate(runs):
        paths.append(str(tmp_path / f"run{i}.json"))
        Path(paths[-1]).write_text(json.dumps({"alpha_star": alpha, "synthetic": synthetic, "real": []}))
    script = [sys.executable, str(ROOT / "benchmarks" / "verify_table.py")]
    out = subprocess.run([*script, *paths, "--batched"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n\n")[1:] == [
        "| Zipf rows, B = 8 | process | draft | univer | rrsw | tv |\n|---|---|---|---|---|---|\n"
        "| EAGLE-like (24 nodes) | wor | all | 5.50–6.10× (30.0–40.0 ms) | - | - |",
        "| Zipf rows, B = 64 | process | draft | univer | rrsw | tv |\n|---|---|---|---|---|---|\n"
        "| EAGLE-like (24 nodes) | wor | all | 4.90–5.20× (250–260 ms) | - | - |\n"
        "| EAGLE-like (24 nodes) | iid | top 1024 | - | **7.50×** (19.5–20.0 ms) | - |\n"]
    for extra, message in ((["--batched", "--plot", str(tmp_path / "x.png")], "not with --batched"), ([], "")):
        bad = subprocess.run([*script, *paths, *extra], capture_output=True, text=True, timeout=300)
        assert bad.returncode == 2 and (message or "without --no-model") in bad.stderr, bad.stderr
    no_loop = tmp_path / "no_loop.json"
    no_loop.write_text(json.dumps({**_run({(None, "univer"): (1.5, 1.2)}, 180.0), "synthetic": []}))
    bad = subprocess.run([*script, str(no_loop), "--batched"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "no run has batched_over_loop rows" in bad.stderr, bad.stderr


def test_verify_table_batched_orders_batches_and_drafts_and_rounds_its_edges():
    """``--batched`` on a run of ``--batches 64,8 --draft-top 64,all,1024``: B ascending, each tree's whole row
    before its truncations (larger m first), the case's name on its first row only; bold where the lowest ratio is
    exactly 5 at B = 64; 9.996 reads 10.0 (the decade rounded up), a batched call of 10 812 ms whole."""
    vt = _script("verify_table")

    def row(B, top, ratio, ms):
        return {"rows": "zipf", "shape": "eagle", "nodes": 24, "process": "wor", "draft_top": top, "B": B,
                "method": "univer", "batched": {"median_ms": ms}, "batched_over_loop": ratio}
    synthetic = [row(64, 64, 5.0, 10812.0), row(64, None, 9.996, 40.0), row(64, 1024, 4.999, 1.0),
                 row(8, 64, 1.0, 1.0), row(8, None, 1.0, 1.0), row(8, 1024, 1.0, 1.0)]
    found = vt.batched_cells([{"synthetic": synthetic}])
    assert list(found) == [8, 64] and all(list(c) == [("zipf", "eagle", "wor", t) for t in (None, 1024, 64)]
                                          for c in found.values())
    assert vt.batched_table(64, found[64]).split("\n")[2:] == [
        "| EAGLE-like (24 nodes) | wor | all | **10.0×** (40.0 ms) | - | - |",
        "|  |  | top 1024 | 5.00× (1.00 ms) | - | - |",
        "|  |  | top 64 | **5.00×** (10812 ms) | - | - |"]


def test_bench_verify_times_univer_right_after_the_forward():
    """The SmolLM2 section's first method (UniVer) runs right after the forward, which evicts the caches (module
    docstring, README); a fresh batch's structure was timed between them.  A stand-in target: no model loaded."""
    import argparse

    import torch

    from gpu.drafting import draft_tree

    bv = _script("bench_verify")
    order = []

    class Target:                       # SmolLM2's role: a forward of the tree and a drafted tree
        V = 50

        def draft(self, shape, process, gen, top=None):
            q = torch.softmax(torch.randn(1, shape.num_nodes, self.V, generator=gen, dtype=torch.float64), -1)
            return draft_tree(shape, q, process, 1, gen)

        def forward(self, batch):
            return torch.randn(batch.token.shape[1], self.V)

    real = bv.repeated_times

    def traced(calls, repeat):
        order.append(list(calls))
        return real(calls, repeat)

    args = argparse.Namespace(shapes="binary:1", processes="wor", draft_top="all", real_trees=1,
                              methods="univer,rrsw,tv", repeat=1, json=True)
    bv.repeated_times = traced
    try:
        bv.real_section(args, Target())
    finally:
        bv.repeated_times = real
    assert order and order[0][:2] == ["forward", "univer"], order


@pytest.mark.parametrize("process,method", [("iid", "univer"), ("wor", "univer"), ("wor", "tv"), ("wor", "rrsw")])
def test_bench_gpu_times_gpu_verify(process, method, monkeypatch, capsys):
    """bench_gpu called the engine with its defaults (no drafted support, other row blocks, unreached nodes planned
    for UniVer, subtree shapes for TV), then ``engine.sample`` with ``gpu.verify``'s options — not the walk (RRSw)
    or the traversal (TV) that ``gpu.verify`` runs since items 108–109.  It times ``gpu.verify(validate=False)``."""
    bench = _script("bench_gpu")
    calls, real = [], bench.verify
    seen = []
    monkeypatch.setattr(bench, "verify", lambda *a, **kw: calls.append((a[4], kw)) or seen.append((a, kw))
                        or real(*a, **kw))
    made = []
    rb = bench.random_batch
    monkeypatch.setattr(bench, "random_batch", lambda *a, **kw: made.append(rb(*a, **kw)) or made[-1])
    bench.main(["--vocab", "60", "--shape", "2,2", "--process", process, "--methods", method, "--repeat", "1"])
    capsys.readouterr()
    assert calls and all(call == (method, {"validate": False}) for call in calls), calls
    import torch
    (_, p, q, proc, _, g), _ = seen[0]
    assert proc == process and isinstance(g, torch.Generator) and p is made[0][1] and q is made[0][2]


def test_bench_gpu_times_univer_with_another_clock_walk_as_gpu_verify_would(monkeypatch, capsys):
    """``--clock-walk fixed_point``: UniVer's engine pass with ``gpu.verify``'s options on its rule with that walk."""
    from gpu import engine
    from gpu.verify import engine_options

    bench, calls, sample = _script("bench_gpu"), [], engine.sample
    monkeypatch.setattr(engine, "sample", lambda *a, **kw: calls.append((a[4], kw)) or sample(*a, **kw))
    bench.main(["--vocab", "60", "--shape", "2,2", "--process", "wor", "--methods", "univer", "--repeat", "1",
                "--clock-walk", "fixed_point"])
    capsys.readouterr()
    want = engine_options("univer", "wor")
    assert calls and all(rule.keywords == {"walk": "fixed_point"} and {key: kw.get(key) for key in want} == want
                         for rule, kw in calls), calls


def test_bench_gpu_default_methods_run_on_iid_trees(capsys):
    """The default ``--methods tv,rrsw`` was refused on i.i.d. trees ("unknown ['rrsw']"): RRS runs in RRSw's
    place there, as in bench_verify.py."""
    _script("bench_gpu").main(["--vocab", "60", "--shape", "2,2", "--process", "iid", "--repeat", "1"])
    out = capsys.readouterr().out
    assert "rrs" in out and "tv" in out, out


def test_bench_verify_refuses_a_vocabulary_beyond_the_models(monkeypatch, capsys):
    """The Zipf rows' trees are fed to SmolLM2's forward: ``--vocab`` above its 49 152 tokens was an IndexError
    after the α* section had been timed.  A stand-in target: no model loaded."""
    bv = _script("bench_verify")

    class Target:
        pair = type("Pair", (), {"vocab_size": 49152})

    monkeypatch.setattr(bv, "Target", Target)
    _refuses("bench_verify", ["--vocab", "60000", "--alpha-vocab", "50"],
             "--vocab 60000 exceeds the target's vocabulary 49152", capsys)


def test_bench_verify_reads_shapes_with_commas_and_times_each_loop_cold():
    """``--shapes 3,2`` timed a 3-child and a 2-child root instead of the 10-node 3,2 tree, and a nested
    TreeShape.parse string was refused; GR's exact loop (a FlatPlanRule caching plans) was warm after its first
    repeat."""
    bv = _script("bench_verify")
    assert bv.shape_specs("3,2") == ["3,2"]
    assert bv.shape_specs("binary:1,(.,(.,.)),eagle") == ["binary:1", "(.,(.,.))", "eagle"]
    assert bv.shape_specs("2, binary:2,3") == ["2", "binary:2", "3"]
    for method in ("univer", "gr"):
        assert bv.fresh_rule(method) is not bv.fresh_rule(method)


def test_bench_verify_peak_mb_sees_memory_an_earlier_call_freed():
    """``peak_mb`` read 0 MB for a call that allocates 30 MB once an earlier call had allocated and freed the same:
    glibc kept the freed heap resident, so the call raised no RSS (the README's "≤ 0.12 MB in every cell")."""
    import numpy as np
    peak_mb = _script("bench_verify").peak_mb
    big = lambda: np.ones(4_000_000).sum()          # 30.5 MB of float64, freed on return
    rises = [peak_mb(big) for _ in range(3)]
    if rises[0] is None:
        pytest.skip("no /proc/self/clear_refs here")
    assert min(rises) > 25, rises


def test_benchmark_outputs_refuse_a_folder_and_make_missing_folders(tmp_path, capsys):
    """An output naming a folder is refused before anything runs; a file in missing folders is written, the
    folders made (each was an IsADirectoryError or FileNotFoundError after the timing)."""
    _refuses("bench_engines", ["--json", str(tmp_path)], "is a folder; give a file name", capsys)
    args = _script("bench_args")
    target = tmp_path / "new" / "deeper" / "cells.json"
    args.write_text(args.output_path(str(target)), "{}")
    assert target.read_text() == "{}"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_benchmark_outputs_take_a_named_pipe_without_opening_it(tmp_path, monkeypatch):
    """A named pipe (a ``mkfifo`` FIFO another process reads) is checked for permission only: opening it
    for the check blocked forever with no reader yet, and with a reader closing it ended the reader's stream, so
    the results were then written into a pipe nobody read.  A character device likewise; a socket is opened."""
    import socket
    import threading

    args = _script("bench_args")
    fifo = tmp_path / "results.fifo"
    os.mkfifo(fifo)
    done = []
    checker = threading.Thread(target=lambda: done.append(args.output_path(str(fifo))), daemon=True)
    checker.start()
    checker.join(timeout=10)
    if not done:                                  # unblock the checker's open so the daemon thread can finish
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
    assert done == [str(fifo)], "output_path blocked on a named pipe with no reader"
    with monkeypatch.context() as patch:                  # (root passes every permission bit: the refusal forced)
        patch.setattr(args.os, "access", lambda *_: False)
        with pytest.raises(argparse.ArgumentTypeError, match="results.fifo' cannot be written: Permission denied"):
            args.output_path(str(fifo))
    sock = tmp_path / "s"                                 # a socket is opened, not checked by its bits: refused now,
    with socket.socket(socket.AF_UNIX) as server:         # not by the final write after the run
        server.bind(str(sock))
        with pytest.raises(argparse.ArgumentTypeError, match="'.*s' cannot be written: "):
            args.output_path(str(sock))
    with monkeypatch.context() as patch:                  # a character device (/dev/stdout) by its bits, not opened
        patch.setattr(args, "open", lambda *a: pytest.fail("opened a character device"), raising=False)
        assert args.output_path(os.devnull) == os.devnull
        patch.setattr(args.os, "access", lambda *_: False)
        with pytest.raises(argparse.ArgumentTypeError, match="cannot be written: Permission denied"):
            args.output_path(os.devnull)


def test_benchmark_outputs_take_an_existing_writable_file_in_a_closed_folder(tmp_path, monkeypatch):
    """A file that exists and is writable is taken even where its folder accepts no new file (the folder probe
    refused it, and ``--json /dev/null``, as a user); a new file there is still refused before the run."""
    args = _script("bench_args")
    existing = tmp_path / "out.json"
    existing.write_text("kept")

    def closed(*_, **__):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(args.tempfile, "NamedTemporaryFile", closed)              # the folder takes no new file
    assert args.output_path(str(existing)) == str(existing)
    assert existing.read_text() == "kept"                                        # checked, not truncated
    assert args.output_path(os.devnull) == os.devnull
    with pytest.raises(argparse.ArgumentTypeError, match="cannot be written: Permission denied"):
        args.output_path(str(tmp_path / "new.json"))
    for pseudo in ("/proc/version", "/proc/self/stat"):      # as root too: the write failed after the timing
        if os.path.exists(pseudo):
            with pytest.raises(argparse.ArgumentTypeError, match="cannot be written: "):
                args.output_path(pseudo)

    def read_only(*_):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(args, "open", read_only, raising=False)                    # a read-only file (as non-root)
    with pytest.raises(argparse.ArgumentTypeError, match="out.json' cannot be written: Permission denied"):
        args.output_path(str(existing))
