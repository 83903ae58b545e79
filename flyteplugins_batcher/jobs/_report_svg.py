"""SVG pieces for the report's charts: a shared time axis, value axes, legends, and labels that fit their room.

Every chart has the same width and plot area, so that their time axes line up one above the
other. Labels are sized so that none leaves its chart: a name that might not fit is cut, then held
to its room with `textLength`.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

PLOT_LEFT = 160
"""Room left of every plot, for replica names and value labels: the same in each chart, so their time axes align."""
PLOT_WIDTH = 740
PLOT_RIGHT = 40
"""Room right of the plot, for the last time label."""
CHART_WIDTH = PLOT_LEFT + PLOT_WIDTH + PLOT_RIGHT
FONT_SIZE = 11
CHAR_WIDTH = 0.6 * FONT_SIZE
"""A system-ui character's mean width; wide ones (W, M) reach 1.5 times that."""
TEXT_COLOR = "#52606d"
GRID_COLOR = "#e4e7eb"
REPLICA_COLORS = ("#2f80ed", "#f2994a", "#27ae60", "#9b51e0", "#eb5757", "#219ebc", "#8d6e63", "#c9a227")


@dataclass(frozen=True)
class TimeAxis:
    """The span a chart draws, in epoch seconds, mapped onto the plot's width.

    Example:
        ```python
        axis = TimeAxis(start=1_700_000_000.0, end=1_700_000_060.0)
        assert axis.x(1_700_000_030.0) == PLOT_LEFT + PLOT_WIDTH / 2
        ```
    """

    start: float
    end: float

    @property
    def duration(self) -> float:
        """Seconds it spans."""
        return self.end - self.start

    def x(self, epoch_s: float) -> float:
        """The x coordinate of a moment (outside the span: beyond the plot's edges)."""
        return PLOT_LEFT + (epoch_s - self.start) / self.duration * PLOT_WIDTH

    def ticks(self) -> list[tuple[float, str]]:
        """(x, label) of round numbers of seconds since the start, at most about eight."""
        step = nice_step(self.duration, 8)
        decimals = max(0, -math.floor(math.log10(step))) if step < 1 else 0
        count = int(self.duration / step + 1e-9)
        return [
            (PLOT_LEFT + n * step / self.duration * PLOT_WIDTH, f"{n * step:.{decimals}f}s") for n in range(count + 1)
        ]


def nice_step(span: float, target: int) -> float:
    """A round step (1, 2 or 5 times a power of ten) that cuts `span` into about `target` parts."""
    raw = span / max(target, 1) if span > 0 else 1.0
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(multiple * magnitude for multiple in (1, 2, 5, 10) if multiple * magnitude >= raw * (1 - 1e-9))


def compact(value: float) -> str:
    """A short number for an axis: 950, 1.2k, 3M, 0.5."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.1f}".rstrip("0").rstrip(".") + suffix
    return f"{value:.0f}" if value == int(value) else f"{value:.2g}"


def text(x: float, y: float, label: str, *, room: float, anchor: str = "start", weight: str = "") -> str:
    """An SVG text of `label` that stays within `room` pixels of width, cut with an ellipsis if need be.

    `room` is measured from `x` in the direction the anchor implies (leftwards for "end"; centred for "middle").
    """
    fits = max(1, int(room / CHAR_WIDTH))
    shown = label if len(label) <= fits else label[: max(fits - 1, 1)] + "…"
    estimate = len(shown) * CHAR_WIDTH
    # A label made of wide glyphs could still overrun its estimate: hold a long one to its room.
    held = f' textLength="{min(estimate, room):.1f}" lengthAdjust="spacingAndGlyphs"' if estimate * 1.5 > room else ""
    bold = f' font-weight="{weight}"' if weight else ""
    tooltip = f"<title>{html.escape(label)}</title>" if shown != label else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{FONT_SIZE}" fill="{TEXT_COLOR}" text-anchor="{anchor}"{held}{bold}>'
        f"{tooltip}{html.escape(shown)}</text>"
    )


def time_axis(axis: TimeAxis, top: float, bottom: float) -> str:
    """Vertical grid lines at the time ticks from `top` to `bottom`, and their labels below."""
    parts = []
    for x, label in axis.ticks():
        parts.append(f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{bottom:.1f}" stroke="{GRID_COLOR}"/>')
        parts.append(text(x, bottom + 14, label, room=60, anchor="middle"))
    return f'<g class="time-axis">{"".join(parts)}</g>'


def value_axis(top: float, bottom: float, highest: float, ticks: int = 4) -> tuple[str, float]:
    """Horizontal grid lines with value labels from 0 at `bottom` up to a round number at `top`.

    Returns:
        The SVG, and the value at `top` (the round number at or above `highest`, in about `ticks` steps).
    """
    step = nice_step(highest, ticks) if highest > 0 else 1.0
    ceiling = step * max(1, math.ceil(highest / step - 1e-9))
    parts = []
    for n in range(round(ceiling / step) + 1):
        y = bottom - n * step / ceiling * (bottom - top)
        parts.append(
            f'<line x1="{PLOT_LEFT}" y1="{y:.1f}" x2="{PLOT_LEFT + PLOT_WIDTH}" y2="{y:.1f}" stroke="{GRID_COLOR}"/>'
        )
        parts.append(text(PLOT_LEFT - 6, y + 4, compact(n * step), room=PLOT_LEFT - 80, anchor="end"))
    return f'<g class="value-axis">{"".join(parts)}</g>', ceiling


def legend(items: Sequence[tuple[str, str, float]], top: float) -> str:
    """Swatches with labels in a row over the plot: (colour, label, opacity) each; up to four to a row."""
    slot = PLOT_WIDTH / min(max(len(items), 1), 4)
    parts = []
    for position, (color, label, opacity) in enumerate(items):
        x = PLOT_LEFT + (position % 4) * slot
        y = top + (position // 4) * 16
        parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="10" height="10" fill="{color}" fill-opacity="{opacity}"/>'
            + text(x + 14, y + 9, label, room=slot - 22)
        )
    return f'<g class="legend">{"".join(parts)}</g>'


def legend_height(items: int) -> int:
    """Pixels the legend of `items` entries takes."""
    return 16 * math.ceil(items / 4)


def svg(name: str, height: float, body: str, description: str) -> str:
    """A chart's SVG element (`data-chart` names it for tests and styles)."""
    return (
        f'<svg class="chart" data-chart="{name}" width="{CHART_WIDTH}" height="{height:.0f}" '
        f'viewBox="0 0 {CHART_WIDTH} {height:.0f}" role="img" aria-label="{html.escape(description)}">'
        f"<title>{html.escape(description)}</title>{body}</svg>"
    )
