"""Batcher statistics: the live recorder the batcher updates, and the `BatchStats` snapshot users read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from flyteplugins_batcher._histogram import Distribution, LogHistogram

DispatchReason = Literal["full", "budget", "timeout", "idle", "drain"]
"""Why a batch went out:

- `full`: it reached `max_batch_size`.
- `budget`: the next record would have pushed it over `target_batch_cost`.
- `timeout`: its oldest record had waited `batch_timeout_s`.
- `idle`: the engine had nothing in flight and at least `min_batch_size` records were waiting.
- `drain`: the batcher was stopping or flushed (for example at the end of `run`/`map`).
"""

DISPATCH_REASONS: tuple[DispatchReason, ...] = ("full", "budget", "timeout", "idle", "drain")


@dataclass
class BatchStats:
    """A snapshot of a batcher's statistics (`batcher.stats`).

    The first eight fields and `utilization` match `flyte.extras.BatchStats`. Time-based figures
    count only the *active* time, when at least one record was in the batcher (submitted and not
    yet resolved), so a replica that sat idle between jobs is not reported as under-utilized.

    Attributes:
        total_submitted: Records accepted by `submit`.
        total_completed: Records that went through the process function (succeeded or failed).
        total_batches: Batches dispatched.
        total_batch_cost: Sum of estimated cost over all batches.
        avg_batch_size: Mean records per batch.
        avg_batch_cost: Mean cost per batch.
        busy_time_s: Seconds with at least one batch inside the process function.
        idle_time_s: Active seconds with no batch in flight (records were waiting, or arriving).
        total_failed: Records whose future got an exception from the process function.
        total_cancelled: Records cancelled by their caller (or by `stop`) before they ran.
        total_oversized: Records costlier than `target_batch_cost` that ran alone.
        active_time_s: Seconds with at least one record in the batcher.
        records_per_s: `total_completed / active_time_s`.
        batches_by_reason: How many batches went out for each `DispatchReason`.
        queue_wait_s: From `submit` to dispatch, per record.
        latency_s: From `submit` to the future resolving, per record.
        batch_size: Records per batch.
        batch_cost: Estimated cost per batch.
        queue_depth: Records waiting right now.
        inflight_batches: Batches inside the process function right now.

    Example:
        ```python
        stats = batcher.stats
        print(stats.summary())
        assert stats.utilization > 0.9
        ```
    """

    total_submitted: int = 0
    total_completed: int = 0
    total_batches: int = 0
    total_batch_cost: int = 0
    avg_batch_size: float = 0.0
    avg_batch_cost: float = 0.0
    busy_time_s: float = 0.0
    idle_time_s: float = 0.0
    total_failed: int = 0
    total_cancelled: int = 0
    total_oversized: int = 0
    active_time_s: float = 0.0
    records_per_s: float = 0.0
    batches_by_reason: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DISPATCH_REASONS, 0))
    queue_wait_s: Distribution = field(default_factory=Distribution)
    latency_s: Distribution = field(default_factory=Distribution)
    batch_size: Distribution = field(default_factory=Distribution)
    batch_cost: Distribution = field(default_factory=Distribution)
    queue_depth: int = 0
    inflight_batches: int = 0

    @property
    def utilization(self) -> float:
        """Fraction of the active time the process function was busy (0.0-1.0)."""
        total = self.busy_time_s + self.idle_time_s
        return self.busy_time_s / total if total > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Every field plus `utilization`, as JSON-friendly plain values."""
        plain: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            plain[name] = value.as_dict() if isinstance(value, Distribution) else value
        plain["batches_by_reason"] = dict(self.batches_by_reason)
        plain["utilization"] = self.utilization
        return plain

    def summary(self) -> str:
        """One line for logs: volume, throughput, utilization, latency and why batches went out."""
        reasons = " ".join(f"{reason}={count}" for reason, count in self.batches_by_reason.items() if count)
        failed = f", {self.total_failed} failed" if self.total_failed else ""
        cancelled = f", {self.total_cancelled} cancelled" if self.total_cancelled else ""
        return (
            f"{self.total_completed}/{self.total_submitted} records{failed}{cancelled} in {self.total_batches} batches "
            f"(avg {self.avg_batch_size:.1f} records, cost {self.avg_batch_cost:.0f}) | "
            f"{self.records_per_s:.1f} rec/s | utilization {self.utilization:.1%} | "
            f"wait p50 {_ms(self.queue_wait_s.p50)} p99 {_ms(self.queue_wait_s.p99)} | "
            f"latency p50 {_ms(self.latency_s.p50)} p99 {_ms(self.latency_s.p99)} | "
            f"batches: {reasons or 'none'}"
        )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}ms" if seconds < 10 else f"{seconds:.1f}s"


class StatsRecorder:
    """The batcher's live counters. All methods run on the batcher's event loop thread."""

    def __init__(self) -> None:
        self.submitted = 0
        self.completed = 0
        self.failed = 0
        self.cancelled = 0
        self.oversized = 0
        self.batches = 0
        self.total_cost = 0
        self.reasons: dict[str, int] = dict.fromkeys(DISPATCH_REASONS, 0)
        self.queue_wait = LogHistogram()
        self.latency = LogHistogram()
        self.batch_size = LogHistogram(floor=1.0)
        self.batch_cost = LogHistogram(floor=1.0)
        self._in_system = 0
        self._active_since = 0.0
        self._active_total = 0.0
        self._inflight = 0
        self._busy_since = 0.0
        self._busy_total = 0.0

    def record_submit(self, now: float) -> None:
        self.submitted += 1
        if not self._in_system:
            self._active_since = now
        self._in_system += 1

    def record_dropped(self, now: float, count: int, *, cancelled: bool) -> None:
        """Records that left before running: cancelled by the caller, or failed with the batcher."""
        if cancelled:
            self.cancelled += count
        self._leave(now, count)

    def record_dispatch(self, now: float, submitted_at: list[float], cost: int, reason: DispatchReason) -> None:
        self.batches += 1
        self.total_cost += cost
        self.reasons[reason] += 1
        self.batch_size.add(len(submitted_at))
        self.batch_cost.add(max(cost, 1))
        wait = self.queue_wait.add
        for at in submitted_at:
            wait(now - at)
        if not self._inflight:
            self._busy_since = now
        self._inflight += 1

    def record_settled(self, now: float, submitted_at: list[float], failed: int) -> None:
        """Records that went through the process function and whose futures are now resolved."""
        self.completed += len(submitted_at)
        self.failed += failed
        latency = self.latency.add
        for at in submitted_at:
            latency(now - at)
        self._leave(now, len(submitted_at))

    def record_batch_done(self, now: float) -> None:
        self._inflight -= 1
        if not self._inflight:
            self._busy_total += now - self._busy_since

    def _leave(self, now: float, count: int) -> None:
        self._in_system -= count
        if not self._in_system:
            self._active_total += now - self._active_since

    def snapshot(self, now: float, *, queue_depth: int) -> BatchStats:
        active = self._active_total + (now - self._active_since if self._in_system else 0.0)
        busy = self._busy_total + (now - self._busy_since if self._inflight else 0.0)
        batches = self.batches
        batch_size = self.batch_size.summary()
        return BatchStats(
            total_submitted=self.submitted,
            total_completed=self.completed,
            total_batches=batches,
            total_batch_cost=self.total_cost,
            avg_batch_size=batch_size.mean,
            avg_batch_cost=self.total_cost / batches if batches else 0.0,
            busy_time_s=busy,
            idle_time_s=max(active - busy, 0.0),
            total_failed=self.failed,
            total_cancelled=self.cancelled,
            total_oversized=self.oversized,
            active_time_s=active,
            records_per_s=self.completed / active if active > 0 else 0.0,
            batches_by_reason=dict(self.reasons),
            queue_wait_s=self.queue_wait.summary(),
            latency_s=self.latency.summary(),
            batch_size=batch_size,
            batch_cost=self.batch_cost.summary(),
            queue_depth=queue_depth,
            inflight_batches=self._inflight,
        )
