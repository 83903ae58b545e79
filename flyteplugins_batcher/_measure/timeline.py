"""The batcher's timeline: when each batch was at the model, how big it was and what it produced, in bounded memory.

The runners time every call of the process function (`_stats.BatchClock`); each call becomes a
point here. A run of a million batches must not grow memory or the snapshots that carry the
timeline across task boundaries, so the recorder keeps at most `max_points` points: when full, it
merges neighbouring points pairwise, halving the resolution and keeping every total (busy
seconds, batches, records, cost, output tokens) exact.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

MAX_POINTS = 2_000
"""Points a timeline keeps before it merges neighbours: finer than any chart of it is wide."""

_Point = tuple[float, float, float, int, int, int, int]
"""(start, end, busy seconds, batches, records, cost, output tokens); start and end on `time.monotonic`."""


@dataclass
class Timeline:
    """A batcher's batches over time (`batcher.stats.timeline`): one point per call of the process function.

    Once more batches ran than a timeline keeps, each point stands for several neighbouring
    batches: its span runs from the first one's start to the last one's end, `busy_s` is the time
    they were at the model (at most the span), and the counts are their sums. Times are seconds
    since `origin_s`, an epoch time, so that timelines of several processes (or hosts) line up.
    Plain fields only: it crosses task boundaries inside `ReplicaSnapshot`.

    Attributes:
        origin_s: Epoch seconds of time 0 (when the batcher was made).
        start_s: When each point's first batch entered the process function.
        end_s: When its last batch left it.
        busy_s: Seconds its batches were inside the process function.
        batches: Calls of the process function it stands for.
        records: Records they held.
        cost: Their estimated cost (tokens, for a `TokenBatcher`).
        output_tokens: Tokens they generated, for results that count them (`completion_tokens`, as the
            engines' `Completion` does); 0 otherwise.

    Example:
        ```python
        timeline = batcher.stats.timeline
        for start, end, size in zip(timeline.start_s, timeline.end_s, timeline.records):
            print(f"{start:.3f}-{end:.3f}s: {size} records")
        ```
    """

    origin_s: float = 0.0
    start_s: list[float] = field(default_factory=list)
    end_s: list[float] = field(default_factory=list)
    busy_s: list[float] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    records: list[int] = field(default_factory=list)
    cost: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)

    @property
    def points(self) -> int:
        """How many points it holds."""
        return len(self.start_s)

    def span(self) -> tuple[float, float] | None:
        """(first start, last end) in epoch seconds, or `None` before the first batch."""
        if not self.start_s:
            return None
        return self.origin_s + min(self.start_s), self.origin_s + max(self.end_s)


class TimelineRecorder:
    """Records each call of the process function; keeps at most `max_points` points. Thread-safe.

    Args:
        max_points: Points kept before neighbours merge (at least 2).

    Raises:
        ValueError: `max_points` is below 2.

    Example:
        ```python
        recorder = TimelineRecorder(max_points=4)
        for n in range(10):
            recorder.add(n, n + 0.5, records=8, cost=80, output_tokens=0)
        assert recorder.snapshot().points <= 4
        assert sum(recorder.snapshot().records) == 80
        ```
    """

    __slots__ = ("_lock", "_max_points", "_origin_epoch", "_origin_monotonic", "_points")

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        if max_points < 2:
            raise ValueError(f"max_points must be at least 2, got {max_points}")
        self._lock = threading.Lock()
        self._max_points = max_points
        self._points: list[_Point] = []
        self._origin_monotonic = time.monotonic()
        self._origin_epoch = time.time()

    def add(self, start: float, end: float, records: int, cost: int, output_tokens: int) -> None:
        """One call of the process function, from `start` to `end` (`time.monotonic` seconds)."""
        point = (start, end, end - start, 1, records, cost, output_tokens)
        with self._lock:
            points = self._points
            points.append(point)
            if len(points) >= self._max_points:
                self._points = _merged_pairwise(points)

    def snapshot(self) -> Timeline:
        """The points so far, as a plain `Timeline`."""
        with self._lock:
            points = list(self._points)
        origin = self._origin_monotonic
        timeline = Timeline(origin_s=self._origin_epoch)
        if points:
            starts, ends, busy, batches, records, cost, tokens = zip(*points, strict=True)
            timeline.start_s = [start - origin for start in starts]
            timeline.end_s = [end - origin for end in ends]
            timeline.busy_s, timeline.batches, timeline.records = list(busy), list(batches), list(records)
            timeline.cost, timeline.output_tokens = list(cost), list(tokens)
        return timeline


def _merged_pairwise(points: list[_Point]) -> list[_Point]:
    """Each two neighbouring points as one (an odd last point stays as it is)."""
    merged: list[_Point] = []
    for first, second in zip(points[::2], points[1::2], strict=False):
        start, end = min(first[0], second[0]), max(first[1], second[1])
        # Batches that overlapped (max_concurrent_batches > 1) were busy at once: never more than the span.
        busy = min(first[2] + second[2], end - start)
        merged.append(
            (start, end, busy, first[3] + second[3], first[4] + second[4], first[5] + second[5], first[6] + second[6])
        )
    if len(points) % 2:
        merged.append(points[-1])
    return merged


def completion_tokens(results: Any) -> int:
    """Tokens a batch generated: the sum of its results' `completion_tokens`, for results that have them.

    Looks at the first result only to decide, so that results without them (most `@batched`
    functions) cost one attribute lookup per batch.
    """
    if results.__class__ is not list or not results:
        return 0
    first = results[0]
    if not isinstance(first, BaseException) and not hasattr(first, "completion_tokens"):
        return 0
    try:
        return sum(getattr(result, "completion_tokens", 0) for result in results)
    except TypeError:  # a `completion_tokens` that is not a number: nothing to count
        return 0
