"""What constrains a request's output, from each field that can: `response_format`, vLLM's `structured_outputs`
(`json`, `json_object`, `regex`, `choice`, `grammar`) and its older top-level names (`guided_json`,
`guided_regex`, `guided_choice`, `guided_grammar`), and a named or required `tool_choice` (`_tools`).

A request gets at most one constraint: two fields that each set one fail the line, naming both
(vLLM refuses several constraints too). Whether the engine can enforce it is the engine's check.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from flyteplugins_batcher.batch_api._fields import FieldChecks
from flyteplugins_batcher.engines import ResponseFormat

STRUCTURED_KINDS = ("json", "json_object", "regex", "choice", "grammar")
"""The constraints of vLLM's `structured_outputs` this package enforces."""

GUIDED_NAMES = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
"""vLLM's older top-level names for `structured_outputs`' constraints."""

_RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")

_STRUCTURED_OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")
"""`structured_outputs` fields that tune a constraint rather than set one: accepted, left to the engine's defaults."""


def output_constraint(data: Mapping[str, Any], checks: FieldChecks) -> ResponseFormat | None:
    """The one constraint a request's fields set, or None.

    Raises:
        RequestLineError: `invalid_request`, naming the field: a constraint of the wrong shape, or
            two fields that each set one.
    """
    found: dict[str, ResponseFormat] = {}
    given = response_format(data.get("response_format"), checks)
    if given is not None:
        found["response_format"] = given
    found.update(_structured_outputs(data.get("structured_outputs"), checks))
    for name, kind in GUIDED_NAMES.items():
        if data.get(name) is not None:
            found[name] = constraint(kind, data[name], name, checks)
    if len(found) > 1:
        raise checks.invalid(" and ".join(found), "each constrain the output; give only one")
    return next(iter(found.values()), None)


def _json_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as error:
        raise ValueError(f"is not JSON: {error}") from None


def _structured_outputs(value: Any, checks: FieldChecks) -> dict[str, ResponseFormat]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise checks.invalid("structured_outputs", f"must be an object, got {value!r}")
    unknown = sorted(set(value) - set(STRUCTURED_KINDS) - set(_STRUCTURED_OPTIONS))
    if unknown:
        known = ", ".join(STRUCTURED_KINDS)
        raise checks.invalid(f"structured_outputs.{unknown[0]}", f"is not supported here (one of {known} is)")
    return {
        f"structured_outputs.{kind}": constraint(kind, value[kind], f"structured_outputs.{kind}", checks)
        for kind in STRUCTURED_KINDS
        if value.get(kind) is not None and not (kind == "json_object" and value[kind] is False)
    }


def constraint(kind: str, value: Any, where: str, checks: FieldChecks) -> ResponseFormat:
    """The `ResponseFormat` for one constraint (`kind` as `structured_outputs` names it) given at field `where`.

    Raises:
        RequestLineError: `invalid_request`, naming `where`.
    """
    try:
        if kind == "json":
            schema = _json_text(value) if isinstance(value, str) else value
            if not isinstance(schema, Mapping):
                raise ValueError(f"must be a JSON schema object, got {value!r}")
            return ResponseFormat.json_schema(schema)
        if kind == "json_object":
            if value is not True:
                raise ValueError(f"must be true, got {value!r}")
            return ResponseFormat.json_object()
        if kind == "choice":
            if not isinstance(value, list) or not value or not all(isinstance(option, str) for option in value):
                raise ValueError(f"must be a non-empty list of strings, got {value!r}")
            return ResponseFormat.choice(value)
        if not isinstance(value, str) or not value:
            raise ValueError(f"must be a non-empty string, got {value!r}")
        return ResponseFormat.regex(value) if kind == "regex" else ResponseFormat.grammar(value)
    except ValueError as error:
        raise checks.invalid(where, str(error).removeprefix(f"{where} ")) from None


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
