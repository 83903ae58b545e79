"""A record cancelled while it runs is told so through its own `cancel()` (`Cancellable`), and counts as cancelled."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

import flyteplugins_batcher as ours


@dataclass(eq=False)
class Job:
    """A record that can be told to stop: the process function checks `stop` between its steps."""

    name: str
    stop: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.stop.set()


def test_a_record_with_cancel_is_cancellable() -> None:
    assert isinstance(Job("a"), ours.Cancellable) and not isinstance("a", ours.Cancellable)


@pytest.mark.parametrize("runner", ["async", "thread"])
async def test_a_running_record_whose_future_is_cancelled_is_told_to_stop_and_counts_as_cancelled(runner: str):
    started = threading.Event()
    steps: dict[str, int] = {}

    def work(batch: list[Job]) -> list[str]:  # 200 steps of 10 ms, unless told to stop
        started.set()
        for job in batch:
            steps[job.name] = next((step for step in range(200) if job.stop.wait(0.01)), 200)
        return [job.name for job in batch]

    async def in_a_coroutine(batch: list[Job]) -> list[str]:
        return await asyncio.to_thread(work, batch)

    process = in_a_coroutine if runner == "async" else work
    async with ours.DynamicBatcher(process, max_batch_size=2, batch_timeout_s=0.0) as batcher:
        running = await batcher.submit(Job("left"))
        await asyncio.to_thread(started.wait, 5)
        running.cancel()
        kept = await batcher.submit(Job("kept"))
        assert await kept == "kept"

    stats = batcher.stats
    assert steps["left"] < 100 and steps["kept"] == 200  # stopped at once; the other ran to its end
    assert (stats.total_cancelled, stats.total_completed) == (1, 1)


async def test_a_cancelled_record_without_cancel_runs_on_and_counts_as_completed():
    release = asyncio.Event()

    async def gated(batch: list[str]) -> list[str]:
        await release.wait()
        return batch

    async with ours.DynamicBatcher(gated, max_batch_size=1, batch_timeout_s=0.0) as batcher:
        running = await batcher.submit("plain")
        await asyncio.sleep(0.05)
        running.cancel()
        release.set()

    assert (batcher.stats.total_cancelled, batcher.stats.total_completed) == (0, 1)


async def test_a_record_cancelled_while_queued_never_runs_and_is_not_told():
    release = asyncio.Event()
    seen: list[str] = []

    async def gated(batch: list[Job]) -> list[str]:
        seen.extend(job.name for job in batch)
        await release.wait()
        return [job.name for job in batch]

    async with ours.DynamicBatcher(gated, max_batch_size=1, batch_timeout_s=0.0) as batcher:
        first = await batcher.submit(Job("first"))
        queued_job = Job("queued")
        queued = await batcher.submit(queued_job)
        await asyncio.sleep(0.05)
        queued.cancel()
        release.set()
        assert await first == "first"

    assert seen == ["first"] and not queued_job.stop.is_set()
    assert (batcher.stats.total_cancelled, batcher.stats.total_completed) == (1, 1)


def _stepping(started: threading.Event, steps: dict[str, int]) -> Callable[[list[Job]], list[str]]:
    """A batch function that steps its records together, 200 steps of 10 ms, each until it is told to stop."""

    def work(batch: list[Job]) -> list[str]:
        started.set()
        for step in range(200):
            for job in batch:
                if job.stop.is_set():
                    steps.setdefault(job.name, step)
            if len(steps) == len(batch):
                break
            threading.Event().wait(0.01)
        for job in batch:
            steps.setdefault(job.name, 200)
        return [job.name for job in batch]

    return work


@pytest.mark.parametrize("return_exceptions", [False, True])
@pytest.mark.parametrize("caller", ["run", "map", "batched"])
async def test_a_cancelled_consumer_of_many_records_has_every_running_one_told_and_is_cancelled_itself(
    caller: str, return_exceptions: bool
) -> None:
    """`run`, `map` and `@batched`'s `run`, cancelled while their records run, cancel every one (those running are
    told to stop) and end cancelled, with `return_exceptions` too: the consumer's own cancel is not a record's."""
    started = threading.Event()
    steps: dict[str, int] = {}
    work = _stepping(started, steps)
    jobs = [Job(f"job-{n}") for n in range(4)]
    batcher = ours.DynamicBatcher(work, max_batch_size=4, batch_timeout_s=0.0)
    batched = ours.batched(work, max_batch_size=4, batch_timeout_s=0.0)

    async def consume() -> object:
        if caller == "batched":
            return await batched.run(jobs, return_exceptions=return_exceptions)
        if caller == "run":
            return await batcher.run(jobs, return_exceptions=return_exceptions)
        return [answer async for answer in batcher.map(jobs, return_exceptions=return_exceptions)]

    async with batcher:
        consumer = asyncio.create_task(consume())
        await asyncio.to_thread(started.wait, 5)
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
        used = batched.batcher if caller == "batched" else batcher
        await batched.aclose()  # its records settle as it drains

    stats = used.stats if used is not None else ours.BatchStats()
    assert sorted(steps) == [job.name for job in jobs] and max(steps.values()) < 100, steps
    assert (stats.total_cancelled, stats.total_completed) == (4, 0)
