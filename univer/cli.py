"""The ``univer`` command line.  Each subcommand lives in ``univer/commands/<name>.py`` and exposes
``add_parser(subparsers)`` which registers itself with ``set_defaults(func=run)``.

JSON output names (methods ``nss, sps, rrs, rrsw, kseq, bv, tv, univer, …``; keys ``expected_accepted``,
``distance``, ``lossless``) are the toolkit's public contract.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path

#: Subcommand modules under ``univer.commands``, in help order.  They import only the exact core at module level
#: (solvers, torch, transformers inside ``run``), so a bad argument is reported before any heavy import.
COMMANDS = ("exact", "bound", "decode", "speed", "accept_bench", "check")
#: The extras that install each optional package a command imports (a missing one is one line naming the extra).
EXTRA_OF = {"torch": "gpu", "cvxpy": "solvers", "highspy": "solvers", **{m: "gpu,llm" for m in (
    "transformers", "gguf", "accelerate", "safetensors", "matplotlib")}}


class _Parser(argparse.ArgumentParser):
    """argparse's own errors (a missing or unknown argument, a bad choice) as one line on stderr and exit status
    2, like the commands' own (argparse prints its usage block first); subcommands' parsers are of this class
    too (``add_subparsers`` makes them with the parent's class)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} -h')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="univer", description="Lossless verification for speculative decoding.")
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE_OR_MODULE",
                        help="import a .py file or a module first (repeatable); a plugin that calls "
                             "univer_theory.register(Verifier(...)) adds its verifier to --methods "
                             "(README, 'Adding a verifier')")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"univer.commands.{name}")
        except ModuleNotFoundError as err:
            if err.name and err.name.startswith("univer.commands"):
                continue  # command not shipped in this build
            raise
        module.add_parser(sub)
    return parser


def load_plugin(spec: str) -> None:
    """Import ``spec``: a path to a ``.py`` file (run as a module of its stem's name) or an importable module name.
    A file that does not exist or a module that cannot be imported is a ValueError naming it."""
    if spec.endswith(".py"):
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"--plugin {spec}: no such file")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[path.stem] = module
        module_spec.loader.exec_module(module)
        return
    try:
        importlib.import_module(spec)
    except ModuleNotFoundError as err:
        if err.name and spec.startswith(err.name):
            raise ValueError(f"--plugin {spec}: no module named {err.name!r} (pass a .py path or put its folder on "
                             f"PYTHONPATH)") from err
        raise


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        for plugin in args.plugin:
            load_plugin(plugin)
    except ValueError as err:
        print(f"univer: error: {err}", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except ValueError as err:
        print(f"univer {args.command}: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:    # an extra the command needs is not installed
        extra = EXTRA_OF.get((err.name or "").split(".")[0])
        if extra is None:
            raise
        print(f"univer {args.command}: error: needs {err.name}, not installed: pip install 'univer[{extra}]'",
              file=sys.stderr)
        return 2
    except NotImplementedError as err:
        print(f"univer {args.command}: error: unsupported method/shape/process combination: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:  # a solver that failed after its re-solves; commands with several results
        print(f"univer {args.command}: failed: {err}", file=sys.stderr)  # report it per result instead
        return 1
    except BrokenPipeError:  # the reader went away (`univer exact --json | head`): stop quietly, as `cat` does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at interpreter exit
        return 141


if __name__ == "__main__":
    sys.exit(main())
