"""Reading request lines: OpenAI Batch API lines (`/v1/chat/completions`, `/v1/completions`) and plain ones.

Accepted, one JSON object per line:

- OpenAI batch: `{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [...]}}`
  or `"url": "/v1/completions"` with `"body": {"prompt": "..."}`.
- Plain: `{"custom_id"?, "prompt": "..."}` or `{"custom_id"?, "messages": [...]}`, with the same
  optional settings beside them; a plain line without a `custom_id` gets `line-<n>`.

Settings taken from a body (or a plain line), for that request alone: `max_tokens` (also
`max_completion_tokens`), `temperature`, `top_p`, `stop`, `seed`. Anything else in a body is
ignored, except `n` > 1, which this engine cannot honour and fails the line. A `model` that is not
the served one fails the line, unless the job is told to ignore it (`model_mismatch="ignore"`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from flyteplugins_batcher.engines import GenerationConfig

Endpoint = Literal["/v1/chat/completions", "/v1/completions"]
ENDPOINTS: tuple[str, ...] = ("/v1/chat/completions", "/v1/completions")
ModelMismatch = Literal["error", "ignore"]

_SETTING_KEYS = {"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens"}
_DIRECT_SETTINGS = ("temperature", "top_p", "stop", "seed")


class RequestLineError(Exception):
    """A request line that cannot run; it becomes one line of the errors file.

    Attributes:
        code: A short machine-readable reason (`invalid_json`, `missing_custom_id`,
            `duplicate_custom_id`, `invalid_url`, `invalid_body`, `invalid_request`,
            `model_mismatch`, `context_length_exceeded`, `inference_failed`).
        message: What is wrong, for a person.
        line: The 1-based line number in the input.
        custom_id: The request's id, when it has one.
    """

    def __init__(self, code: str, message: str, *, line: int, custom_id: str | None = None) -> None:
        super().__init__(f"line {line}: {message}")
        self.code = code
        self.message = message
        self.line = line
        self.custom_id = custom_id


@dataclass(frozen=True)
class BatchRequest:
    """One parsed request line.

    Attributes:
        line: Its 1-based line number in the input.
        custom_id: Its id (given, or `line-<n>` for a plain line without one).
        endpoint: `/v1/chat/completions` (chat messages) or `/v1/completions` (a prompt).
        prompt: The prompt text, or the chat messages.
        settings: Its own generation settings, by `GenerationConfig` field name.
        model: The model its body asked for, if any.
    """

    line: int
    custom_id: str
    endpoint: Endpoint
    prompt: str | list[dict[str, str]]
    settings: dict[str, Any] = field(default_factory=dict)
    model: str | None = None

    def generation(self, defaults: GenerationConfig) -> GenerationConfig:
        """The run's defaults with this request's own settings applied.

        Raises:
            RequestLineError: A setting is out of range (`invalid_request`).
        """
        if not self.settings:
            return defaults
        try:
            return replace(defaults, **self.settings)
        except (TypeError, ValueError) as error:
            raise RequestLineError("invalid_request", str(error), line=self.line, custom_id=self.custom_id) from None


def parse_request_line(
    text: str,
    line: int,
    *,
    served_model: str | None = None,
    model_mismatch: ModelMismatch = "error",
) -> BatchRequest:
    """Parse and validate one input line (see the module notes for what is accepted).

    Args:
        text: The line, without its newline.
        line: Its 1-based number, for messages.
        served_model: The model that will answer; a body naming another one fails the line unless
            `model_mismatch="ignore"`.
        model_mismatch: `"error"` or `"ignore"`.

    Raises:
        RequestLineError: Naming the line and what is wrong with it.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise RequestLineError(
            "invalid_json", f"not valid JSON: {error.msg} at column {error.colno}", line=line
        ) from None
    if not isinstance(data, dict):
        raise RequestLineError("invalid_json", f"a request must be a JSON object, got {type(data).__name__}", line=line)
    if "url" in data or "body" in data or "method" in data:
        return _parse_openai(data, line, served_model, model_mismatch)
    return _parse_plain(data, line)


def _parse_openai(
    data: dict[str, Any], line: int, served_model: str | None, model_mismatch: ModelMismatch
) -> BatchRequest:
    custom_id = _custom_id(data, line, required=True)
    method = data.get("method", "POST")
    if method != "POST":
        raise _error("invalid_request", f"method must be POST, got {method!r}", line, custom_id)
    url = data.get("url")
    if url not in ENDPOINTS:
        raise _error("invalid_url", f"url must be one of {', '.join(ENDPOINTS)}, got {url!r}", line, custom_id)
    body = data.get("body")
    if not isinstance(body, dict):
        raise _error("invalid_body", "body must be a JSON object", line, custom_id)
    model = body.get("model")
    if model is not None and served_model is not None and model != served_model and model_mismatch == "error":
        raise _error(
            "model_mismatch",
            f"body.model {model!r} is not the served model {served_model!r} (set model_mismatch='ignore' to run it "
            "on the served model anyway)",
            line,
            custom_id,
        )
    if url == "/v1/chat/completions":
        prompt: str | list[dict[str, str]] = _messages(body, line, custom_id, where="body.messages")
    else:
        prompt = _prompt(body, line, custom_id, where="body.prompt")
    return BatchRequest(line, custom_id, url, prompt, _settings(body, line, custom_id), model)


def _parse_plain(data: dict[str, Any], line: int) -> BatchRequest:
    custom_id = _custom_id(data, line, required=False)
    if "messages" in data:
        return BatchRequest(
            line,
            custom_id,
            "/v1/chat/completions",
            _messages(data, line, custom_id, where="messages"),
            _settings(data, line, custom_id),
        )
    if "prompt" in data:
        return BatchRequest(
            line,
            custom_id,
            "/v1/completions",
            _prompt(data, line, custom_id, where="prompt"),
            _settings(data, line, custom_id),
        )
    raise _error(
        "invalid_body", "a request needs 'messages' or 'prompt' (or an OpenAI batch 'url' and 'body')", line, custom_id
    )


def _custom_id(data: Mapping[str, Any], line: int, *, required: bool) -> str:
    custom_id = data.get("custom_id")
    if custom_id is None:
        if required:
            raise _error("missing_custom_id", "an OpenAI batch request needs a custom_id", line, None)
        return f"line-{line}"
    if not isinstance(custom_id, str) or not custom_id.strip():
        raise _error("missing_custom_id", f"custom_id must be a non-empty string, got {custom_id!r}", line, None)
    return custom_id


def _messages(data: Mapping[str, Any], line: int, custom_id: str, *, where: str) -> list[dict[str, str]]:
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _error("invalid_body", f"{where} must be a non-empty list of chat messages", line, custom_id)
    normalized = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _error("invalid_body", f"{where}: each message needs a 'role' and 'content'", line, custom_id)
        content = message.get("content")
        if isinstance(content, list):  # OpenAI's content parts: text parts only
            texts = [part.get("text") for part in content if isinstance(part, dict) and part.get("type") == "text"]
            if len(texts) != len(content) or not all(isinstance(text, str) for text in texts):
                raise _error("invalid_body", f"{where}: only text content parts are supported", line, custom_id)
            content = "".join(texts)
        if not isinstance(content, str):
            raise _error("invalid_body", f"{where}: message content must be text", line, custom_id)
        normalized.append({"role": message["role"], "content": content})
    return normalized


def _prompt(data: Mapping[str, Any], line: int, custom_id: str, *, where: str) -> str:
    prompt = data.get("prompt")
    if not isinstance(prompt, str):
        raise _error("invalid_body", f"{where} must be one string (one prompt per line)", line, custom_id)
    return prompt


def _settings(data: Mapping[str, Any], line: int, custom_id: str) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for key, name in _SETTING_KEYS.items():
        if data.get(key) is not None:
            settings[name] = _number(data[key], key, line, custom_id, integer=True)
    for key in _DIRECT_SETTINGS:
        value = data.get(key)
        if value is None:
            continue
        if key == "stop":
            stops = [value] if isinstance(value, str) else value
            if not isinstance(stops, list) or not all(isinstance(stop, str) and stop for stop in stops):
                raise _error(
                    "invalid_request", f"stop must be a string or a list of strings, got {value!r}", line, custom_id
                )
            settings["stop"] = tuple(stops)
        else:
            settings[key] = _number(value, key, line, custom_id, integer=key == "seed")
    n = data.get("n", 1)
    if n != 1:
        raise _error("invalid_request", f"n={n!r}: one completion per request is supported", line, custom_id)
    return settings


def _number(value: Any, key: str, line: int, custom_id: str, *, integer: bool) -> int | float:
    valid = isinstance(value, int) if integer else isinstance(value, (int, float)) and math.isfinite(value)
    if isinstance(value, bool) or not valid:
        kind = "an integer" if integer else "a number"
        raise _error("invalid_request", f"{key} must be {kind}, got {value!r}", line, custom_id)
    return value


def _error(code: str, message: str, line: int, custom_id: str | None) -> RequestLineError:
    return RequestLineError(code, message, line=line, custom_id=custom_id)
