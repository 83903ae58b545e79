"""The final report: the GPU column says n/a with one note, and the charts draw the replicas' timelines faithfully."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from flyte.io import File
from flyte.types import TypeEngine

from flyteplugins_batcher import Timeline
from flyteplugins_batcher._measure.timeline import TimelineRecorder
from flyteplugins_batcher.jobs import RunSummary
from flyteplugins_batcher.jobs._report import final_html
from flyteplugins_batcher.jobs._report_charts import (
    RATE_BUCKETS,
    STRIP_COLUMNS,
    busy_runs,
    busy_shares,
    chart_series,
    mean_batch_sizes,
    rates,
    run_axis,
)
from flyteplugins_batcher.jobs._report_svg import TimeAxis, nice_step
from flyteplugins_batcher.replica import ChunkOutcome, ReplicaSnapshot

NO_NVML = "not available: nvidia-ml-py is not installed (it comes with the GPU image)"


def summary(wall_s: float = 10.0) -> RunSummary:
    nowhere = File(path="/tmp/results.jsonl")
    return RunSummary(
        "sample",
        10,
        10,
        0,
        inference_s=wall_s,
        requests_per_s=1.0,
        output_tokens_per_s=10.0,
        results=nowhere,
        errors=nowhere,
    )


def timeline(origin: float, *points: tuple[float, float, int, int]) -> Timeline:
    """A timeline of single batches: (start, end, records, output tokens) each."""
    return Timeline(
        origin_s=origin,
        start_s=[point[0] for point in points],
        end_s=[point[1] for point in points],
        busy_s=[point[1] - point[0] for point in points],
        batches=[1] * len(points),
        records=[point[2] for point in points],
        cost=[10 * point[2] for point in points],
        output_tokens=[point[3] for point in points],
    )


def test_the_gpu_column_says_n_a_and_one_note_under_the_table_says_why() -> None:
    replicas = [ReplicaSnapshot(replica=name, device_note=NO_NVML, utilization=1.0) for name in ("a", "b")]

    page = final_html(summary(), replicas)

    assert page.count('<td class="na">n/a</td>') == 2
    assert "GPU utilization" not in page
    assert page.count("100% busy, GPU n/a, avg batch 0.0") == 2
    notes = re.findall(r'<p class="note">GPU \(NVML\) n/a: (.*?)</p>', page)
    assert notes == ["nvidia-ml-py is not installed (it comes with the GPU image)."]


def test_a_gpu_that_answered_shows_its_utilization_and_no_note() -> None:
    page = final_html(summary(), [ReplicaSnapshot(replica="a", device_utilization=0.93, device_note="NVML, GPU 0")])
    assert "<td>93%</td>" in page and "GPU 93%" in page
    assert "n/a:" not in page


def test_the_charts_keep_to_this_run_of_a_replica_that_served_an_earlier_one() -> None:
    served = timeline(1_000.0, (0.0, 1.0, 4, 40), (3_600.0, 3_601.0, 4, 40), (3_602.0, 3_604.0, 8, 80))

    axis = run_axis([ReplicaSnapshot(replica="a", timeline=served)], wall_s=5.0)

    assert axis == TimeAxis(1_000.0 + 3_604.0 - 5.0, 1_000.0 + 3_604.0)
    assert run_axis([ReplicaSnapshot(replica="a", timeline=served)], 5.0, started_at=4_601.0) == TimeAxis(
        4_601.0, 4_604.0
    )
    assert run_axis([ReplicaSnapshot(replica="a")], wall_s=5.0) is None
    assert "No replica recorded a batch timeline" in final_html(summary(), [ReplicaSnapshot(replica="a")])


def test_the_charts_draw_each_point_where_and_as_much_as_it_was() -> None:
    # busy 0-2s and 6-7s of a 10s run; 300 tokens at 0-2s, 100 at 6-7s
    busy = timeline(0.0, (0.0, 2.0, 8, 300), (6.0, 7.0, 2, 100))
    series = chart_series([ReplicaSnapshot(replica="a", timeline=busy)])
    axis = TimeAxis(0.0, 10.0)

    shares = busy_shares(series[0], axis)
    assert sum(shares) / STRIP_COLUMNS == pytest.approx(0.3)
    runs = busy_runs(shares)
    assert [(first * 10 / STRIP_COLUMNS, count * 10 / STRIP_COLUMNS, shade) for first, count, shade in runs] == [
        (0.0, 2.0, 1.0),
        (6.0, 1.0, 1.0),
    ]
    tokens_per_s = rates(series[0], axis, tokens=True)
    assert sum(tokens_per_s) * 10 / RATE_BUCKETS == pytest.approx(400)
    assert max(tokens_per_s) == pytest.approx(150) and tokens_per_s[-1] == 0
    sizes = [size for size in mean_batch_sizes(series[0], axis) if size is not None]
    assert sizes == [8, 2]


def test_merged_points_draw_their_busy_share_paler() -> None:
    merged = replace(timeline(0.0, (0.0, 4.0, 8, 0)), busy_s=[1.0], batches=[2])  # two batches busy 1s of 4s
    series = chart_series([ReplicaSnapshot(replica="a", timeline=merged)])[0]
    runs = busy_runs(busy_shares(series, TimeAxis(0.0, 4.0)))
    assert runs == [(0, STRIP_COLUMNS, 0.25)]
    assert set(mean_batch_sizes(series, TimeAxis(0.0, 4.0))) == {None, 4.0}


def test_time_ticks_are_round_seconds() -> None:
    assert nice_step(10, 8) == 2 and nice_step(0.9, 8) == 0.2 and nice_step(3600, 8) == 500
    assert [label for _, label in TimeAxis(0.0, 1.0).ticks()] == ["0.0s", "0.2s", "0.4s", "0.6s", "0.8s", "1.0s"]
    assert TimeAxis(0.0, 75.0).ticks()[-1][1] == "70s"


async def test_a_snapshot_carries_its_timeline_across_the_task_boundary() -> None:
    recorder = TimelineRecorder()
    for n in range(3_000):
        recorder.add(n * 0.01, n * 0.01 + 0.005, records=8, cost=100, output_tokens=50)
    outcome = ChunkOutcome(0, [], ReplicaSnapshot(replica="a", timeline=recorder.snapshot()), finished_at=1.0)

    literal = await TypeEngine.to_literal(outcome, ChunkOutcome, TypeEngine.to_literal_type(ChunkOutcome))
    back = await TypeEngine.to_python_value(literal, ChunkOutcome)

    assert back.replica.timeline == outcome.replica.timeline
    assert sum(back.replica.timeline.records) == 24_000
    assert len(literal.SerializeToString()) < 100_000  # bounded, however many batches ran


def test_the_table_report_draws_the_replicas_this_run_used():
    from flyte.io import DataFrame

    from flyteplugins_batcher.jobs._driver import FanOutStats
    from flyteplugins_batcher.replica import EmbeddingOutcome

    output = DataFrame.from_existing_remote("/tmp/table", format="parquet")
    run = RunSummary(
        "docs", 4, 4, 0, inference_s=5.0, requests_per_s=0.8, output=output, dimensions=384, padding_efficiency=0.9
    )

    def chunk(finished_at: float, name: str, records: int) -> EmbeddingOutcome:
        snapshot = ReplicaSnapshot(replica=name, records=records, timeline=timeline(1000.0, (1.0, 2.0, records, 0)))
        return EmbeddingOutcome(0, [], snapshot, finished_at=finished_at)

    fanned, reused_only = FanOutStats(), FanOutStats()
    earlier_run = chunk(900.0, "host/1 (embeddings)", 2)  # reused from the cache: another run's replica
    for stats, outcome in ((fanned, earlier_run), (fanned, chunk(1002.0, "host/2 (embeddings)", 2))):
        stats.record(outcome, started=1000.0)
    reused_only.record(earlier_run, started=1000.0)
    page = final_html(run, fanned.replicas, noun="documents", started_at=1000.0)
    assert "Where the time went" in page and ">384<" in page and ">90%<" in page
    assert "host/2" in page and "host/1" not in page
    assert "No replica reported" in final_html(run, reused_only.replicas, started_at=1000.0)
