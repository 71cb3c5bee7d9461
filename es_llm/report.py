"""The one report writer: every report of the project (``es-llm compare``, ``es-llm testtime``,
``es-llm latent-revise``, the scaling study) is a list of blocks rendered twice, to
``report.md`` and ``report.html``, so the two pages always say the same thing; the number
formats the reports share, each written once; and the figure saver.

A block is a frozen dataclass that renders itself: ``Heading``, ``Paragraph``, ``Table``,
``Figure`` (a PNG under the report's ``figures/``) and ``Bullets``. Text may hold ``**bold**``,
kept as bold in HTML. A page's title is its first level-1 heading.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, Union

from es_llm.io import write_text_atomic


def _inline(text: str) -> str:
    """HTML of a cell or paragraph: escaped, with **bold** kept."""
    parts = html.escape(text).split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))


@dataclass(frozen=True)
class Heading:
    level: int
    text: str

    def markdown(self) -> list[str]:
        return ["#" * self.level + " " + self.text, ""]

    def html(self) -> str:
        return f"<h{self.level}>{html.escape(self.text)}</h{self.level}>"


@dataclass(frozen=True)
class Paragraph:
    text: str

    def markdown(self) -> list[str]:
        return [self.text, ""]

    def html(self) -> str:
        return f"<p>{_inline(self.text)}</p>"


@dataclass(frozen=True)
class Table:
    header: Sequence[str]
    rows: Sequence[Sequence[str]]
    # One letter per column, "l" or "r" (right-aligned, e.g. counts); "" = all left.
    align: str = ""

    def _right(self, i: int) -> bool:
        return self.align[i:i + 1] == "r"

    def markdown(self) -> list[str]:
        cell = lambda c: c.replace("|", "\\|")  # noqa: E731 (a "|" would end the cell)
        rule = "".join("---:|" if self._right(i) else "---|" for i in range(len(self.header)))
        return (["| " + " | ".join(map(cell, self.header)) + " |", "|" + rule]
                + ["| " + " | ".join(map(cell, row)) + " |" for row in self.rows] + [""])

    def html(self) -> str:
        style = lambda i: ' style="text-align:right"' if self._right(i) else ""  # noqa: E731
        head = "".join(f"<th{style(i)}>{html.escape(c)}</th>" for i, c in enumerate(self.header))
        rows = "".join("<tr>" + "".join(f"<td{style(i)}>{_inline(c)}</td>"
                                        for i, c in enumerate(row)) + "</tr>"
                       for row in self.rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


@dataclass(frozen=True)
class Figure:
    # The PNG's name under the report's figures/ folder.
    file: str
    caption: str

    def markdown(self) -> list[str]:
        return [f"![{self.caption}](figures/{self.file})", "", f"*{self.caption}*", ""]

    def html(self) -> str:
        return (f'<figure><img src="figures/{html.escape(self.file)}" '
                f'alt="{html.escape(self.caption)}"><figcaption>{_inline(self.caption)}'
                f"</figcaption></figure>")


@dataclass(frozen=True)
class Bullets:
    items: Sequence[str]

    def markdown(self) -> list[str]:
        return [f"- {item}" for item in self.items] + [""] if self.items else []

    def html(self) -> str:
        if not self.items:
            return ""
        return "<ul>" + "".join(f"<li>{_inline(item)}</li>" for item in self.items) + "</ul>"


Block = Union[Heading, Paragraph, Table, Figure, Bullets]

STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
         "table{border-collapse:collapse;margin:1em 0;font-size:14px}"
         "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}th{background:#f3f3f3}"
         "img{max-width:100%;border:1px solid #eee}figcaption{font-size:13px;color:#555}")


def to_markdown(blocks: Sequence[Block]) -> str:
    return "\n".join(line for block in blocks for line in block.markdown())


def to_html(blocks: Sequence[Block]) -> str:
    title = next((b.text for b in blocks if isinstance(b, Heading) and b.level == 1), "report")
    body = "\n".join(part for part in (block.html() for block in blocks) if part)
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}"
            f"</title><style>{STYLE}</style></head>\n<body>\n{body}\n</body></html>\n")


def write_report(folder: Path, blocks: Sequence[Block]) -> str:
    """``report.md`` and ``report.html`` in ``folder``; returns the Markdown."""
    text = to_markdown(blocks)
    write_text_atomic(folder / "report.md", text)
    write_text_atomic(folder / "report.html", to_html(blocks))
    return text


# --- number formats: "-" stands for a missing value in every one ---------------------------

def pct(x: float | None) -> str:
    """A share as a percentage: 0.1234 -> '12.3%'."""
    return "-" if x is None else f"{100 * x:.1f}%"


def in_points(x: float) -> str:
    """A share in percentage points, no sign or unit: 0.1234 -> '12.3' (inside intervals
    whose unit is written once after them)."""
    return f"{100 * x:.1f}"


def signed_points(x: float | None) -> str:
    """A change of a share: 0.012 -> '+1.2 pts'."""
    return "-" if x is None else f"{100 * x:+.1f} pts"


def number(x: float | None, digits: int = 3) -> str:
    """``digits`` decimals, or ``digits`` significant digits from 100 up: 0.12345 -> '0.123',
    1234.5 -> '1.23e+03'."""
    return "-" if x is None else f"{x:.{digits}g}" if abs(x) >= 100 else f"{x:.{digits}f}"


def fixed(x: float | None, digits: int) -> str:
    """Exactly ``digits`` decimals: (0.12345, 2) -> '0.12'."""
    return "-" if x is None else f"{x:.{digits}f}"


def signed(x: float | None, digits: int, scale: float = 1.0) -> str:
    """``scale * x`` with its sign and ``digits`` decimals: (0.012, 1, 100) -> '+1.2'."""
    return "-" if x is None else f"{scale * x:+.{digits}f}"


def count(x: float | None) -> str:
    """A count, or a mean of counts over seeds (one decimal then): 3.0 -> '3', 2.5 -> '2.5'."""
    return "-" if x is None else f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def share(part: int, total: int) -> str:
    """A count with its share of ``total``: (3, 12) -> '3 (25.0%)'."""
    return f"{part} ({pct(part / total)})" if total else "-"


def interval(value: float | None, ci: Sequence[float] | None,
             fmt: Callable[[float], str]) -> str:
    """A value and its interval in one format: (0.5, [0.3, 0.7], pct) -> '50.0% [30.0%,
    70.0%]'; the value alone when there is no interval."""
    if value is None:
        return "-"
    return fmt(value) + ("" if not ci or None in ci else f" [{fmt(ci[0])}, {fmt(ci[1])}]")


def bracket(ci: Sequence[float] | None, fmt: Callable[[float], str]) -> str:
    """An interval alone, for a table column of its own: ([-0.01, 0.02], f) -> '[f(-0.01),
    f(0.02)]'."""
    return "-" if ci is None else f"[{fmt(ci[0])}, {fmt(ci[1])}]"


def difference(diff: float, ci: Sequence[float], fmt: Callable[[float], str]) -> str:
    """A paired difference a - b with its interval, the sign on the difference only: (0.05,
    [-0.01, 0.1], in_points) -> '+5.0 [-1.0, 10.0]'."""
    return f"{'+' if diff >= 0 else ''}{fmt(diff)} [{fmt(ci[0])}, {fmt(ci[1])}]"


# --- figures ---------------------------------------------------------------------------------

def pyplot():
    """matplotlib's pyplot on the Agg backend: reports write files, never open a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def colors(names: Sequence[str]) -> dict[str, str]:
    """One colour of matplotlib's default cycle per name, in order."""
    cycle = pyplot().rcParams["axes.prop_cycle"].by_key()["color"]
    return {name: cycle[i % len(cycle)] for i, name in enumerate(names)}


def save_figure(fig, path: Path) -> str:
    """Lay out, write and close ``fig`` as a PNG at ``path``; returns the file's name. The PNG
    carries no metadata (matplotlib writes its version as "Software"), so the same figure
    gives the same bytes on any matplotlib."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    pyplot().close(fig)
    return path.name
