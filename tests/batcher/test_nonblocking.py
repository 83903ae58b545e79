"""The event loop stays free while the model runs, so producers keep loading data."""

from __future__ import annotations

import asyncio
import threading
import time
import warnings

import pytest

import flyteplugins_batcher as ours
from tests.batcher.conftest import fixed_in_ours


async def count_ticks_while(awaitable, tick_s: float = 0.01) -> tuple[object, int]:
    """Await `awaitable` while a ticker counts how often the event loop let it run."""
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(tick_s)

    ticker_task = asyncio.create_task(ticker())
    try:
        result = await awaitable
    finally:
        stop.set()
        await ticker_task
    return result, ticks


def blocking_model(batch: list[int]) -> list[int]:
    time.sleep(0.3)  # a CUDA call or llm.generate: blocks its thread, releases the GIL
    return [value + 1 for value in batch]


@fixed_in_ours("awaits the process function directly: a plain def raises TypeError")
async def test_a_plain_def_process_fn_runs_off_the_event_loop(impl):
    async with impl.DynamicBatcher(process_fn=blocking_model) as batcher:
        future = await batcher.submit(1)
        result, ticks = await count_ticks_while(future)
    assert result == 2
    assert ticks >= 15  # ~30 possible in 0.3 s; a blocked loop would give 1


async def test_the_plain_def_runs_in_a_worker_thread_with_context():
    threads: list[str] = []

    def where(batch: list[int]) -> list[int]:
        threads.append(threading.current_thread().name)
        return batch

    async with ours.DynamicBatcher(where, name="ctx-batcher") as batcher:
        assert await (await batcher.submit(1)) == 1
    assert threads and threads[0].startswith("ctx-batcher")
    assert threads[0] != threading.current_thread().name
    assert not batcher.is_async


@fixed_in_ours("never notices an async process function that blocks the loop")
async def test_an_async_process_fn_that_blocks_the_loop_gets_one_warning(impl):
    async def blocks_inside_async(batch: list[int]) -> list[int]:
        return blocking_model(batch)  # the flyte.extras vLLM example's mistake

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with impl.DynamicBatcher(process_fn=blocks_inside_async, max_batch_size=1) as batcher:
            futures = await batcher.submit_batch([1, 2])
            assert await asyncio.gather(*futures) == [2, 3]
    blocking = [w for w in caught if issubclass(w.category, ours.BlockingProcessFnWarning)]
    assert len(blocking) == 1
    assert "plain `def`" in str(blocking[0].message) and "asyncio.to_thread" in str(blocking[0].message)


async def test_a_well_behaved_async_process_fn_gets_no_warning():
    async def awaits_properly(batch: list[int]) -> list[int]:
        return await asyncio.to_thread(blocking_model, batch)

    with warnings.catch_warnings():
        warnings.simplefilter("error", ours.BlockingProcessFnWarning)
        async with ours.DynamicBatcher(awaits_properly) as batcher:
            assert await (await batcher.submit(1)) == 2


@pytest.mark.parametrize("kind", ["partial", "callable-object", "lambda-returning-coroutine"])
async def test_async_callables_of_every_shape_are_awaited(kind: str):
    import functools

    async def add(offset: int, batch: list[int]) -> list[int]:
        return [value + offset for value in batch]

    class Adder:
        async def __call__(self, batch: list[int]) -> list[int]:
            return await add(1, batch)

    fn = {
        "partial": functools.partial(add, 1),
        "callable-object": Adder(),
        "lambda-returning-coroutine": lambda batch: add(1, batch),
    }[kind]
    async with ours.DynamicBatcher(fn) as batcher:
        assert await (await batcher.submit(41)) == 42
