"""Argument checks the benchmark scripts share: one-line argparse errors (exit 2) before anything is timed."""
from __future__ import annotations

import argparse
import os
import stat
import tempfile
from pathlib import Path


def at_least(ap, checks) -> None:
    """``ap.error`` naming the first ``(flag, value, least)`` of ``checks`` whose value is below ``least``."""
    for flag, value, least in checks:
        if value < least:
            ap.error(f"{flag} must be ≥ {least}, got {value}")


def known(ap, flag: str, text: str, allowed) -> None:
    """``ap.error`` unless every item of the comma-separated ``text`` is one of ``allowed`` (an empty item is not)."""
    bad = [x for x in text.split(",") if x not in allowed]
    if bad:
        ap.error(f"{flag}: unknown {bad}; choose from {', '.join(allowed)}")


def output_path(text: str) -> str:
    """argparse type: a file the script writes when it is done (its missing folders made then), checked before
    anything runs: not a folder; an existing regular file (or socket, block device) opened for appending, nothing
    written (permission bits alone pass every file for root, and a /proc file then failed the write), an existing
    pipe or character device (``/dev/stdout``) checked for write permission only (opening a pipe blocks without a
    reader, and closing it ends the reader's stream before the results come); else no part of its folder a file,
    and a file can be created in the nearest folder that exists (a probe file, removed at once) — each was a
    FileNotFoundError, FileExistsError or PermissionError after the timing (a new ``--out`` under /proc passes
    every check but the probe)."""
    path = Path(text)
    try:
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file name")
        if path.exists():           # rewritten in place: its folder may refuse new files (the probe) yet not this one
            mode = path.stat().st_mode
            if not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):       # a file (or a socket: refused by the open)
                with open(path, "a"):
                    pass
            elif not os.access(path, os.W_OK):
                raise PermissionError(13, "Permission denied")
            return text
        existing = next(parent for parent in path.absolute().parents if parent.exists())
        if not existing.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r}: {existing} is a file, not a folder")
        with tempfile.NamedTemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise argparse.ArgumentTypeError(f"{text!r} cannot be written: {err.strerror or err}") from None
    return text


def device_arg(ap, text: str):
    """``--device`` as a torch device this build and machine can compute on, else ``ap.error`` naming why
    (:func:`gpu.llm.models.check_device`: ``meta`` or a backend torch lacks failed mid-run)."""
    from gpu.llm.models import check_device

    try:
        return check_device(text, "--device")
    except ValueError as err:
        ap.error(str(err))


def seed_below(ap, value: int, bound: int, why: str) -> None:
    """``ap.error`` unless the seed ``value`` lies in ``[0, bound)`` (``why``: whose limit ``bound`` is)."""
    if not 0 <= value < bound:
        ap.error(f"--seed must lie in [0, {bound}) ({why}), got {value}")


def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` (an :func:`output_path`), making its folders."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)


def image_path(text: str) -> str:
    """argparse type: a file name matplotlib writes an image to (a format it knows by the suffix; an
    :func:`output_path`), checked before anything runs."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise argparse.ArgumentTypeError("drawing needs matplotlib (the dev extra)") from None
    formats = FigureCanvasBase.get_supported_filetypes()
    if Path(text).is_dir() or Path(text).suffix[1:].lower() not in formats:
        raise argparse.ArgumentTypeError(f"{text!r} is not an image file name; end it in one of "
                                         f"{', '.join('.' + f for f in formats)}")
    return output_path(text)
