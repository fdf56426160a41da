"""The three notebooks execute top to bottom on small settings, and are committed without outputs."""
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
ROOT = NOTEBOOKS.parent


def execute(name: str, parameters: str, tmp_path: Path):
    """Run ``notebooks/<name>.ipynb`` with its first (parameter) cell replaced; returns the executed notebook."""
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    assert nb.cells[0].cell_type == "code" and nb.cells[0].source.lstrip().startswith("# Parameters")
    nb.cells[0].source = parameters
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
    assert "8 instances" in text and "UniVer below CF by" in text and "| 0.00 |" in text
    assert not re.search(r"-0\.00(?!\d)", text), "a gap that rounds to zero printed as -0.00"
    assert images(nb) == 2


def test_node_ot_notebook(tmp_path):
    nb = execute("node_ot", "FAST = True\nV, K, SEED = 5, 2, 1", tmp_path)
    text = outputs(nb)
    assert "iid: OT gain over TV's rule is largest" in text and "wor: OT gain" in text
    assert images(nb) == 1


@pytest.mark.llm
def test_real_trees_notebook(tmp_path):
    from univer.cli import main

    out = tmp_path / "bench"
    assert main(["accept-bench", "--fast", "--methods", "rrsw,tv,univer", "--out", str(out)]) == 0
    nb = execute("real_trees", f"BENCH_JSON = {str(out / 'accept_bench.json')!r}", tmp_path)
    text = outputs(nb)
    assert "baseline rrsw" in text and "['tv', 'univer']" in text
    assert images(nb) == 1
