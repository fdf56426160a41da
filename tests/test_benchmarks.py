"""Every benchmark script runs end to end on tiny sizes (they print ratios; nothing here is timed)."""
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
