"""`ResponseFormat`: constrain one request's output to JSON, or to a JSON schema."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from flyteplugins_batcher.engines._json_text import parse_json_object

ANY_JSON_OBJECT_SCHEMA = '{"type":"object"}'
"""The schema a `json_object` format decodes with: any JSON object (as vLLM and OpenAI's JSON mode do)."""

ResponseFormatKind = Literal["json_object", "json_schema"]


@dataclass(frozen=True)
class ResponseFormat:
    """The shape one request's output must take: any JSON object, or JSON that follows a schema.

    Engines enforce it while decoding (vLLM's structured outputs, or an `xgrammar` logits processor
    for Transformers), so an answer that ends on its own (`finish_reason="stop"`) parses as JSON and
    follows the schema; an answer cut off by `max_new_tokens` (`"length"`) is unfinished JSON. A
    schema the grammar compiler cannot handle fails that record alone with an `InvalidPromptError`
    (`InvalidResponseFormatError`).

    The schema is kept as compact JSON text, so that a format is hashable (`GenerationConfig` stays
    hashable with one in it) and equal schemas are equal formats. Key order is kept as written: the
    output follows the schema's property order, and that order matters to a model (a "reasoning"
    property before an "answer" one, say).

    Attributes:
        schema: The JSON schema as compact JSON text (any JSON text is accepted and compacted), or
            `None` for any JSON object.
        name: The schema's name (OpenAI's `json_schema.name`), used in messages only.

    Example:
        ```python
        person = ResponseFormat.json_schema(
            {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}, name="person"
        )
        request = Request("Invent a person.", GenerationConfig(max_new_tokens=64, response_format=person))
        ```
    """

    schema: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.schema is not None:
            object.__setattr__(self, "schema", canonical_schema(self.schema))
        if self.name is not None and not isinstance(self.name, str):
            raise ValueError(f"a response format's name must be a string, got {self.name!r}")

    @classmethod
    def json_object(cls) -> ResponseFormat:
        """Any JSON object (OpenAI's `{"type": "json_object"}`)."""
        return cls()

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str, *, name: str | None = None) -> ResponseFormat:
        """JSON that follows `schema` (a mapping, or its JSON text).

        Raises:
            ValueError: `schema` is not a JSON object (or the text of one).
        """
        return cls(schema if isinstance(schema, str) else _dumps(schema), name)

    @property
    def kind(self) -> ResponseFormatKind:
        """`"json_schema"` with a schema, else `"json_object"`."""
        return "json_object" if self.schema is None else "json_schema"

    @property
    def grammar_schema(self) -> str:
        """The schema text decoding is constrained by (any object for `json_object`)."""
        return ANY_JSON_OBJECT_SCHEMA if self.schema is None else self.schema

    def describe(self) -> str:
        """A short label for messages: `json_object`, or `json_schema 'name'`."""
        if self.schema is None:
            return "json_object"
        return f"json_schema {self.name!r}" if self.name else "json_schema"


def canonical_schema(schema: str | Mapping[str, Any]) -> str:
    """A JSON schema as compact text: parsed and written without spaces, its keys in their order.

    Raises:
        ValueError: It is not JSON, or not a JSON object.
    """
    if isinstance(schema, str):
        schema = parse_json_object(schema, "a JSON schema")
    if not isinstance(schema, Mapping):
        raise ValueError(f"a JSON schema must be a JSON object, got {type(schema).__name__}")
    return _dumps(schema)


def _dumps(schema: Mapping[str, Any]) -> str:
    try:
        return json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"a JSON schema must hold only JSON values: {error}") from None
