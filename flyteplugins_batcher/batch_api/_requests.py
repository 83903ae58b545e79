"""Reading request lines: OpenAI Batch API lines (chat, completions, embeddings) and plain ones.

See the `batch_api` package notes for what is accepted; this module turns one line of text into a
`BatchRequest` (text generation) or an `EmbeddingRequest`, or fails it with a `RequestLineError`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal, TypedDict

from typing_extensions import Unpack

from flyteplugins_batcher.batch_api._embeddings import EMBEDDINGS_ENDPOINT, EmbeddingRequest, parse_embedding_body
from flyteplugins_batcher.batch_api._fields import FieldChecks
from flyteplugins_batcher.batch_api._generation import generation_settings
from flyteplugins_batcher.batch_api._json import JSONBoundsError, loads_bounded
from flyteplugins_batcher.batch_api._line_errors import RequestLineError
from flyteplugins_batcher.batch_api._logprobs import chat_logprobs, completion_logprobs
from flyteplugins_batcher.batch_api._messages import chat_messages, template_kwargs
from flyteplugins_batcher.batch_api._results import line_id
from flyteplugins_batcher.batch_api._tools import ToolUse, tool_use
from flyteplugins_batcher.engines import GenerationConfig, Request, TokenLogprob, model_display_name

Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]
GENERATION_ENDPOINTS: tuple[str, ...] = ("/v1/chat/completions", "/v1/completions")
"""The text-generation urls: what a job with only an LLM serves (`parse_request_line`'s default)."""
ENDPOINTS: tuple[str, ...] = (*GENERATION_ENDPOINTS, EMBEDDINGS_ENDPOINT)
"""Every url this format knows: pass it as `endpoints` to a job that also serves embeddings."""
ModelMismatch = Literal["error", "ignore"]


class LineChecks(TypedDict, total=False):
    """What a request line is checked against (`parse_request_line`'s and `parse_request`'s keywords).

    Attributes:
        served_model: The model that answers chat and completion lines; a body naming another one
            fails the line unless `model_mismatch="ignore"`.
        served_embedding_model: The same, for embedding lines (its short name, a path's last part, too).
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
    model_mismatch: ModelMismatch
    endpoints: Collection[str]
    model_aliases: Collection[str]
    context_length: int
    adapters: Collection[str]
    tool_parser: str
    other_models: Collection[str]


@dataclass(frozen=True)
class BatchRequest:
    """One parsed text-generation line (chat or completion).

    Attributes:
        line: Its 1-based line number in the input.
        custom_id: Its id (given, or `line-<n>` for a plain line without one).
        endpoint: `/v1/chat/completions` (chat messages) or `/v1/completions` (a prompt).
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

    Example:
        ```python
        request = parse_request_line(text, number)
        if isinstance(request, BatchRequest):
            [outcome] = engine.generate([request.engine_request(engine.generation)])
        ```
    """

    kind: ClassVar[str] = "generation"

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

    @property
    def chat(self) -> bool:
        """Whether it is a chat request (answered with messages), else a text completion."""
        return self.endpoint == "/v1/chat/completions"

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
        A `BatchRequest` for chat and completion lines, an `EmbeddingRequest` for embedding lines
        (route on the type, or on `kind`: `"generation"` or `"embedding"`).

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
        embedding = data.get("url") == EMBEDDINGS_ENDPOINT
        served = checks.get("served_embedding_model") if embedding else checks.get("served_model")
        return _parse_openai(data, line, served, checks, embedding=embedding)
    return _parse_plain(data, line, checks)


def _parse_openai(
    data: Mapping[str, Any], line: int, served_model: str | None, rules: LineChecks, *, embedding: bool
) -> ParsedRequest:
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
    if embedding:  # the embedding model answers to its reference as given and to its short name
        short = (model_display_name(served_model),) if served_model else ()
        _check_model(model, served_model, short, (), rules.get("model_mismatch", "error"), checks)
        inputs, encoding_format = parse_embedding_body(body, checks)
        return EmbeddingRequest(line, custom_id, inputs, encoding_format, model)
    adapters = rules.get("adapters", ())
    aliases = (*rules.get("model_aliases", ()), *rules.get("other_models", ()))
    _check_model(
        model, served_model, aliases, adapters, rules.get("model_mismatch", "error"), checks, rules.get("other_models")
    )
    request = _generation_request(body, checks, url, rules.get("tool_parser", ""))
    return replace(request, model=model, adapter=model if model in adapters else None)


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
