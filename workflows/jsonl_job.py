"""The JSONL batch job on the driver: requests read from a file lazily, cut into chunks, results written as they come.

`Job` knows the file format (through `flyteplugins_batcher.batch_api`) and nothing of where chunks
run: `fan_out(job.chunks(n), infer, job.on_chunk, ...)` runs them with any `infer` callable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from flyteplugins_batcher.batch_api import (
    BatchRequest,
    RequestLineError,
    SeenIds,
    error_line,
    parse_request_line,
    response_line,
)
from flyteplugins_batcher.engines import Completion, GenerationConfig
from workflows.driver import Counts, JsonLines
from workflows.report import Progress
from workflows.schema import ChatMessage, ChunkOutcome, ItemResult, RequestChunk, RequestItem


class Job:
    """One JSONL job on the driver: reads requests lazily, writes results and errors as they come."""

    def __init__(
        self, input_path: Path, folder: Path, *, served_model: str, model_mismatch: str, defaults: GenerationConfig
    ) -> None:
        self.input_path = input_path
        self.defaults = defaults
        self.served_model = served_model
        self.model_mismatch = model_mismatch
        self.results = JsonLines(folder / "results.jsonl")
        self.errors = JsonLines(folder / "errors.jsonl")
        self.counts = Counts()
        self.progress = Progress(f"Batch job {input_path.name}", total=0)
        self._seen = SeenIds(folder)
        self._in_flight: dict[str, BatchRequest] = {}  # requests of the chunks outstanding, by custom_id
        self._started = time.time()

    async def chunks(self, chunk_size: int) -> AsyncIterator[RequestChunk]:
        """Chunks of valid requests, read from the file as they are needed; bad lines go to the errors file."""
        items: list[RequestItem] = []
        number = 0
        for request in self._requests():
            self._in_flight[request.custom_id] = request
            items.append(to_item(request))
            if len(items) == chunk_size:
                yield RequestChunk(number, items)
                number, items = number + 1, []
                await asyncio.sleep(0)  # let finished chunks write out between reads
        if items:
            yield RequestChunk(number, items)

    def _requests(self) -> Iterator[BatchRequest]:
        with self.input_path.open(encoding="utf-8", errors="replace") as lines:
            for line_number, text in enumerate(lines, start=1):
                if not text.strip():
                    continue
                self.progress.total += 1
                try:
                    request = parse_request_line(
                        text,
                        line_number,
                        served_model=self.served_model,
                        model_mismatch=self.model_mismatch,  # type: ignore[arg-type]
                    )
                    request.generation(self.defaults)  # settings out of range fail the line here, not the chunk
                    _refuse_unrouted_settings(request)
                    first = self._seen.add(request.custom_id, line_number)
                    if first is not None:
                        raise RequestLineError(
                            "duplicate_custom_id",
                            f"custom_id {request.custom_id!r} was already used on line {first}",
                            line=line_number,
                            custom_id=request.custom_id,
                        )
                except RequestLineError as error:
                    self._fail(error)
                    continue
                yield request

    async def on_chunk(self, chunk: RequestChunk, outcome: ChunkOutcome | None, reason: str) -> None:
        reused = outcome is not None and outcome.finished_at < self._started
        for position, item in enumerate(chunk.items):
            request = self._in_flight.pop(item.key)
            result = (
                outcome.results[position]
                if outcome is not None
                else ItemResult(item.key, error_code="inference_failed", error_message=reason)
            )
            if result.error_code:
                failure = RequestLineError(
                    result.error_code, result.error_message, line=request.line, custom_id=request.custom_id
                )
                self._fail(failure)
                continue
            completion = Completion(
                result.text,
                result.prompt_tokens,
                result.completion_tokens,
                result.finish_reason,  # type: ignore[arg-type]
            )
            line = response_line(request, completion, model=self.served_model, request_number=request.line)
            self.results.write(line)
            self.counts.count(failed=False, completion_tokens=result.completion_tokens, fresh=not reused)
        self.counts.reused_chunks += reused
        await self.progress.update(self.counts.done, self.counts.failed)

    def _fail(self, error: RequestLineError) -> None:
        self.errors.write(error_line(error, request_number=error.line))
        self.counts.count(failed=True, completion_tokens=0, fresh=True)

    def close(self) -> None:
        self.results.close()
        self.errors.close()
        self._seen.close()


def _refuse_unrouted_settings(request: BatchRequest) -> None:
    # Interim (issue 17): chunk items do not carry `n` or `response_format` yet; fail such a line
    # alone rather than running it without them. Remove once the replica carries both.
    unrouted = [name for name in ("n", "response_format") if request.settings.get(name, 1) != 1]
    if unrouted:
        raise RequestLineError(
            "invalid_request",
            f"{', '.join(unrouted)}: not supported by this job yet",
            line=request.line,
            custom_id=request.custom_id,
        )


def to_item(request: BatchRequest) -> RequestItem:
    """The chunk item for a parsed request line; its own settings travel with it, by `GenerationConfig` name."""
    settings: dict[str, Any] = dict(request.settings)
    settings.pop("n", None)  # interim: only n == 1 gets here (see _refuse_unrouted_settings)
    if "stop" in settings:
        settings["stop"] = list(settings["stop"])
    item = RequestItem(key=request.custom_id, **settings)
    if isinstance(request.prompt, str):
        item.prompt = request.prompt
    else:
        item.messages = [ChatMessage(message["role"], message["content"]) for message in request.prompt]
    return item
