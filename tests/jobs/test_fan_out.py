"""`fan_out`: a chunk's answers that cannot be kept stop the run, loudly, instead of being lost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from flyteplugins_batcher.jobs import fan_out


@dataclass(frozen=True)
class Chunk:
    index: int


async def chunks(count: int, sent: list[int]) -> AsyncIterator[Chunk]:
    for index in range(count):
        sent.append(index)
        yield Chunk(index)


async def answer(chunk: Chunk) -> None:
    await asyncio.sleep(0)


def test_an_on_chunk_failure_stops_the_run_and_is_raised() -> None:
    sent: list[int] = []
    kept: list[int] = []

    async def keep(chunk: Chunk, outcome: object, reason: str) -> None:
        if chunk.index == 3:
            raise OSError("No space left on device")
        kept.append(chunk.index)

    with pytest.raises(OSError, match="No space left"):
        asyncio.run(fan_out(chunks(100, sent), answer, keep, max_in_flight=2))

    assert 3 not in kept and len(sent) < 10  # it stopped sending soon after, rather than running all 100


def test_without_failures_every_chunk_is_kept() -> None:
    sent: list[int] = []
    kept: list[int] = []

    async def keep(chunk: Chunk, outcome: object, reason: str) -> None:
        kept.append(chunk.index)

    asyncio.run(fan_out(chunks(20, sent), answer, keep, max_in_flight=3))

    assert sorted(kept) == list(range(20)) == sent
