"""The driver side of the LLM workflows: fan chunks out to the replicas, keep what finishes, account for the rest.

Chunks are produced lazily and at most `max_in_flight` are outstanding, so a driver reading a
million-line file holds a bounded amount of it. Each finished chunk is handed to the workflow's
`on_chunk` at once (which writes its results out), so nothing accumulates either. A chunk that fails
after Flyte's retries is reported by its records, and the run goes on; a failure that retrying
cannot fix (a missing model, say) stops the whole run at once with its message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import flyte
import flyte.errors
from flyte.io import File

from images import driver_image
from workflows.llm_replica import gpu_env
from workflows.schema import ChunkOutcome, ReplicaSnapshot, RequestChunk, RunSummary

logger = logging.getLogger("workflows.driver")

driver_env = flyte.TaskEnvironment(
    name="batch_llm_driver",
    image=driver_image,
    resources=flyte.Resources(cpu=2, memory="4Gi"),
    depends_on=[gpu_env],
)

ChunkHandler = Callable[[RequestChunk, ChunkOutcome | None, str], Awaitable[None]]
"""Called once per chunk, as it finishes: its outcome, or `None` and why it failed."""


class UnrecoverableRunError(RuntimeError):
    """A chunk failed in a way no retry can fix; the run stops with its message."""


@dataclass
class FanOutStats:
    """What the fan-out saw."""

    chunks: int = 0
    failed_chunks: int = 0
    load_time_s: float = 0.0  # the slowest replica's model load (a fresh one's; reused chunks load nothing)
    wall_s: float = 0.0
    replicas: list[ReplicaSnapshot] = field(default_factory=list)  # each replica's latest state

    @property
    def inference_s(self) -> float:
        """The run's wall time less model loading."""
        return max(self.wall_s - self.load_time_s, 0.0)

    def per_second(self, amount: float) -> float:
        """`amount` per second of inference."""
        return amount / self.inference_s if self.inference_s > 0 else 0.0


class Counts:
    """Running counts of a run's requests, for its summary and live report."""

    def __init__(self) -> None:
        self.done = self.failed = self.fresh_answers = self.fresh_tokens = self.reused_chunks = 0

    def count(self, *, failed: bool, completion_tokens: int, fresh: bool) -> None:
        """One request finished (`fresh`: computed by this run, not reused from an earlier one)."""
        self.done += 1
        self.failed += failed
        if fresh and not failed:
            self.fresh_answers += 1
            self.fresh_tokens += completion_tokens


async def fan_out(
    chunks: Iterable[RequestChunk] | AsyncIterator[RequestChunk],
    infer: Callable[[RequestChunk], Awaitable[ChunkOutcome]],
    on_chunk: ChunkHandler,
    *,
    max_in_flight: int,
) -> FanOutStats:
    """Send every chunk to `infer`, at most `max_in_flight` at once, and hand each result to `on_chunk`.

    Raises:
        UnrecoverableRunError: A chunk failed with an error that retrying cannot fix.
    """
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
    stats = FanOutStats()
    replicas: dict[str, ReplicaSnapshot] = {}
    started = time.time()
    slots = asyncio.Semaphore(max_in_flight)
    running: set[asyncio.Task[None]] = set()
    fatal: list[BaseException] = []

    async def run(chunk: RequestChunk) -> None:
        try:
            outcome: ChunkOutcome | None = await infer(chunk)
            reason = ""
        except Exception as error:
            if not_retryable(error):
                fatal.append(error)
                return
            logger.error("chunk %d failed after retries: %s", chunk.index, error)
            outcome, reason = None, f"chunk failed: {error}"
        finally:
            slots.release()
        stats.chunks += 1
        if outcome is None:
            stats.failed_chunks += 1
        elif outcome.finished_at >= started:  # computed by this run, not reused from an earlier one
            latest = replicas.get(outcome.replica.replica)
            if latest is None or outcome.replica.records >= latest.records:
                replicas[outcome.replica.replica] = outcome.replica
            stats.load_time_s = max(stats.load_time_s, outcome.replica.load_time_s)
        await on_chunk(chunk, outcome, reason)

    try:
        async for chunk in _aiter(chunks):
            await slots.acquire()
            if fatal:
                slots.release()
                break
            task = asyncio.create_task(run(chunk))
            running.add(task)
            task.add_done_callback(running.discard)
        while running and not fatal:
            await asyncio.wait(set(running), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in running:
            task.cancel()
    if fatal:
        raise UnrecoverableRunError(str(fatal[0])) from fatal[0]
    stats.wall_s = time.time() - started
    stats.replicas = sorted(replicas.values(), key=lambda snapshot: snapshot.replica)
    return stats


def not_retryable(error: BaseException) -> bool:
    """Whether a chunk failed in a way that retrying cannot fix (the task raised `NonRecoverableError`)."""
    return isinstance(error, flyte.errors.NonRecoverableError) or getattr(error, "code", "") == "NonRecoverableError"


async def _aiter(items: Iterable[Any] | AsyncIterator[Any]) -> AsyncIterator[Any]:
    if hasattr(items, "__aiter__"):
        async for item in items:  # type: ignore[union-attr]
            yield item
    else:
        for item in items:  # type: ignore[union-attr]
            yield item


class JsonLines:
    """A JSONL file written line by line as results arrive (nothing is kept in memory).

    Args:
        path: Where to write it (its folder is created).
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.count = 0
        self._handle: IO[str] = path.open("w", encoding="utf-8")

    def write(self, line: dict[str, Any]) -> None:
        self._handle.write(json.dumps(line, ensure_ascii=False) + "\n")
        self.count += 1

    def close(self) -> None:
        self._handle.close()


async def publish(path: Path, destination: str) -> File:
    """The file as a Flyte `File` (blob storage on a cluster), also copied to `destination` when given.

    A `destination` that is a local folder gets a copy there; a remote URI (`s3://...`) gets the upload.
    """
    if destination and "://" not in destination:
        target = Path(destination).expanduser() / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        return await File.from_local(str(target))
    remote = f"{destination.rstrip('/')}/{path.name}" if destination else None
    return await File.from_local(str(path), remote)


def check_failures(failed: int, total: int, max_failed_fraction: float, where: str, noun: str = "requests") -> None:
    """Fail the run (non-zero exit) when more requests failed than allowed; the results are written first.

    Raises:
        RuntimeError: More than `max_failed_fraction` of `total` failed, or everything did.
    """
    if not failed:
        return
    fraction = failed / total if total else 1.0
    if failed == total or fraction > max_failed_fraction:
        raise RuntimeError(
            f"{failed} of {total} {noun} failed ({fraction:.1%}, allowed: {max_failed_fraction:.1%}); {where}. "
            "Raise --max_failed_fraction to accept failures."
        )


def summary_line(summary: RunSummary, noun: str) -> str:
    """The one line a run prints: outcome, throughput (model loading excluded) and where the results are."""
    accuracy = f"accuracy {summary.accuracy:.1%} on {summary.scored} scored | " if summary.scored else ""
    reused = f", {summary.reused_chunks} chunks reused from an earlier run" if summary.reused_chunks else ""
    return (
        f"{accuracy}answered {summary.answered}/{summary.requests} {noun}, {summary.failed} failed{reused} | "
        f"{summary.requests_per_s:.2f} {noun}/s, {summary.output_tokens_per_s:.0f} output tokens/s (inference "
        f"{summary.inference_s:.1f} s, model load {summary.load_time_s:.1f} s) | results: {summary.results.path} | "
        f"errors: {summary.errors.path}"
    )
