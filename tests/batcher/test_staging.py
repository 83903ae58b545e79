"""Batches staged at the device: the next one starts when the previous returns, without the event loop."""

from __future__ import annotations

import asyncio
import threading
import time

import flyteplugins_batcher as ours


class TimedDevice:
    """A plain-def device that records when each batch started and ended (its own clock)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.batches: list[list[int]] = []
        self.spans: list[tuple[float, float]] = []
        self.lock = threading.Lock()

    def __call__(self, batch: list[int]) -> list[int]:
        started = time.monotonic()
        time.sleep(self.seconds)  # releases the GIL, like a CUDA call
        with self.lock:
            self.batches.append(list(batch))
            self.spans.append((started, time.monotonic()))
        return batch


async def test_staged_batches_run_back_to_back_while_the_event_loop_is_blocked():
    device = TimedDevice(seconds=0.03)
    async with ours.DynamicBatcher(device, max_batch_size=4, prefetch_batches=2) as batcher:
        futures = await batcher.submit_batch(list(range(16)))  # one running, two staged, more queued
        await asyncio.sleep(0.005)  # the first batch starts
        blocked_at = time.monotonic()
        time.sleep(0.2)  # producers hog the loop (tokenizing, decoding) for 200 ms
        unblocked_at = time.monotonic()
        assert await asyncio.gather(*futures) == list(range(16))
    during_block = [span for span in device.spans if blocked_at <= span[0] < unblocked_at]
    # 200 ms of a blocked loop fit six 30 ms batches; the device takes its next batch itself.
    assert len(during_block) >= 3
    gaps = [later[0] - earlier[1] for earlier, later in zip(device.spans, device.spans[1:], strict=False)]
    assert max(gaps[:3]) < 0.01  # back to back, not one loop turn (200 ms) apart


async def test_a_record_cancelled_in_a_staged_batch_never_reaches_the_device():
    release = threading.Event()
    seen: list[int] = []

    def gated(batch: list[int]) -> list[int]:
        release.wait(2.0)
        seen.extend(batch)
        return batch

    async with ours.DynamicBatcher(gated, max_batch_size=2, prefetch_batches=2) as batcher:
        futures = await batcher.submit_batch(list(range(6)))
        await asyncio.sleep(0.02)  # [0, 1] runs; [2, 3] and [4, 5] are staged
        futures[3].cancel()
        futures[4].cancel()
        release.set()
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
    assert seen == [0, 1, 2, 5]
    assert [outcome for outcome in outcomes if not isinstance(outcome, BaseException)] == [0, 1, 2, 5]
    assert batcher.stats.total_cancelled == 2


async def test_the_first_batch_goes_at_once_and_the_tail_does_not_wait_for_the_timeout():
    device = TimedDevice(seconds=0.02)
    async with ours.DynamicBatcher(device, max_batch_size=8, batch_timeout_s=5.0) as batcher:
        started = time.monotonic()
        first = await batcher.submit(0)
        assert await first == 0
        assert time.monotonic() - started < 0.5  # an idle device does not wait 5 s for a fuller batch
        futures = await batcher.submit_batch(list(range(1, 12)))
        assert await asyncio.gather(*futures) == list(range(1, 12))
        assert time.monotonic() - started < 1.0  # nor does the partial tail batch
    assert sum(len(batch) for batch in device.batches) == 12


async def test_busy_time_is_what_the_device_saw():
    device = TimedDevice(seconds=0.05)
    async with ours.DynamicBatcher(device, max_batch_size=1) as batcher:
        futures = await batcher.submit_batch(list(range(4)))
        await asyncio.sleep(0.01)
        time.sleep(0.1)  # a blocked loop must not hide (or add) device time
        await asyncio.gather(*futures)
        await asyncio.sleep(0.2)  # idle, with nothing in the batcher: not counted at all
    stats = batcher.stats
    device_busy = sum(end - start for start, end in device.spans)
    assert abs(stats.busy_time_s - device_busy) < 0.01
    assert stats.utilization > 0.9  # the device worked back to back while records were in the batcher
    assert stats.active_time_s < device_busy + 0.1


async def test_an_async_process_fn_is_timed_around_the_awaited_call():
    async def slow(batch: list[int]) -> list[int]:
        await asyncio.sleep(0.05)
        return batch

    async with ours.DynamicBatcher(slow, max_batch_size=2, max_concurrent_batches=2) as batcher:
        futures = await batcher.submit_batch(list(range(4)))  # two batches overlap: counted once
        await asyncio.gather(*futures)
    assert 0.045 <= batcher.stats.busy_time_s < 0.09
