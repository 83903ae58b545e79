"""SharedBatcher: one model and one batcher per process, across tasks, loops and configurations."""

from __future__ import annotations

import asyncio
import threading

import pytest

import flyteplugins_batcher as ours
from tests.process.conftest import wait_for_worker_threads


class FakeModel:
    """Stands for a loaded engine: counts what it did so the tests can tell loads apart."""

    def __init__(self, key: object) -> None:
        self.key = key
        self.closed = False

    def generate(self, batch: list[str]) -> list[str]:
        return [f"{self.key}:{item}" for item in batch]

    def close(self) -> None:
        self.closed = True


def make_shared() -> tuple[ours.SharedBatcher, list[FakeModel]]:
    loaded: list[FakeModel] = []

    def load(key: object) -> FakeModel:
        model = FakeModel(key)
        loaded.append(model)
        return model

    shared = ours.SharedBatcher(load, lambda model, key: ours.DynamicBatcher(model.generate, batch_timeout_s=0.01))
    return shared, loaded


async def test_concurrent_tasks_share_one_model_and_one_batcher():
    shared, loaded = make_shared()

    async def task(index: int) -> tuple[int, str]:
        batcher = await shared.get("m")
        result = await (await batcher.submit(f"q{index}"))
        return id(batcher), result

    outcomes = await asyncio.gather(*(task(i) for i in range(10)))
    assert len(loaded) == 1 and shared.loads == 1
    assert len({batcher_id for batcher_id, _ in outcomes}) == 1
    assert [result for _, result in outcomes] == [f"m:q{i}" for i in range(10)]
    assert shared.batcher.stats.total_batches < 10  # the ten tasks' records were batched together
    await shared.aclose()
    assert loaded[0].closed


def test_an_event_loop_change_stops_the_old_batcher_and_keeps_the_model():
    shared, loaded = make_shared()

    async def use() -> tuple[ours.DynamicBatcher, str, bool]:
        batcher = await shared.get("m")
        result = await (await batcher.submit("x"))
        return batcher, result, all(b.is_running == (b is batcher) for b in built)

    built: list[ours.DynamicBatcher] = []
    first, first_result, _ = asyncio.run(use())  # the loop closes afterwards, as async-lru's cache would see
    built.append(first)
    second, second_result, only_second_running = asyncio.run(use())

    assert first_result == second_result == "m:x"
    assert first is not second
    assert only_second_running  # the first was retired with its loop, not orphaned
    assert not first.is_running
    assert len(loaded) == 1  # the model survived the loop change
    assert shared.batchers_built == 2
    asyncio.run(shared.aclose())
    assert wait_for_worker_threads("DynamicBatcher", at_most=0) == 0  # no worker thread left behind


def test_a_batcher_on_a_loop_still_running_in_another_thread_is_drained_there():
    shared, _ = make_shared()
    other_loop = asyncio.new_event_loop()
    runner = threading.Thread(target=other_loop.run_forever, daemon=True)
    runner.start()
    try:
        first = asyncio.run_coroutine_threadsafe(shared.get("m"), other_loop).result(timeout=5)

        async def use_here() -> str:
            batcher = await shared.get("m")
            return await (await batcher.submit("y"))

        assert asyncio.run(use_here()) == "m:y"
        for _ in range(100):
            if not first.is_running:
                break
            threading.Event().wait(0.01)
        assert not first.is_running
    finally:
        other_loop.call_soon_threadsafe(other_loop.stop)
        runner.join(timeout=5)


async def test_a_new_configuration_replaces_and_closes_the_old_model():
    shared, loaded = make_shared()
    first = await shared.get("small")
    assert await (await first.submit("a")) == "small:a"
    second = await shared.get("large")
    assert await (await second.submit("a")) == "large:a"
    assert loaded[0].closed and not loaded[1].closed
    assert not first.is_running
    await shared.aclose()


async def test_an_async_loader_runs_once_for_concurrent_first_callers():
    calls = 0

    async def load(key: object) -> FakeModel:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return FakeModel(key)

    shared = ours.SharedBatcher(load, lambda model, key: ours.DynamicBatcher(model.generate))
    batchers = await asyncio.gather(*(shared.get("k") for _ in range(5)))
    assert calls == 1
    assert len({id(batcher) for batcher in batchers}) == 1
    await shared.aclose()


async def test_a_failing_load_is_retried_on_the_next_call():
    attempts = 0

    def load(key: object) -> FakeModel:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise OSError("weights not downloaded yet")
        return FakeModel(key)

    shared = ours.SharedBatcher(load, lambda model, key: ours.DynamicBatcher(model.generate))
    with pytest.raises(OSError):
        await shared.get("k")
    batcher = await shared.get("k")
    assert await (await batcher.submit("z")) == "k:z"
    await shared.aclose()


async def test_a_stopped_batcher_is_replaced_on_the_next_call():
    shared, loaded = make_shared()
    first = await shared.get("m")
    await first.stop()
    second = await shared.get("m")
    assert second is not first and second.is_running
    assert len(loaded) == 1
    await shared.aclose()


async def test_a_batcher_whose_model_died_is_rebuilt_with_a_fresh_model():
    loaded: list[FakeModel] = []

    class DyingModel(FakeModel):
        def generate(self, batch: list[str]) -> list[str]:
            if "kill" in batch:
                raise ours.UnrecoverableError("the engine process died")
            return super().generate(batch)

    def load(key: object) -> DyingModel:
        model = DyingModel(key)
        loaded.append(model)
        return model

    shared = ours.SharedBatcher(load, lambda model, key: ours.DynamicBatcher(model.generate, max_batch_size=1))
    first = await shared.get("m")
    waiting = [await first.submit(item) for item in ("kill", "a", "b")]
    outcomes = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(outcome, ours.UnrecoverableError) for outcome in outcomes)  # nothing hangs
    assert first.is_failed and isinstance(first.failure.__cause__, ours.UnrecoverableError)
    with pytest.raises(ours.BatcherFailedError, match="engine process died"):
        await first.submit("later")

    second = await shared.get("m")
    assert second is not first and await (await second.submit("c")) == "m:c"
    assert len(loaded) == 2 and loaded[0].closed and not loaded[1].closed
    await shared.aclose()


def test_release_lets_go_of_a_batcher_whose_loop_is_gone():
    gate = threading.Event()

    def stuck(batch: list[int]) -> list[int]:
        gate.wait(5)
        return batch

    holder: dict[str, object] = {}

    async def leave_it_running() -> None:
        batcher = ours.DynamicBatcher(stuck, name="released")
        await batcher.start()
        holder["batcher"] = batcher
        holder["future"] = await batcher.submit(1)
        loop = asyncio.get_running_loop()
        loop.call_soon(loop.stop)  # the loop stops while the batcher runs (a worker crashed, say)

    loop = asyncio.new_event_loop()
    starter = loop.create_task(leave_it_running())
    loop.run_forever()
    batcher = holder["batcher"]
    assert starter.done() and isinstance(batcher, ours.DynamicBatcher) and batcher.is_running
    batcher.release()
    assert not batcher.is_running and holder["future"].cancelled()
    gate.set()
    assert wait_for_worker_threads("released", at_most=0) == 0
    loop.run_until_complete(asyncio.sleep(0))  # let its cancelled housekeeping task finish before closing
    loop.close()
