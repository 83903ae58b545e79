"""Stats worth reading: utilization over the active window, percentiles, reasons, summary."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

import flyteplugins_batcher as ours


def busy_model(batch: list[int]) -> list[int]:
    time.sleep(0.02)
    return batch


async def test_utilization_ignores_idle_time_before_the_first_submit_and_between_jobs():
    started = time.monotonic()
    async with ours.DynamicBatcher(busy_model, max_batch_size=4) as batcher:
        await asyncio.sleep(0.3)  # a replica waiting for work: not "idle device"
        await batcher.run(range(16))
        await asyncio.sleep(0.3)
        await batcher.run(range(16))
    wall = time.monotonic() - started
    stats = batcher.stats
    assert stats.total_batches == 8
    # Bounds that hold on a loaded machine too: a sleep never ends early, and the 0.6 s of waiting is never active.
    assert 8 * 0.02 <= stats.busy_time_s <= stats.active_time_s <= wall - 0.6
    # Counting the waits would put utilization near busy / wall (about 0.2 on an idle machine).
    assert stats.utilization > 2 * stats.busy_time_s / wall


async def test_latency_percentiles_and_batch_distributions():
    async with ours.DynamicBatcher(busy_model, max_batch_size=5) as batcher:
        await batcher.run(range(20))
    stats = batcher.stats
    assert stats.batch_size.count == stats.total_batches == 4
    assert stats.batch_size.max == 5 and stats.batch_size.mean == 5
    assert stats.latency_s.count == 20
    assert 0.015 < stats.latency_s.p50 <= stats.latency_s.p95 <= stats.latency_s.p99 <= stats.latency_s.max + 1e-9
    assert stats.queue_wait_s.p99 <= stats.latency_s.p99
    assert stats.records_per_s == pytest.approx(20 / stats.active_time_s)
    assert sum(stats.batches_by_reason.values()) == 4


async def test_as_dict_is_json_ready_and_summary_is_one_line():
    async with ours.DynamicBatcher(busy_model) as batcher:
        await batcher.run(range(3))
    stats = batcher.stats
    plain = json.loads(json.dumps(stats.as_dict()))
    assert plain["total_completed"] == 3
    assert plain["latency_s"]["count"] == 3
    assert plain["utilization"] == pytest.approx(stats.utilization)
    line = stats.summary()
    assert "\n" not in line and "3/3 records" in line and "utilization" in line


async def test_percentiles_are_within_two_percent():
    async def echo(batch: list[int]) -> list[int]:
        return batch

    costs = list(range(1, 10_001))  # one record per batch: every batch cost is observed once, 1 .. 10 000
    async with ours.DynamicBatcher(echo, max_batch_size=1, max_queue_size=0) as batcher:
        await asyncio.gather(*[await batcher.submit(cost, estimated_cost=cost) for cost in costs])
    summary = batcher.stats.batch_cost
    assert summary.count == len(costs)
    for fraction, percentile in ((0.5, summary.p50), (0.95, summary.p95), (0.99, summary.p99)):
        exact = costs[int(fraction * len(costs)) - 1]
        assert percentile == pytest.approx(exact, rel=0.02)
    assert summary.min == 1 and summary.max == 10_000
    assert summary.mean == pytest.approx(sum(costs) / len(costs))


async def test_records_count_as_completed_when_they_resolve_not_when_their_batch_ends():
    seen_while_running: list[int] = []

    # async, so that each call runs on the loop, after the previous part's records were settled there
    async def picky(batch: list[int]) -> list[int]:
        if 0 in batch and len(batch) > 1:
            raise ValueError("zero spoils the batch")
        seen_while_running.append(batcher.stats.total_completed)
        if batch == [0]:
            raise ValueError("zero")
        return batch

    batcher = ours.DynamicBatcher(picky, on_error="split", batch_timeout_s=0.05)
    async with batcher:
        futures = await batcher.submit_batch([1, 2, 0, 3])
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
    assert outcomes[:2] == [1, 2] and outcomes[3] == 3 and isinstance(outcomes[2], ValueError)
    # split into [1, 2] and [0, 3], then [0] and [3]: each call saw the records already resolved
    assert seen_while_running == [0, 2, 3]
    assert batcher.stats.total_completed == 4 and batcher.stats.total_failed == 1


async def test_an_observer_sees_every_batch_and_every_settled_record_and_one_that_raises_is_dropped(caplog):
    class Seen:
        def __init__(self) -> None:
            self.batches: list[tuple[int, int, str, int]] = []
            self.settled: list[tuple[str, int, int]] = []

        def on_dispatch(self, size, cost, reason, queue_waits_s) -> None:
            self.batches.append((size, cost, reason, len(queue_waits_s)))

        def on_settled(self, outcome, latencies_s, failed) -> None:
            self.settled.append((outcome, len(latencies_s), failed))

    class Broken(Seen):
        def on_dispatch(self, size, cost, reason, queue_waits_s) -> None:
            raise RuntimeError("the exporter is down")

    def half_fail(batch: list[int]) -> list[int | Exception]:
        return [ValueError("odd") if record % 2 else record for record in batch]

    seen, broken = Seen(), Broken()
    async with ours.DynamicBatcher(half_fail, max_batch_size=4, default_cost=2) as batcher:
        batcher.add_observer(seen)
        batcher.add_observer(broken)
        results = await batcher.run(range(8), return_exceptions=True)

    assert [isinstance(result, ValueError) for result in results] == [False, True] * 4
    assert [(size, cost) for size, cost, _, _ in seen.batches] == [(4, 8), (4, 8)]
    assert all(waits == size for size, _, _, waits in seen.batches)
    reasons = batcher.stats.batches_by_reason
    assert sorted(reason for _, _, reason, _ in seen.batches) == sorted(r for r, n in reasons.items() for _ in range(n))
    assert sum(count for _, count, _ in seen.settled) == 8 and sum(failed for _, _, failed in seen.settled) == 4
    assert {outcome for outcome, _, _ in seen.settled} == {"completed"}
    assert broken.batches == [] and caplog.text.count("is no longer called") == 1
