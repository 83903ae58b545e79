"""Structured answers as typed columns: an Arrow type built from a JSON schema, and each answer checked into it.

A JSON schema's `object` becomes a struct (its properties in the schema's order), `array` a list,
`string` text, `integer` int64, `number` float64, `boolean` bool; a type with `"null"` beside it is
that type (Arrow columns are nullable). What has no one Arrow type (`anyOf`, `oneOf`, a `$ref`, an
object without `properties`, several types) is kept as its JSON text, in a string field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from flyteplugins_batcher.jobs._table.requests import RowError

_SCALARS = {"string": pa.string(), "integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}


def arrow_type(schema: Mapping[str, Any]) -> pa.DataType:
    """The Arrow type of values that follow `schema` (JSON text, in a string, where no one type fits)."""
    kind = _kind(schema)
    if kind == "object":
        return pa.struct([pa.field(name, arrow_type(part)) for name, part in schema["properties"].items()])
    if kind == "array":
        return pa.list_(arrow_type(schema.get("items") or {}))
    return _SCALARS.get(kind, pa.string())


def structured_value(text: str, schema: Mapping[str, Any], finish_reason: str) -> Any:
    """The answer `text` as a value of `arrow_type(schema)`.

    Raises:
        RowError: The answer is not JSON that fits the schema (`invalid_answer`), saying why when it was cut short.
    """
    try:
        parsed = json.loads(text)
        value = _fitted(parsed, schema)
        pa.scalar(value, arrow_type(schema))  # the column will take it
    except (json.JSONDecodeError, TypeError, ValueError, pa.ArrowException) as error:
        cut = " (the answer was cut at max_new_tokens: raise it)" if finish_reason == "length" else ""
        raise RowError("invalid_answer", f"the answer is not JSON that fits the schema{cut}: {error}") from None
    return value


def _kind(schema: Mapping[str, Any]) -> str:
    """The one JSON type `schema` asks for ("" where there is none, or several)."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [name for name in kind if name != "null"]
        kind = kinds[0] if len(kinds) == 1 else ""
    if kind == "object" and not isinstance(schema.get("properties"), Mapping):
        return ""
    if kind is None and all(isinstance(choice, str) for choice in schema.get("enum") or [0]):
        return "string"
    return kind if isinstance(kind, str) else ""


def _fitted(value: Any, schema: Mapping[str, Any]) -> Any:
    """`value` shaped for its Arrow type: objects by their properties, what has no one type as its JSON text."""
    kind = _kind(schema)
    if value is None:
        return None
    if kind == "object":
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {value!r}")
        return {name: _fitted(value.get(name), part) for name, part in schema["properties"].items()}
    if kind == "array":
        if not isinstance(value, list):
            raise TypeError(f"expected an array, got {value!r}")
        return [_fitted(item, schema.get("items") or {}) for item in value]
    if kind == "":
        return json.dumps(value, ensure_ascii=False)
    return value
