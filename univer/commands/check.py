"""``univer check``: run every paper check, write results/paper_checks.md, exit 1 if a claim fails or none was
checked (``--only`` naming only checks that ``--no-real-model`` skips)."""
from __future__ import annotations

from paper_checks import CHECKS, run_checks

from .common import output_folder


def add_parser(sub) -> None:
    p = sub.add_parser("check", help="run the paper checks (one per claim); non-zero exit if any claim fails, or "
                                    "if none was checked")
    p.add_argument("--fast", action="store_true", help="CI-sized grids (minutes instead of the full run)")
    p.add_argument("--only", help=f"comma-separated subset of {', '.join(CHECKS)}")
    p.add_argument("--out", default="results", help="output folder (default results/)")
    p.add_argument("--no-real-model", action="store_true", help="skip the checks that load SmolLM2 (reported as NOT RUN)")
    p.set_defaults(func=run)


def run(args) -> int:
    names = None
    if args.only is not None:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in CHECKS]
        if not names or unknown:
            raise ValueError(f"--only {args.only!r}: unknown check(s) {unknown or [args.only]}; "
                             f"choose from {', '.join(CHECKS)}")
    results = run_checks(names, fast=args.fast, out_dir=output_folder(args.out), real_model=not args.no_real_model)
    for r in results:
        print(f"{'PASS' if r.passed else 'FAIL'}  {r.name:<12} {r.summary}")
    ran = {r.name for r in results}
    for name in (n for n in (names or CHECKS) if n not in ran):   # skipped by --no-real-model: undecided
        print(f"NOT RUN  {name:<12} skipped (--no-real-model); the claim is undecided")
    print(f"report: {args.out}/paper_checks.md")
    return 0 if results and all(r.passed for r in results) else 1
