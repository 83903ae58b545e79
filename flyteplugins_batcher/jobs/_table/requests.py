"""A row's way to its request: a template over its columns, its messages, its text, or your `preprocess`.

A generation request is checked exactly as a plain batch line is (`batch_api.parse_request`: the
same fields, ranges and error codes), so a table and a batch file with the same requests send the
same `RequestItem`s to the replicas. A row that cannot make its request (a null field, a column it
lacks, a `preprocess` that raised, a setting out of range) fails alone with a `RowError`.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flyteplugins_batcher import BatcherError
from flyteplugins_batcher.batch_api import BatchRequest, RequestLineError, parse_request
from flyteplugins_batcher.engines import GenerationConfig
from flyteplugins_batcher.jobs._table.options import Row, RowFunction, TableOptions
from flyteplugins_batcher.replica import EmbeddingItem, RequestItem

RowItem = RequestItem | EmbeddingItem

_SHOWN_COLUMNS = 10
"""Columns a missing column's message names (a wide table's others are counted)."""


class RowError(BatcherError, ValueError):
    """Why one row fails alone: a code, as a batch line's error has one, and what is wrong.

    Example:
        ```python
        raise RowError("null_value", "column 'question' is null")  # its error column: "null_value: column ..."
        ```
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def row_key(number: int) -> str:
    """The key of the row at `number` (from 0) in its chunk, as its request's `custom_id`."""
    return f"row-{number}"


@dataclass(frozen=True)
class RowRequests:
    """How the rows of one table job become requests.

    Attributes:
        options: What each row asks.
        preprocess: The function that maps a row to its request, when `options` names one.
        defaults: The run's generation settings: a row's own settings are checked over them.
        schema: The JSON schema answers follow, when the run gives one (a row's own `response_format` wins).

    Example:
        ```python
        rules = RowRequests(TableOptions(prompt="Answer briefly: {question}"), None, GenerationConfig())
        item = rules.item({"question": "What is 2 + 2?"}, 0)  # a RequestItem, or raises RowError
        ```
    """

    options: TableOptions
    preprocess: RowFunction | None
    defaults: GenerationConfig
    schema: dict[str, Any] | None = None

    def item(self, row: Row, number: int) -> RowItem:
        """The request of the row at `number` (from 0).

        Raises:
            RowError: The row cannot make its request; it fails alone.
        """
        options = self.options
        if options.task_type in ("embed", "classify"):
            return EmbeddingItem(row_key(number), [_text(row, options.column)], options.task_type)
        if options.task_type == "score":
            query, document = _text(row, options.query_column), _text(row, options.document_column)
            return EmbeddingItem(row_key(number), [document], "score", [query])
        body = self._body(row)
        if self.schema is not None:
            body.setdefault("response_format", {"type": "json_schema", "json_schema": {"schema": self.schema}})
        return _checked(body, number, self.defaults)

    def _body(self, row: Row) -> dict[str, Any]:
        """The row's request as a plain batch line's body: `messages` or `prompt`, and its own settings."""
        options = self.options
        if self.preprocess is not None:
            return _preprocessed(self.preprocess, row)
        if options.messages_column:
            return {"messages": _messages(row, options.messages_column)}
        text = _text(row, options.column) if options.column else fill(options.prompt, row)
        return {"messages": [{"role": "user", "content": text}]}


def fill(template: str, row: Row) -> str:
    """`template` with the row's columns in it.

    Raises:
        RowError: The template names a column the row lacks (`missing_column`) or one that is null (`null_value`),
            or is no valid template (`invalid_template`).
    """
    try:
        names = {field.split(".")[0].split("[")[0] for _, field, _, _ in string.Formatter().parse(template) if field}
    except ValueError as error:
        raise RowError("invalid_template", f"the prompt template {template!r} is not valid: {error}") from None
    for name in sorted(names):
        _value(row, name)
    try:
        return template.format_map(row)
    except (KeyError, IndexError, AttributeError, ValueError) as error:
        raise RowError("invalid_template", f"the prompt template cannot be filled from this row: {error!r}") from None


def _value(row: Row, column: str) -> Any:
    """The row's value in `column`.

    Raises:
        RowError: The row has no such column, or its value is null.
    """
    if column not in row:
        names = [repr(name) for name in row]
        shown = ", ".join(names[:_SHOWN_COLUMNS]) + (
            f" and {len(names) - _SHOWN_COLUMNS} more" if len(names) > _SHOWN_COLUMNS else ""
        )
        raise RowError("missing_column", f"the row has no column {column!r} (it has {shown})")
    value = row[column]
    if value is None:
        raise RowError("null_value", f"column {column!r} is null")
    return value


def _text(row: Row, column: str) -> str:
    value = _value(row, column)
    if not isinstance(value, str):
        raise RowError("invalid_value", f"column {column!r} holds {type(value).__name__} {value!r}, not text")
    return value


def _messages(row: Row, column: str) -> Any:
    """The chat messages in `column`: a list of messages, or its JSON text."""
    value = _value(row, column)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as error:
            raise RowError("invalid_value", f"column {column!r} is not a JSON list of messages: {error.msg}") from None
    return value


def _preprocessed(preprocess: RowFunction, row: Row) -> dict[str, Any]:
    """Your `preprocess`'s request for the row, with Ray's `sampling_params` spread among its settings."""
    try:
        made = preprocess(dict(row))
    except Exception as error:  # your function's own failure fails its row, not the run
        raise RowError("preprocess_failed", f"{type(error).__name__}: {error}") from None
    if not isinstance(made, Mapping):
        raise RowError("preprocess_failed", f"preprocess must return a dict, got {type(made).__name__}")
    body = dict(made)
    sampling = body.pop("sampling_params", None) or {}
    if not isinstance(sampling, Mapping):
        raise RowError("invalid_request", f"sampling_params must be a dict, got {type(sampling).__name__}")
    return {**sampling, **body}


def _checked(body: dict[str, Any], number: int, defaults: GenerationConfig) -> RequestItem:
    """The row's `RequestItem`, its body checked as a plain batch line's is.

    Raises:
        RowError: Its body is not a request, or a setting is out of range (with the batch line's error code).
    """
    body["custom_id"] = row_key(number)
    try:
        request = parse_request(body, number)
    except RequestLineError as error:
        raise RowError(error.code, error.message) from None
    if not isinstance(request, BatchRequest):  # a preprocess that made an OpenAI embeddings line
        raise RowError("invalid_request", "a row asks for a chat or completion here (embeddings: task_type='embed')")
    try:
        request.generation(defaults)
    except ValueError as error:
        raise RowError("invalid_request", str(error)) from None
    if request.settings.get("n", 1) > 1:
        raise RowError(
            "invalid_request",
            f"n is {request.settings['n']}: a table gets one answer per row (repeat the row, or use run-batch)",
        )
    return RequestItem.of(request)
