"""`fan_out`: a chunk's answers that cannot be kept stop the run, loudly, instead of being lost."""

from __future__ import annotations

import asyncio
import subprocess
import sys
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


RACE = """
import asyncio, sys
import flyteplugins_batcher.jobs as jobs

assert type(sys.modules["pandas"]).__name__ == "_LazyModule", type(sys.modules["pandas"])
seen = []

class Chunk:
    def __init__(self, index):
        self.index = index

async def chunks():
    for index in range(8):
        yield Chunk(index)

async def infer(chunk):
    await asyncio.to_thread(lambda: seen.append(hasattr(sys.modules["pandas"], "DataFrame")))

async def keep(chunk, outcome, reason):
    pass

asyncio.run(jobs.fan_out(chunks(), infer, keep, max_in_flight=8))
print(sum(seen), len(seen))
"""


def test_chunks_in_several_threads_see_flyte_s_lazy_pandas_whole() -> None:
    # flyte imports pandas through importlib's LazyLoader; chunks converted in 8 threads at once used
    # to see it half-loaded ("module 'pandas' has no attribute 'DataFrame'") and fail.
    finished = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=120)

    assert finished.returncode == 0, finished.stderr[-2000:]
    assert finished.stdout.split() == ["8", "8"]
