"""A run's inference time: its wall time less the model loads inside it, never 0 for a run that computed answers.

Each way it came out 0 before: a load the process had done before the run counted in it (a replica whose
batcher started in the run, over a model loaded earlier), a load that began before the run counted whole
(a command line's preload), loads that overlapped counted twice, and a wall time measured by a clock that
the system may set back. Where the time cannot be known, the run says "not measured", not a number.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from flyteplugins_batcher import Timeline
from flyteplugins_batcher.jobs import RunSummary, _driver, fan_out
from flyteplugins_batcher.jobs._driver import FanOutStats
from flyteplugins_batcher.jobs._report import final_html
from flyteplugins_batcher.jobs._summary import Counts, summary_line
from flyteplugins_batcher.replica import ChunkOutcome, ReplicaSnapshot

STARTED = 1_000.0
"""When the runs below started (epoch seconds)."""


def ran(*snapshots: ReplicaSnapshot, wall_s: float, phases: list[object] | None = None) -> FanOutStats:
    """What a run of `wall_s` from `STARTED` saw: a chunk finished just before its end by each replica."""
    stats = FanOutStats(started_at=STARTED, wall_s=wall_s)
    for snapshot, phase in zip(snapshots, phases or [None] * len(snapshots), strict=True):
        stats.record(ChunkOutcome(0, [], snapshot, finished_at=STARTED + wall_s - 0.1), STARTED, phase)
    return stats


def loaded(seconds: float, ended_at: float, *, replica: str = "r", model: str = "m") -> ReplicaSnapshot:
    """A replica whose model's load took `seconds` and ended at `ended_at`, and whose batcher started in the run."""
    batcher = Timeline(origin_s=STARTED + 0.5)
    return ReplicaSnapshot(
        replica=replica, model=model, load_time_s=seconds, loaded_at=ended_at, records=4, timeline=batcher
    )


def test_a_model_the_process_loaded_before_the_run_costs_the_run_nothing() -> None:
    # A replica's batcher may start in the run over a model its process loaded earlier (the embedding model is
    # loaded once per process, whatever replica asks): only when the load happened says whose it was.
    stats = ran(loaded(20.0, ended_at=STARTED - 5.0), wall_s=3.0)

    assert stats.load_time_s == 0.0 and stats.inference_s == pytest.approx(3.0)
    assert stats.per_second(4) == pytest.approx(4 / 3.0)


def test_a_load_that_began_before_the_run_counts_from_the_runs_start() -> None:
    # A command line loads its engine while flyte starts, before the fan-out: 20 s of load, 2 s of it in the run.
    stats = ran(loaded(20.0, ended_at=STARTED + 2.0), wall_s=5.0)

    assert stats.load_time_s == pytest.approx(2.0) and stats.inference_s == pytest.approx(3.0)
    assert stats.model_loads == {"m": pytest.approx(2.0)}


def test_loads_that_overlap_count_once_and_each_phase_counts_its_slowest() -> None:
    chat = loaded(6.0, ended_at=STARTED + 6.0, replica="llm", model="chat")
    slower_chat = loaded(7.0, ended_at=STARTED + 7.5, replica="llm2", model="chat")
    embeddings = loaded(3.0, ended_at=STARTED + 4.0, replica="embed", model="minilm")  # beside the chat model's
    later = loaded(2.0, ended_at=STARTED + 12.0, replica="llm", model="other")  # the next phase's, once alone

    stats = ran(chat, slower_chat, embeddings, later, wall_s=20.0, phases=[0, 0, None, 1])

    assert stats.load_time_s == pytest.approx(7.0 + 2.0)  # the embedding model's load fell inside the chat's
    assert stats.inference_s == pytest.approx(20.0 - 9.0)


def test_a_load_the_run_cannot_place_in_time_leaves_the_inference_time_not_measured() -> None:
    unplaced = ReplicaSnapshot(replica="r", model="m", load_time_s=2.0, records=4)  # no loaded_at

    stats = ran(unplaced, wall_s=5.0)

    assert stats.inference_s is None and stats.per_second(4) is None


def test_loads_that_fill_the_run_by_a_replicas_clock_leave_it_not_measured() -> None:
    ahead = loaded(10.0, ended_at=STARTED + 9.0)  # a replica whose clock runs ahead of the driver's

    stats = ran(ahead, wall_s=5.0)

    assert stats.load_time_s == pytest.approx(5.0) and stats.inference_s is None


def test_a_summary_says_not_measured_rather_than_zero() -> None:
    counts = Counts()
    for _ in range(4):
        counts.count(failed=False, completion_tokens=5)
    unknown = ran(ReplicaSnapshot(replica="r", model="m", load_time_s=2.0, records=4), wall_s=5.0)

    summary = RunSummary.of("docs", counts, unknown)
    line = summary_line(summary, "rows")
    html = final_html(summary, unknown.replicas, "", noun="rows", started_at=STARTED)

    assert (summary.inference_s, summary.requests_per_s, summary.output_tokens_per_s) == (None, None, None)
    assert "rows/s not measured" in line and "output tokens/s not measured" in line
    assert "inference not measured" in line and "0.00" not in line
    assert html.count("not measured") == 3  # the rate, the tokens' rate and the inference time


@dataclass(frozen=True)
class Chunk:
    index: int


async def two_chunks() -> AsyncIterator[Chunk]:
    for index in range(2):
        yield Chunk(index)


def test_the_wall_time_is_measured_by_a_clock_the_system_cannot_set_back(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([STARTED, STARTED - 3600.0])  # the system's clock set back an hour during the run

    def epoch() -> float:
        return next(readings, STARTED - 3600.0)

    monkeypatch.setattr(_driver, "time", SimpleNamespace(time=epoch, monotonic=time.monotonic))

    async def answer(chunk: Chunk) -> ChunkOutcome:
        await asyncio.sleep(0.01)
        return ChunkOutcome(chunk.index, [], ReplicaSnapshot(replica="r", model="m", records=1), finished_at=STARTED)

    async def keep(chunk: Chunk, outcome: object, reason: str) -> None:
        pass

    stats = asyncio.run(fan_out(two_chunks(), answer, keep, max_in_flight=1))

    assert stats.wall_s >= 0.02 and stats.inference_s == stats.wall_s and stats.per_second(2) > 0
