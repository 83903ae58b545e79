"""Per-record priority (with aging) and deadlines."""

from __future__ import annotations

import asyncio
import time

import pytest

import flyteplugins_batcher as ours
from tests.conftest import GatedLog as Log


async def hold_first_batch(batcher: ours.DynamicBatcher, log: Log) -> asyncio.Future:
    """Occupy the device with one record, so the next submits wait in the queue."""
    log.gate.clear()
    blocker = await batcher.submit("blocker")
    await log.until_held()
    return blocker


async def test_higher_priority_goes_first_fifo_within_a_level():
    log = Log()
    async with ours.DynamicBatcher(log, max_batch_size=2, prefetch_batches=0) as batcher:
        blocker = await hold_first_batch(batcher, log)
        order = [("low-1", 0), ("high-1", 5), ("low-2", 0), ("mid-1", 1), ("high-2", 5), ("mid-2", 1)]
        futures = [await batcher.submit(name, priority=priority) for name, priority in order]
        log.gate.set()
        await asyncio.gather(blocker, *futures)
    assert log.batches[1:] == [["high-1", "high-2"], ["mid-1", "mid-2"], ["low-1", "low-2"]]


async def test_priorities_keep_the_cost_budget():
    log = Log()
    async with ours.DynamicBatcher(log, target_batch_cost=10, prefetch_batches=0) as batcher:
        blocker = await hold_first_batch(batcher, log)
        futures = [
            await batcher.submit(f"r{i}", estimated_cost=4, priority=i % 3) for i in range(12)
        ]  # 4 per record: at most two per batch
        log.gate.set()
        await asyncio.gather(blocker, *futures)
    assert all(len(batch) <= 2 for batch in log.batches)
    assert sum(len(batch) for batch in log.batches) == 13


async def test_aging_lets_a_long_waiting_low_priority_record_overtake():
    log = Log()
    async with ours.DynamicBatcher(log, max_batch_size=1, prefetch_batches=0, priority_aging_s=0.05) as batcher:
        blocker = await hold_first_batch(batcher, log)
        old_low = await batcher.submit("old-low", priority=0)
        await asyncio.sleep(0.2)  # four levels' worth of waiting
        fresh_high = await batcher.submit("fresh-high", priority=2)
        log.gate.set()
        await asyncio.gather(blocker, old_low, fresh_high)
    assert log.batches[1:] == [["old-low"], ["fresh-high"]]


async def test_strict_priorities_without_aging():
    log = Log()
    async with ours.DynamicBatcher(log, max_batch_size=1, prefetch_batches=0, priority_aging_s=None) as batcher:
        blocker = await hold_first_batch(batcher, log)
        old_low = await batcher.submit("old-low", priority=0)
        await asyncio.sleep(0.2)
        fresh_high = await batcher.submit("fresh-high", priority=2)
        log.gate.set()
        await asyncio.gather(blocker, old_low, fresh_high)
    assert log.batches[1:] == [["fresh-high"], ["old-low"]]


async def test_a_record_past_its_deadline_fails_by_name_and_never_runs():
    log = Log()
    async with ours.DynamicBatcher(log, max_batch_size=4) as batcher:
        blocker = await hold_first_batch(batcher, log)
        started = time.monotonic()
        doomed = await batcher.submit("doomed", deadline_s=0.05)
        patient = await batcher.submit("patient", deadline_s=30)
        with pytest.raises(ours.RecordExpiredError, match="record #2 'doomed'") as raised:
            await doomed
        assert time.monotonic() - started < 0.5  # it failed at its deadline, while the device was still busy
        assert isinstance(raised.value, TimeoutError)
        log.gate.set()
        assert await patient == "patient"
        await blocker
    assert ["doomed"] not in log.batches and all("doomed" not in batch for batch in log.batches)
    assert batcher.stats.total_expired == 1
    assert batcher.stats.total_failed == 0


async def test_deadlines_apply_to_staged_batches_too():
    log = Log()
    async with ours.DynamicBatcher(log, max_batch_size=1, prefetch_batches=2) as batcher:
        blocker = await hold_first_batch(batcher, log)
        staged = await batcher.submit("staged", deadline_s=0.03)  # a full batch of one: staged at once
        await asyncio.sleep(0.1)
        log.gate.set()
        with pytest.raises(ours.RecordExpiredError):
            await staged
        await blocker
    assert log.batches == [["blocker"]]


async def test_a_queued_record_that_expires_gives_its_place_in_the_queue_at_once():
    log = Log()
    settings = {"max_batch_size": 1, "prefetch_batches": 1, "max_queue_size": 1}  # room for 2 unstaged records
    async with ours.DynamicBatcher(log, **settings) as batcher:
        blocker = await hold_first_batch(batcher, log)
        staged = await batcher.submit("staged")
        queued = await batcher.submit("queued")
        doomed = await batcher.submit("doomed", deadline_s=0.05)
        started = time.monotonic()
        late = await asyncio.wait_for(batcher.submit("late"), timeout=1.0)  # waits until "doomed" expires
        assert 0.03 < time.monotonic() - started < 0.5 and not log.gate.is_set()
        with pytest.raises(ours.RecordExpiredError):
            await doomed
        log.gate.set()
        assert await asyncio.gather(blocker, staged, queued, late) == ["blocker", "staged", "queued", "late"]
    assert batcher.stats.total_expired == 1 and batcher.stats.total_completed == 4


@pytest.mark.parametrize("bad", [{"priority": 1.5}, {"priority": "high"}, {"deadline_s": 0}, {"deadline_s": -1}])
async def test_invalid_priority_or_deadline_is_a_clear_error(bad: dict):
    async with ours.DynamicBatcher(Log()) as batcher:
        with pytest.raises(ValueError):
            await batcher.submit("x", **bad)
        assert await (await batcher.submit("ok")) == "ok"
        assert batcher.stats.total_submitted == 1  # the rejected one was never accepted


async def test_token_batcher_and_batched_take_priority_and_deadline():
    calls: list[list[str]] = []

    @ours.batched(batcher_class=ours.TokenBatcher, max_batch_size=4)
    def shout(texts: list[str]) -> list[str]:
        calls.append(texts)
        return [text.upper() for text in texts]

    assert await shout("hi", priority=3, deadline_s=10) == "HI"
    async with ours.TokenBatcher(inference_fn=shout.__wrapped__) as batcher:
        assert await (await batcher.submit("yo", estimated_tokens=3, priority=1, deadline_s=5)) == "YO"
    await shout.aclose()
