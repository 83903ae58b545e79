"""Batcher statistics: the live recorder the batcher updates, and the `BatchStats` snapshot users read."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from flyteplugins_batcher._deprecation import warn_deprecated
from flyteplugins_batcher._measure.histogram import Distribution, LogHistogram
from flyteplugins_batcher._measure.observers import Observers
from flyteplugins_batcher._measure.slo_stats import SloStats, SloTally
from flyteplugins_batcher._measure.timeline import Timeline, TimelineRecorder, completion_tokens
from flyteplugins_batcher._types import DispatchReason, RecordState, SettledOutcome

DISPATCH_REASONS: tuple[DispatchReason, ...] = ("full", "budget", "timeout", "idle", "drain")


@dataclass
class BatchStats:
    """A snapshot of a batcher's statistics (`batcher.stats`).

    The first eight fields and `utilization` match `flyte.extras.BatchStats`. Busy time is measured
    where the model runs: inside the worker thread around a plain `def` process function, and
    around the awaited call of an `async def` one; with several batches in flight it counts the
    time during which at least one is running. Idle time is the rest of the *active* time, when at
    least one record was in the batcher (submitted and not yet resolved), so a replica that sat
    idle between jobs is not reported as under-utilized. `utilization` is busy / (busy + idle):
    the fraction of the active time the device was working.

    Attributes:
        total_submitted: Records accepted by `submit`.
        total_completed: Records that went through the process function (succeeded or failed).
        total_batches: Batches dispatched.
        total_batch_cost: Sum of estimated cost over all batches.
        avg_batch_size: Mean records per batch.
        avg_batch_cost: Mean cost per batch.
        busy_time_s: Seconds with at least one batch inside the process function.
        idle_time_s: Active seconds with no batch inside the process function.
        total_failed: Records whose future got an exception (from the process function, or because
            the batcher failed before they ran).
        total_cancelled: Records cancelled by their caller (or by `stop`) before they ran, or while they ran
            when they could be told to stop (`Cancellable`).
        total_expired: Records whose `deadline_s` passed before dispatch (they never ran).
        total_oversized: Records costlier than `target_batch_cost` that ran alone.
        active_time_s: Seconds with at least one record in the batcher.
        records_per_s: `total_completed / active_time_s`.
        batches_by_reason: How many batches went out for each `DispatchReason`.
        queue_wait_s: From `submit` to dispatch, per record.
        latency_s: From `submit` to the future resolving, per record.
        batch_size: Records per batch.
        batch_cost: Estimated cost per batch.
        queue_depth: Records waiting right now (queued, or in a staged batch).
        in_flight_batches: Batches inside the process function right now.
        timeline: When each batch was inside the process function, its size, cost and output tokens
            (bounded: neighbouring batches merge once there are many; see `Timeline`).
        slo: With `latency_slo_s`: the target, the share of records that met it, the controller's
            choice, and whether the load is more than any choice can serve (`SloStats`); else `None`.

    Example:
        ```python
        stats = batcher.stats
        print(stats.summary())
        assert stats.utilization > 0.9
        ```
    """

    # flyte.extras' BatchStats fields first, in its order, so that code written for it reads the same values
    total_submitted: int = 0
    total_completed: int = 0
    total_batches: int = 0
    total_batch_cost: int = 0
    avg_batch_size: float = 0.0
    avg_batch_cost: float = 0.0
    busy_time_s: float = 0.0
    idle_time_s: float = 0.0
    # what flyte.extras cannot tell
    total_failed: int = 0
    total_cancelled: int = 0
    total_oversized: int = 0
    total_expired: int = 0
    active_time_s: float = 0.0
    records_per_s: float = 0.0
    batches_by_reason: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DISPATCH_REASONS, 0))
    queue_wait_s: Distribution = field(default_factory=Distribution)
    latency_s: Distribution = field(default_factory=Distribution)
    batch_size: Distribution = field(default_factory=Distribution)
    batch_cost: Distribution = field(default_factory=Distribution)
    queue_depth: int = 0
    in_flight_batches: int = 0
    timeline: Timeline = field(default_factory=Timeline)
    slo: SloStats | None = None

    @property
    def utilization(self) -> float:
        """Fraction of the active time the process function was busy (0.0-1.0)."""
        total = self.busy_time_s + self.idle_time_s
        return self.busy_time_s / total if total > 0 else 0.0

    @property
    def inflight_batches(self) -> int:
        """Deprecated spelling of `in_flight_batches`."""
        warn_deprecated("inflight_batches", "in_flight_batches")
        return self.in_flight_batches

    def as_dict(self) -> dict[str, Any]:
        """Every field plus `utilization`, as JSON-friendly plain values."""
        plain: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            plain[name] = value.as_dict() if isinstance(value, Distribution) else value
        plain["timeline"] = asdict(self.timeline)
        plain["slo"] = None if self.slo is None else asdict(self.slo) | {"met_fraction": self.slo.met_fraction}
        plain["batches_by_reason"] = dict(self.batches_by_reason)
        plain["utilization"] = self.utilization
        return plain

    def summary(self) -> str:
        """One line for logs: volume, throughput, utilization, latency and why batches went out."""
        reasons = " ".join(f"{reason}={count}" for reason, count in self.batches_by_reason.items() if count)
        failed = f", {self.total_failed} failed" if self.total_failed else ""
        cancelled = f", {self.total_cancelled} cancelled" if self.total_cancelled else ""
        expired = f", {self.total_expired} expired" if self.total_expired else ""
        return (
            f"{self.total_completed}/{self.total_submitted} records{failed}{cancelled}{expired} "
            f"in {self.total_batches} batches "
            f"(avg {self.avg_batch_size:.1f} records, cost {self.avg_batch_cost:.0f}) | "
            f"{self.records_per_s:.1f} rec/s | utilization {self.utilization:.1%} | "
            f"wait p50 {_ms(self.queue_wait_s.p50)} p99 {_ms(self.queue_wait_s.p99)} | "
            f"latency p50 {_ms(self.latency_s.p50)} p99 {_ms(self.latency_s.p99)} | "
            f"batches: {reasons or 'none'}" + ("" if self.slo is None else f" | {self.slo.summary()}")
        )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}ms" if seconds < 10 else f"{seconds:.1f}s"


_OUTCOMES: dict[RecordState, SettledOutcome] = {
    RecordState.COMPLETED: "completed",
    RecordState.FAILED: "failed",
    RecordState.CANCELLED: "cancelled",
    RecordState.EXPIRED: "expired",
}


class BusyClock:
    """Time during which at least one batch is inside the process function, measured where it runs.

    Thread-safe: a plain-`def` process function is timed in its worker thread.
    """

    __slots__ = ("_lock", "_running", "_since", "_total")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._since = 0.0
        self._total = 0.0

    def enter(self) -> float:
        """A batch starts inside the process function; returns when (`time.monotonic`)."""
        with self._lock:
            now = time.monotonic()
            if not self._running:
                self._since = now
            self._running += 1
        return now

    def exit(self) -> float:
        """A batch left the process function; returns when (`time.monotonic`)."""
        with self._lock:
            now = time.monotonic()
            self._running -= 1
            if not self._running:
                self._total += now - self._since
        return now

    def busy_s(self, now: float) -> float:
        """Busy seconds so far, including a batch still running."""
        with self._lock:
            return self._total + (now - self._since if self._running else 0.0)


class BatchClock(BusyClock):
    """The batcher's busy clock, which also puts each call of the process function on the batcher's timeline.

    It reads what the runner hands it (how many records a call took, their cost, its results) and writes only
    its own figures: the runner keeps its batch's.

    Example:
        ```python
        clock = BatchClock()
        started = clock.enter()
        results = process_fn(records)
        device_s = clock.exit_call(started, len(records), cost, results)
        ```
    """

    __slots__ = ("timeline",)

    def __init__(self) -> None:
        super().__init__()
        self.timeline = TimelineRecorder()

    def exit_call(self, started: float, size: int, cost: int, results: Any) -> float:
        """A call of `size` records costing `cost`, begun at `started`, left the process function with `results`.

        `results` is what the call returned (`None` when it raised).

        Returns:
            The call's seconds inside the process function.
        """
        ended = self.exit()
        self.timeline.add(started, ended, size, cost, completion_tokens(results))
        return ended - started


class StatsRecorder:
    """The batcher's live counters. The batcher changes them only through these methods, on its event loop.

    Args:
        slo: With a latency target, where records are counted against it.
    """

    def __init__(self, slo: SloTally | None = None) -> None:
        self.slo = slo
        self.busy = BatchClock()
        self._submitted = 0
        self._completed = 0
        self._failed = 0
        self._cancelled = 0
        self._expired = 0
        self._oversized = 0
        self._batches = 0
        self._total_cost = 0
        self._reasons: dict[str, int] = dict.fromkeys(DISPATCH_REASONS, 0)
        self._queue_wait = LogHistogram()
        self._latency = LogHistogram()
        self._batch_size = LogHistogram(floor=1.0)
        self._batch_cost = LogHistogram(floor=1.0)
        self._in_system = 0
        self._active_since = 0.0
        self._active_total = 0.0
        self.observers = Observers()

    @property
    def in_system(self) -> int:
        """Records accepted and not yet settled."""
        return self._in_system

    def record_submit(self, now: float) -> int:
        """A record was accepted; returns how many have been, which numbers it."""
        if not self._in_system:
            self._active_since = now
        self._in_system += 1
        self._submitted += 1
        return self._submitted

    def active_s(self, now: float) -> float:
        """Seconds with at least one record in the batcher, as of `now`."""
        return self._active_total + (now - self._active_since if self._in_system else 0.0)

    def records_per_s(self, now: float) -> float:
        """Records completed per active second so far (`BatchStats.records_per_s`, without a snapshot)."""
        active = self.active_s(now)
        return self._completed / active if active > 0 else 0.0

    @property
    def submitted(self) -> int:
        """Records accepted so far; the last one accepted has this submission number."""
        return self._submitted

    def record_dispatch(
        self, now: float, starts: list[float], cost: int, reason: DispatchReason, *, oversized: bool
    ) -> None:
        """A batch went to the process function; `starts` are its records' submit times (`time.monotonic`)."""
        self._batches += 1
        self._total_cost += cost
        self._reasons[reason] += 1
        self._oversized += oversized
        self._batch_size.add(len(starts))
        self._batch_cost.add(max(cost, 1))
        self._queue_wait.add_since(now, starts)
        if self.observers:
            self.observers.dispatched(len(starts), cost, reason, [now - start for start in starts])

    def record_settled(self, now: float, starts: list[float], end: RecordState, *, failed: int = 0) -> None:
        """Records that ended in `end` at `now`; `starts` are their submit times (`time.monotonic`).

        `failed` of them (when they completed) got an exception.
        """
        count = len(starts)
        if end is RecordState.COMPLETED:
            self._completed += count
            self._failed += failed
            self._latency.add_since(now, starts)
        elif end is RecordState.FAILED:
            self._failed += count
        elif end is RecordState.CANCELLED:
            self._cancelled += count
        else:
            self._expired += count
        self._in_system -= count
        if not self._in_system:
            self._active_total += now - self._active_since
        if self.observers:
            self.observers.settled(_OUTCOMES[end], [now - start for start in starts], failed)

    def snapshot(self, now: float, *, queue_depth: int, in_flight_batches: int) -> BatchStats:
        """The statistics as of `now`."""
        active = self.active_s(now)
        busy = self.busy.busy_s(now)
        batches = self._batches
        batch_size = self._batch_size.summary()
        return BatchStats(
            total_submitted=self._submitted,
            total_completed=self._completed,
            total_batches=batches,
            total_batch_cost=self._total_cost,
            avg_batch_size=batch_size.mean,
            avg_batch_cost=self._total_cost / batches if batches else 0.0,
            busy_time_s=busy,
            idle_time_s=max(active - busy, 0.0),
            total_failed=self._failed,
            total_cancelled=self._cancelled,
            total_oversized=self._oversized,
            total_expired=self._expired,
            active_time_s=active,
            records_per_s=self.records_per_s(now),
            batches_by_reason=dict(self._reasons),
            queue_wait_s=self._queue_wait.summary(),
            latency_s=self._latency.summary(),
            batch_size=batch_size,
            batch_cost=self._batch_cost.summary(),
            queue_depth=queue_depth,
            in_flight_batches=in_flight_batches,
            timeline=self.busy.timeline.snapshot(),
            slo=None if self.slo is None else self.slo.snapshot(),
        )
