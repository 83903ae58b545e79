"""Line charts for benchmarks that sweep a variable (load): one or more panels sharing the x axis and a legend.

The data file (`docs/benchmarks/data/<bench>.json`) has `panels` where a bar chart has `rows`:

    {"title": "...", "unit": "...", "note": "...", "x_label": "records/s offered",
     "panels": [{"label": "p99 latency, ms", "log": true, "threshold": 250, "threshold_label": "target",
                 "series": [["ours", [[50, 29.0], [100, 37.0]]], ...]}, ...]}

`render_line_svg` draws it as deterministically as the bar charts (`_charts.render_svg`): the same
data gives the same bytes, and every label fits inside the chart.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from benchmarks._charts import (
    AXIS_COLOR,
    FONT,
    LABEL_SIZE,
    MUTED_COLOR,
    PADDING,
    TEXT_COLOR,
    heading_lines,
    heading_svg,
    text_width,
)

WIDTH = 760
PLOT_HEIGHT = 210
Y_AXIS = 64  # room for the y tick labels, left of the plot
RIGHT = 24
COLORS = ("#3f6ec6", "#d1495b", "#66a182", "#edae49", "#8e6c8a", "#00798c", "#7f7f7f", "#c1666b")
THRESHOLD_COLOR = "#1f2328"


@dataclass(frozen=True)
class Panel:
    """One plot: its y label, whether its y axis is logarithmic, an optional threshold line, and its series.

    Attributes:
        label: What the y axis shows, with its unit.
        series: (name, ((x, y), ...)) per line; the first is drawn boldest. Values must be positive on a log axis.
        log: A logarithmic y axis (latencies that span orders of magnitude).
        threshold: A horizontal dashed line (a target), or `None`.
        threshold_label: Its label, drawn at its right end.
    """

    label: str
    series: tuple[tuple[str, tuple[tuple[float, float], ...]], ...]
    log: bool = False
    threshold: float | None = None
    threshold_label: str = ""


@dataclass(frozen=True)
class LineChartData:
    """Panels of lines over one x axis (see the module notes)."""

    title: str
    unit: str
    x_label: str
    panels: tuple[Panel, ...]
    note: str = ""

    def __post_init__(self) -> None:
        if not self.panels or not all(panel.series for panel in self.panels):
            raise ValueError(f"chart {self.title!r} needs panels with series")
        for panel in self.panels:
            if panel.log and any(y <= 0 for _, points in panel.series for _, y in points):
                raise ValueError(f"chart {self.title!r}: a log axis needs positive values ({panel.label})")

    @classmethod
    def from_json(cls, text: str) -> LineChartData:
        """The chart in a data file's text."""
        data = json.loads(text)
        panels = tuple(
            Panel(
                label=panel["label"],
                series=tuple(
                    (name, tuple((float(x), float(y)) for x, y in points)) for name, points in panel["series"]
                ),
                log=bool(panel.get("log", False)),
                threshold=panel.get("threshold"),
                threshold_label=panel.get("threshold_label", ""),
            )
            for panel in data["panels"]
        )
        return cls(data["title"], data["unit"], data["x_label"], panels, data.get("note", ""))

    def to_json(self) -> str:
        """The data file's text (what `from_json` reads back): one line per field and per series."""
        fields = {"title": self.title, "unit": self.unit, "note": self.note, "x_label": self.x_label}
        lines = [f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}," for key, value in fields.items()]
        panels = []
        for panel in self.panels:
            head = {"label": panel.label, "log": panel.log, "threshold": panel.threshold}
            head["threshold_label"] = panel.threshold_label
            opening = json.dumps(head, ensure_ascii=False)[:-1]
            series = [f"      {json.dumps([name, [list(point) for point in points]])}" for name, points in panel.series]
            panels.append(f'    {opening}, "series": [\n' + ",\n".join(series) + "\n    ]}")
        return "{\n" + "\n".join(lines) + '\n  "panels": [\n' + ",\n".join(panels) + "\n  ]\n}\n"


def write_line_chart_data(path: Path | None, chart: LineChartData) -> None:
    """Write a sweep's chart data to `path` (nothing when it is `None`), values rounded to 2 decimals."""
    if path is None:
        return
    rounded = tuple(
        dataclasses.replace(
            panel, series=tuple((name, tuple((x, round(y, 2)) for x, y in points)) for name, points in panel.series)
        )
        for panel in chart.panels
    )
    path.write_text(dataclasses.replace(chart, panels=rounded).to_json(), encoding="utf-8")
    print(f"chart data: {path}")


def render_line_svg(chart: LineChartData) -> str:
    """The chart as a standalone SVG: the heading, the legend, then each panel over the shared x axis."""
    heading, y = heading_svg(heading_lines(chart, WIDTH - 2 * PADDING))
    parts = [f'<g font-family="{FONT}" fill="{TEXT_COLOR}">', *heading]
    names = [name for name, _ in chart.panels[0].series]
    legend, y = _legend(names, y + 10)
    parts += legend
    xs = sorted({x for panel in chart.panels for _, points in panel.series for x, _ in points})
    for panel in chart.panels:
        drawn, y = _panel(panel, xs, chart.x_label, y + 14)
        parts += drawn
    height = y + PADDING
    header = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
        f'viewBox="0 0 {WIDTH} {height:.0f}" role="img" aria-label={quoteattr(chart.title)}>',
        f"<title>{escape(chart.title)}</title>",
        '<rect width="100%" height="100%" fill="#ffffff"/>',
    ]
    return "\n".join([*header, *parts, "</g></svg>"]) + "\n"


def _legend(names: Sequence[str], top: float) -> tuple[list[str], float]:
    """A swatch and a name per series, in rows that fit the width; returns the parts and where they end."""
    parts: list[str] = []
    x, y = float(PADDING), top
    for index, name in enumerate(names):
        width = 26 + text_width(name, LABEL_SIZE) + 18
        if x + width > WIDTH - PADDING and x > PADDING:
            x, y = float(PADDING), y + LABEL_SIZE + 8
        stroke = 3 if index == 0 else 2
        parts += [
            f'<line x1="{x:.1f}" y1="{y - 4:.1f}" x2="{x + 20:.1f}" y2="{y - 4:.1f}" '
            f'stroke="{COLORS[index % len(COLORS)]}" stroke-width="{stroke}"/>',
            f'<text x="{x + 26:.1f}" y="{y:.1f}" font-size="{LABEL_SIZE}">{escape(name)}</text>',
        ]
        x += width
    return parts, y + 4


def _panel(panel: Panel, xs: list[float], x_label: str, top: float) -> tuple[list[str], float]:
    """One plot below `top`: its label, axes and ticks, threshold and lines; returns the parts and where it ends."""
    left, right = PADDING + Y_AXIS, WIDTH - RIGHT
    plot_top = top + LABEL_SIZE + 8
    bottom = plot_top + PLOT_HEIGHT
    ticks = _y_ticks(panel)
    scale_y = _y_scale(panel, ticks, plot_top, bottom)

    def scale_x(x: float) -> float:
        return left + (x - xs[0]) / ((xs[-1] - xs[0]) or 1.0) * (right - left)

    parts = [f'<text x="{PADDING}" y="{top + LABEL_SIZE:.1f}" font-size="{LABEL_SIZE}">{escape(panel.label)}</text>']
    parts += _axes(ticks, scale_y, [(x, scale_x(x)) for x in xs], left, right, bottom)
    if panel.threshold is not None:
        level = scale_y(panel.threshold)
        parts += [
            f'<line x1="{left}" y1="{level:.1f}" x2="{right}" y2="{level:.1f}" stroke="{THRESHOLD_COLOR}" '
            'stroke-width="1" stroke-dasharray="6 4"/>',
            f'<text x="{right - 4}" y="{level - 4:.1f}" font-size="{LABEL_SIZE - 2}" fill="{THRESHOLD_COLOR}" '
            f'text-anchor="end">{escape(panel.threshold_label)}</text>',
        ]
    for index, (_, points) in enumerate(reversed(panel.series)):
        order = len(panel.series) - 1 - index  # the first series is drawn last, on top
        color, stroke = COLORS[order % len(COLORS)], 3 if order == 0 else 2
        path = " ".join(f"{scale_x(x):.1f},{scale_y(y):.1f}" for x, y in points)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="{stroke}"/>')
    label_y = bottom + LABEL_SIZE + 22
    parts.append(
        f'<text x="{(left + right) / 2:.1f}" y="{label_y:.1f}" font-size="{LABEL_SIZE}" fill="{MUTED_COLOR}" '
        f'text-anchor="middle">{escape(x_label)}</text>'
    )
    return parts, label_y


def _y_ticks(panel: Panel) -> list[float]:
    """Decades on a log axis; on a linear one, round steps from 0 to past the largest value."""
    values = [y for _, points in panel.series for _, y in points]
    values += [] if panel.threshold is None else [panel.threshold]
    if panel.log:
        low, high = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
        return [10.0**power for power in range(low, max(high, low + 1) + 1)]
    step = _nice_step(max(values) / 5)
    return [step * index for index in range(math.ceil(max(values) / step) + 1)]


def _nice_step(rough: float) -> float:
    power = 10 ** math.floor(math.log10(rough)) if rough > 0 else 1.0
    return next(power * factor for factor in (1, 2, 2.5, 5, 10) if power * factor >= rough)


def _y_scale(panel: Panel, ticks: list[float], top: float, bottom: float) -> Callable[[float], float]:
    """Where a value goes on the panel's y axis, from `bottom` (the first tick) up to `top` (the last)."""
    low, high = (math.log10(ticks[0]), math.log10(ticks[-1])) if panel.log else (ticks[0], ticks[-1])

    def scale(y: float) -> float:
        value = math.log10(y) if panel.log else y
        return bottom - (value - low) / ((high - low) or 1.0) * (bottom - top)

    return scale


def _axes(
    ticks: list[float],
    scale_y: Callable[[float], float],
    xs: list[tuple[float, float]],
    left: float,
    right: float,
    bottom: float,
) -> list[str]:
    """The axes, the y ticks with their grid lines, and the x ticks (as many as fit)."""
    parts: list[str] = []
    for tick in ticks:
        level = scale_y(tick)
        parts += [
            f'<line x1="{left}" y1="{level:.1f}" x2="{right}" y2="{level:.1f}" stroke="#eaeef2" stroke-width="1"/>',
            f'<text x="{left - 6}" y="{level + 4:.1f}" font-size="{LABEL_SIZE - 2}" fill="{MUTED_COLOR}" '
            f'text-anchor="end">{_tick_text(tick)}</text>',
        ]
    every = max(1, math.ceil(len(xs) * text_width("0000", LABEL_SIZE - 2) / (right - left)))
    for x, position in xs[::every]:
        parts.append(
            f'<text x="{position:.1f}" y="{bottom + LABEL_SIZE + 2:.1f}" font-size="{LABEL_SIZE - 2}" '
            f'fill="{MUTED_COLOR}" text-anchor="middle">{_tick_text(x)}</text>'
        )
    parts += [
        f'<line x1="{left}" y1="{bottom:.1f}" x2="{right}" y2="{bottom:.1f}" stroke="{AXIS_COLOR}" stroke-width="1"/>',
        f'<line x1="{left}" y1="{scale_y(ticks[-1]):.1f}" x2="{left}" y2="{bottom:.1f}" stroke="{AXIS_COLOR}"/>',
    ]
    return parts


def _tick_text(value: float) -> str:
    return f"{value:,.0f}" if value >= 1 or value == 0 else f"{value:g}"
