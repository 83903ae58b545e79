"""A request line's way through a batch job: parsed, cut into chunks, answered with a result or an error line.

One place for each step, shared by the JSONL workflow's driver (`flyteplugins_batcher/jobs/_jsonl_job.py`) and the
OpenAI-compatible server's Batch API (`flyteplugins_batcher/server/`), so that a file gives the same results
and the same per-line errors through either:

- `LineRules.parse` turns a line into a request (`flyteplugins_batcher.batch_api`), checking its
  settings against the run's defaults; `read_requests` does so for a whole file, failing duplicate
  `custom_id`s.
- `ChunkCutter` cuts the requests into chunks of one kind: `RequestChunk`s for the LLM replicas,
  `EmbeddingChunk`s for the embedding replicas.
- `chunk_answers` turns a finished chunk's outcome into each line's output: a result line, or an
  error line naming its code.
"""

from __future__ import annotations

import array
import base64
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
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
from flyteplugins_batcher.jobs._embed_replica import EmbeddingChunk, EmbeddingItem, EmbeddingOutcome, EmbeddingResult
from flyteplugins_batcher.jobs._schema import (
    ChatMessage,
    ChunkOutcome,
    ItemResult,
    OutputFormat,
    RequestChunk,
    RequestItem,
)

JobChunk = RequestChunk | EmbeddingChunk
JobOutcome = ChunkOutcome | EmbeddingOutcome


@dataclass(frozen=True)
class LineRules:
    """How a job reads its lines and answers them.

    Attributes:
        served_model: The LLM's name (chat and completion lines are answered by it).
        served_embedding_model: The embedding model's name.
        model_mismatch: What to do with a line naming another model ("error" or "ignore").
        defaults: The run's generation settings (a request's own win).
        endpoints: The urls the job serves; a line for another one fails as `invalid_url`.
        model_aliases: Other names a line may give the served LLM (the model reference as the user gave it).
        context_length: The LLM's context, when known (0: unknown): a line whose `max_tokens` fills it
            fails at parse (`context_length_exceeded`), before it is costed in the batcher.
    """

    served_model: str
    served_embedding_model: str
    model_mismatch: ModelMismatch
    defaults: GenerationConfig
    endpoints: tuple[str, ...] = ENDPOINTS
    model_aliases: tuple[str, ...] = ()
    context_length: int = 0

    def parse(self, text: str, line_number: int) -> ParsedRequest:
        """The request on a line, its settings checked (out of range: the line fails here, not its chunk).

        Raises:
            RequestLineError: The line is not a request this job can run.
        """
        request = parse_request_line(
            text,
            line_number,
            served_model=self.served_model,
            served_embedding_model=self.served_embedding_model,
            model_mismatch=self.model_mismatch,
            endpoints=self.endpoints,
            model_aliases=self.model_aliases,
            context_length=self.context_length,
        )
        if isinstance(request, BatchRequest):
            request.generation(self.defaults)
        return request

    def response_line(self, request: ParsedRequest, result: ItemResult | EmbeddingResult) -> dict[str, Any]:
        """The result line of a request that succeeded."""
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


LineOutcome = tuple[int, ParsedRequest | RequestLineError]
"""A line's number, and its request or the error that fails it."""


def read_requests(lines: Iterable[bytes], rules: LineRules, seen: SeenIds) -> Iterator[LineOutcome]:
    """Each non-blank line of a file opened in binary mode, parsed; a `custom_id` seen before fails its line.

    Args:
        lines: The file's lines as bytes.
        rules: How lines are read.
        seen: The ids seen so far (a fresh `SeenIds` per pass over the file).
    """
    for line_number, text in read_request_lines(lines):
        if isinstance(text, RequestLineError):
            yield line_number, text
            continue
        try:
            request = rules.parse(text, line_number)
        except RequestLineError as error:
            yield line_number, error
            continue
        first = seen.add(request.custom_id, line_number)
        if first is not None:
            message = f"custom_id {request.custom_id!r} was already used on line {first}"
            yield (
                line_number,
                RequestLineError("duplicate_custom_id", message, line=line_number, custom_id=request.custom_id),
            )
            continue
        yield line_number, request


@dataclass(frozen=True)
class LineAnswer:
    """What a request's line became: its output line, and the counts that go with it.

    Attributes:
        request: The request.
        output: Its result line, or its error line.
        failure: Why it failed, or `None` when it succeeded.
        prompt_tokens: Tokens the model read for it (0 when it failed).
        completion_tokens: Tokens it generated (0 for embeddings and failures).
    """

    request: ParsedRequest
    output: dict[str, Any]
    failure: RequestLineError | None
    prompt_tokens: int = 0
    completion_tokens: int = 0


def chunk_answers(
    rules: LineRules, chunk: JobChunk, outcome: JobOutcome | None, reason: str, requests: Mapping[str, ParsedRequest]
) -> list[LineAnswer]:
    """Each request's answer in a finished chunk, in the chunk's order.

    Args:
        rules: How lines are answered.
        chunk: The chunk.
        outcome: Its outcome, or `None` when the chunk failed as a whole (each line fails with `reason`).
        reason: Why the chunk failed.
        requests: The chunk's requests, by `custom_id`.
    """
    answers = []
    for position, item in enumerate(chunk.items):
        request = requests[item.key]
        result = outcome.results[position] if outcome is not None else None
        if result is None:
            result = ItemResult(item.key, error_code="inference_failed", error_message=reason)
        if result.error_code:
            failure = RequestLineError(
                result.error_code, result.error_message, line=request.line, custom_id=request.custom_id
            )
            answers.append(LineAnswer(request, error_line(failure, request_number=request.line), failure))
            continue
        completion_tokens = result.completion_tokens if isinstance(result, ItemResult) else 0
        output = rules.response_line(request, result)
        answers.append(LineAnswer(request, output, None, result.prompt_tokens, completion_tokens))
    return answers


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
