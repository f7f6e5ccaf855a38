"""Markdown tables for the benchmarks: what a script prints is what README shows, verbatim."""
from __future__ import annotations


def markdown_table(header: list[str], rows: list[list], align: list[str] | None = None) -> str:
    """`header` and `rows` (cells turned to text with `str`) as a markdown table.

    `align`: per column `"l"` (`---`) or `"r"` (`---:`); default all `---`.
    """
    rule = ["---:" if a == "r" else "---" for a in (align or ["l"] * len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def ms(value: float) -> str:
    """Milliseconds with three significant figures at most one decimal: 8.9, 27.8, 280."""
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"
