"""map() and run(): process a whole input in order, with backpressure, in one call."""

from __future__ import annotations

import asyncio

import pytest

import flyteplugins_batcher as ours


def triple(batch: list[int]) -> list[int]:
    return [value * 3 for value in batch]


async def test_run_starts_and_stops_around_the_call():
    batcher = ours.DynamicBatcher(triple, max_batch_size=7)
    assert await batcher.run(range(50)) == [value * 3 for value in range(50)]
    assert not batcher.is_running
    assert batcher.stats.total_completed == 50


async def test_run_on_a_running_batcher_keeps_it_running():
    async with ours.DynamicBatcher(triple) as batcher:
        assert await batcher.run([1, 2]) == [3, 6]
        assert batcher.is_running


async def test_map_yields_in_input_order_from_an_async_iterable():
    async def slow_source():
        for value in range(20):
            await asyncio.sleep(0)
            yield value

    async def shuffled_latency(batch: list[int]) -> list[int]:
        await asyncio.sleep(0.001 * (batch[0] % 3))
        return [value * 3 for value in batch]

    async with ours.DynamicBatcher(shuffled_latency, max_batch_size=3, max_concurrent_batches=4) as batcher:
        results = [result async for result in batcher.map(slow_source())]
    assert results == [value * 3 for value in range(20)]


async def test_map_bounds_records_in_flight():
    peak_pending = 0

    async def observe(batch: list[int]) -> list[int]:
        nonlocal peak_pending
        peak_pending = max(peak_pending, batcher.stats.queue_depth + len(batch))
        await asyncio.sleep(0.001)
        return batch

    batcher = ours.DynamicBatcher(observe, max_batch_size=4)
    async with batcher:
        count = 0
        async for _ in batcher.map(range(1000), max_in_flight=10):
            count += 1
    assert count == 1000
    assert peak_pending <= 10


async def test_map_with_return_exceptions_keeps_going_past_bad_records():
    def picky(batch: list[int]) -> list[object]:
        return [ValueError(f"odd {value}") if value % 2 else value for value in batch]

    results = await ours.DynamicBatcher(picky).run(range(6), return_exceptions=True)
    assert results[0::2] == [0, 2, 4]
    assert all(isinstance(result, ValueError) for result in results[1::2])


async def test_run_raises_the_first_failure_without_return_exceptions():
    def picky(batch: list[int]) -> list[object]:
        return [ValueError("bad") if value == 3 else value for value in batch]

    with pytest.raises(ValueError, match="bad"):
        await ours.DynamicBatcher(picky).run(range(6))


async def test_a_submit_error_lands_at_its_own_position():
    def estimator(value: int) -> int:
        if value == 2:
            raise LookupError("cannot cost 2")
        return 1

    batcher = ours.DynamicBatcher(triple, cost_estimator=estimator)
    results = await batcher.run([1, 2, 3], return_exceptions=True)
    assert results[0] == 3 and results[2] == 9
    assert isinstance(results[1], LookupError)


async def test_breaking_out_of_map_cancels_the_unfinished_records():
    gate = asyncio.Event()

    async def gated(batch: list[int]) -> list[int]:
        if batch[0] > 0:
            await gate.wait()
        return batch

    async with ours.DynamicBatcher(gated, max_batch_size=1) as batcher:
        stream = batcher.map(range(10), max_in_flight=5)
        async for first in stream:
            assert first == 0
            break
        await stream.aclose()
        await asyncio.sleep(0.01)
        stats = batcher.stats
        gate.set()
    assert stats.total_cancelled >= 3


async def test_the_tail_of_map_is_flushed_not_left_waiting_for_the_timeout():
    async with ours.DynamicBatcher(triple, min_batch_size=100, batch_timeout_s=60.0) as batcher:
        results = await asyncio.wait_for(batcher.run([1, 2, 3]), timeout=2.0)
    assert results == [3, 6, 9]
    assert batcher.stats.batches_by_reason["drain"] == 1
