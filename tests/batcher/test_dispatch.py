"""How batches are formed: the hard cost budget, timeouts, minimum size, bounded queues, concurrency."""

from __future__ import annotations

import asyncio
import time

import pytest

import flyteplugins_batcher as ours
from tests.batcher.conftest import fixed_in_ours, run_isolated


class CallLog:
    """An async process function that records every batch it sees."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.batches: list[list[object]] = []
        self.delay_s = delay_s

    async def __call__(self, batch: list[object]) -> list[object]:
        self.batches.append(list(batch))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return list(batch)


@fixed_in_ours("checks the budget before adding, so the record that crosses it always goes in")
async def test_no_batch_exceeds_the_cost_budget(impl):
    log = CallLog(delay_s=0.001)
    costs = [(i * 37) % 90 + 10 for i in range(400)]  # 10..99 tokens, budget 500
    async with impl.DynamicBatcher(process_fn=log, target_batch_cost=500, batch_timeout_s=0.01) as batcher:
        futures = [await batcher.submit(cost, estimated_cost=cost) for cost in costs]
        assert await asyncio.gather(*futures) == costs
    batch_costs = [sum(batch) for batch in log.batches]
    assert max(batch_costs) <= 500
    assert sum(len(batch) for batch in log.batches) == len(costs)


async def test_budget_batches_are_filled_close_to_the_budget():
    log = CallLog(delay_s=0.001)
    async with ours.DynamicBatcher(log, target_batch_cost=100, batch_timeout_s=1.0) as batcher:
        futures = [await batcher.submit(10, estimated_cost=10) for _ in range(100)]
        await asyncio.gather(*futures)
    assert [sum(batch) for batch in log.batches[1:]] == [100] * (len(log.batches) - 1)
    assert batcher.stats.batches_by_reason["budget"] >= 8


async def test_a_record_costlier_than_the_budget_runs_alone():
    log = CallLog()
    async with ours.DynamicBatcher(log, target_batch_cost=50, batch_timeout_s=0.02, max_batch_size=10) as batcher:
        futures = [await batcher.submit(value, estimated_cost=value) for value in (10, 80, 10)]
        assert await asyncio.gather(*futures) == [10, 80, 10]
    assert [80] in log.batches
    assert batcher.stats.total_oversized == 1


async def test_oversized_reject_raises_a_clear_error_at_submit():
    async with ours.DynamicBatcher(CallLog(), target_batch_cost=50, oversized="reject") as batcher:
        with pytest.raises(ours.CostBudgetExceededError, match="costs 80, more than target_batch_cost=50"):
            await batcher.submit("big", estimated_cost=80)
        assert await (await batcher.submit("small", estimated_cost=5)) == "small"


@fixed_in_ours("re-queues forever below min_batch_size instead of honouring the timeout")
def test_min_batch_size_gives_way_after_the_timeout(impl):
    log = CallLog()

    async def scenario() -> float:
        async with impl.DynamicBatcher(process_fn=log, min_batch_size=4, batch_timeout_s=0.05) as batcher:
            futures = await batcher.submit_batch(["a", "b"])
            started = time.monotonic()
            assert await asyncio.gather(*futures) == ["a", "b"]
            return time.monotonic() - started

    waited = run_isolated(scenario, 2.0)
    assert log.batches == [["a", "b"]]
    assert 0.03 <= waited < 1.0


async def test_min_batch_size_is_honoured_before_the_timeout():
    log = CallLog()
    async with ours.DynamicBatcher(log, min_batch_size=3, batch_timeout_s=0.5) as batcher:
        first = await batcher.submit_batch(["a", "b"])
        await asyncio.sleep(0.05)
        assert log.batches == []  # two records, minimum three, timeout not reached
        second = await batcher.submit_batch(["c"])
        assert await asyncio.gather(*first, *second) == ["a", "b", "c"]
    assert log.batches == [["a", "b", "c"]]
    assert batcher.stats.batches_by_reason["idle"] == 1


@fixed_in_ours("puts records back into the bounded queue and deadlocks when it is small")
def test_small_queue_with_min_batch_size_cannot_deadlock(impl):
    log = CallLog()

    async def closed_loop_producer(batcher, offset: int) -> list[object]:
        return [await (await batcher.submit(offset + i)) for i in range(3)]

    async def scenario() -> list[list[object]]:
        # Five producers, each waiting for its result: never 8 records at once, and only 2 fit the queue.
        async with impl.DynamicBatcher(process_fn=log, max_queue_size=2, min_batch_size=8, batch_timeout_s=0.02) as b:
            return await asyncio.gather(*(closed_loop_producer(b, 100 * p) for p in range(5)))

    results = run_isolated(scenario, 3.0)
    assert results == [[100 * p + i for i in range(3)] for p in range(5)]


async def test_timeout_counts_from_the_oldest_records_submission():
    log = CallLog()
    async with ours.DynamicBatcher(log, min_batch_size=100, batch_timeout_s=0.2) as batcher:
        started = time.monotonic()
        first = await batcher.submit("old")
        await asyncio.sleep(0.15)
        second = await batcher.submit("new")  # must not restart the clock
        await asyncio.gather(first, second)
        elapsed = time.monotonic() - started
    assert log.batches == [["old", "new"]]
    assert 0.18 <= elapsed < 0.34  # a restarted clock would give at least 0.35
    assert batcher.stats.batches_by_reason["timeout"] == 1


async def test_idle_engine_takes_waiting_records_at_once():
    log = CallLog(delay_s=0.05)
    async with ours.DynamicBatcher(log, batch_timeout_s=10.0) as batcher:
        started = time.monotonic()
        assert await (await batcher.submit("only")) == "only"
        assert time.monotonic() - started < 0.5  # not the 10 s timeout


async def test_records_arriving_during_a_batch_form_the_next_one():
    log = CallLog(delay_s=0.05)
    async with ours.DynamicBatcher(log, batch_timeout_s=10.0) as batcher:
        first = await batcher.submit(0)
        await asyncio.sleep(0.01)  # the first batch is in flight now
        rest = await batcher.submit_batch(list(range(1, 6)))
        await asyncio.gather(first, *rest)
    assert log.batches == [[0], [1, 2, 3, 4, 5]]


async def test_max_concurrent_batches_overlaps_and_routes_results():
    in_flight = 0
    peak = 0

    async def slow_square(batch: list[int]) -> list[int]:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.03)
        in_flight -= 1
        return [value * value for value in batch]

    async with ours.DynamicBatcher(slow_square, max_batch_size=4, max_concurrent_batches=3) as batcher:
        futures = await batcher.submit_batch(list(range(24)))
        assert await asyncio.gather(*futures) == [value * value for value in range(24)]
    assert peak == 3


async def test_max_in_flight_cost_bounds_the_cost_in_flight():
    in_flight_cost = 0
    peak_cost = 0

    async def one_at_a_time(batch: list[int]) -> list[int]:
        nonlocal in_flight_cost, peak_cost
        in_flight_cost += sum(batch)
        peak_cost = max(peak_cost, in_flight_cost)
        await asyncio.sleep(0.01)
        in_flight_cost -= sum(batch)
        return batch

    async with ours.TokenBatcher(
        inference_fn=one_at_a_time, max_batch_size=1, max_concurrent_batches=100, max_in_flight_tokens=100
    ) as batcher:
        futures = [await batcher.submit(cost, estimated_tokens=cost) for cost in [30] * 20]
        await asyncio.gather(*futures)
    assert peak_cost == 90


async def test_flush_dispatches_without_waiting_for_the_timeout():
    log = CallLog()
    async with ours.DynamicBatcher(log, min_batch_size=10, batch_timeout_s=30.0) as batcher:
        futures = await batcher.submit_batch(["a", "b"])
        batcher.flush()
        assert await asyncio.wait_for(asyncio.gather(*futures), timeout=1.0) == ["a", "b"]
    assert batcher.stats.batches_by_reason["drain"] == 1


async def test_submit_blocks_exactly_where_flyte_extras_does(impl):
    release = asyncio.Event()

    async def gated(batch: list[int]) -> list[int]:
        await release.wait()
        return batch

    async with impl.DynamicBatcher(process_fn=gated, max_queue_size=5, max_batch_size=2) as batcher:
        # One batch running (2) + prefetch_batches=2 staged batches (4) + the batch being
        # assembled (2) + max_queue_size records (5): the documented capacity.
        futures = [await batcher.submit(i) for i in range(13)]
        blocked = asyncio.ensure_future(batcher.submit(99))
        await asyncio.sleep(0.05)
        assert not blocked.done()
        if impl is ours:
            assert batcher.stats.queue_depth == 11  # all but the running batch
        release.set()
        futures.append(await asyncio.wait_for(blocked, timeout=1.0))
        assert await asyncio.gather(*futures) == [*range(13), 99]


async def test_a_full_queue_refuses_at_once_when_the_caller_will_not_wait():
    release = asyncio.Event()

    async def gated(batch: list[int]) -> list[int]:
        await release.wait()
        return batch

    async with ours.DynamicBatcher(process_fn=gated, max_queue_size=5, max_batch_size=2) as batcher:
        futures = [await batcher.submit(i) for i in range(13)]  # the capacity, as above
        await asyncio.sleep(0.01)
        with pytest.raises(ours.QueueFullError, match="the queue is full") as refused:
            await batcher.submit(99, wait_for_room=False)
        assert refused.value.queue_depth == 7 and refused.value.retry_after_s >= 1  # assembling (2) + queued (5)
        assert batcher.stats.total_submitted == 13  # the refused record was never taken
        waiting = asyncio.ensure_future(batcher.submit(100))
        await asyncio.sleep(0.01)
        with pytest.raises(ours.QueueFullError):  # no jumping ahead of a producer that waits for room
            await batcher.submit(101, wait_for_room=False)
        release.set()
        futures.append(await asyncio.wait_for(waiting, timeout=1.0))
        await asyncio.gather(*futures)
        assert await (await batcher.submit(102, wait_for_room=False)) == 102


@pytest.mark.parametrize(
    "bad",
    [
        {"target_batch_cost": 0},
        {"max_batch_size": 0},
        {"min_batch_size": 300},
        {"batch_timeout_s": -1},
        {"max_concurrent_batches": 0},
        {"on_error": "ignore"},
        {"oversized": "truncate"},
    ],
)
def test_invalid_settings_are_rejected(bad: dict):
    with pytest.raises(ValueError):
        ours.DynamicBatcher(CallLog(), **bad)
