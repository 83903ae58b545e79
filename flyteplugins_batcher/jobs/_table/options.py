"""What a table job asks of each row, and where the answer goes: `TableOptions`, declared once.

`run_table` takes its fields as inputs of their own (`task_with_options`), so each is a flag of
`flyteplugins-batcher run-table` with the help written below; `TableProcessor` is a `TableOptions`
that also takes Python functions for `preprocess` and `postprocess`, and the run's settings.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Row = dict[str, Any]
"""One row of the table as Python values, by column name (nested columns as dicts and lists)."""

RowFunction = Callable[[Row], Mapping[str, Any]]
"""A `preprocess` (a row to its request) or a `postprocess` (a row and its answer to columns to add)."""

TASK_TYPES = ("generate", "embed", "score", "classify")
ENCODER_TASKS = ("embed", "score", "classify")
"""The tasks an encoder answers (the embedding model, or a classifier given as the model), not an LLM."""
DEFAULT_COLUMNS = {"generate": "generated_text", "embed": "embedding", "score": "score", "classify": "label"}
"""The answer's column when `output_column` is empty (as Ray Data LLM names them, where it does)."""
PROBS_COLUMN = "probs"
"""A classify row's class probabilities, beside its label."""


@dataclass(frozen=True)
class TableOptions:
    """What each row of a table asks, and where its answer goes.

    Attributes:
        task_type: "generate" (an LLM answer per row, on the LLM replicas), "embed" (a vector per row from
            `column`, on the embedding replicas), as Ray Data LLM's processor config names them; "score" (a
            score per row for the pair of `query_column` and `document_column`: the cosine similarity of
            their embeddings, or a cross-encoder's score when the model is one) or "classify" (the label and
            class probabilities of `column`'s text, from the model, which must be a sequence classifier).
        prompt: The user message, as a template over the row's columns in Python's format syntax:
            "Answer briefly: {question}" ({{ and }} for literal braces). A row whose column is null, or a
            template naming a column the row lacks, fails alone.
        messages_column: A column holding each row's chat messages, ready ([{"role", "content"}, ...],
            or their JSON text), instead of a prompt.
        column: The column whose text is embedded ("embed"), classified ("classify"), or sent as it is as the
            user message ("generate").
        query_column: The column of each row's query, for "score".
        document_column: The column of each row's document, scored against its query, for "score".
        preprocess: A function of your own as "module:function" (imported from the current folder): it
            maps a row (a dict) to its request, {"messages": [...]} or {"prompt": "..."}, with settings of
            its own named as in a batch line's body (max_tokens, temperature, top_p, stop, seed,
            response_format; Ray's "sampling_params" too), which win over the run's.
        postprocess: A function of your own as "module:function": it maps a row with its answer (the
            answer column and the token counts added) to the columns to add to it.
        output_column: The answer's column; empty: "generated_text" ("generate"), "embedding" ("embed"), "score"
            ("score") or "label" ("classify", with the probabilities in "probs").
        response_format: A JSON schema (its JSON text, or OpenAI's {"type": "json_schema", ...} object)
            that answers follow: the answer column is then a struct built from the schema, not text.
        embedding_chunk_size: Rows per chunk sent to an encoder ("embed", "score", "classify"; "generate" uses
            chunk_size).
    """

    task_type: str = "generate"
    prompt: str = ""
    messages_column: str = ""
    column: str = ""
    query_column: str = ""
    document_column: str = ""
    preprocess: str = ""
    postprocess: str = ""
    output_column: str = ""
    response_format: str = ""
    embedding_chunk_size: int = 128

    def check(self) -> None:
        """Refuse options that cannot work together, before any row is read (the defaults alone ask nothing).

        Raises:
            ValueError: An unknown task, no way (or two ways) to make a row's request, or a bad chunk size.
        """
        if self.task_type not in TASK_TYPES:
            raise ValueError(f"task_type must be one of {', '.join(TASK_TYPES)}, got {self.task_type!r}")
        if self.embedding_chunk_size < 1:
            raise ValueError(f"embedding_chunk_size must be >= 1, got {self.embedding_chunk_size}")
        if self.task_type in ("embed", "classify") and not self.column:
            verb = self.task_type
            raise ValueError(f"task_type={verb!r} needs the column to {verb}: column='text', say (--column text)")
        if self.task_type == "score" and not (self.query_column and self.document_column):
            raise ValueError(
                "task_type='score' needs the columns of each row's pair: query_column and document_column "
                "(--query-column question --document-column passage, say)"
            )
        if self.task_type in ENCODER_TASKS:
            return
        ways = {"prompt": self.prompt, "messages_column": self.messages_column, "column": self.column}
        ways["preprocess"] = self.preprocess
        given = [name for name, value in ways.items() if value]
        if len(given) != 1:
            named = " and ".join(given) if given else "none"
            raise ValueError(f"give exactly one of prompt, messages_column, column or preprocess (got {named})")

    @property
    def encoder(self) -> bool:
        """Whether an encoder answers the rows (embed, score, classify), not an LLM."""
        return self.task_type in ENCODER_TASKS

    @property
    def answer_column(self) -> str:
        """The column the answers go to."""
        return self.output_column or DEFAULT_COLUMNS[self.task_type]

    def schema(self) -> dict[str, Any] | None:
        """The JSON schema answers follow, if `response_format` gives one.

        Raises:
            ValueError: `response_format` is not JSON, or not a JSON schema object.
        """
        return parse_schema(self.response_format) if self.response_format else None


def parse_schema(text: str | Mapping[str, Any]) -> dict[str, Any]:
    """The JSON schema in `text`: a bare schema, or OpenAI's `{"type": "json_schema", "json_schema": {...}}`.

    Raises:
        ValueError: Not JSON, or not a schema object.
    """
    try:
        value = json.loads(text) if isinstance(text, str) else dict(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"response_format is not JSON: {error.msg} (line {error.lineno})") from None
    if isinstance(value, dict) and value.get("type") == "json_schema":
        value = (value.get("json_schema") or {}).get("schema")
    if not isinstance(value, dict):
        raise ValueError(f"response_format must be a JSON schema object, got {type(value).__name__}")
    return value


def row_function(spec: RowFunction | str | None, role: Literal["preprocess", "postprocess"]) -> RowFunction | None:
    """The function `spec` names: itself if callable, or the `function` of `module` for "module:function".

    Raises:
        ValueError: `spec` is not "module:function", the module cannot be imported, or it has no such function.
    """
    if spec is None or callable(spec):
        return spec
    if not spec:
        return None
    module_name, separator, name = spec.partition(":")
    if not separator or not module_name or not name:
        raise ValueError(f"{role} must be 'module:function', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(
            f"{role} {spec!r}: cannot import {module_name!r} ({error}); run from the folder that holds "
            f"{module_name.replace('.', '/')}.py, or install it"
        ) from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"{role} {spec!r}: {module_name} has no function {name!r}")
    return function  # type: ignore[no-any-return]
