"""The ``univer`` command line.  Each subcommand lives in ``univer/commands/<name>.py`` and exposes
``add_parser(subparsers)`` which registers itself with ``set_defaults(func=run)``.

JSON output names (methods ``nss, sps, rrs, rrsw, kseq, bv, tv, univer, …``; keys ``expected_accepted``,
``distance``, ``lossless``) are the toolkit's public contract.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path

from .extras import EXTRA_OF, install_hint

#: Subcommand modules under ``univer.commands``, in help order.  They import only the exact core at module level
#: (solvers, torch, transformers inside ``run``), so a bad argument is reported before any heavy import.
COMMANDS = ("exact", "bound", "decode", "speed", "accept_bench", "check")


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
    """Import ``spec`` once: a path to a ``.py`` file (as the module ``univer_plugin_<stem>_<hash>``, the hash of its
    resolved path: it shadows no other module, the same file given twice is imported once and two files of one name
    in two folders are two plugins) or an importable module name.  A file or module that is missing, or whose
    import raises, is a ValueError naming it and the error."""
    path = Path(spec)
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    name = f"univer_plugin_{path.stem}_{digest}" if spec.endswith(".py") else spec
    if spec.endswith(".py") and not path.is_file():
        raise ValueError(f"--plugin {spec}: no such file")
    if name in sys.modules:                                  # the same plugin twice: imported once
        return
    try:
        if spec.endswith(".py"):
            module_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module                       # dataclasses of the plugin look their module up
            module_spec.loader.exec_module(module)
        else:
            importlib.import_module(spec)
    except Exception as err:
        sys.modules.pop(name, None)
        if isinstance(err, ModuleNotFoundError) and (err.name == spec or spec.startswith(f"{err.name}.")):
            raise ValueError(f"--plugin {spec}: no module named {err.name!r} (pass a .py path or put its folder on "
                             f"PYTHONPATH)") from err
        raise ValueError(f"--plugin {spec}: importing it raised {type(err).__name__}: {err}") from err


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        for plugin in args.plugin:
            load_plugin(plugin)
    except ValueError as err:
        print(f"univer: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return _interrupted("univer")
    try:
        return int(args.func(args) or 0)
    except NotImplementedError as err:   # (before ValueError: validation.Unsupported is both)
        print(f"univer {args.command}: error: unsupported method/shape/process combination: {err}", file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"univer {args.command}: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:    # an extra the command needs is not installed
        package = (err.name or "").split(".")[0]
        if package not in EXTRA_OF:
            raise
        print(f"univer {args.command}: error: needs {package}, not installed: {install_hint([package])}",
              file=sys.stderr)
        return 2
    except RuntimeError as err:  # a solver that failed after its re-solves; commands with several results
        print(f"univer {args.command}: failed: {err}", file=sys.stderr)  # report it per result instead
        return 1
    except BrokenPipeError:  # the reader went away (`univer exact --json | head`): stop quietly, as `cat` does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at interpreter exit
        return 141
    except OSError as err:   # a folder or file the run could not write (--out under /proc, a full disk)
        print(f"univer {args.command}: failed: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return _interrupted(f"univer {args.command}")


def _interrupted(who: str) -> int:
    """Ctrl-C: one line, and the shell's status for SIGINT (files written so far are kept)."""
    print(f"\n{who}: interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
    sys.exit(main())
