"""What every paper check returns, and how results are written.

A check turns one claim into a computation on stated instances: it returns a :class:`CheckResult` with a
markdown table, the figures it saved, and ``passed`` — False when the claim does not hold there.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from univer_theory.tolerance import worst_of


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one claim check.

    Attributes
    ----------
    name : short id (module name).
    claim : the claim in one sentence, as the paper / theory states it.
    passed : whether it holds on every stated instance.
    table : markdown table of the evidence.
    summary : one line with the headline number(s).
    figures : paths of saved PNG figures.
    """

    name: str
    claim: str
    passed: bool
    table: str
    summary: str
    figures: tuple[Path, ...] = field(default_factory=tuple)

    def as_markdown(self) -> str:
        status = "PASS" if self.passed else "FAIL"
        figs = "".join(f"\n![{p.stem}]({p.name})\n" for p in self.figures)
        return f"## {self.name} — {status}\n\n*Claim:* {self.claim}\n\n{self.summary}\n\n{self.table}\n{figs}"


def percent(x: float, signed: bool = False) -> str:
    """``100·x`` with two decimals (and its sign when ``signed``); a value that rounds to zero prints ``0.00`` /
    ``+0.00``, never ``-0.00`` (a round-off negative gap is refused or reported by the check that computed it, not
    by its printed sign)."""
    text = f"{100 * x:+.2f}" if signed else f"{100 * x:.2f}"
    return text.replace("-", "+" if signed else "") if text == "-0.00" else text


def law_distance(a: dict, b: dict) -> float:
    """``max_k |a(k) − b(k)|`` of two laws given as ``{outcome: probability}`` (floats, Fractions), NaN if an entry
    is NaN wherever it comes (:func:`worst_of`)."""
    return worst_of(*(abs(float(a.get(k, 0)) - float(b.get(k, 0))) for k in a.keys() | b.keys()))


def markdown_table(header: list[str], rows: list[list]) -> str:
    """A GitHub-flavoured markdown table; floats are printed with 4 significant decimals, a ``|`` in a cell (``max
    |α − α*|``) escaped (it split the cell: a header of more cells than its delimiter row is no table)."""
    def fmt(x):
        if isinstance(x, float):
            return f"{x:.4g}" if abs(x) < 1e-3 and x != 0 else f"{x:.4f}"
        return cell(x)
    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def cell(x) -> str:
    """``x`` as the text of one markdown table cell: each ``|`` escaped that is not already (``\\|`` escaped again
    was an escaped backslash and a bare ``|``, which split the cell)."""
    return re.sub(r"(?<!\\)\|", r"\\|", str(x))


def save_figure(fig, out_dir: Path, name: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path
