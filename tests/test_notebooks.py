"""The three notebooks execute top to bottom on small settings, and are committed without outputs.

The notebooks assert their own claims (orderings against the bounds, per instance); the tests below read the
printed results and show that an injected violation stops the notebook."""
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
ROOT = NOTEBOOKS.parent


def execute(name: str, parameters: str, tmp_path: Path, replace: tuple[str, str] | None = None):
    """Run ``notebooks/<name>.ipynb`` with its first (parameter) cell replaced (and, with ``replace = (old, new)``,
    the one code cell holding ``old`` edited); returns the executed notebook."""
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    assert nb.cells[0].cell_type == "code" and nb.cells[0].source.lstrip().startswith("# Parameters")
    nb.cells[0].source = parameters
    if replace is not None:
        hits = [c for c in nb.cells if c.cell_type == "code" and replace[0] in c.source]
        assert len(hits) == 1, f"{name}: {replace[0]!r} in {len(hits)} code cells"
        hits[0].source = hits[0].source.replace(*replace)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    nbformat.write(nb, tmp_path / f"{name}.ipynb")
    return nb


def outputs(nb) -> str:
    """The text, plain-text and markdown outputs of the notebook's code cells, joined."""
    return "\n".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                     + str(o.get("data", {}).get("text/markdown", ""))
                     for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def images(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


@pytest.mark.parametrize("name", ["optimality_gap", "node_ot", "real_trees"])
def test_notebook_is_committed_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{name}: outputs not stripped"


def test_optimality_gap_notebook(tmp_path):
    nb = execute("optimality_gap", "FAST = True", tmp_path)
    text = outputs(nb)
    assert "24 instances; no method above the global bound, no UniVer variant above CF" in text
    assert re.search(r"UniVer below CF: \d+\.\d+% on average, worst \d+\.\d+% \(\w+/V3/", text)
    assert re.search(r"CF below the global bound: \d+\.\d+% on average, worst", text)
    assert not re.search(r"-0\.00(?!\d)", text), "a gap that rounds to zero printed as -0.00"
    assert images(nb) == 2


def test_optimality_gap_notebook_stops_on_univer_above_cf(tmp_path):
    """UniVer 1e-6 above CF wherever that stays below the global bound: the notebook's CF check refuses it."""
    lift = ('if r["global"] - r["cf"] > 2e-6:\n        r["univer"] = r["cf"] + 1e-6\n    r["baseline"] = r["rrs"]')
    with pytest.raises(CellExecutionError, match=r": univer above CF"):
        execute("optimality_gap", "FAST = True", tmp_path, ('r["baseline"] = r["rrs"]', lift))


def test_node_ot_notebook(tmp_path):
    nb = execute("node_ot", "FAST = True\nV, K, SEED = 5, 2, 1", tmp_path)
    text = outputs(nb)
    assert "iid: OT gain over TV's rule largest at" in text and "wor: OT gain" in text
    assert "144 node instances; every ordering held" in text
    assert re.search(r"OT gain α\*\(ρ\) − α_TV\(ρ\): never below -?\d", text)
    assert re.search(r"the gain peaks strictly inside \(ρ < 1\) on \d+ of 144", text)
    assert images(nb) == 1


def test_node_ot_notebook_stops_on_a_rule_above_alpha_star(tmp_path):
    """α*(ρ) lowered by 1%: TV's rule (a feasible plan) lies above it, and the notebook's first check stops it."""
    with pytest.raises(CellExecutionError, match="TV scaled rule above"):
        execute("node_ot", "FAST = True\nV, K, SEED = 5, 2, 1", tmp_path,
                ("for rho in RHOS])\n    tv =", "for rho in RHOS]) * 0.99\n    tv ="))


@pytest.mark.llm
def test_real_trees_notebook(tmp_path):
    from univer.cli import main

    out = tmp_path / "bench"
    assert main(["accept-bench", "--fast", "--methods", "rrsw,tv,univer", "--out", str(out)]) == 0
    nb = execute("real_trees", f"BENCH_JSON = {str(out / 'accept_bench.json')!r}", tmp_path)
    text = outputs(nb)
    assert "baseline rrsw" in text and "['tv', 'univer']" in text
    assert "| gain per forward % | 95% CI |" in text and "| gain on E[τ] % | 95% CI |" in text
    assert "– (n = 1)" in text                   # the fast run's categories hold one prompt each: no interval
    assert images(nb) == 1
