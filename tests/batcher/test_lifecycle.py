"""Starting, stopping and restarting: stop() never hangs, and can cancel what is left."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import flyteplugins_batcher as ours
from tests.batcher.conftest import fixed_in_ours, run_isolated


async def gated_identity(gate: asyncio.Event):
    async def process(batch: list[int]) -> list[int]:
        await gate.wait()
        return batch

    return process


@fixed_in_ours("stop() puts a sentinel into the bounded queue and blocks forever when it is full")
def test_stop_does_not_hang_on_a_full_queue(impl):
    async def scenario() -> list[object]:
        gate = asyncio.Event()
        batcher = impl.DynamicBatcher(process_fn=await gated_identity(gate), max_queue_size=2, max_batch_size=1)
        await batcher.start()
        # Full: one record running, two staged batches (prefetch_batches=2), one being assembled, two queued.
        futures = [await batcher.submit(i) for i in range(6)]
        blocked_producer = asyncio.ensure_future(batcher.submit(99))
        await asyncio.sleep(0.01)
        assert not blocked_producer.done()
        stopping = asyncio.ensure_future(batcher.stop())
        await asyncio.sleep(0.01)
        gate.set()
        await stopping
        outcomes = await asyncio.gather(*futures, blocked_producer, return_exceptions=True)
        return outcomes

    outcomes = run_isolated(scenario, 2.0)
    assert outcomes[:6] == [0, 1, 2, 3, 4, 5]  # graceful: queued work still ran
    assert isinstance(outcomes[6], ours.BatcherClosedError)  # the waiting producer was told, not left hanging


async def test_stop_with_timeout_cancels_what_is_left():
    gate = asyncio.Event()  # never set: the model hangs
    batcher = ours.DynamicBatcher(await gated_identity(gate), max_batch_size=1)
    await batcher.start()
    futures = [await batcher.submit(i) for i in range(3)]
    started = time.monotonic()
    await batcher.stop(timeout=0.1)
    assert time.monotonic() - started < 1.0
    assert all(future.cancelled() for future in futures)
    assert not batcher.is_running


async def test_stop_cancel_pending_skips_queued_records_but_finishes_the_running_batch():
    gate = asyncio.Event()
    batcher = ours.DynamicBatcher(await gated_identity(gate), max_batch_size=1)
    await batcher.start()
    futures = [await batcher.submit(i) for i in range(3)]
    await asyncio.sleep(0.01)
    stopping = asyncio.ensure_future(batcher.stop(cancel_pending=True))
    await asyncio.sleep(0.01)
    gate.set()
    await stopping
    assert await futures[0] == 0
    assert futures[1].cancelled() and futures[2].cancelled()
    assert batcher.stats.total_cancelled == 2


async def test_submit_after_stop_raises_closed():
    async with ours.DynamicBatcher(lambda batch: batch) as batcher:
        pass
    with pytest.raises(ours.BatcherClosedError):
        await batcher.submit(1)
    with pytest.raises(RuntimeError):  # still a RuntimeError, as in flyte.extras
        await batcher.submit(1)


async def test_a_stopped_batcher_can_start_again():
    batcher = ours.DynamicBatcher(lambda batch: [value * 2 for value in batch])
    for _ in range(2):
        async with batcher:
            assert await (await batcher.submit(21)) == 42
    assert batcher.stats.total_completed == 2


async def test_stop_is_idempotent_and_safe_before_start():
    batcher = ours.DynamicBatcher(lambda batch: batch)
    await batcher.stop()
    await batcher.start()
    await batcher.stop()
    await batcher.stop()
    assert not batcher.is_running


async def test_submit_from_another_event_loop_is_a_clear_error():
    async with ours.DynamicBatcher(lambda batch: batch) as batcher:

        def other_loop() -> BaseException | None:
            async def submit() -> None:
                await batcher.submit(1)

            try:
                asyncio.run(submit())
            except RuntimeError as exc:
                return exc
            return None

        error = await asyncio.to_thread(other_loop)
    assert error is not None and "another event loop" in str(error)


def test_submit_from_another_event_loop_on_the_same_thread_is_a_clear_error() -> None:
    # The batcher's loop is stopped, not closed, and another runs on its thread: the thread alone says nothing.
    batcher = ours.DynamicBatcher(lambda batch: batch)
    first = asyncio.new_event_loop()
    try:
        first.run_until_complete(batcher.start())

        async def submit() -> None:
            await batcher.submit(1)

        with pytest.raises(RuntimeError, match="another event loop"):
            asyncio.run(submit())
        assert batcher.stats.total_submitted == 0
        first.run_until_complete(batcher.stop())
    finally:
        first.close()


async def test_a_timeout_around_run_fires_even_when_the_device_hangs():
    stuck = threading.Event()

    def hangs(batch: list[int]) -> list[int]:
        stuck.wait(10)  # a dead engine: the call never returns
        return batch

    batcher = ours.DynamicBatcher(hangs, name="hangs")
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(batcher.run(range(8)), timeout=0.2)
    assert time.monotonic() - started < 1.0
    assert not batcher.is_running
    stuck.set()
