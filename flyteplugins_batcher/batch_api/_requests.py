"""Reading request lines: OpenAI Batch API lines (chat, completions, responses, embeddings, vLLM's pooling urls)
and plain ones.

See the `batch_api` package notes for what is accepted; this module turns one line of text into a
`BatchRequest` (text generation) or an `EmbeddingRequest` (an encoder's: embeddings, score, rerank,
classify), or fails it with a `RequestLineError`. A line's url picks its task in the endpoint table
(`_endpoints.py`), and the task its body's parser (`_PARSERS`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal, TypedDict

from typing_extensions import Unpack

from flyteplugins_batcher.batch_api._embeddings import EmbeddingRequest, parse_embedding_body
from flyteplugins_batcher.batch_api._endpoints import ENDPOINT_TABLE, Task, urls
from flyteplugins_batcher.batch_api._fields import FieldChecks
from flyteplugins_batcher.batch_api._generation import generation_settings
from flyteplugins_batcher.batch_api._json import JSONBoundsError, loads_bounded
from flyteplugins_batcher.batch_api._line_errors import RequestLineError
from flyteplugins_batcher.batch_api._lines import line_id
from flyteplugins_batcher.batch_api._logprobs import chat_logprobs, completion_logprobs
from flyteplugins_batcher.batch_api._messages import chat_messages, template_kwargs
from flyteplugins_batcher.batch_api._pooling import pooling_request
from flyteplugins_batcher.batch_api._responses_api import chat_body
from flyteplugins_batcher.batch_api._tools import ToolUse, tool_use
from flyteplugins_batcher.engines import GenerationConfig, Request, TokenLogprob, model_display_name

Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/responses"]
GENERATION_ENDPOINTS: tuple[str, ...] = urls(served_by="llm")
"""The text-generation urls (chat, completions, responses): what a job with only an LLM serves
(`parse_request_line`'s default)."""
ENDPOINTS: tuple[str, ...] = tuple(ENDPOINT_TABLE)
"""Every url this format knows (the endpoint table's): pass it as `endpoints` to a job that also serves an
encoder model (embeddings, score, rerank, classify)."""
ModelMismatch = Literal["error", "ignore"]


class LineChecks(TypedDict, total=False):
    """What a request line is checked against (`parse_request_line`'s and `parse_request`'s keywords).

    Attributes:
        served_model: The model that answers chat and completion lines; a body naming another one
            fails the line unless `model_mismatch="ignore"`.
        served_embedding_model: The same, for embedding lines (and score and rerank lines, by cosine similarity);
            it answers to its short name (a path's last part) too.
        encoder_tasks: The encoder models served, each with the tasks it can do (`"embed"`, `"score"`,
            `"rerank"`, `"classify"`), when a cross-encoder or classifier is served: an encoder line
            naming one that cannot do its task, or the LLM, fails (`model_mismatch`), and one whose
            task no served model does fails as `invalid_url`. Empty: `served_embedding_model` embeds,
            scores and reranks.
        model_mismatch: `"error"` (the default) or `"ignore"`.
        endpoints: The urls the job serves; an OpenAI line for another one fails as `invalid_url`.
            By default chat and completions; a job that also embeds passes `ENDPOINTS`.
        model_aliases: Other names a chat or completion line may give the served model: the model
            reference as the user gave it (a path, say), as `vllm run-batch --model PATH` accepts it.
        context_length: The model's context, when known: a `max_tokens` that leaves no space in it for
            a prompt fails as `context_length_exceeded` here, before the request costs anything. 0: unknown.
        adapters: The LoRA adapters served beside the model (vLLM's `--lora-modules` names): a chat or
            completion line whose `model` names one runs with it (`BatchRequest.adapter`).
        tool_parser: How `tool_choice: "auto"` finds tool calls in the text (one of `TOOL_PARSERS`,
            vLLM's `--tool-call-parser`); empty: a line asking for "auto" fails, saying so.
        other_models: The names of other base models served beside `served_model` (a run that names
            several): a chat or completion line naming one passes, and its caller routes it by `model`.
    """

    served_model: str | None
    served_embedding_model: str | None
    encoder_tasks: Mapping[str, Collection[str]]
    model_mismatch: ModelMismatch
    endpoints: Collection[str]
    model_aliases: Collection[str]
    context_length: int
    adapters: Collection[str]
    tool_parser: str
    other_models: Collection[str]


@dataclass(frozen=True)
class BatchRequest:
    """One parsed text-generation line (chat, completion, or a Responses API request, which runs as a chat).

    Attributes:
        line: Its 1-based line number in the input.
        custom_id: Its id (given, or `line-<n>` for a plain line without one).
        endpoint: `/v1/chat/completions` (chat messages), `/v1/completions` (a prompt) or `/v1/responses`
            (its input as chat messages, answered as a `response` object).
        prompt: The prompt text, or the chat messages.
        settings: Its own generation settings, by `GenerationConfig` field name (`max_new_tokens`,
            `temperature`, `top_p`, `stop`, `seed`, `n`, `response_format`, `logprobs`,
            `presence_penalty`, `frequency_penalty`, `logit_bias`), already checked with the API's ranges.
        model: The model its body asked for, if any.
        raw_prompt: The prompt goes to the model as written, with no chat template: an OpenAI
            `/v1/completions` line. A plain line's `prompt` is answered like a user message.
        adapter: The LoRA adapter its `model` names, if it names one (its answer names it as the model).
        tools: Its tools and tool choice, if it gives tools (`ToolUse`: the answer is read for calls).
        template_kwargs: Its `chat_template_kwargs`, for the chat template.
        request_echo: What a Responses API answer repeats of its request (`instructions`, `tools`,
            `text`, `metadata`, ...), as the request wrote it.

    Example:
        ```python
        request = parse_request_line(text, number)
        if isinstance(request, BatchRequest):
            [outcome] = engine.generate([request.engine_request(engine.generation)])
        ```
    """

    kind: ClassVar[str] = "generation"
    URLS: ClassVar[tuple[str, ...]] = GENERATION_ENDPOINTS
    """The urls whose lines become a `BatchRequest` (chat, completions, responses)."""

    line: int
    custom_id: str
    endpoint: Endpoint
    prompt: str | list[dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    raw_prompt: bool = False
    adapter: str | None = None
    tools: ToolUse | None = None
    template_kwargs: dict[str, Any] | None = None
    request_echo: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def chat(self) -> bool:
        """Whether its prompt is chat messages (a chat or Responses request), else a text completion's prompt."""
        return self.endpoint != "/v1/completions"

    def logprobs_object(self, logprobs: Sequence[TokenLogprob], text_offset: int = 0) -> dict[str, Any]:
        """Tokens' logprobs in this request's answer shape: a chat choice's `{"content": [...]}`, or a text
        completion's `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}` (offsets from `text_offset`)."""
        return chat_logprobs(logprobs) if self.chat else completion_logprobs(logprobs, text_offset)

    @property
    def samples(self) -> int:
        """Samples the request asked for (`n`; 1 when it did not say)."""
        return int(self.settings.get("n", 1))

    def generation(self, defaults: GenerationConfig) -> GenerationConfig:
        """The run's defaults with this request's own settings applied.

        Raises:
            RequestLineError: The combination is out of the engine's range (`invalid_request`).
        """
        if not self.settings:
            return defaults
        try:
            return replace(defaults, **self.settings)
        except (TypeError, ValueError) as error:
            raise RequestLineError("invalid_request", str(error), line=self.line, custom_id=self.custom_id) from None

    def engine_request(self, defaults: GenerationConfig) -> Request:
        """The engine `Request` for this request: its prompt, its settings over `defaults`, adapter, tools, keywords.

        Raises:
            RequestLineError: Its settings are out of the engine's range over `defaults` (`invalid_request`).
        """
        return Request(
            self.prompt,
            self.generation(defaults),
            id=self.custom_id,
            chat_template=False if self.raw_prompt else None,
            adapter=self.adapter,
            tools=[dict(tool) for tool in self.tools.tools] if self.tools is not None else None,
            template_kwargs=self.template_kwargs or None,
        )


ParsedRequest = BatchRequest | EmbeddingRequest
"""What a request line becomes: text generation (`BatchRequest`) or embeddings (`EmbeddingRequest`)."""


def parse_request_line(
    text: str,
    line: int,
    **checks: Unpack[LineChecks],
) -> ParsedRequest:
    """Parse and validate one input line (see the `batch_api` notes for what is accepted).

    Args:
        text: The line, without its newline (`read_request_lines` yields it so).
        line: Its 1-based number, for messages.
        **checks: What the line is checked against (`LineChecks`: the served models, the endpoints, the context).

    Returns:
        A `BatchRequest` for chat, completion and responses lines, an `EmbeddingRequest` for embedding,
        score, rerank and classify lines (route on the type, or on `kind`: `"generation"` or `"embedding"`).

    Raises:
        RequestLineError: Naming the line, the field as the line wrote it, and what is wrong.
    """
    try:
        data = loads_bounded(text.removeprefix("\ufeff") if line == 1 else text)
    except JSONBoundsError as error:
        raise RequestLineError("invalid_json", str(error), line=line) from None
    if not isinstance(data, dict):
        raise RequestLineError("invalid_json", f"a request must be a JSON object, got {type(data).__name__}", line=line)
    return parse_request(data, line, **checks)


def parse_request(
    data: Mapping[str, Any],
    line: int,
    **checks: Unpack[LineChecks],
) -> ParsedRequest:
    """Parse and validate one request already decoded from JSON (a line's object; an HTTP request's, say).

    Takes the same arguments as `parse_request_line`, and checks the same things.

    Example:
        ```python
        request = parse_request({"custom_id": "r1", "url": "/v1/chat/completions", "body": body}, 0)
        ```

    Raises:
        RequestLineError: Naming the line, the field as the request wrote it, and what is wrong.
    """
    if "url" in data or "body" in data or "method" in data:
        return _parse_openai(data, line, checks)
    return _parse_plain(data, line, checks)


def _parse_openai(data: Mapping[str, Any], line: int, rules: LineChecks) -> ParsedRequest:
    custom_id = _custom_id(data, line, required=True)
    checks = FieldChecks("body.", line, custom_id, context_length=rules.get("context_length", 0))
    method = data.get("method", "POST")
    if method != "POST":
        raise checks.fail("invalid_request", f"method must be POST, got {method!r}")
    url = data.get("url")
    endpoints = rules.get("endpoints", GENERATION_ENDPOINTS)
    if url not in endpoints or url not in ENDPOINTS:
        served = ", ".join(endpoint for endpoint in ENDPOINTS if endpoint in endpoints)
        raise checks.fail("invalid_url", f"url must be one of {served}, got {url!r}")
    body = data.get("body")
    if not isinstance(body, dict):
        raise checks.fail("invalid_body", "body must be a JSON object")
    model = body.get("model")
    endpoint = ENDPOINT_TABLE[url]
    if endpoint.served_by == "encoder":
        _check_encoder(model, endpoint.task, rules, checks)
        return _PARSERS[endpoint.task](body, checks, url, rules)
    adapters = rules.get("adapters", ())
    aliases = (*rules.get("model_aliases", ()), *rules.get("other_models", ()))
    mismatch = rules.get("model_mismatch", "error")
    _check_model(model, rules.get("served_model"), aliases, adapters, mismatch, checks, rules.get("other_models"))
    request = _PARSERS[endpoint.task](body, checks, url, rules)
    assert isinstance(request, BatchRequest)
    return replace(request, model=model, adapter=model if model in adapters else None)


def _check_encoder(model: Any, task: str, rules: LineChecks, checks: FieldChecks) -> None:
    """Fail an encoder line whose task no served model does, or naming a model that cannot do it (the LLM too)."""
    tasks = rules.get("encoder_tasks")
    embedding_model = rules.get("served_embedding_model")
    if not tasks:
        tasks = {embedding_model: ("embed", "score", "rerank")} if embedding_model else {}
    able = [name for name, done in tasks.items() if task in done]
    mismatch = rules.get("model_mismatch", "error")
    if not tasks or (model is not None and mismatch != "error" and able):
        return
    if not able:
        served = ", ".join(f"{name!r} ({', '.join(done)})" for name, done in tasks.items())
        raise checks.fail(
            "invalid_url",
            f"no served model can {task}: the encoder models here are {served}"
            + (" (serve a sequence classifier as the model to classify)" if task == "classify" else ""),
        )
    short_names = tuple(model_display_name(name) for name in able)  # an encoder answers to its short name too
    if model is None or model in able or model in short_names:
        return
    llm = {rules.get("served_model"), *rules.get("model_aliases", ()), *rules.get("other_models", ())} - {None}
    what = "generates text" if model in llm else ("cannot" if model in tasks else None)
    if what is None:
        _check_model(model, able[0], (*able[1:], *short_names), (), mismatch, checks)
        return
    why = f"is a text generator: it cannot {task}" if what == "generates text" else f"cannot {task}"
    raise checks.fail(
        "model_mismatch", f"body.model {model!r} {why}; {', '.join(map(repr, able))} can (name it, or no model)"
    )


def _check_model(
    model: Any,
    served_model: str | None,
    aliases: Collection[str],
    adapters: Collection[str],
    mismatch: ModelMismatch,
    checks: FieldChecks,
    others: Collection[str] | None = None,
) -> None:
    """Fail a line naming a model that is neither a served one (or an alias) nor a served adapter."""
    if model is None or served_model is None or mismatch != "error" or model in {served_model, *aliases, *adapters}:
        return
    listed = ", ".join(map(repr, adapters))
    served = f"the served model {served_model!r}{f' or one of its LoRA adapters ({listed})' if adapters else ''}"
    if others:
        models = ", ".join(map(repr, [served_model, *others]))
        served = f"a served model ({models}){f' or LoRA adapter ({listed})' if adapters else ''}"
    raise checks.fail(
        "model_mismatch",
        f"body.model {model!r} is not {served} (set model_mismatch='ignore' to run it on the "
        f"{'first ' if others else ''}served model anyway)",
    )


def _generation_request(data: Mapping[str, Any], checks: FieldChecks, url: str, tool_parser: str) -> BatchRequest:
    """A chat (`messages`) or completion (`prompt`) request's prompt, settings, tools and template keywords."""
    if url != "/v1/chat/completions":
        settings = generation_settings(data, checks, chat=False)
        raw = checks.prefix == "body."
        return BatchRequest(
            checks.line, str(checks.custom_id), "/v1/completions", _prompt(data, checks), settings, raw_prompt=raw
        )
    messages = chat_messages(data, checks)
    settings = generation_settings(data, checks, chat=True)
    tools = tool_use(data, checks, tool_parser)
    calls_format = tools.output_format() if tools is not None else None
    if calls_format is not None:
        if "response_format" in settings:
            raise checks.invalid("tool_choice", "constrains the output to tool calls; drop the other output constraint")
        settings["response_format"] = calls_format
    kwargs = template_kwargs(data.get("chat_template_kwargs"), checks)
    return BatchRequest(
        checks.line, str(checks.custom_id), url, messages, settings, tools=tools, template_kwargs=kwargs
    )


def _parse_plain(data: Mapping[str, Any], line: int, rules: LineChecks) -> BatchRequest:
    custom_id = _custom_id(data, line, required=False)
    checks = FieldChecks("", line, custom_id, context_length=rules.get("context_length", 0))
    if "messages" in data:
        return _generation_request(data, checks, "/v1/chat/completions", rules.get("tool_parser", ""))
    if "prompt" in data:
        return _generation_request(data, checks, "/v1/completions", rules.get("tool_parser", ""))
    raise checks.fail("invalid_body", "a request needs 'messages' or 'prompt' (or an OpenAI batch 'url' and 'body')")


def _custom_id(data: Mapping[str, Any], line: int, *, required: bool) -> str:
    custom_id = data.get("custom_id")
    if custom_id is None:
        if required:
            raise RequestLineError("missing_custom_id", "an OpenAI batch request needs a custom_id", line=line)
        return line_id(line)
    if not isinstance(custom_id, str):
        raise RequestLineError(
            "invalid_custom_id",
            f"custom_id must be a string, got {type(custom_id).__name__} {custom_id!r} (write it in quotes)",
            line=line,
        )
    if not custom_id.strip():
        raise RequestLineError("invalid_custom_id", f"custom_id must not be empty, got {custom_id!r}", line=line)
    return custom_id


def _prompt(data: Mapping[str, Any], checks: FieldChecks) -> str:
    prompt = data.get("prompt")
    if not isinstance(prompt, str):
        raise checks.fail("invalid_body", f"{checks.prefix}prompt must be one string (one prompt per line)")
    return prompt


def _embeddings(body: Mapping[str, Any], checks: FieldChecks, url: str, rules: LineChecks) -> ParsedRequest:
    inputs, encoding_format = parse_embedding_body(body, checks)
    return EmbeddingRequest(checks.line, str(checks.custom_id), inputs, encoding_format, body.get("model"))


def _pooling(task: Task) -> Callable[[Mapping[str, Any], FieldChecks, str, LineChecks], ParsedRequest]:
    return lambda body, checks, url, rules: pooling_request(body, checks, url, task)


def _generation(body: Mapping[str, Any], checks: FieldChecks, url: str, rules: LineChecks) -> ParsedRequest:
    return _generation_request(body, checks, url, rules.get("tool_parser", ""))


def _responses(body: Mapping[str, Any], checks: FieldChecks, url: str, rules: LineChecks) -> ParsedRequest:
    """A Responses request: the chat request it means (`_responses_api.chat_body`), through the chat parser."""
    chat, echo = chat_body(body, checks)
    request = _generation_request(chat, checks, "/v1/chat/completions", rules.get("tool_parser", ""))
    settings = dict(request.settings)
    if settings.get("response_format") is not None:  # its errors name the field this request wrote
        settings["response_format"] = settings["response_format"].set_by("text.format")
    return replace(request, endpoint="/v1/responses", request_echo=echo, settings=settings)


_PARSERS: dict[Task, Callable[[Mapping[str, Any], FieldChecks, str, LineChecks], ParsedRequest]] = {
    "chat": _generation,
    "completion": _generation,
    "responses": _responses,
    "embed": _embeddings,
    "score": _pooling("score"),
    "rerank": _pooling("rerank"),
    "classify": _pooling("classify"),
}
"""Each task's body parser (the endpoint table gives a url's task)."""
