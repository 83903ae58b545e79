"""A request's generation settings, checked with the OpenAI API's ranges and named as the request wrote them.

The engine's `GenerationConfig` validates its own fields too, but its names and limits are the
engine's (`max_new_tokens`, any temperature >= 0); a request line is checked first here, as the
API would check it, so that a bad line fails with the field it wrote (`body.max_tokens`) and the
API's range (temperature 0 to 2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from flyteplugins_batcher.batch_api._line_errors import RequestLineError
from flyteplugins_batcher.engines import MAX_SAMPLES, ResponseFormat

MAX_STOP_SEQUENCES = 4
"""Most stop sequences a request may give, as OpenAI's API allows."""

BOOLEAN_FIELDS = ("stream", "logprobs", "echo", "store", "parallel_tool_calls")
"""A request's flags that must be JSON booleans (or null) when given."""

_INT64 = 2**63
_TOKEN_LIMIT_KEYS = ("max_tokens", "max_completion_tokens")
_RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")


class FieldChecks:
    """Checks one request's fields, failing its line with the field named as written (`body.top_p`).

    Args:
        prefix: What the request's fields are under (`"body."` for an OpenAI line, `""` for a plain one).
        line: The request's line number.
        custom_id: The request's id.
        context_length: The model's context, when known (0: unknown); a token limit that fills it is refused.
    """

    def __init__(self, prefix: str, line: int, custom_id: str | None, *, context_length: int = 0) -> None:
        self.prefix = prefix
        self.line = line
        self.custom_id = custom_id
        self.context_length = context_length

    def fail(self, code: str, message: str) -> RequestLineError:
        """The error for this request's line."""
        return RequestLineError(code, message, line=self.line, custom_id=self.custom_id)

    def invalid(self, key: str, message: str) -> RequestLineError:
        """An `invalid_request` naming field `key`."""
        return self.fail("invalid_request", f"{self.prefix}{key} {message}")

    def integer(self, data: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
        """The integer at `key` (None when absent), within [low, high]."""
        value = data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.invalid(key, f"must be an integer, got {value!r}")
        if not low <= value <= high:
            raise self.invalid(key, f"must be {_range_text(low, high)}, got {value!r}")
        return value

    def number(self, data: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
        """The finite number at `key` (None when absent), within [low, high]."""
        value = data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.invalid(key, f"must be a number, got {value!r}")
        if not low <= value <= high:
            raise self.invalid(key, f"must be from {low:g} to {high:g}, got {value!r}")
        return float(value)

    def boolean(self, data: Mapping[str, Any], key: str) -> bool | None:
        """The JSON boolean at `key` (None when absent): `"yes"`, `1` or `"true"` are refused, not taken as true."""
        value = data.get(key)
        if value is not None and not isinstance(value, bool):
            raise self.invalid(key, f"must be true or false, got {value!r}")
        return value


def generation_settings(data: Mapping[str, Any], checks: FieldChecks) -> dict[str, Any]:
    """A request's own generation settings, by `GenerationConfig` field name, checked with the API's ranges.

    `max_tokens` / `max_completion_tokens` >= 1 (and below the model's context when `checks` knows
    it: `context_length_exceeded` otherwise), `temperature` 0 to 2, `top_p` 0 to 1 (0 keeps only
    the most likely token, which is greedy decoding: it becomes temperature 0), `n` 1 to 128, an
    integer `seed`, at most 4 `stop` sequences, and a `response_format`.

    Raises:
        RequestLineError: `invalid_request`, naming the field as the request wrote it.
    """
    check_flags(data, checks)
    settings: dict[str, Any] = {}
    for key in _TOKEN_LIMIT_KEYS:
        limit = checks.integer(data, key, 1, _INT64 - 1)
        if limit is not None and checks.context_length and limit >= checks.context_length:
            # Refused here, not by the engine: a record is costed (and counted in the metrics) once submitted.
            message = (
                f"{checks.prefix}{key} is {limit}, but the model's context holds {checks.context_length} tokens, "
                "the prompt included"
            )
            raise checks.fail("context_length_exceeded", message)
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
        "seed": checks.integer(data, "seed", -_INT64, _INT64 - 1),
        "stop": stop_sequences(data.get("stop"), checks),
        "response_format": response_format(data.get("response_format"), checks),
    }
    settings.update({name: value for name, value in optional.items() if value is not None})
    return settings


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


def response_format(value: Any, checks: FieldChecks) -> ResponseFormat | None:
    """`response_format`: `{"type": "text"}` (no constraint), `{"type": "json_object"}`, or a `json_schema`.

    Whether the schema compiles to a grammar is the engine's check: a schema that does not fails
    its record with `InvalidResponseFormatError` (`error_code` maps it to `invalid_request`).
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise checks.invalid("response_format", f"must be an object, got {value!r}")
    kind = value.get("type")
    if kind not in _RESPONSE_FORMAT_TYPES:
        choices = ", ".join(_RESPONSE_FORMAT_TYPES)
        raise checks.invalid("response_format.type", f"must be one of {choices}, got {kind!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat.json_object()
    return _json_schema(value.get("json_schema"), checks)


def _json_schema(value: Any, checks: FieldChecks) -> ResponseFormat:
    where = "response_format.json_schema"
    if not isinstance(value, Mapping):
        raise checks.invalid(where, f"must be an object with a 'schema', got {value!r}")
    name, strict, schema = value.get("name"), value.get("strict"), value.get("schema")
    if name is not None and not isinstance(name, str):
        raise checks.invalid(f"{where}.name", f"must be a string, got {name!r}")
    if strict is not None and not isinstance(strict, bool):
        raise checks.invalid(f"{where}.strict", f"must be true or false, got {strict!r}")
    if not isinstance(schema, Mapping):
        raise checks.invalid(f"{where}.schema", f"must be a JSON schema object, got {schema!r}")
    try:
        return ResponseFormat.json_schema(schema, name=name)
    except ValueError as error:
        raise checks.invalid(f"{where}.schema", f"is not usable: {error}") from None


def _range_text(low: int, high: int) -> str:
    if high >= _INT64 - 1:
        return f">= {low}" if low > -_INT64 else "a 64-bit integer"
    return f"from {low} to {high}"
