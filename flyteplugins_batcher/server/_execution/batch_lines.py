"""A batch's lines: checked before it runs, answered through the workflows' code, each recorded once.

`BatchLines` runs one pass over a batch's input file. Lines already answered (by this server
before it was killed and restarted) are skipped; the rest are parsed and cut into chunks exactly
as the JSONL job does (`flyteplugins_batcher.replica`'s `LineRules` and `ChunkCutter`), the chunks run on this process's
replica (`Inference.run_chunk`, the body of the workflows' replica tasks), and each chunk's
answers are committed together with the batch's counts before they count.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import flyte.errors

from flyteplugins_batcher.batch_api import (
    EmbeddingRequest,
    JSONBoundsError,
    ParsedRequest,
    RequestLineError,
    SeenIds,
    loads_bounded,
    read_request_lines,
)
from flyteplugins_batcher.engines import EngineConfigError
from flyteplugins_batcher.jobs import fan_out
from flyteplugins_batcher.replica import ChunkCutter, FinishedLine, JobChunk, JobOutcome, LineRules
from flyteplugins_batcher.server._inference import Inference
from flyteplugins_batcher.server._state.store import Store

logger = logging.getLogger("flyteplugins_batcher.server")

CHUNK_ATTEMPTS = 3
"""Tries per chunk before its lines fail: a dead engine is replaced by the next try, as Flyte retries a task."""

EMBEDDING_CHUNK_TEXTS = 128
"""Texts per chunk of embedding lines (as `workflows/batch_jsonl.py`'s default)."""

MAX_REPORTED_ERRORS = 10
"""Most validation errors a failed batch lists."""


def scan_input(path: Path, endpoint: str) -> tuple[int, list[dict[str, Any]]]:
    """The requests in a batch's input file, and the lines whose `url` is not the batch's endpoint.

    Returns:
        The number of request lines (non-blank), and validation errors in OpenAI's shape
        (`code`, `message`, `param`, `line`): `url_mismatch` per mismatched line (the first few), or
        `empty_file`.
    """
    total, mismatched = 0, []
    with path.open("rb") as lines:
        for number, text in read_request_lines(lines):
            total += 1
            url = _string_field(text, "url") if isinstance(text, str) else None
            if url is not None and url != endpoint and len(mismatched) < MAX_REPORTED_ERRORS:
                message = f"line {number}: url {url!r} does not match the batch's endpoint {endpoint!r}"
                mismatched.append({"code": "url_mismatch", "message": message, "param": "url", "line": number})
    if not total:
        return 0, [{"code": "empty_file", "message": "The input file has no requests.", "param": None, "line": None}]
    return total, mismatched


def _string_field(text: str, key: str) -> str | None:
    """A line's top-level string field `key`, if the line is a JSON object that has one."""
    try:
        data = loads_bounded(text)
    except JSONBoundsError:  # the line fails alone, when it is parsed
        return None
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


class BatchLines:
    """One pass over a batch's lines, answering those not answered yet.

    Args:
        batch: The batch (in progress).
        path: Its input file.
        rules: How its lines are read and answered.
        store: Where answered lines are recorded.
        inference: What runs the chunks.
        chunk_size: Requests per chunk.
        order: How the requests are cut into chunks ("prefix" or "file", `ChunkCutter`).
        chunks_in_flight: Chunks outstanding at once.
        should_stop: Asked between lines: true once the batch is cancelled or its window has passed.
        cancelled: Set when the batch is cancelled: the lines in flight stop too (queued ones never
            run, running ones stop where the engine can stop them) and are left unanswered, for the
            batch's end to fail; the lines their chunks answered are recorded.
    """

    def __init__(
        self,
        batch: dict[str, Any],
        path: Path,
        rules: LineRules,
        *,
        store: Store,
        inference: Inference,
        chunk_size: int,
        order: str = "prefix",
        chunks_in_flight: int,
        should_stop: Callable[[], bool],
        cancelled: asyncio.Event | None = None,
    ) -> None:
        self.batch_id = batch["id"]
        self.path = path
        self.rules = rules
        self.store = store
        self.inference = inference
        self.chunk_size = chunk_size
        self.order = order
        self.chunks_in_flight = chunks_in_flight
        self.should_stop = should_stop
        self.cancelled = cancelled
        self._requests: dict[str, ParsedRequest] = {}

    async def answer(self) -> None:
        """Answer every line not answered yet (until `should_stop`), recording each chunk as it finishes.

        Raises:
            UnrecoverableRunError: The engine cannot start with these settings.
        """
        answered = await asyncio.to_thread(self.store.answered_lines, self.batch_id)
        await fan_out(self._chunks(answered), self._run, self._record, max_in_flight=self.chunks_in_flight)

    async def _chunks(self, answered: set[int]) -> AsyncIterator[JobChunk]:
        cutter = ChunkCutter(self.chunk_size, EMBEDDING_CHUNK_TEXTS, self.order)  # type: ignore[arg-type]
        with self.path.open("rb") as lines, SeenIds() as seen:
            for number, request in self.rules.read(lines, seen):
                if self.should_stop():
                    return
                if number in answered:
                    continue
                if isinstance(request, RequestLineError):
                    self.store.record_lines(self.batch_id, [FinishedLine.failed(request)])
                    continue
                self._requests[request.custom_id] = request
                lane = self.rules.encoder_of(request) if isinstance(request, EmbeddingRequest) else ""
                for chunk in cutter.add(request, lane):
                    if self.should_stop():  # placement hands many chunks at once: each is sent only while it may run
                        return
                    yield chunk
                    await asyncio.sleep(0)  # let finished chunks record between reads
        for chunk in cutter.rest():
            if self.should_stop():
                return
            yield chunk

    async def _run(self, chunk: JobChunk) -> JobOutcome:
        """A chunk on this process's replica; a failure is tried again, as Flyte retries a replica task."""
        for attempt in range(1, CHUNK_ATTEMPTS + 1):
            try:
                return await self.inference.run_chunk(chunk, stop=self.cancelled)
            except EngineConfigError as error:
                raise flyte.errors.NonRecoverableError(f"the engine cannot start: {error}") from error
            except Exception as error:
                if attempt == CHUNK_ATTEMPTS:
                    raise
                logger.warning("batch %s: chunk %d failed (%s); trying again", self.batch_id, chunk.index, error)
        raise AssertionError("unreachable")

    async def _record(self, chunk: JobChunk, outcome: JobOutcome | None, reason: str) -> None:
        requests = {item.key: self._requests.pop(item.key) for item in chunk.items}
        # A line stopped by a cancel has no answer: the batch's end fails it.
        records = [line for line in self.rules.answers(chunk, outcome, reason, requests) if line is not None]
        await asyncio.to_thread(self.store.record_lines, self.batch_id, records)


def unanswered_records(path: Path, answered: set[int], code: str, message: str) -> list[FinishedLine]:
    """An error record for every request line not answered (a cancelled or expired batch's rest)."""
    records = []
    with path.open("rb") as lines:
        for number, text in read_request_lines(lines):
            if number in answered:
                continue
            custom_id = _string_field(text, "custom_id") if isinstance(text, str) else None
            failure = RequestLineError(code, message, line=number, custom_id=custom_id)
            records.append(FinishedLine.failed(failure))
    return records


def seconds_left(batch: dict[str, Any]) -> float:
    """Seconds until the batch's completion window closes."""
    return batch["expires_at"] - time.time()
