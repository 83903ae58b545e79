"""`ResponseFormat`: constrain one request's output to JSON, a JSON schema, a regex, a choice or a grammar."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from flyteplugins_batcher.engines._engine_errors import parse_json_object

ANY_JSON_OBJECT_SCHEMA = '{"type":"object"}'
"""The schema a `json_object` format decodes with: any JSON object (as vLLM and OpenAI's JSON mode do)."""

ResponseFormatKind = Literal["json_object", "json_schema", "regex", "choice", "grammar"]


@dataclass(frozen=True)
class ResponseFormat:
    """The shape one request's output must take: JSON, JSON that follows a schema, a regex's match, one of
    several strings, or a sentence of a grammar (vLLM's `structured_outputs`: `json`, `regex`, `choice`, `grammar`).

    Engines enforce it while decoding (vLLM's structured outputs, or an `xgrammar` logits processor
    for Transformers), so an answer that ends on its own (`finish_reason="stop"`) follows it; an
    answer cut off by `max_new_tokens` (`"length"`) is unfinished. A format the grammar compiler
    cannot handle fails that record alone with an `InvalidPromptError` (`InvalidResponseFormatError`).

    The schema is kept as compact JSON text, so that a format is hashable (`GenerationConfig` stays
    hashable with one in it) and equal schemas are equal formats. Key order is kept as written: the
    output follows the schema's property order, and that order matters to a model (a "reasoning"
    property before an "answer" one, say). At most one of `schema`, `pattern`, `options` and `rules`
    is set; none is any JSON object.

    Attributes:
        schema: The JSON schema as compact JSON text (any JSON text is accepted and compacted).
        name: The schema's name (OpenAI's `json_schema.name`), used in messages only.
        pattern: A regular expression the whole output matches.
        options: The strings the output is one of.
        rules: A grammar in EBNF (GBNF, as xgrammar and vLLM take it; its start rule is `root`).
        request_field: The request field that set it, as messages name it: `response_format` (chat and
            completions), `text.format` (the Responses API). Not part of the format: formats that differ
            only in it are equal.

    Example:
        ```python
        person = ResponseFormat.json_schema(
            {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}, name="person"
        )
        request = Request("Invent a person.", GenerationConfig(max_new_tokens=64, response_format=person))
        verdict = ResponseFormat.choice(["positive", "negative"])
        year = ResponseFormat.regex(r"(19|20)\\d\\d")
        ```
    """

    schema: str | None = None
    name: str | None = None
    pattern: str | None = None
    options: tuple[str, ...] = ()
    rules: str | None = None
    request_field: str = field(default="response_format", compare=False)

    def __post_init__(self) -> None:
        if self.schema is not None:
            object.__setattr__(self, "schema", canonical_schema(self.schema))
        if self.name is not None and not isinstance(self.name, str):
            raise ValueError(f"a response format's name must be a string, got {self.name!r}")
        options = tuple(self.options)
        if not all(isinstance(option, str) for option in options):
            raise ValueError(f"a choice's options must be strings, got {list(options)!r}")
        object.__setattr__(self, "options", options)
        for label, text in (("regex", self.pattern), ("grammar", self.rules)):
            if text is not None and (not isinstance(text, str) or not text):
                raise ValueError(f"a {label} must be a non-empty string, got {text!r}")
        given = [self.schema is not None, self.pattern is not None, bool(options), self.rules is not None]
        if sum(given) > 1:
            raise ValueError("a response format is one of a JSON schema, a regex, a choice or a grammar, not several")

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

    @classmethod
    def regex(cls, pattern: str) -> ResponseFormat:
        """Text that matches `pattern` whole (vLLM's `structured_outputs.regex`)."""
        return cls(pattern=pattern)

    @classmethod
    def choice(cls, options: Iterable[str]) -> ResponseFormat:
        """Exactly one of `options` (vLLM's `structured_outputs.choice`).

        Raises:
            ValueError: No options, or one that is not a string.
        """
        chosen = tuple(options)
        if not chosen:
            raise ValueError("a choice needs at least one option")
        return cls(options=chosen)

    @classmethod
    def grammar(cls, rules: str) -> ResponseFormat:
        """A sentence of an EBNF grammar whose start rule is `root` (vLLM's `structured_outputs.grammar`)."""
        return cls(rules=rules)

    @property
    def kind(self) -> ResponseFormatKind:
        """Which constraint it is: `json_object`, `json_schema`, `regex`, `choice` or `grammar`."""
        if self.pattern is not None:
            return "regex"
        if self.options:
            return "choice"
        if self.rules is not None:
            return "grammar"
        return "json_object" if self.schema is None else "json_schema"

    @property
    def is_json(self) -> bool:
        """Whether it constrains to JSON (an object or a schema), which every engine's JSON mode knows."""
        return self.kind in ("json_object", "json_schema")

    @property
    def grammar_schema(self) -> str:
        """The JSON schema text decoding is constrained by (any object for `json_object`; JSON formats only)."""
        return ANY_JSON_OBJECT_SCHEMA if self.schema is None else self.schema

    def set_by(self, request_field: str) -> ResponseFormat:
        """The same format, named in messages as the request field `request_field` (`text.format`, say)."""
        return replace(self, request_field=request_field)

    @property
    def label(self) -> str:
        """How a message names it: the field that set it and what it is (`text.format json_schema 'user'`), or vLLM's
        `structured_outputs.regex` (`choice`, `grammar`)."""
        if self.is_json:
            return f"{self.request_field} {self.describe()}"
        return f"structured_outputs.{self.kind}"

    def describe(self) -> str:
        """A short label for messages: `json_object`, `json_schema 'name'`, `regex`, `choice` or `grammar`."""
        if self.kind == "json_schema" and self.name:
            return f"json_schema {self.name!r}"
        return self.kind


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
