"""A request line's way through a batch: read and checked, cut into chunks, answered with a finished line.

One place for each step, shared by the JSONL job's driver (`flyteplugins_batcher.jobs`) and the
OpenAI-compatible server's Batch API (`flyteplugins_batcher.server`), so that a file gives the same results
and the same per-line errors through either:

- `LineRules.read` turns each line of a file into a request (`flyteplugins_batcher.batch_api`), checking
  its settings against the run's defaults and failing duplicate `custom_id`s;
- `ChunkCutter` cuts the requests into chunks of one kind: `RequestChunk`s for the LLM replica,
  `EmbeddingChunk`s for an encoder (the embedding model's, or the run's classifier's); requests that
  share a prompt prefix share a chunk (`_placement.py`), unless the run keeps the file's order;
- `LineRules.answers` turns a finished chunk's outcome into each line's `FinishedLine`: its result
  line, or its error line naming its code.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
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
from flyteplugins_batcher.engines import EmbeddingModel, GenerationConfig
from flyteplugins_batcher.replica._chunks import (
    EmbeddingChunk,
    EmbeddingItem,
    EmbeddingResult,
    ItemResult,
    JobChunk,
    JobOutcome,
    RequestChunk,
    RequestItem,
)
from flyteplugins_batcher.replica._models import ServedModel
from flyteplugins_batcher.replica._placement import ORDERS, PLACEMENT_WINDOW, Order, check_order, place, prefix_text

LineOutcome = tuple[int, "ParsedRequest | RequestLineError"]
"""A line's number, and its request or the error that fails it."""


@dataclass(frozen=True)
class FinishedLine:
    """One finished line of a batch: its 1-based number in the input, whether it was answered, its output line.

    What a batch's answer is wherever it is kept: the JSONL job's results and errors files and its
    run journal, and the server's database.

    Attributes:
        line: The line's 1-based number in the input file.
        ok: Whether it was answered (`output` is a result line), else it failed (an error line).
        output: Its result line or error line, in OpenAI's batch format.
        input_tokens: Tokens the model read for it (0 when it failed).
        output_tokens: Tokens it generated (0 for embeddings and failures).
        cached_tokens: Of `input_tokens`, those the engine found in its prefix cache (not computed again).

    Example:
        ```python
        FinishedLine.failed(RequestLineError("invalid_json", "not JSON", line=3))  # its error line
        ```
    """

    line: int
    ok: bool
    output: dict[str, Any]
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0

    @classmethod
    def failed(cls, error: RequestLineError) -> FinishedLine:
        """The line `error` fails, with its error line."""
        return cls(error.line, False, error_line(error, request_number=error.line))

    def to_json(self) -> str:
        """One line of JSON (`from_json` reads it back): `tokens` is `[input, output, cached]`."""
        tokens = [self.input_tokens, self.output_tokens, self.cached_tokens]
        return json.dumps({"line": self.line, "ok": self.ok, "output": self.output, "tokens": tokens})

    @classmethod
    def from_json(cls, text: str) -> FinishedLine:
        """The line `to_json` wrote, or an older one (its `tokens` without `cached`, which reads as 0)."""
        data = json.loads(text)
        tokens = [*data.get("tokens", ()), 0, 0, 0]  # journals written before cached tokens hold [input, output]
        input_tokens, output_tokens, cached_tokens = (int(count) for count in tokens[:3])
        return cls(int(data["line"]), bool(data["ok"]), data["output"], input_tokens, output_tokens, cached_tokens)


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
        adapters: The LoRA adapters served beside the LLM: a line whose `model` names one runs with it,
            and its result line names it as the model.
        tool_parser: How `tool_choice: "auto"` finds tool calls (`EngineSettings.tool_call_parser`).
        models: Every base model of a run that names several (`EngineSettings.served_models`; the first is
            `served_model`, and `adapters` lists all of theirs): a line naming one of them, or one of its
            adapters, runs on it (`model_of`) and its result line names it. Empty: `served_model` alone.
        classifier: The reference of the run's model when it is a sequence classifier (a cross-encoder, say)
            rather than a text generator: it answers score, rerank and classify lines (`classifier_tasks`)
            under `served_model`'s name and aliases, and chat, completion and responses lines fail
            (`invalid_url`). Empty: the model generates text.
        classifier_tasks: What the classifier does (`EmbeddingModel.tasks`).
        embedding_tasks: What the embedding model does (`EmbeddingModel.tasks`: an embedder embeds,
            and scores and reranks by cosine similarity).

    Example:
        ```python
        rules = LineRules("SmolLM2-135M-Instruct", "all-MiniLM-L6-v2", "error", GenerationConfig())
        with open("requests.jsonl", "rb") as lines, SeenIds() as seen:
            requests = [request for _, request in rules.read(lines, seen)]  # each a request or its error
        ```
    """

    served_model: str
    served_embedding_model: str
    model_mismatch: ModelMismatch
    defaults: GenerationConfig
    endpoints: tuple[str, ...] = ENDPOINTS
    model_aliases: tuple[str, ...] = ()
    context_length: int = 0
    adapters: tuple[str, ...] = ()
    tool_parser: str = ""
    models: tuple[ServedModel, ...] = ()
    classifier: str = ""
    classifier_tasks: tuple[str, ...] = ()
    embedding_tasks: tuple[str, ...] = EmbeddingModel.EMBEDDER_TASKS

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
            endpoints=self._endpoints(),
            encoder_tasks=self._encoder_tasks(),
            model_aliases=self.model_aliases,
            context_length=self.context_length,
            adapters=self.adapters,
            tool_parser=self.tool_parser,
            other_models=[name for model in self.models[1:] for name in model.names],
        )
        if isinstance(request, BatchRequest):
            request.generation(self.defaults)
        return request

    def _endpoints(self) -> tuple[str, ...]:
        """The urls served: a classifier as the run's model generates no text."""
        if not self.classifier:
            return self.endpoints
        return tuple(url for url in self.endpoints if url not in BatchRequest.URLS)

    def _encoder_tasks(self) -> dict[str, tuple[str, ...]]:
        """The encoder models a line may name, each with what it does (the classifier under each of its names)."""
        tasks = {self.served_embedding_model: self.embedding_tasks} if self.served_embedding_model else {}
        if self.classifier:
            tasks |= {name: self.classifier_tasks for name in (self.served_model, *self.model_aliases)}
        return tasks

    def encoder_of(self, request: EmbeddingRequest) -> str:
        """The encoder an encoder line runs on: the classifier's reference, or `""` for the embedding model.

        A line naming one runs on it; one naming none on the classifier when it does the line's task (it is
        the run's model, as with `vllm run-batch --model`), else on the embedding model.
        """
        if not self.classifier or request.model == self.served_embedding_model:
            return ""
        if request.model in (self.served_model, *self.model_aliases) or request.task in self.classifier_tasks:
            return self.classifier
        return ""

    def model_of(self, request: BatchRequest) -> ServedModel | None:
        """The base model a line runs on: the one its `model` names, or whose adapter it names; else the first.

        `None` when the run serves one model (`models` is empty).
        """
        if not self.models:
            return None
        for model in self.models:
            if request.adapter in model.adapter_names or request.model in model.names:
                return model
        return self.models[0]  # no model named (or model_mismatch="ignore"): the first runs it

    def read(self, lines: Iterable[bytes], seen: SeenIds) -> Iterator[LineOutcome]:
        """Each non-blank line of a file opened in binary mode, parsed; a `custom_id` seen before fails its line.

        Args:
            lines: The file's lines as bytes.
            seen: The ids seen so far (a fresh `SeenIds` per pass over the file).
        """
        for line_number, text in read_request_lines(lines):
            if isinstance(text, RequestLineError):
                yield line_number, text
                continue
            try:
                request = self.parse(text, line_number)
            except RequestLineError as error:
                yield line_number, error
                continue
            first = seen.add(request.custom_id, line_number)
            if first is None:
                yield line_number, request
                continue
            message = f"custom_id {request.custom_id!r} was already used on line {first}"
            yield (
                line_number,
                RequestLineError("duplicate_custom_id", message, line=line_number, custom_id=request.custom_id),
            )

    def answers(
        self, chunk: JobChunk, outcome: JobOutcome | None, reason: str, requests: Mapping[str, ParsedRequest]
    ) -> list[FinishedLine | None]:
        """Each request's finished line in a finished chunk, in the chunk's order.

        Args:
            chunk: The chunk.
            outcome: Its outcome, or `None` when the chunk failed as a whole (each line fails with `reason`).
            reason: Why the chunk failed.
            requests: The chunk's requests, by `custom_id`.

        Returns:
            A finished line per request; `None` for one its chunk was told to stop before it finished
            (`ItemResult.was_stopped`): it has no answer yet.
        """
        answers: list[FinishedLine | None] = []
        for position, item in enumerate(chunk.items):
            request = requests[item.key]
            result = outcome.results[position] if outcome is not None else None
            if result is None:
                result = ItemResult(item.key, error_code="inference_failed", error_message=reason)
            answers.append(
                None if isinstance(result, ItemResult) and result.was_stopped else self._answer(request, result)
            )
        return answers

    def _answer(self, request: ParsedRequest, result: ItemResult | EmbeddingResult) -> FinishedLine:
        if result.error_code:
            failure = RequestLineError(
                result.error_code, result.error_message, line=request.line, custom_id=request.custom_id
            )
            return FinishedLine.failed(failure)
        output = self._result_line(request, result)
        if isinstance(result, EmbeddingResult):
            return FinishedLine(request.line, True, output, result.prompt_tokens)
        return FinishedLine(
            request.line, True, output, result.prompt_tokens, result.completion_tokens, result.cached_tokens
        )

    def _result_line(self, request: ParsedRequest, result: ItemResult | EmbeddingResult) -> dict[str, Any]:
        """The result line of a request that succeeded."""
        if isinstance(request, EmbeddingRequest) and isinstance(result, EmbeddingResult):
            outputs = result.outputs()
            on_classifier = self.encoder_of(request) != ""
            return embedding_response_line(
                request,
                outputs,
                prompt_tokens=result.prompt_tokens,
                model=self.served_model if on_classifier else self.served_embedding_model,
                request_number=request.line,
                labels=[label or None for label in result.labels],
            )
        assert isinstance(request, BatchRequest) and isinstance(result, ItemResult)
        model = self.model_of(request)
        name = model.name if model is not None else self.served_model
        return response_line(request, result.completion(), model=name, request_number=request.line)


class ChunkCutter:
    """Cuts a stream of parsed requests into chunks of one kind each, numbered in the order they are made.

    Chat and completion requests may come in lanes (a run's base models): a chunk holds one lane's.
    In `"prefix"` order (the default), a lane's requests are held until `window` of them wait, then
    placed so that those sharing a prompt prefix share a chunk (`place`); in `"file"` order, each
    chunk takes the next `chunk_size` requests as they come. Embedding requests come in file order.

    `ORDERS` are the orders it knows, `WINDOW` the default window; `placed` cuts any list of items the
    same way (the table job's rows).

    Args:
        chunk_size: Chat and completion requests per `RequestChunk` (at most).
        embedding_chunk_texts: Texts per `EmbeddingChunk`: it closes once it holds at least this many
            (a request's texts stay together).
        order: `"prefix"` or `"file"`.
        window: Requests of a lane placed together, in `"prefix"` order.

    Example:
        ```python
        cutter = ChunkCutter(chunk_size=8, embedding_chunk_texts=128)
        chunks = [chunk for request in requests for chunk in cutter.add(request)] + cutter.rest()
        ```
    """

    ORDERS = ORDERS
    WINDOW = PLACEMENT_WINDOW

    def __init__(
        self, chunk_size: int, embedding_chunk_texts: int, order: Order = "prefix", window: int = PLACEMENT_WINDOW
    ) -> None:
        if chunk_size < 1 or embedding_chunk_texts < 1:
            raise ValueError(f"chunk sizes must be >= 1, got {chunk_size} and {embedding_chunk_texts}")
        if window < 1:
            raise ValueError(f"the placement window must be >= 1, got {window}")
        self.chunk_size = chunk_size
        self.embedding_chunk_texts = embedding_chunk_texts
        self.held = window if check_order(order) == "prefix" else chunk_size
        """Requests a lane holds before they are cut: the placement window, or one chunk in file order."""
        self.order = order
        self._number = 0
        self._generation: dict[str, list[RequestItem]] = {}
        self._encoder: dict[str, list[EmbeddingItem]] = {}  # by encoder: "" the embedding model's

    def add(self, request: ParsedRequest, lane: str = "") -> list[JobChunk]:
        """Take a request into `lane` (a chat or completion request's model, an encoder request's encoder, `""`
        the embedding model: `LineRules.encoder_of`); returns the chunks it completed, if any."""
        if isinstance(request, EmbeddingRequest):
            items = self._encoder.setdefault(lane, [])
            items.append(EmbeddingItem.of(request))
            full = sum(item.size for item in items) >= self.embedding_chunk_texts
            return [self._embedding_chunk(lane)] if full else []
        items = self._generation.setdefault(lane, [])
        items.append(RequestItem.of(request))
        return self._generation_chunks(lane) if len(items) == self.held else []

    def rest(self, lane: str | None = None) -> list[JobChunk]:
        """The unfinished chunks, once the input is read (of one lane only, when given: no embedding chunk)."""
        lanes = list(self._generation) if lane is None else [lane]
        chunks: list[JobChunk] = [
            chunk for name in lanes if self._generation.get(name) for chunk in self._generation_chunks(name)
        ]
        if lane is None:
            chunks += [self._embedding_chunk(encoder) for encoder, items in list(self._encoder.items()) if items]
        return chunks

    @staticmethod
    def placed(items: Sequence[RequestItem], chunk_size: int, order: Order = "prefix") -> list[list[int]]:
        """The positions of `items` cut into chunks of at most `chunk_size`: by shared prefix, or in order."""
        if check_order(order) == "file":
            return [
                list(range(start, min(start + chunk_size, len(items)))) for start in range(0, len(items), chunk_size)
            ]
        return place([prefix_text(item) for item in items], chunk_size)

    def _generation_chunks(self, lane: str) -> list[JobChunk]:
        items = self._generation.pop(lane)
        return [
            RequestChunk(self._next_number(), [items[position] for position in chunk])
            for chunk in self.placed(items, self.chunk_size, self.order)
        ]

    def _embedding_chunk(self, encoder: str) -> EmbeddingChunk:
        return EmbeddingChunk(self._next_number(), self._encoder.pop(encoder), encoder)

    def _next_number(self) -> int:
        self._number += 1
        return self._number - 1
