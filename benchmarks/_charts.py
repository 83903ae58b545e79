"""Benchmark charts: the JSON a benchmark page's chart is drawn from, and a small hand-written SVG bar chart.

Each benchmark page in `docs/benchmarks/` shows one chart, `docs/benchmarks/charts/<bench>.svg`,
drawn from `docs/benchmarks/data/<bench>.json`:

    {"title": "...", "unit": "...", "note": "...", "digits": 2, "rows": [["label", 1.0], ...]}

(or, for a sweep, `panels` of lines instead of `rows`: `_line_charts.py`).

A benchmark run with `--chart-data PATH` writes that JSON from its own results
(`add_chart_flag`, `write_chart_data`); `benchmarks/render_charts.py` draws every SVG from the
JSON files (`render_svg`, or `_line_charts.render_line_svg`, which draws with this module's parts).
The SVG is deterministic: the same data gives the same bytes.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from xml.sax.saxutils import escape, quoteattr

FONT = "ui-monospace, SFMono-Regular, Menlo, Consolas, 'DejaVu Sans Mono', monospace"
CHAR_WIDTH = 0.62
"""A monospace character's advance, in font sizes (0.6 in most monospace fonts; a little over, to be safe)."""
LABEL_SIZE = 13
TITLE_SIZE = 15
NOTE_SIZE = 12
ROW_HEIGHT = 28
BAR_HEIGHT = 18
PADDING = 16
GAP = 10
BAR_AREA = 380
MIN_WIDTH = 640
BAR_COLOR = "#3f6ec6"
TEXT_COLOR = "#1f2328"
MUTED_COLOR = "#57606a"
AXIS_COLOR = "#8c959f"


@dataclass(frozen=True)
class ChartData:
    """One bar chart: a title, the values' unit, an optional note, and (label, value) rows.

    Attributes:
        title: What was measured, in a few words.
        unit: The values' unit, and which way is better ("µs per record, lower is better").
        rows: (label, value) pairs, drawn top to bottom; values must not be negative.
        note: Where and how it was measured (machine, engine, simulated or not).
        digits: Decimals shown for each value.
    """

    title: str
    unit: str
    rows: tuple[tuple[str, float], ...]
    note: str = ""
    digits: int = 2

    def __post_init__(self) -> None:
        if not self.rows:
            raise ValueError(f"chart {self.title!r} has no rows")
        if any(value < 0 for _, value in self.rows):
            raise ValueError(f"chart {self.title!r} has a negative value")

    @classmethod
    def from_json(cls, text: str) -> ChartData:
        """The chart in a data file's text."""
        data = json.loads(text)
        rows = tuple((str(label), float(value)) for label, value in data["rows"])
        return cls(data["title"], data["unit"], rows, data.get("note", ""), int(data.get("digits", 2)))

    def to_json(self) -> str:
        """The data file's text (what `from_json` reads back): one line per field and per row."""
        fields = {"title": self.title, "unit": self.unit, "note": self.note, "digits": self.digits}
        lines = [f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}," for key, value in fields.items()]
        rows = [f"    {json.dumps([label, value], ensure_ascii=False)}" for label, value in self.rows]
        return "{\n" + "\n".join(lines) + '\n  "rows": [\n' + ",\n".join(rows) + "\n  ]\n}\n"


def add_chart_flag(parser: argparse.ArgumentParser) -> None:
    """Add `--chart-data PATH` to a benchmark's flags."""
    parser.add_argument(
        "--chart-data",
        type=Path,
        default=None,
        help="also write the chart's data here (docs/benchmarks/data/<bench>.json; then benchmarks/render_charts.py)",
    )


def write_chart_data(
    path: Path | None, *, title: str, unit: str, rows: Iterable[tuple[str, float]], note: str = "", digits: int = 2
) -> None:
    """Write a run's chart data to `path` (nothing when it is `None`), values rounded to `digits` decimals."""
    if path is None:
        return
    rounded = tuple((str(label), round(float(value), digits)) for label, value in rows)
    path.write_text(ChartData(title, unit, rounded, note, digits).to_json(), encoding="utf-8")
    print(f"chart data: {path}")


def text_width(text: str, size: float) -> float:
    """The width of `text` in the chart's monospace font at `size` pixels."""
    return len(text) * size * CHAR_WIDTH


def value_text(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}"


def render_svg(chart: ChartData) -> str:
    """The chart as a standalone SVG: the title and note above, one labelled horizontal bar per row."""
    labels = [label.replace("`", "") for label, _ in chart.rows]
    values = [value_text(value, chart.digits) for _, value in chart.rows]
    label_width = max(text_width(label, LABEL_SIZE) for label in labels)
    value_width = max(text_width(value, LABEL_SIZE) for value in values)
    width = max(MIN_WIDTH, PADDING * 2 + label_width + GAP * 2 + BAR_AREA + value_width)
    heading = heading_lines(chart, width - 2 * PADDING)
    top = PADDING + sum(size + 6 for _, size, _ in heading) + 8
    height = top + ROW_HEIGHT * len(labels) + PADDING
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label={quoteattr(chart.title)}>',
        f"<title>{escape(chart.title)}</title>",
        '<rect width="100%" height="100%" fill="#ffffff"/>',
        f'<g font-family="{FONT}" fill="{TEXT_COLOR}">',
    ]
    parts += heading_svg(heading)[0]
    parts += _bars(chart, labels, values, top, PADDING + label_width + GAP)
    parts.append("</g></svg>")
    return "\n".join(parts) + "\n"


class Headed(Protocol):
    """What a chart's heading is drawn from."""

    title: str
    unit: str
    note: str


def heading_lines(chart: Headed, width: float) -> list[tuple[str, int, str]]:
    """The heading's lines: the title (bold), then the unit and the note (muted), each wrapped to fit `width`."""
    lines = [(line, TITLE_SIZE, TEXT_COLOR) for line in textwrap.wrap(chart.title, _fitting(width, TITLE_SIZE))]
    for text in (chart.unit, chart.note):
        lines += [(line, NOTE_SIZE, MUTED_COLOR) for line in textwrap.wrap(text, _fitting(width, NOTE_SIZE))]
    return lines


def heading_svg(heading: list[tuple[str, int, str]]) -> tuple[list[str], float]:
    """The heading's lines (`heading_lines`) as SVG text from the top; returns them and where they end."""
    parts = []
    y = float(PADDING)
    for text, size, color in heading:
        y += size
        weight = ' font-weight="bold"' if size == TITLE_SIZE else ""
        parts.append(f'<text x="{PADDING}" y="{y:.1f}" font-size="{size}" fill="{color}"{weight}>{escape(text)}</text>')
        y += 6
    return parts, y


def _fitting(width: float, size: float) -> int:
    """How many characters at `size` fit in `width` (at least 20)."""
    return max(20, int(width / (size * CHAR_WIDTH)))


def _bars(chart: ChartData, labels: list[str], values: list[str], top: float, axis: float) -> list[str]:
    """One row per (label, value): the label right-aligned before the axis, the bar, the value after it."""
    largest = max(value for _, value in chart.rows) or 1.0
    parts = [
        f'<line x1="{axis:.1f}" y1="{top - 4:.1f}" x2="{axis:.1f}" '
        f'y2="{top + ROW_HEIGHT * len(labels):.1f}" stroke="{AXIS_COLOR}" stroke-width="1"/>'
    ]
    for index, ((_, value), label, shown) in enumerate(zip(chart.rows, labels, values, strict=True)):
        row_top = top + index * ROW_HEIGHT + (ROW_HEIGHT - BAR_HEIGHT) / 2
        baseline = row_top + BAR_HEIGHT / 2 + LABEL_SIZE * 0.35
        length = BAR_AREA * value / largest
        parts += [
            f'<text x="{axis - GAP:.1f}" y="{baseline:.1f}" font-size="{LABEL_SIZE}" '
            f'text-anchor="end">{escape(label)}</text>',
            f'<rect x="{axis:.1f}" y="{row_top:.1f}" width="{length:.1f}" height="{BAR_HEIGHT}" '
            f'fill="{BAR_COLOR}" rx="2"/>',
            f'<text x="{axis + length + GAP / 2:.1f}" y="{baseline:.1f}" '
            f'font-size="{LABEL_SIZE}">{escape(shown)}</text>',
        ]
    return parts
