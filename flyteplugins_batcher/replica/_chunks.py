"""What a replica takes and gives back: chunks of requests, each request's result, and the chunk's outcome.

Chunks are dataclasses rather than bare lists: Flyte serializes a top-level list element by element,
which is several times slower than one dataclass holding the list. Two kinds travel: `RequestChunk`s
of prompts for the LLM replicas, and `EmbeddingChunk`s of texts for the embedding replicas.
"""

from __future__ import annotations

import array
import base64
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from typing_extensions import Self

from flyteplugins_batcher.batch_api import BatchRequest, EmbeddingRequest
from flyteplugins_batcher.engines import Completion, GenerationConfig, Request, ResponseFormat, Sample, TokenLogprob
from flyteplugins_batcher.replica._snapshot import ReplicaSnapshot


@dataclass
class ToolCallItem:
    """A tool call an assistant message made, earlier in a conversation (OpenAI's `tool_calls[i]`)."""

    id: str
    name: str
    arguments: str  # JSON text, as OpenAI writes it


@dataclass
class ChatMessage:
    """One chat message: its role and text, and an assistant's tool calls or a tool answer's call id."""

    role: str
    content: str
    tool_calls: list[ToolCallItem] = field(default_factory=list)
    tool_call_id: str = ""
    name: str = ""

    @classmethod
    def of(cls, message: dict[str, Any]) -> ChatMessage:
        """The message as `batch_api` parsed it."""
        calls = [
            ToolCallItem(call["id"], call["function"]["name"], _json_text(call["function"]["arguments"]))
            for call in message.get("tool_calls") or []
        ]
        return cls(message["role"], message["content"], calls, message.get("tool_call_id", ""), message.get("name", ""))

    def to_dict(self) -> dict[str, Any]:
        """The message as an engine's chat template takes it."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                for call in self.tool_calls
            ]
        message.update({key: getattr(self, key) for key in ("tool_call_id", "name") if getattr(self, key)})
        return message


@dataclass
class RequestItem:
    """One prompt for the engine, with the generation settings its request set for itself.

    The request's own settings travel as JSON text, by `GenerationConfig` field name (empty: the run's),
    so that `GenerationConfig` stays the one place a setting is described; `generation` lays them over
    the run's. What else has no fixed shape (tools, chat template keywords) travels as JSON text too.

    Example:
        ```python
        item = RequestItem("q1", prompt="Name a prime.", settings='{"max_new_tokens": 8}')
        assert item.generation(GenerationConfig()).max_new_tokens == 8
        ```
    """

    key: str
    prompt: str = ""
    messages: list[ChatMessage] = field(default_factory=list)
    settings: str = ""  # its own `GenerationConfig` fields, as JSON text
    raw_prompt: bool = False  # an OpenAI /v1/completions prompt: no chat template
    adapter: str = ""  # the LoRA adapter its `model` named; empty: the base model
    tools: str = ""  # the request's `tools`, as JSON text
    template_kwargs: str = ""  # its `chat_template_kwargs`, as JSON text

    @classmethod
    def of(cls, request: BatchRequest) -> RequestItem:
        """The chunk item for a parsed request line; its own settings travel with it, by `GenerationConfig` name."""
        prompt = request.prompt if isinstance(request.prompt, str) else ""
        messages = [] if isinstance(request.prompt, str) else [ChatMessage.of(message) for message in request.prompt]
        return cls(
            request.custom_id,
            prompt,
            messages,
            _settings_text(request.settings),
            request.raw_prompt,
            request.adapter or "",
            json.dumps([dict(tool) for tool in request.tools.tools]) if request.tools is not None else "",
            json.dumps(request.template_kwargs) if request.template_kwargs else "",
        )

    def generation(self, defaults: GenerationConfig) -> GenerationConfig:
        """The run's `defaults` with this item's own settings over them.

        Raises:
            ValueError: A setting is out of range.
        """
        own = _settings_of(self.settings)
        return replace(defaults, **own) if own else defaults

    def engine_request(self, defaults: GenerationConfig) -> Request:
        """The engine `Request` for this item: its prompt (or chat messages), settings, adapter, tools and keywords."""
        prompt = [message.to_dict() for message in self.messages] if self.messages else self.prompt
        return Request(
            prompt,
            self.generation(defaults),
            id=self.key,
            chat_template=False if self.raw_prompt else None,
            adapter=self.adapter or None,
            tools=json.loads(self.tools) if self.tools else None,
            template_kwargs=json.loads(self.template_kwargs) if self.template_kwargs else None,
        )


_STOPPED = "cancelled"
"""The error code of a prompt stopped before it finished."""


def _settings_text(settings: Mapping[str, Any]) -> str:
    """A request's own settings (`GenerationConfig` names and values) as JSON text; empty when it has none.

    A response format goes as its fields, a logit bias as `[token id, bias]` pairs (JSON keys are text).
    """
    if not settings:
        return ""
    own = dict(settings)
    if own.get("response_format") is not None:
        own["response_format"] = dataclasses.asdict(own["response_format"])
    if "logit_bias" in own:
        own["logit_bias"] = list(dict(own["logit_bias"]).items())
    return json.dumps(own, ensure_ascii=False)


def _settings_of(text: str) -> dict[str, Any]:
    """The settings `_settings_text` wrote, as `GenerationConfig` takes them."""
    own: dict[str, Any] = json.loads(text) if text else {}
    if own.get("response_format") is not None:
        own["response_format"] = ResponseFormat(**own["response_format"])
    return own


def _json_text(arguments: str | dict[str, Any]) -> str:
    """Tool call arguments as JSON text (a request may give them as an object)."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


@dataclass
class RequestChunk:
    """A slice of the job sent to one `infer_chunk` call."""

    index: int
    items: list[RequestItem]

    def only(self, positions: list[int]) -> RequestChunk:
        """This chunk with only the items at `positions` (a rerun's retry of the items that failed)."""
        return RequestChunk(self.index, [self.items[position] for position in positions])


@dataclass
class LogprobResult:
    """One generated token's logprob (`engines.TokenLogprob`'s fields), its alternatives as two lists."""

    token: str
    logprob: float
    top_tokens: list[str] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, item: TokenLogprob) -> LogprobResult:
        return cls(item.token, item.logprob, [token for token, _ in item.top], [value for _, value in item.top])

    def token_logprob(self) -> TokenLogprob:
        return TokenLogprob(self.token, self.logprob, tuple(zip(self.top_tokens, self.top_logprobs, strict=True)))


@dataclass
class SampleResult:
    """One sample of a completion (`engines.Sample`'s fields); `logprobs` `None` when the request asked for none.

    `stop_reason` empty: none (EOS or the length ended it); `reasoning` `None`: no reasoning parser, or none found.
    """

    text: str
    finish_reason: str
    completion_tokens: int
    logprobs: list[LogprobResult] | None = None
    stop_reason: str = ""
    reasoning: str | None = None
    reasoning_tokens: int = 0

    @classmethod
    def of(cls, sample: Sample) -> SampleResult:
        logprobs = None if sample.logprobs is None else [LogprobResult.of(item) for item in sample.logprobs]
        return cls(
            sample.text,
            sample.finish_reason,
            sample.completion_tokens,
            logprobs,
            sample.stop_reason or "",
            sample.reasoning,
            sample.reasoning_tokens,
        )

    def sample(self) -> Sample:
        logprobs = None if self.logprobs is None else tuple(item.token_logprob() for item in self.logprobs)
        return Sample(
            self.text,
            self.completion_tokens,
            self.finish_reason,  # type: ignore[arg-type]
            logprobs,
            self.stop_reason or None,
            self.reasoning,
            self.reasoning_tokens,
        )


@dataclass
class ItemResult:
    """One prompt's outcome: a completion, or an error code and message.

    `text` and `finish_reason` are the first sample's and `completion_tokens` counts every sample, as
    in `Completion`; `samples` holds every sample when the request asked for more than one, or for
    logprobs (which only a sample carries). `cached_tokens`: prompt tokens the engine found in its
    prefix cache (0 in outcomes written before it was kept). `stop_reason`, `reasoning` and
    `reasoning_tokens` are the first sample's (`SampleResult`'s).
    """

    key: str
    text: str = ""
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error_code: str = ""
    error_message: str = ""
    samples: list[SampleResult] = field(default_factory=list)
    cached_tokens: int = 0
    stop_reason: str = ""
    reasoning: str | None = None
    reasoning_tokens: int = 0

    @classmethod
    def of(cls, key: str, completion: Completion) -> ItemResult:
        """The result for a completion (its samples kept only when there are several, or they carry logprobs)."""
        samples = [SampleResult.of(sample) for sample in completion.samples]
        first = samples[0]
        return cls(
            key,
            completion.text,
            completion.finish_reason,
            completion.prompt_tokens,
            completion.completion_tokens,
            samples=samples if len(samples) > 1 or first.logprobs is not None else [],
            cached_tokens=completion.cached_tokens,
            stop_reason=first.stop_reason,
            reasoning=first.reasoning,
            reasoning_tokens=first.reasoning_tokens,
        )

    @classmethod
    def stopped(cls, key: str) -> ItemResult:
        """The result of a prompt its chunk was told to stop before it finished (it has no answer yet)."""
        return cls(key, error_code=_STOPPED, error_message="The request was cancelled before it finished.")

    @property
    def was_stopped(self) -> bool:
        """Whether the prompt was stopped before it finished (`stopped`): it has no answer, for another pass to give."""
        return self.error_code == _STOPPED

    def completion(self) -> Completion:
        """The completion this result carries, every sample included."""
        only = SampleResult(
            self.text,
            self.finish_reason,
            self.completion_tokens,
            stop_reason=self.stop_reason,
            reasoning=self.reasoning,
            reasoning_tokens=self.reasoning_tokens,
        )
        samples = [sample.sample() for sample in self.samples or [only]]
        return Completion.from_samples(self.prompt_tokens, samples, cached_tokens=self.cached_tokens)


PERMANENT_ERRORS = frozenset({"context_length_exceeded", "invalid_prompt"})
"""Error codes an item gets again on every attempt: its prompt is too long for the model, empty, or refused by the
chat template. A chunk's cached outcome is keyed by its items and the engine's settings, so a rerun that finds one
has the same model and template: retrying such an item would load a model only to fail it again."""


class ItemOutcomes:
    """What the workflows' chunk outcomes share: which items this run computed, and merging a retry.

    A dataclass that mixes it in has `finished_at` (when its replica finished it), `results` (one per
    item, each with an `error_code`, empty when it succeeded), `replica`, and `fresh`: `None` when all
    its items share `finished_at`'s run, else the positions this run computed (its retried items).
    """

    finished_at: float
    fresh: list[int] | None
    results: list[Any]

    def computed_since(self, position: int, started: float) -> bool:
        """Whether the item at `position` was computed by the run that started at `started` (not reused)."""
        if self.fresh is not None:
            return position in self.fresh
        return self.finished_at >= started

    def was_retried(self, position: int) -> bool:
        """Whether the item at `position` had failed in an earlier run and this run computed it again."""
        return self.fresh is not None and position in self.fresh

    def failed_positions(self) -> list[int]:
        return [position for position, result in enumerate(self.results) if result.error_code]

    def retryable_positions(self) -> list[int]:
        """Positions of the items that failed for a reason another attempt may not meet (not `PERMANENT_ERRORS`)."""
        return [
            position
            for position, result in enumerate(self.results)
            if result.error_code and result.error_code not in PERMANENT_ERRORS
        ]

    def with_retried(self, positions: Sequence[int], retried: Self, started: float) -> Self:
        """This (reused) outcome with the items at `positions` replaced by their retry's outcomes.

        Everything but the results (the replica's state, when it finished) is the later outcome's, so
        that a retry that ran in this run counts in the run's statistics.
        """
        results = list(self.results)
        for retry_position, position in enumerate(positions):
            results[position] = retried.results[retry_position]
        fresh = [position for index, position in enumerate(positions) if retried.computed_since(index, started)]
        latest = retried if retried.finished_at > self.finished_at else self
        return dataclasses.replace(latest, results=results, fresh=fresh)  # type: ignore[type-var]


@dataclass
class ChunkOutcome(ItemOutcomes):
    """What one `infer_chunk` call returns: an `ItemResult` per prompt, in order, and its replica's state.

    `finished_at` (epoch seconds) tells a chunk reused from an earlier run (it finished before this run
    began); `fresh` is set on an outcome that merges an earlier run's answers with this run's retry of
    its failures (`flyteplugins_batcher/jobs/_reruns.py`).
    """

    index: int
    results: list[ItemResult]
    replica: ReplicaSnapshot
    finished_at: float = 0.0
    fresh: list[int] | None = None


@dataclass
class EmbeddingItem:
    """One request for an encoder model of a batch job: texts to embed or classify, or pairs to score.

    Attributes:
        key: The request's id.
        inputs: The texts to embed or classify, or the documents to score against `queries`.
        task: `"embed"`, `"score"`, `"rerank"` or `"classify"` (a rerank is a score, ranked when answered).
        queries: A score's queries: one, scored against every document, or one per document.
        activation: Whether a classifier's logits go through its activation (vLLM's `use_activation`).
    """

    key: str
    inputs: list[str]
    task: str = "embed"
    queries: list[str] = field(default_factory=list)
    activation: bool = True

    @classmethod
    def of(cls, request: EmbeddingRequest) -> EmbeddingItem:
        """The chunk item for a parsed embeddings, score, rerank or classify line."""
        return cls(request.custom_id, list(request.inputs), request.task, list(request.queries), request.use_activation)

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """A score's (query, document) pairs, in the documents' order."""
        queries = self.queries * len(self.inputs) if len(self.queries) == 1 else self.queries
        return list(zip(queries, self.inputs, strict=True))

    @property
    def size(self) -> int:
        """Texts (or pairs) it holds: what a chunk's size counts."""
        return len(self.inputs)


@dataclass
class EmbeddingChunk:
    """A slice of a batch job's requests for one encoder model, sent to one `embed_requests` call.

    `model` is empty for the embedding model (`EMBED_MODEL`); for the run's classifier (a cross-encoder
    given as the model) it is its reference, and the chunk runs on the LLM replicas' environment.
    """

    index: int
    items: list[EmbeddingItem]
    model: str = ""

    def only(self, positions: list[int]) -> EmbeddingChunk:
        """This chunk with only the requests at `positions` (a rerun's retry of the requests that failed)."""
        return EmbeddingChunk(self.index, [self.items[position] for position in positions], self.model)


@dataclass
class EmbeddingResult:
    """One encoder request's outcome: a vector per text, a score per pair, or an error code and message.

    Vectors travel as base64 of their little-endian float32 bytes (OpenAI's `encoding_format="base64"`):
    exact, and a third of the size of JSON numbers; a classify's class probabilities are its vectors,
    with each text's `labels`. A score's or rerank's `scores` are floats, one per pair. `truncated`
    counts the request's texts the model cut at its `max_seq_length`.
    """

    key: str
    vectors: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    error_code: str = ""
    error_message: str = ""
    truncated: int = 0
    scores: list[float] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)

    def outputs(self) -> list[list[float]]:
        """Each input's output as floats: a text's vector (or class probabilities), a pair's score (a list of one)."""
        return [[score] for score in self.scores] or [decode_vector(vector) for vector in self.vectors]


def decode_vector(encoded: str) -> list[float]:
    """A vector sent as base64 of little-endian float32 bytes, as floats."""
    values = array.array("f", base64.b64decode(encoded))
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


@dataclass
class EmbeddingOutcome(ItemOutcomes):
    """What one `embed_requests` call returns: an `EmbeddingResult` per request, in order, and its replica's state.

    `finished_at` and `fresh` as in `ChunkOutcome`.
    """

    index: int
    results: list[EmbeddingResult]
    replica: ReplicaSnapshot
    finished_at: float = 0.0
    fresh: list[int] | None = None


JobChunk = RequestChunk | EmbeddingChunk


JobOutcome = ChunkOutcome | EmbeddingOutcome
