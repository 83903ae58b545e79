"""The report's "where the time went" charts, from each replica's batcher timeline (`ReplicaSnapshot.timeline`).

Three charts over the run's wall time, their time axes aligned:

- the device: per replica, a strip that is blue where a batch was inside the model and grey where
  none was (a column that was busy part of the time is paler);
- batch size: the mean records per batch, per replica, in narrow time columns;
- throughput: output tokens per second (records per second where the results count no tokens),
  in wider buckets, stacked per replica.

Points are spread over time in proportion to how much of their span falls in a column, so a
timeline whose neighbouring batches were merged (a long run) still draws its totals right.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

from flyteplugins_batcher import Timeline
from flyteplugins_batcher.jobs._report_svg import (
    PLOT_LEFT,
    PLOT_WIDTH,
    REPLICA_COLORS,
    TimeAxis,
    legend,
    legend_height,
    svg,
    text,
    time_axis,
    value_axis,
)
from flyteplugins_batcher.replica import ReplicaSnapshot

BUSY_COLOR = "#2f80ed"
IDLE_COLOR = "#e4e7eb"
STRIP_COLUMNS = PLOT_WIDTH // 2
"""Columns of the busy/idle strip: two pixels each."""
SIZE_COLUMNS = PLOT_WIDTH // 5
"""Columns of the batch-size chart: one dot per five pixels at most."""
RATE_BUCKETS = 60
"""Bars of the throughput chart."""
SHADES = 4
"""A strip column's busy share is drawn in quarters: any busy time at all shows."""


@dataclass(frozen=True)
class ChartSeries:
    """One replica's timeline, as the charts read it: its points in epoch seconds.

    Example:
        ```python
        [series] = chart_series([snapshot])
        shares = busy_shares(series, TimeAxis(series.starts[0], series.ends[-1]))
        ```
    """

    name: str
    color: str
    timeline: Timeline

    @property
    def starts(self) -> list[float]:
        """Each point's start, in epoch seconds."""
        return [self.timeline.origin_s + start for start in self.timeline.start_s]

    @property
    def ends(self) -> list[float]:
        """Each point's end, in epoch seconds."""
        return [self.timeline.origin_s + end for end in self.timeline.end_s]


def chart_series(replicas: Sequence[ReplicaSnapshot]) -> list[ChartSeries]:
    """Each replica's timeline with its colour (in the replicas' order)."""
    return [
        ChartSeries(replica.replica, REPLICA_COLORS[position % len(REPLICA_COLORS)], replica.timeline)
        for position, replica in enumerate(replicas)
    ]


def run_axis(replicas: Sequence[ReplicaSnapshot], wall_s: float, started_at: float | None = None) -> TimeAxis | None:
    """The span the charts draw: from the run's start to the replicas' last batch; `None` when none recorded any.

    A replica serves run after run, and its timeline goes back to when it started: the charts keep
    to this run, from `started_at` (epoch seconds), else `wall_s` (the run's wall time) before the
    last batch ended, but never before the first batch recorded.
    """
    spans = [span for replica in replicas if (span := replica.timeline.span()) is not None]
    if not spans:
        return None
    first, last = min(span[0] for span in spans), max(span[1] for span in spans)
    start = started_at if started_at is not None else last - wall_s if wall_s > 0 else first
    start = max(start, first)
    return TimeAxis(start, last) if last > start else TimeAxis(start, start + 1.0)


def spread(series: ChartSeries, weights: Sequence[float], axis: TimeAxis, columns: int) -> list[float]:
    """Each point's weight shared among the equal time columns of `axis` in proportion to its span in each."""
    sums = [0.0] * columns
    width = axis.duration / columns
    for start, end, weight in zip(series.starts, series.ends, weights, strict=True):
        if not weight or end < axis.start or start > axis.end:
            continue
        if end - start <= 0:  # an instant: all of it in its column
            sums[min(max(int((start - axis.start) / width), 0), columns - 1)] += weight
            continue
        first, last = max(start, axis.start), min(end, axis.end)
        column = min(int((first - axis.start) / width), columns - 1)
        while column < columns:
            left = axis.start + column * width
            if left >= last:
                break
            overlap = min(last, left + width) - max(first, left)
            if overlap > 0:
                sums[column] += weight * overlap / (end - start)
            column += 1
    return sums


def busy_shares(series: ChartSeries, axis: TimeAxis, columns: int = STRIP_COLUMNS) -> list[float]:
    """Per column, the share of its time a batch was inside the model (0-1)."""
    width = axis.duration / columns
    return [min(busy / width, 1.0) for busy in spread(series, series.timeline.busy_s, axis, columns)]


def busy_runs(shares: Sequence[float]) -> list[tuple[int, int, float]]:
    """Runs of neighbouring columns with the same shade: (first column, columns, shade), busy ones only."""
    runs: list[tuple[int, int, float]] = []
    for column, share in enumerate(shares):
        shade = math.ceil(share * SHADES - 1e-9) / SHADES
        if shade <= 0:
            continue
        if runs and runs[-1][0] + runs[-1][1] == column and runs[-1][2] == shade:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, shade)
        else:
            runs.append((column, 1, shade))
    return runs


def mean_batch_sizes(series: ChartSeries, axis: TimeAxis, columns: int = SIZE_COLUMNS) -> list[float | None]:
    """Per column, the mean records per batch of the points whose middle falls in it (`None`: no batch)."""
    batches = [0] * columns
    records = [0] * columns
    timeline = series.timeline
    for start, end, count, size in zip(series.starts, series.ends, timeline.batches, timeline.records, strict=True):
        middle = (start + end) / 2
        if axis.start <= middle <= axis.end:
            column = min(int((middle - axis.start) / axis.duration * columns), columns - 1)
            batches[column] += count
            records[column] += size
    return [records[n] / batches[n] if batches[n] else None for n in range(columns)]


def rates(series: ChartSeries, axis: TimeAxis, tokens: bool, buckets: int = RATE_BUCKETS) -> list[float]:
    """Per bucket, output tokens per second (`tokens`), else records per second."""
    weights = series.timeline.output_tokens if tokens else series.timeline.records
    width = axis.duration / buckets
    return [total / width for total in spread(series, weights, axis, buckets)]


def counts_tokens(series: Sequence[ChartSeries]) -> bool:
    """Whether any replica's results counted output tokens (else the throughput chart counts records)."""
    return any(any(one.timeline.output_tokens) for one in series)


def device_chart(series: Sequence[ChartSeries], axis: TimeAxis) -> str:
    """The busy/idle strips, one row per replica, with a legend and the time axis."""
    row, strip, top = 24, 16, 8 + legend_height(2) + 6
    parts = [legend([(BUSY_COLOR, "busy: a batch in the model", 1.0), (IDLE_COLOR, "idle", 1.0)], 8)]
    column_width = PLOT_WIDTH / STRIP_COLUMNS
    for position, one in enumerate(series):
        y = top + position * row
        shares = busy_shares(one, axis)
        busy = sum(shares) / len(shares)
        parts.append(text(PLOT_LEFT - 8, y + 12, one.name, room=PLOT_LEFT - 52, anchor="end"))
        parts.append(text(8, y + 12, f"{busy:.0%}", room=36, weight="600"))
        parts.append(
            f'<rect class="idle" x="{PLOT_LEFT}" y="{y}" width="{PLOT_WIDTH}" height="{strip}" fill="{IDLE_COLOR}"/>'
        )
        parts.extend(
            f'<rect class="busy" x="{PLOT_LEFT + first * column_width:.1f}" y="{y}" '
            f'width="{count * column_width:.1f}" height="{strip}" fill="{BUSY_COLOR}" fill-opacity="{shade}"/>'
            for first, count, shade in busy_runs(shares)
        )
    bottom = top + len(series) * row
    body = time_axis(axis, top - 4, bottom) + "".join(parts)
    return svg("device", bottom + 22, body, "each replica's device, busy and idle, over the run")


def batch_size_chart(series: Sequence[ChartSeries], axis: TimeAxis) -> str:
    """Mean records per batch over time: a lane per replica (one scale for all), a dot per column with batches."""
    sizes = [mean_batch_sizes(one, axis) for one in series]
    highest = max((size for column in sizes for size in column if size is not None), default=1.0)
    lane, name_room, top = 48, 26, 8
    parts, width = [], PLOT_WIDTH / SIZE_COLUMNS
    for position, (one, column_sizes) in enumerate(zip(series, sizes, strict=True)):
        lane_top = top + position * (lane + name_room) + name_room
        grid, ceiling = value_axis(lane_top, lane_top + lane, highest, ticks=2)
        parts.append(grid + text(PLOT_LEFT, lane_top - 6, one.name, room=PLOT_WIDTH, weight="600"))
        parts.extend(
            f'<circle class="size" cx="{PLOT_LEFT + (column + 0.5) * width:.1f}" '
            f'cy="{lane_top + lane - size / ceiling * lane:.1f}" r="2.5" fill="{one.color}"/>'
            for column, size in enumerate(column_sizes)
            if size is not None
        )
    bottom = top + len(series) * (lane + name_room)
    body = time_axis(axis, top + name_room, bottom) + "".join(parts)
    return svg("batch-size", bottom + 22, body, "records per batch over the run, per replica")


def throughput_chart(series: Sequence[ChartSeries], axis: TimeAxis, tokens: bool) -> str:
    """Output tokens (or records) per second in time buckets, stacked per replica (coloured as in the legend)."""
    per_replica = [rates(one, axis, tokens) for one in series]
    totals = [sum(column) for column in zip(*per_replica, strict=True)]
    top = 8 + legend_height(len(series)) + 8
    bottom = top + 130
    grid, ceiling = value_axis(top, bottom, max(totals, default=0.0) or 1.0)
    width = PLOT_WIDTH / RATE_BUCKETS
    bars, stacked = [], [0.0] * RATE_BUCKETS
    for one, values in zip(series, per_replica, strict=True):
        for bucket, value in enumerate(values):
            if value <= 0:
                continue
            height = max(value / ceiling * (bottom - top), 1.0)  # a sliver of work still shows
            y = bottom - stacked[bucket] - height
            stacked[bucket] += height
            bars.append(
                f'<rect class="rate" x="{PLOT_LEFT + bucket * width + 0.5:.1f}" y="{y:.1f}" '
                f'width="{width - 1:.1f}" height="{height:.1f}" fill="{one.color}"/>'
            )
    body = grid + time_axis(axis, top, bottom) + _series_legend(series) + "".join(bars)
    what = "output tokens" if tokens else "records"
    return svg("throughput", bottom + 22, body, f"{what} per second over the run")


def _series_legend(series: Sequence[ChartSeries]) -> str:
    return legend([(one.color, one.name, 1.0) for one in series], 8)


def timeline_section(replicas: Sequence[ReplicaSnapshot], wall_s: float, started_at: float | None = None) -> str:
    """The charts, with their titles; a line saying why there are none when no replica recorded a batch."""
    axis = run_axis(replicas, wall_s, started_at)
    if axis is None:
        return "<p>No replica recorded a batch timeline.</p>"
    series = chart_series(replicas)
    tokens = counts_tokens(series)
    rate = "Output tokens per second" if tokens else "Records per second (the results count no tokens)"
    return "".join(
        [
            "<h3>Where the time went</h3>",
            f'<p class="note">Seconds since the run started ({axis.duration:.1f}s drawn); the batcher times each '
            "batch where it runs the model.</p>",
            "<h4>Device: busy and idle, per replica (share of the time busy on the left)</h4>",
            device_chart(series, axis),
            "<h4>Batch size: mean records per batch</h4>",
            batch_size_chart(series, axis),
            f"<h4>{html.escape(rate)}</h4>",
            throughput_chart(series, axis, tokens),
        ]
    )
