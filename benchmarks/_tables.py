"""Markdown tables for benchmark output (pasted into the docs as is)."""

from __future__ import annotations

from collections.abc import Sequence


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str = "") -> str:
    """Render rows as a GitHub-flavoured markdown table with aligned columns.

    `align` has a letter per column, `l` or `r` (right-aligned: numbers); left where it says nothing.

    Example:
        ```python
        print(markdown_table(["way", "records/s"], [["ours", 1234.5]], align="lr"))
        ```
    """
    if set(align) - {"l", "r"} or len(align) > len(headers):
        raise ValueError(f"align {align!r}: one 'l' or 'r' per column, at most {len(headers)}")
    right = [index < len(align) and align[index] == "r" for index in range(len(headers))]
    cells = [[str(header) for header in headers], *[[_format(value) for value in row] for row in rows]]
    widths = [max(len(row[column]) for row in cells) for column in range(len(headers))]
    lines = [
        "| "
        + " | ".join(
            value.rjust(width) if flush else value.ljust(width)
            for value, width, flush in zip(row, widths, right, strict=True)
        )
        + " |"
        for row in cells
    ]
    rule = [
        ("-" * (width + 1) + ":") if flush else "-" * (width + 2) for width, flush in zip(widths, right, strict=True)
    ]
    lines.insert(1, "|" + "|".join(rule) + "|")
    return "\n".join(lines)


def _format(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) >= 1 else f"{value:.3f}"
    return str(value)
