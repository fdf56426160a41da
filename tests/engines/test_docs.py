"""docs/engines.md's example runs and prints outputs of the engines' shapes."""
import re
from pathlib import Path


def test_engines_doc_example_runs(capsys):
    text = (Path(__file__).resolve().parents[2] / "docs" / "engines.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], "engines.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    head, path = out[0].split(" path ")
    tau, path = eval(head.removeprefix("accepted "))[0], eval(path)[0]
    assert path[0] == 0 and all(x >= 0 for x in path[:tau + 1]) and all(x == -1 for x in path[tau + 1:])
    rows = eval(out[1].removeprefix("output_token_ids "))
    assert len(rows) == 2 and all(len(r) == 3 and -1 not in r[:1] for r in rows)
