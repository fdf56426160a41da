"""Each layer imports only what it needs (the extras' promise, checked in this interpreter by hiding packages;
``tests/test_extras.py`` installs each extra into a fresh venv): the CLI parses its arguments before any heavy
import, ``gpu`` needs neither cvxpy nor highspy, and the exact core — UniVer's LP plans included — needs neither
torch nor cvxpy nor highspy (its node LPs run on the compiled simplex; scipy's bundled HiGHS serves the solvers')."""
import json
import subprocess
import sys
import textwrap

import numpy as np

HEAVY = ("torch", "cvxpy", "highspy", "transformers", "solvers", "gpu")


def run_python(code: str, hide=()) -> dict:
    """Run ``code`` in a fresh interpreter with ``hide`` made unimportable; it prints one JSON object."""
    prelude = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in hide)
    out = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_cli_reports_bad_arguments_before_heavy_imports():
    out = run_python("""
        import contextlib, io, json, sys
        from univer.cli import main
        codes = []
        with contextlib.redirect_stderr(io.StringIO()) as err:
            for argv in (["exact", "--shape", "(,,.)"], ["bound", "--shape", "2,x"],
                         ["exact", "--methods", "bv", "--shape", "2,2"]):
                codes.append(main(argv))
        heavy = sorted({m.split(".")[0] for m in sys.modules} & set(%r))
        print(json.dumps({"codes": codes, "heavy": heavy, "err": err.getvalue()}))
    """ % (HEAVY,))
    assert out["codes"] == [2, 2, 2] and out["heavy"] == [], out
    assert "comma at position 1" in out["err"] and "cannot read shape '2,x'" in out["err"]
    assert "unsupported method/shape/process combination" in out["err"]


def test_gpu_needs_neither_cvxpy_nor_highspy():
    out = run_python("""
        import json, torch
        import gpu
        from univer_theory import DirichletModel, DraftTree
        model = DirichletModel(4, seed=1)
        tree = DraftTree((-1, 0, 0, 1, 1), (-1, 0, 1, 2, 3))
        p, q = (torch.tensor(x)[None] for x in model.node_probs(tree))
        batch = gpu.TreeBatch.from_trees([tree])
        values = [float(gpu.expected_accepted_length(batch, p, q, proc, m)[0])
                  for proc in ("iid", "wor") for m in ("tv", "univer")]
        print(json.dumps({"values": values}))
    """, hide=("cvxpy", "highspy", "transformers"))
    assert len(out["values"]) == 4 and all(0 < v <= 2 for v in out["values"])


def test_exact_core_needs_no_extra():
    out = run_python("""
        import json
        from univer_theory import VERIFIERS, DirichletModel, evaluate
        model = DirichletModel(4, seed=2, similarity=0.5)
        rows = {f"{shape} {proc}": evaluate(model, shape, proc, VERIFIERS["univer"]).as_json()
                for shape in ("2,2", "3", "((..),.)") for proc in ("iid", "wor")}
        import solvers
        from solvers.highs_lp import bindings
        lp_calls = bindings.cache_info().hits + bindings.cache_info().misses
        highs = bindings()[1].__module__
        p, q = model.target(()), model.draft(())
        closed = [float(solvers.solve_flat(p, q, 2, "wor", method=m).value) for m in ("fast", "mincut", "lp")]
        try:
            solvers.solve_flat(p, q, 2, "wor", method="cvxpy")
            flat = "solved"
        except ImportError as err:
            flat = str(err)
        print(json.dumps({"rows": rows, "flat": flat, "closed": closed, "lp_calls": lp_calls, "highs": highs}))
    """, hide=("torch", "cvxpy", "highspy"))
    assert all(r["lossless"] for r in out["rows"].values()), out["rows"]
    # UniVer's node LPs (rule 1, the shape and slot rules) ran on the lexicographic simplex (torch hidden), not HiGHS
    assert any("lp" in r["plans"] or "shape_lp" in r["plans"] for r in out["rows"].values()), out["rows"]
    assert out["lp_calls"] == 0, out
    assert out["highs"].startswith("scipy.optimize"), out      # HiGHS, the oracle, comes from scipy without highspy
    assert "needs cvxpy: pip install 'univer[solvers]'" in out["flat"]
    assert np.ptp(out["closed"]) <= 1e-9, out       # α* without cvxpy: closed form, min-cut, LP (NaN wherever it comes)


def test_a_missing_extra_is_one_line_naming_it():
    """A command whose extra is not installed ended in a traceback deep inside (``decode.py``: No module named
    'torch'); now one line naming the extra's pip command, exit status 2."""
    out = run_python("""
        import contextlib, io, json
        from univer.cli import main
        with contextlib.redirect_stderr(io.StringIO()) as err:
            code = main(["decode", "--prompt", "hi", "--max-new-tokens", "2"])
        print(json.dumps({"code": code, "err": err.getvalue()}))
    """, hide=("torch",))
    assert out["code"] == 2 and out["err"] == ("univer decode: error: needs torch, not installed: "
                                               "pip install 'univer[gpu]'\n"), out


def test_every_public_name_is_there():
    """Each package's ``__all__`` names what it imports (``gpu.llm`` listed ``eagle_like_shape`` after it moved)."""
    import importlib

    for package in ("univer_theory", "solvers", "gpu", "gpu.llm", "paper_checks"):
        module = importlib.import_module(package)
        missing = [name for name in getattr(module, "__all__", ()) if not hasattr(module, name)]
        assert not missing, (package, missing)
