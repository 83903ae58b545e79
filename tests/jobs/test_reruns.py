"""Reruns: answered items are reused, failed ones go out again, level by level through the cache."""

from __future__ import annotations

import time

from flyteplugins_batcher.jobs import retrying_reused_failures
from flyteplugins_batcher.replica import (
    ChatMessage,
    ChunkOutcome,
    ItemResult,
    ReplicaSnapshot,
    RequestChunk,
    RequestItem,
)


class CachedReplica:
    """Answers chunks as `infer_chunk` would, keeping each outcome under its chunk and salt as Flyte's cache does.

    Args:
        broken: Prompts that fail (with `code`, `invalid_request` by default) while they are in it.
        code: The error code of a broken prompt.
    """

    def __init__(self, broken: set[str], code: str = "invalid_request") -> None:
        self.broken = broken
        self.code = code
        self.calls = 0
        self.cache: dict[tuple[tuple[str, ...], str], ChunkOutcome] = {}
        self.computed: list[str] = []

    async def infer(self, chunk: RequestChunk, salt: str) -> ChunkOutcome:
        key = (tuple(item.key for item in chunk.items), salt)
        self.calls += 1
        if key not in self.cache:
            self.computed.extend(item.key for item in chunk.items)
            results = [
                ItemResult(item.key, error_code=self.code, error_message="needs xgrammar, or too long")
                if item.key in self.broken
                else ItemResult(item.key, text=f"answer to {item.key}", completion_tokens=1)
                for item in chunk.items
            ]
            self.cache[key] = ChunkOutcome(chunk.index, results, ReplicaSnapshot(), finished_at=time.time())
        return self.cache[key]


def chunk_of(*keys: str) -> RequestChunk:
    return RequestChunk(0, [RequestItem(key, messages=[ChatMessage("user", key)]) for key in keys])


async def rerun(replica: CachedReplica, chunk: RequestChunk) -> tuple[ChunkOutcome, float]:
    started = time.time()
    time.sleep(0.001)  # outcomes of earlier runs finished strictly before this one started
    return await retrying_reused_failures(replica.infer, salt="", started=started)(chunk), started


async def test_a_fresh_failure_is_kept_and_only_a_reused_one_is_retried() -> None:
    replica = CachedReplica(broken={"b"})
    first, started = await rerun(replica, chunk_of("a", "b", "c"))
    assert replica.computed == ["a", "b", "c"] and first.failed_positions() == [1]
    assert [first.computed_since(n, started) for n in range(3)] == [True, True, True]

    replica.broken.clear()  # the user fixed the cause
    replica.computed.clear()
    second, started = await rerun(replica, chunk_of("a", "b", "c"))

    assert replica.computed == ["b"] and second.failed_positions() == []
    assert [result.text for result in second.results] == ["answer to a", "answer to b", "answer to c"]
    assert [second.computed_since(n, started) for n in range(3)] == [False, True, False]
    assert [second.was_retried(n) for n in range(3)] == [False, True, False]


async def test_each_rerun_reuses_the_last_retry_and_retries_what_still_fails() -> None:
    replica = CachedReplica(broken={"a", "b"})
    await rerun(replica, chunk_of("a", "b", "c"))
    replica.broken = {"b"}
    await rerun(replica, chunk_of("a", "b", "c"))  # retries a and b: a now answers
    replica.broken.clear()
    replica.computed.clear()

    third, _ = await rerun(replica, chunk_of("a", "b", "c"))

    assert replica.computed == ["b"]  # a's answer comes from the second run's cached retry
    assert third.failed_positions() == [] and [third.was_retried(n) for n in range(3)] == [False, True, False]
    replica.computed.clear()
    fourth, _ = await rerun(replica, chunk_of("a", "b", "c"))
    assert replica.computed == [] and fourth.failed_positions() == []


async def test_a_failure_that_can_never_succeed_is_not_retried() -> None:
    """A prompt too long for the model fails again with the same model and settings (the chunk's cache key): a rerun
    takes the cached outcome as it is, and no retry chunk goes out to load a model for nothing."""
    for code in ("context_length_exceeded", "invalid_prompt"):
        replica = CachedReplica(broken={"b"}, code=code)
        await rerun(replica, chunk_of("a", "b", "c"))
        replica.computed.clear()
        replica.calls = 0

        again, _ = await rerun(replica, chunk_of("a", "b", "c"))

        assert replica.calls == 1 and replica.computed == []  # the cache hit, and nothing sent to a replica
        assert again.failed_positions() == [1] and again.retryable_positions() == []
        assert again.results[1].error_code == code
