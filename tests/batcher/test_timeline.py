"""The batcher's timeline: one point per call of the process function, bounded, with exact totals."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import pytest

import flyteplugins_batcher as ours
from flyteplugins_batcher import Timeline
from flyteplugins_batcher._measure.timeline import MAX_POINTS, TimelineRecorder, completion_tokens


@dataclass
class Generated:
    """A result that counts its tokens, as the engines' `Completion` does."""

    completion_tokens: int


def generate(batch: list[int]) -> list[Generated]:
    time.sleep(0.005)
    return [Generated(record % 5 + 1) for record in batch]


async def test_each_batch_is_a_point_with_its_records_cost_and_output_tokens() -> None:
    async with ours.TokenBatcher(generate, max_batch_size=4, batch_timeout_s=0.01) as batcher:
        for record in range(10):
            await batcher.submit(record, estimated_tokens=10 + record)
        await asyncio.sleep(0.05)
        await asyncio.gather(*await batcher.submit_batch(range(10, 17), estimated_tokens=[10] * 7))
    stats = batcher.stats
    timeline = stats.timeline

    assert timeline.points == stats.total_batches
    assert sum(timeline.batches) == stats.total_batches
    assert sum(timeline.records) == stats.total_completed == 17
    assert sum(timeline.cost) == stats.total_batch_cost == sum(10 + record for record in range(10)) + 70
    assert sum(timeline.output_tokens) == sum(record % 5 + 1 for record in range(17))
    assert all(0 <= start < end for start, end in zip(timeline.start_s, timeline.end_s, strict=True))
    # one batch at a time: the points' busy seconds are the busy clock's, taken at the same moments
    assert sum(timeline.busy_s) == pytest.approx(stats.busy_time_s, rel=1e-6)
    assert timeline.origin_s == pytest.approx(time.time(), abs=60)


async def test_results_that_count_no_tokens_record_none_and_a_failing_batch_is_one_point_per_call() -> None:
    def picky(batch: list[int]) -> list[int]:
        if 0 in batch and len(batch) > 1:
            raise ValueError("zero spoils the batch")
        return batch

    async with ours.DynamicBatcher(picky, max_batch_size=4, on_error="split") as batcher:
        futures = await batcher.submit_batch(range(4), estimated_cost=[1, 2, 3, 4])
        await asyncio.gather(*futures)
    timeline = batcher.stats.timeline

    # [0 1 2 3] fails, then [0 1] fails, then [0], [1] and [2 3] run
    assert sorted(timeline.records) == [1, 1, 2, 2, 4]
    assert sorted(timeline.cost) == [1, 2, 3, 7, 10]  # each part's own cost: [0], [1], [0 1], [2 3], all
    assert timeline.output_tokens == [0] * 5


def test_a_full_recorder_merges_neighbours_and_keeps_every_total() -> None:
    recorder = TimelineRecorder(max_points=100)
    for n in range(10_000):
        recorder.add(n * 1.0, n + 0.25, records=n % 7, cost=3, output_tokens=2)
    timeline = recorder.snapshot()

    assert 50 <= timeline.points < 100
    assert sum(timeline.batches) == 10_000
    assert sum(timeline.records) == sum(n % 7 for n in range(10_000))
    assert sum(timeline.cost) == 30_000 and sum(timeline.output_tokens) == 20_000
    assert sum(timeline.busy_s) == pytest.approx(2_500)
    origin = timeline.origin_s
    span = timeline.span()
    assert span is not None
    assert span[0] - origin == pytest.approx(min(timeline.start_s)) and span[1] - span[0] == pytest.approx(9_999.25)
    assert timeline.start_s == sorted(timeline.start_s)
    assert all(busy <= end - start + 1e-9 for start, end, busy in _spans(timeline))


def test_overlapping_batches_merge_into_no_more_busy_time_than_their_span() -> None:
    recorder = TimelineRecorder(max_points=2)
    recorder.add(0.0, 1.0, records=1, cost=1, output_tokens=0)
    recorder.add(0.5, 1.5, records=1, cost=1, output_tokens=0)  # a second runner, at the same time
    timeline = recorder.snapshot()
    assert timeline.points == 1
    assert timeline.busy_s[0] == pytest.approx(1.5)
    assert timeline.end_s[0] - timeline.start_s[0] == pytest.approx(1.5)


def test_the_default_bound_and_its_validation() -> None:
    assert MAX_POINTS == 2_000
    with pytest.raises(ValueError, match="at least 2"):
        TimelineRecorder(max_points=1)
    assert Timeline().span() is None and Timeline().points == 0


def test_completion_tokens_counts_results_that_have_them_only() -> None:
    assert completion_tokens([Generated(3), Generated(4)]) == 7
    assert completion_tokens([ValueError("bad prompt"), Generated(4)]) == 4  # a failed slot first
    assert completion_tokens([1, 2, 3]) == 0
    assert completion_tokens(None) == 0 and completion_tokens([]) == 0 and completion_tokens((Generated(1),)) == 0


async def test_batched_functions_and_json_stats_carry_the_timeline() -> None:
    @ours.batched(max_batch_size=3)
    async def double(batch: list[int]) -> list[int]:
        return [2 * record for record in batch]

    await asyncio.gather(*(double(record) for record in range(7)))
    plain = json.loads(json.dumps(double.stats.as_dict()))
    assert sum(plain["timeline"]["records"]) == 7
    assert len(plain["timeline"]["start_s"]) == double.stats.total_batches
    await double.aclose()


def _spans(timeline: Timeline) -> list[tuple[float, float, float]]:
    return list(zip(timeline.start_s, timeline.end_s, timeline.busy_s, strict=True))
