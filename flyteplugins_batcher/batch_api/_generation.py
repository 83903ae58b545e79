"""A request's generation settings, checked with the OpenAI API's ranges and named as the request wrote them.

The engine's `GenerationConfig` validates its own fields too, but its names and limits are the
engine's (`max_new_tokens`, any temperature >= 0); a request line is checked first here, as the
API would check it, so that a bad line fails with the field it wrote (`body.max_tokens`) and the
API's range (temperature 0 to 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flyteplugins_batcher.batch_api._constraints import output_constraint
from flyteplugins_batcher.batch_api._fields import INT64, FieldChecks
from flyteplugins_batcher.engines import MAX_SAMPLES

MAX_STOP_SEQUENCES = 4
"""Most stop sequences a request may give, as OpenAI's API allows."""

MAX_TOP_LOGPROBS = 20
"""Most alternatives per token (`top_logprobs`, a completion's `logprobs`), as OpenAI's API and vLLM allow."""

BOOLEAN_FIELDS = ("stream", "echo", "store", "parallel_tool_calls")
"""A request's flags that must be JSON booleans (or null) when given (a chat request's `logprobs` too)."""

_TOKEN_LIMIT_KEYS = ("max_tokens", "max_completion_tokens")


def generation_settings(data: Mapping[str, Any], checks: FieldChecks, *, chat: bool = True) -> dict[str, Any]:
    """A request's own generation settings, by `GenerationConfig` field name, checked with the API's ranges.

    `max_tokens` / `max_completion_tokens` >= 1 (and below the model's context when `checks` knows
    it: `context_length_exceeded` otherwise), `temperature` 0 to 2, `top_p` 0 to 1 (0 keeps only
    the most likely token, which is greedy decoding: it becomes temperature 0), `n` 1 to 128, an
    integer `seed`, at most 4 `stop` sequences, `presence_penalty` and `frequency_penalty` -2 to 2,
    a `logit_bias` of token ids to -100 to 100, logprobs (`logprobs` and `top_logprobs` 0 to 20
    for a chat request, `logprobs` 0 to 20 for a completion), and what constrains the output
    (`response_format`, `structured_outputs`, `guided_*`).

    Raises:
        RequestLineError: `invalid_request`, naming the field as the request wrote it.
    """
    check_flags(data, checks)
    settings: dict[str, Any] = {}
    limit = _token_limit(data, checks)
    if limit is not None:
        settings["max_new_tokens"] = limit
    temperature = checks.number(data, "temperature", 0.0, 2.0)
    top_p = checks.number(data, "top_p", 0.0, 1.0)
    if top_p == 0.0:
        temperature, top_p = 0.0, None
    optional = {
        "temperature": temperature,
        "top_p": top_p,
        "n": checks.integer(data, "n", 1, MAX_SAMPLES),
        "seed": checks.integer(data, "seed", -INT64, INT64 - 1),
        "stop": stop_sequences(data.get("stop"), checks),
        "response_format": output_constraint(data, checks),
        "logprobs": chat_logprobs(data, checks) if chat else checks.integer(data, "logprobs", 0, MAX_TOP_LOGPROBS),
        "presence_penalty": checks.number(data, "presence_penalty", -2.0, 2.0) or None,
        "frequency_penalty": checks.number(data, "frequency_penalty", -2.0, 2.0) or None,
        "logit_bias": logit_bias(data.get("logit_bias"), checks),
    }
    settings.update({name: value for name, value in optional.items() if value is not None})
    return settings


def _token_limit(data: Mapping[str, Any], checks: FieldChecks) -> int | None:
    """`max_tokens` or `max_completion_tokens` (the later one wins), refused when it fills the model's context."""
    settings = None
    for key in _TOKEN_LIMIT_KEYS:
        limit = checks.integer(data, key, 1, INT64 - 1)
        if limit is not None and checks.context_length and limit >= checks.context_length:
            # Refused here, not by the engine: a record is costed (and counted in the metrics) once submitted.
            message = (
                f"{checks.prefix}{key} is {limit}, but the model's context holds {checks.context_length} tokens, "
                "the prompt included"
            )
            raise checks.fail("context_length_exceeded", message)
        if limit is not None:
            settings = limit
    return settings


def chat_logprobs(data: Mapping[str, Any], checks: FieldChecks) -> int | None:
    """A chat request's logprobs: `logprobs: true` with `top_logprobs` alternatives (0 by default), else None.

    Raises:
        RequestLineError: `logprobs` not a boolean, `top_logprobs` out of range, or given without `logprobs: true`.
    """
    wanted = checks.boolean(data, "logprobs")
    top = checks.integer(data, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top and not wanted:
        raise checks.invalid("top_logprobs", f"is {top}, but it needs {checks.prefix}logprobs: true")
    return (top or 0) if wanted else None


def logit_bias(value: Any, checks: FieldChecks) -> dict[int, float] | None:
    """`logit_bias`: token ids (JSON keys: strings of integers) to biases from -100 to 100; None when absent or empty.

    Raises:
        RequestLineError: Naming the key or value that is wrong.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise checks.invalid("logit_bias", f"must be an object of token ids to numbers, got {value!r}")
    bias: dict[int, float] = {}
    for key, number in value.items():
        token = str(key).strip()
        if not token.isdigit():
            raise checks.invalid("logit_bias", f"keys must be token ids (integers), got {key!r}")
        checked = checks.number({f"logit_bias.{token}": number}, f"logit_bias.{token}", -100.0, 100.0)
        bias[int(token)] = float(checked or 0.0)
    return bias or None


def check_flags(data: Mapping[str, Any], checks: FieldChecks) -> None:
    """Refuse an OpenAI flag that is not a JSON boolean (`"stream": "yes"`), and a `stream_options` not an object.

    The server reads `stream` and `stream_options.include_usage`; the other flags are ignored, but
    a client that sends them in the wrong type is told, as OpenAI tells it.
    """
    for key in BOOLEAN_FIELDS:
        checks.boolean(data, key)
    options = data.get("stream_options")
    if options is not None:
        if not isinstance(options, Mapping):
            raise checks.invalid("stream_options", f"must be an object, got {options!r}")
        include_usage = options.get("include_usage")
        if include_usage is not None and not isinstance(include_usage, bool):
            raise checks.invalid("stream_options.include_usage", f"must be true or false, got {include_usage!r}")


def stop_sequences(value: Any, checks: FieldChecks) -> tuple[str, ...] | None:
    """`stop` as a tuple of non-empty strings (at most 4), or None when absent or empty."""
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(stop, str) and stop for stop in stops):
        raise checks.invalid("stop", f"must be a non-empty string or a list of them, got {value!r}")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise checks.invalid("stop", f"may hold at most {MAX_STOP_SEQUENCES} sequences, got {len(stops)}")
    return tuple(stops) or None
