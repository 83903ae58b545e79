"""`ReplicaSnapshot`: a replica's batcher, engine and device, as seen when it finished a chunk."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flyteplugins_batcher import BatchStats, Timeline
from flyteplugins_batcher.engines import EngineStats


@dataclass
class ReplicaSnapshot:
    """One replica's engine and shared batcher, as seen at the end of a chunk (since the replica started).

    The engine counters (`engine_steps`, `running_seqs`, `max_num_seqs`, `engine_busy_s`) are
    cumulative, so how full the engine was between two snapshots of a replica is
    `later.engine_counts().since(earlier.engine_counts()).occupancy`.
    `timeline` is the batcher's (`BatchStats.timeline`): when each batch was at the model, since the
    replica started (bounded; the report draws it). `loaded_at` is when its model's load ended (epoch
    seconds, 0.0 where it never loaded): with `load_time_s` it places the load in time, so that a run
    counts only the part of it that fell inside the run.
    """

    replica: str = ""
    model: str = ""
    load_time_s: float = 0.0
    loaded_at: float = 0.0
    records: int = 0
    batches: int = 0
    avg_batch_size: float = 0.0
    avg_batch_tokens: float = 0.0
    utilization: float = 0.0
    device_utilization: float = -1.0  # the GPU's own (NVML); -1 where it cannot be asked
    device_note: str = ""
    records_per_s: float = 0.0
    latency_p50_s: float = 0.0
    latency_p99_s: float = 0.0
    queue_wait_p99_s: float = 0.0
    batches_by_reason: dict[str, int] = field(default_factory=dict)
    padding_efficiency: float = 1.0
    completion_tokens_per_s: float = 0.0
    engine_steps: int = 0  # steps of an engine that schedules sequences itself (vLLM, simulated); 0 for others
    running_seqs: int = 0  # sequences running in each step, summed over the steps
    max_num_seqs: int = 0  # the engine's capacity (0 where it has none)
    occupancy: float | None = None  # running sequences per step over max_num_seqs since it started; None: no steps
    engine_busy_s: float = 0.0  # seconds with at least one request in the engine
    timeline: Timeline = field(default_factory=Timeline)

    def engine_counts(self) -> EngineStats:
        """The engine counters as `EngineStats`, for `since()` and `occupancy`."""
        return EngineStats(
            steps=self.engine_steps,
            running_seqs=self.running_seqs,
            max_num_seqs=self.max_num_seqs,
            generate_time_s=self.engine_busy_s,
        )

    @staticmethod
    def engine_fields(stats: EngineStats) -> dict[str, Any]:
        """A snapshot's fields taken from the replica's engine `stats` (pass them to `of_batcher`)."""
        return {
            "load_time_s": stats.load_time_s,
            "loaded_at": stats.loaded_at,
            "padding_efficiency": stats.padding_efficiency,
            "completion_tokens_per_s": stats.completion_tokens_per_s,
            "engine_steps": stats.steps,
            "running_seqs": stats.running_seqs,
            "max_num_seqs": stats.max_num_seqs,
            "occupancy": stats.occupancy if stats.steps else None,
            "engine_busy_s": stats.generate_time_s,
        }

    @classmethod
    def of_batcher(cls, stats: BatchStats, **fields: Any) -> ReplicaSnapshot:
        """A snapshot with the batching fields taken from the replica's batcher `stats`, and `fields` for the rest."""
        return cls(
            records=stats.total_completed,
            batches=stats.total_batches,
            avg_batch_size=stats.avg_batch_size,
            avg_batch_tokens=stats.avg_batch_cost,
            utilization=stats.utilization,
            records_per_s=stats.records_per_s,
            latency_p50_s=stats.latency_s.p50,
            latency_p99_s=stats.latency_s.p99,
            queue_wait_p99_s=stats.queue_wait_s.p99,
            batches_by_reason=dict(stats.batches_by_reason),
            timeline=stats.timeline,
            **fields,
        )
