"""Markdown tables for benchmark output (pasted into the README as is)."""

from __future__ import annotations

from collections.abc import Sequence


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Render rows as a GitHub-flavoured markdown table with aligned columns."""
    cells = [[str(header) for header in headers], *[[_format(value) for value in row] for row in rows]]
    widths = [max(len(row[column]) for row in cells) for column in range(len(headers))]
    lines = [
        "| " + " | ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)) + " |" for row in cells
    ]
    lines.insert(1, "|" + "|".join("-" * (width + 2) for width in widths) + "|")
    return "\n".join(lines)


def _format(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) >= 1 else f"{value:.3f}"
    return str(value)
