"""@batched: user functions called per record, batched across every concurrent caller."""

from __future__ import annotations

import asyncio

import pytest

import flyteplugins_batcher as ours
from tests.process.conftest import wait_for_worker_threads

batch_sizes: dict[str, list[int]] = {"square": [], "shout": []}


@ours.batched(max_batch_size=16, batch_timeout_s=0.02)
def square(values: list[int]) -> list[int]:
    batch_sizes["square"].append(len(values))
    return [value * value for value in values]


@ours.batched
async def shout(texts: list[str]) -> list[str]:
    batch_sizes["shout"].append(len(texts))
    await asyncio.sleep(0.01)
    return [text.upper() + "!" for text in texts]


async def test_two_user_functions_batch_independently_across_concurrent_tasks():
    async def user_task(index: int) -> tuple[int, str]:
        # what a user's @env.task body looks like: one await per record
        return await square(index), await shout(f"task {index}")

    results = await asyncio.gather(*(user_task(i) for i in range(40)))
    assert results == [(i * i, f"TASK {i}!") for i in range(40)]
    assert max(batch_sizes["square"]) > 1 and max(batch_sizes["shout"]) > 1
    assert sum(batch_sizes["square"]) == 40 and sum(batch_sizes["shout"]) == 40
    assert square.batcher is not shout.batcher
    assert square.stats.total_completed == 40
    await square.aclose()
    await shout.aclose()


async def test_batched_keeps_the_function_identity_and_offers_map_and_run():
    assert square.__name__ == "square"
    assert await square.run([1, 2, 3]) == [1, 4, 9]
    assert [value async for value in square.map(range(4))] == [0, 1, 4, 9]
    await square.aclose()


def test_batched_survives_an_event_loop_change():
    first = asyncio.run(square(3))
    second = asyncio.run(square(4))
    assert (first, second) == (9, 16)
    # Each loop's batcher was released with its loop: no worker thread is left behind.
    assert wait_for_worker_threads("square", at_most=0) == 0
    asyncio.run(square.aclose())


def test_bad_batcher_options_fail_at_decoration_time():
    with pytest.raises(ValueError, match="max_batch_size"):
        ours.batched(max_batch_size=0)(lambda batch: batch)
    with pytest.raises(TypeError):
        ours.batched(no_such_option=1)(lambda batch: batch)


async def test_token_batched_functions_use_record_token_estimates():
    @ours.batched(batcher_class=ours.TokenBatcher, target_batch_tokens=10)
    def lengths(prompts: list[ours.Prompt]) -> list[int]:
        return [len(prompt.text) for prompt in prompts]

    results = await asyncio.gather(*(lengths(ours.Prompt("x" * 12)) for _ in range(6)))
    assert results == [12] * 6
    assert lengths.stats.batch_cost.max <= 10  # 4 tokens each: at most two per batch
    await lengths.aclose()
