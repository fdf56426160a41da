"""The README's Python example runs and prints what it claims."""
import re
from pathlib import Path


BLOCKS = re.findall(r"```python\n(.*?)```", (Path(__file__).resolve().parents[1] / "README.md").read_text(), flags=re.S)


def test_readme_python_example_runs(capsys):
    assert len(BLOCKS) == 2
    exec(compile(BLOCKS[0], "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert out.count("lossless: True") == 3 and "global bound" in out


def test_readme_new_verifier_is_refuted_exactly_where_it_is_lossy(capsys):
    """'Adding a verifier': the naive rule is token-level speculative sampling on a chain (lossless) and lossy with
    two i.i.d. children (its residual ignores the first child's rejection)."""
    exec(compile(BLOCKS[1], "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["1,1:", "2:"]
    assert lines[0].endswith("lossless: True") and lines[1].endswith("lossless: False"), lines
