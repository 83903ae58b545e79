"""The JSONL batch job on the driver: requests read from a file lazily, cut into chunks, results written as they come.

`Job` knows the file format (through `flyteplugins_batcher.batch_api`) and nothing of where chunks
run: `fan_out(job.chunks(n, m), infer, job.on_chunk, ...)` runs them with any `infer` callable
that takes both kinds of chunk.

**Mixed files.** Chat and completion lines become `RequestChunk`s (for the LLM replicas), embedding
lines `EmbeddingChunk`s (for the embedding replicas); a chunk holds one kind only. Both come out of
one pass over the file, as one stream, in the order they fill up, and share the driver's cap on
chunks in flight: kinds that are interleaved in the file run side by side, and a file sorted by kind
runs one kind after the other. The driver holds at most the chunks in flight and one unfinished
chunk of each kind, whatever the file's size.
"""

from __future__ import annotations

import array
import asyncio
import base64
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from flyteplugins_batcher.batch_api import (
    ENDPOINTS,
    BatchRequest,
    EmbeddingRequest,
    ModelMismatch,
    ParsedRequest,
    RequestLineError,
    SeenIds,
    embedding_response_line,
    error_line,
    parse_request_line,
    read_request_lines,
    response_line,
)
from flyteplugins_batcher.engines import GenerationConfig
from workflows.driver import Counts, JsonLines
from workflows.embed_replica import EmbeddingChunk, EmbeddingItem, EmbeddingOutcome, EmbeddingResult
from workflows.report import Progress
from workflows.schema import ChatMessage, ChunkOutcome, ItemResult, OutputFormat, RequestChunk, RequestItem

JobChunk = RequestChunk | EmbeddingChunk
JobOutcome = ChunkOutcome | EmbeddingOutcome


class Job:
    """One JSONL job on the driver: reads requests lazily, writes results and errors as they come.

    Args:
        input_path: The request file.
        folder: Where the results, errors and the table of seen ids are written.
        served_model: The LLM's name (chat and completion lines are answered by it).
        served_embedding_model: The embedding model's name.
        model_mismatch: What to do with a line naming another model ("error" or "ignore").
        defaults: The run's generation settings (a request's own win).
    """

    def __init__(
        self,
        input_path: Path,
        folder: Path,
        *,
        served_model: str,
        served_embedding_model: str,
        model_mismatch: ModelMismatch,
        defaults: GenerationConfig,
    ) -> None:
        self.input_path = input_path
        self.defaults = defaults
        self.served_model = served_model
        self.served_embedding_model = served_embedding_model
        self.model_mismatch = model_mismatch
        self.results = JsonLines(folder / "results.jsonl")
        self.errors = JsonLines(folder / "errors.jsonl")
        self.counts = Counts()
        self.progress = Progress(f"Batch job {input_path.name}", total=0, total_known=False)
        self._seen = SeenIds(folder)
        self._in_flight: dict[str, ParsedRequest] = {}  # requests of the chunks outstanding, by custom_id
        self.started = time.time()
        """When the job started (epoch seconds): a chunk that finished before was reused from an earlier run."""

    async def chunks(self, chunk_size: int, embedding_chunk_texts: int = 128) -> AsyncIterator[JobChunk]:
        """Chunks of valid requests, read from the file as they are needed; bad lines go to the errors file.

        Args:
            chunk_size: Chat and completion requests per LLM chunk.
            embedding_chunk_texts: Texts per embedding chunk (a request is never split, so a chunk may hold more).
        """
        cutter = ChunkCutter(chunk_size, embedding_chunk_texts)
        for request in self._requests():
            self._in_flight[request.custom_id] = request
            chunk = cutter.add(request)
            if chunk is not None:
                yield chunk
                await asyncio.sleep(0)  # let finished chunks write out between reads
        self.progress.total_known = True
        for chunk in cutter.rest():
            yield chunk

    def _requests(self) -> Iterator[ParsedRequest]:
        with self.input_path.open("rb") as lines:
            for line_number, text in read_request_lines(lines):
                self.progress.total += 1
                try:
                    if isinstance(text, RequestLineError):
                        raise text
                    yield self._parse(text, line_number)
                except RequestLineError as error:
                    self._fail(error)

    def _parse(self, text: str, line_number: int) -> ParsedRequest:
        request = parse_request_line(
            text,
            line_number,
            served_model=self.served_model,
            served_embedding_model=self.served_embedding_model,
            model_mismatch=self.model_mismatch,
            endpoints=ENDPOINTS,
        )
        if isinstance(request, BatchRequest):
            request.generation(self.defaults)  # settings out of range fail the line here, not the chunk
        first = self._seen.add(request.custom_id, line_number)
        if first is not None:
            raise RequestLineError(
                "duplicate_custom_id",
                f"custom_id {request.custom_id!r} was already used on line {first}",
                line=line_number,
                custom_id=request.custom_id,
            )
        return request

    async def on_chunk(self, chunk: JobChunk, outcome: JobOutcome | None, reason: str) -> None:
        """Write a finished chunk's result lines and error lines (`None`: the chunk failed, for `reason`)."""
        for position, item in enumerate(chunk.items):
            request = self._in_flight.pop(item.key)
            result = outcome.results[position] if outcome is not None else None
            if result is None:
                result = ItemResult(item.key, error_code="inference_failed", error_message=reason)
            retried = outcome is not None and outcome.was_retried(position)
            if result.error_code:
                failure = RequestLineError(
                    result.error_code, result.error_message, line=request.line, custom_id=request.custom_id
                )
                self._fail(failure, retried=retried)
                continue
            self.results.write(self._response_line(request, result))
            tokens = result.completion_tokens if isinstance(result, ItemResult) else 0
            fresh = outcome is None or outcome.computed_since(position, self.started)
            self.counts.count(failed=False, completion_tokens=tokens, fresh=fresh, retried=retried)
        await self.progress.update(self.counts.done, self.counts.failed)

    def _response_line(self, request: ParsedRequest, result: ItemResult | EmbeddingResult) -> dict[str, Any]:
        if isinstance(request, EmbeddingRequest) and isinstance(result, EmbeddingResult):
            vectors = [decode_vector(vector) for vector in result.vectors]
            return embedding_response_line(
                request,
                vectors,
                prompt_tokens=result.prompt_tokens,
                model=self.served_embedding_model,
                request_number=request.line,
            )
        assert isinstance(request, BatchRequest) and isinstance(result, ItemResult)
        return response_line(request, result.completion(), model=self.served_model, request_number=request.line)

    def _fail(self, error: RequestLineError, *, retried: bool = False) -> None:
        self.errors.write(error_line(error, request_number=error.line))
        self.counts.count(failed=True, completion_tokens=0, retried=retried)

    def close(self) -> None:
        self.results.close()
        self.errors.close()
        self._seen.close()


class ChunkCutter:
    """Cuts a stream of parsed requests into chunks of one kind each, numbered in the order they fill up.

    Args:
        chunk_size: Chat and completion requests per `RequestChunk`.
        embedding_chunk_texts: Texts per `EmbeddingChunk`: it closes once it holds at least this many
            (a request's texts stay together).
    """

    def __init__(self, chunk_size: int, embedding_chunk_texts: int) -> None:
        if chunk_size < 1 or embedding_chunk_texts < 1:
            raise ValueError(f"chunk sizes must be >= 1, got {chunk_size} and {embedding_chunk_texts}")
        self.chunk_size = chunk_size
        self.embedding_chunk_texts = embedding_chunk_texts
        self._number = 0
        self._generation: list[RequestItem] = []
        self._embedding: list[EmbeddingItem] = []
        self._texts = 0

    def add(self, request: ParsedRequest) -> JobChunk | None:
        """Take a request; returns the chunk it completed, if it did."""
        if isinstance(request, EmbeddingRequest):
            self._embedding.append(EmbeddingItem(request.custom_id, list(request.inputs)))
            self._texts += len(request.inputs)
            return self._embedding_chunk() if self._texts >= self.embedding_chunk_texts else None
        self._generation.append(to_item(request))
        return self._generation_chunk() if len(self._generation) == self.chunk_size else None

    def rest(self) -> list[JobChunk]:
        """The unfinished chunks, once the input is read."""
        chunks: list[JobChunk] = []
        if self._generation:
            chunks.append(self._generation_chunk())
        if self._embedding:
            chunks.append(self._embedding_chunk())
        return chunks

    def _generation_chunk(self) -> RequestChunk:
        chunk = RequestChunk(self._next_number(), self._generation)
        self._generation = []
        return chunk

    def _embedding_chunk(self) -> EmbeddingChunk:
        chunk = EmbeddingChunk(self._next_number(), self._embedding)
        self._embedding, self._texts = [], 0
        return chunk

    def _next_number(self) -> int:
        self._number += 1
        return self._number - 1


def to_item(request: BatchRequest) -> RequestItem:
    """The chunk item for a parsed request line; its own settings travel with it, by `GenerationConfig` name."""
    settings: dict[str, Any] = dict(request.settings)
    if "stop" in settings:
        settings["stop"] = list(settings["stop"])
    response_format = settings.pop("response_format", None)
    item = RequestItem(key=request.custom_id, raw_prompt=request.raw_prompt, **settings)
    if response_format is not None:
        item.output_format = OutputFormat.of(response_format)
    if isinstance(request.prompt, str):
        item.prompt = request.prompt
    else:
        item.messages = [ChatMessage(message["role"], message["content"]) for message in request.prompt]
    return item


def decode_vector(encoded: str) -> list[float]:
    """A vector sent as base64 of little-endian float32 bytes, as floats."""
    values = array.array("f", base64.b64decode(encoded))
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()
