"""Runs the checks in order and writes ``paper_checks.md``."""
from __future__ import annotations

import importlib
import inspect
import time
from pathlib import Path

from .base import CheckResult

#: Check modules in claim order (theory / issue numbering).
CHECKS = ("lossless", "optimality", "reductions", "global_gap", "real_gain", "temperature")


def run_checks(names=None, fast: bool = False, out_dir: str | Path = "results", progress: bool = True,
               real_model: bool = True) -> list[CheckResult]:
    """Run the named checks (all by default; one name or a list), write ``out_dir/paper_checks.md``, return the results.

    ``real_model=False`` skips the checks that load SmolLM2 and says so in the report (never silently).
    """
    names = list(CHECKS if names is None else [names] if isinstance(names, str) else names)   # one name or many
    unknown = [n for n in names if n not in CHECKS]
    if unknown or not names:
        raise ValueError(f"run_checks: unknown check(s) {unknown or names}; choose from {list(CHECKS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results, lines = [], ["# Paper checks", "", f"Mode: {'fast' if fast else 'full'}.", ""]
    for name in names:
        module = importlib.import_module(f"paper_checks.{name}")
        kwargs = {}
        if getattr(module, "NEEDS_REAL_MODEL", False) and not real_model:
            if "real_model" not in inspect.signature(module.run).parameters:
                lines += [f"## {name} — NOT RUN", "", "Skipped by request (--no-real-model); the claim is undecided.", ""]
                continue
            kwargs["real_model"] = False   # the check has a part without the model; it says what it left out
        t0 = time.perf_counter()
        res = module.run(fast=fast, out_dir=out_dir, progress=progress, **kwargs)
        results.append(res)
        lines += [res.as_markdown(), f"*Runtime: {time.perf_counter() - t0:.1f} s.*", ""]
    lines[3:3] = ["| check | status | headline |", "|---|---|---|"] + [
        f"| {r.name} | {'PASS' if r.passed else 'FAIL'} | {r.summary} |" for r in results] + [""]
    (out_dir / "paper_checks.md").write_text("\n".join(lines))
    return results
