"""What the batcher measured against its latency target (`latency_slo_s`), and what its controller chose.

`SloTally` is the live side: each completed record's latency against its priority's target, the
latest latencies of each priority (the controller calibrates its model on them), and the
controller's latest choice and verdict (`_pipeline/slo_control.py` writes them). `SloStats` is the snapshot
users read as `BatchStats.slo`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

RECENT = 512
"""Latest latencies kept per priority: enough for a p99 of the last second at a few hundred records per second."""


@dataclass(frozen=True)
class SloChoice:
    """What the controller chose last, from its model of the batches' time and the load it sees.

    Attributes:
        batch_time_s: The longest a batch may take, as the model predicts it: a batch grows (in cost
            order with `grouping="by_cost"`, else in submission order) while its predicted time stays
            within this. Batches of cheap records hold more records than batches of costly ones.
        batch_size: Records in a typical batch of that time, with the records seen lately.
        batch_cost: Summed cost of such a batch: waiting records of that cost count as a full batch.
        wait_s: The longest a record waits for its batch to fill (`batch_timeout_s` at most).
        in_flight_cost: The bound on the summed cost of the batches in flight.

    Example:
        ```python
        choice = batcher.stats.slo.choice
        print(f"batches of up to {choice.batch_time_s * 1000:.0f} ms, about {choice.batch_size:.0f} records")
        ```
    """

    batch_time_s: float
    batch_size: float
    batch_cost: float
    wait_s: float
    in_flight_cost: int


@dataclass(frozen=True)
class SloClassStats:
    """One priority's latency target and how its records fare.

    Attributes:
        latency_slo_s: The priority's target, in seconds: its setting, or the tightest target its
            records carried (`submit(latency_slo_s=...)`) when that is tighter.
        completed: Records of the priority that completed with a target (they count against it).
        met: Those whose latency was within their target (a record's own, else the priority's).
        recent_s: The `slo_quantile` of the latest completed records' latencies (up to 512 of them).
        predicted_s: The model's prediction of that quantile for the current choice and load.
        arrivals_per_s: Records submitted per second at this priority or above (they go before it).
        overloaded: No choice can meet the target at the load the priority sees.

    Example:
        ```python
        online = batcher.stats.slo.by_priority[10]
        if online.overloaded:  # a server answers new online requests 429
            print(f"{online.met_fraction:.1%} within {online.latency_slo_s}s, p99 lately {online.recent_s:.3f}s")
        ```
    """

    latency_slo_s: float
    completed: int = 0
    met: int = 0
    recent_s: float = 0.0
    predicted_s: float = 0.0
    arrivals_per_s: float = 0.0
    overloaded: bool = False

    @property
    def met_fraction(self) -> float:
        """Share of the completed records that met the target (1.0 before any completed)."""
        return self.met / self.completed if self.completed else 1.0


@dataclass(frozen=True)
class SloStats:
    """The latency target, the share of records that met it, and the controller's choice (`BatchStats.slo`).

    Attributes:
        latency_slo_s: The setting: seconds for every record, or `{priority: seconds}`.
        quantile: The share of records that must meet it (`slo_quantile`).
        completed: Completed records that had a target.
        met: Those that met it.
        overloaded: At the load offered, no choice meets the target of some priority: records of
            that priority will miss it until the load falls (a server answers 429 to new ones).
            Logged once as a warning each time it starts.
        choice: The controller's current choice; `None` until it has timed a few batches.
        arrivals_per_s: Records submitted per second, lately.
        sustainable_per_s: The highest load, in records per second with the current mix of
            priorities and costs, at which the model predicts every target met.
        by_priority: Each priority with a target that records have used, with its own figures.
        model: The learned batch time: `overhead_s + per_record_s * records + per_cost_s * cost +
            per_padded_cost_s * records * max_cost + per_in_flight_cost_s * cost_in_flight`.

    Example:
        ```python
        slo = batcher.stats.slo
        print(f"{slo.met_fraction:.1%} within {slo.latency_slo_s}s; batches of up to {slo.choice.batch_time_s:.3f}s")
        if slo.overloaded:
            print(f"more load than fits: about {slo.sustainable_per_s:.0f} records/s would")
        ```
    """

    latency_slo_s: float | Mapping[int, float]
    quantile: float
    completed: int = 0
    met: int = 0
    overloaded: bool = False
    choice: SloChoice | None = None
    arrivals_per_s: float = 0.0
    sustainable_per_s: float = 0.0
    by_priority: dict[int, SloClassStats] = field(default_factory=dict)
    model: dict[str, float] = field(default_factory=dict)

    @property
    def met_fraction(self) -> float:
        """Share of the completed records that met their target (1.0 before any completed)."""
        return self.met / self.completed if self.completed else 1.0

    def summary(self) -> str:
        """A few words for `BatchStats.summary`: the share met, and the overload if there is one."""
        overloaded = " OVERLOADED" if self.overloaded else ""
        chosen = f", batches <= {self.choice.batch_time_s * 1000:.0f}ms" if self.choice is not None else ""
        return f"slo {self.met_fraction:.1%} met (target {self.quantile:.0%}){chosen}{overloaded}"


@dataclass
class SloVerdict:
    """The controller's latest word on one priority (written by `_pipeline/slo_control.py`)."""

    predicted_s: float = 0.0
    arrivals_per_s: float = 0.0
    overloaded: bool = False


class _Priority:
    """A priority's completed records against its target, and its latest latencies."""

    __slots__ = ("completed", "met", "recent", "slo_s")

    def __init__(self, slo_s: float) -> None:
        self.slo_s = slo_s
        self.completed = 0
        self.met = 0
        self.recent: deque[tuple[float, float]] = deque(maxlen=RECENT)  # (ended at, latency)


class SloTally:
    """Completed records against their targets, and the controller's latest choice and verdicts.

    Lives as long as its batcher, across restarts; changed on the batcher's event loop only.

    Args:
        latency_slo_s: The setting (seconds, or `{priority: seconds}`).
        quantile: `slo_quantile`.
        slo_of: A priority's target (`BatcherSettings.slo_of`).
    """

    def __init__(
        self, latency_slo_s: float | Mapping[int, float], quantile: float, slo_of: Callable[[int], float | None]
    ) -> None:
        self.latency_slo_s = latency_slo_s
        self.quantile = quantile
        self._slo_of = slo_of
        self._priorities: dict[int, _Priority | None] = {}
        self.choice: SloChoice | None = None
        self.verdicts: dict[int, SloVerdict] = {}
        self.arrivals_per_s = 0.0
        self.sustainable_per_s = 0.0
        self.model: dict[str, float] = {}

    def settled(
        self,
        now: float,
        priorities: Sequence[int],
        latencies: Sequence[float],
        own_targets: Sequence[float | None],
    ) -> None:
        """Records that completed: each one's priority, latency (seconds from submit to `now`) and own target.

        A record with its own target (`submit(latency_slo_s=...)`) counts against it; the others
        against their priority's setting, and not at all when it has none.
        """
        for priority, latency, own in zip(priorities, latencies, own_targets, strict=True):
            tally = self.priority(priority, own)
            slo_s = own if own is not None else self._slo_of(priority)
            if tally is None or slo_s is None:
                continue
            tally.completed += 1
            tally.met += latency <= slo_s
            tally.recent.append((now, latency))

    def priority(self, priority: int, own_target: float | None = None) -> _Priority | None:
        """The tally of a priority's records (`None`: they have no target).

        A record's own target makes a tally for a priority without a setting, and the tally's target
        is the tightest its records had.
        """
        try:
            tally = self._priorities[priority]
        except KeyError:
            slo_s = self._slo_of(priority)
            tally = self._priorities[priority] = None if slo_s is None else _Priority(slo_s)
        if own_target is not None:
            if tally is None:
                tally = self._priorities[priority] = _Priority(own_target)
            tally.slo_s = min(tally.slo_s, own_target)
        return tally

    def recent_quantile(self, priority: int, since: float, least: int) -> float | None:
        """The `quantile` of the latencies of `priority`'s latest records that arrived after `since`.

        `None` when fewer than `least` of them have completed.
        """
        tally = self.priority(priority)
        if tally is None:
            return None
        latest = sorted(latency for ended, latency in tally.recent if ended - latency > since)
        if len(latest) < least:
            return None
        return latest[min(len(latest) - 1, math.ceil(self.quantile * len(latest)) - 1)]

    @property
    def overloaded(self) -> bool:
        """Whether some priority is overloaded."""
        return any(verdict.overloaded for verdict in self.verdicts.values())

    def snapshot(self) -> SloStats:
        """The figures as of now."""
        by_priority = {
            priority: self._class_stats(priority, tally)
            for priority, tally in sorted(self._priorities.items(), reverse=True)
            if tally is not None
        }
        return SloStats(
            latency_slo_s=self.latency_slo_s,
            quantile=self.quantile,
            completed=sum(stats.completed for stats in by_priority.values()),
            met=sum(stats.met for stats in by_priority.values()),
            overloaded=self.overloaded,
            choice=self.choice,
            arrivals_per_s=self.arrivals_per_s,
            sustainable_per_s=self.sustainable_per_s,
            by_priority=by_priority,
            model=dict(self.model),
        )

    def _class_stats(self, priority: int, tally: _Priority) -> SloClassStats:
        verdict = self.verdicts.get(priority, SloVerdict())
        recent = self.recent_quantile(priority, -math.inf, 1)
        return SloClassStats(
            latency_slo_s=tally.slo_s,
            completed=tally.completed,
            met=tally.met,
            recent_s=recent or 0.0,
            predicted_s=verdict.predicted_s,
            arrivals_per_s=verdict.arrivals_per_s,
            overloaded=verdict.overloaded,
        )


def describe(value: Any) -> str:
    """A target for a log line: `0.25s`, or `{10: 0.25s, 0: 30s}`."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{key}: {seconds:g}s" for key, seconds in value.items()) + "}"
    return f"{value:g}s"
