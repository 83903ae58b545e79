"""A finished chunk's rows, joined with their answers, written as one Parquet part of the output dataset.

A part holds its chunk's input rows as they were read (every column, nested types included, in order), then
the answer column (text; a struct built from the JSON schema; a fixed-size list of float32 for embeddings; a
score; a label, with the class probabilities in `probs`), the token counts (`num_input_tokens`,
`num_generated_tokens`, as Ray Data LLM names them), the columns your `postprocess` adds, and `error`: null
where the row succeeded, `code: reason` where it failed. A part holds a run of consecutive rows (one chunk's,
or a placement window's whose rows ran in several chunks) and parts are numbered in row order
(`part-000000000.parquet`, ...), so reading the folder reads the rows in input order.
"""

from __future__ import annotations

import array
import base64
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from flyteplugins_batcher.jobs._table.options import PROBS_COLUMN, Row, RowFunction, TableOptions
from flyteplugins_batcher.jobs._table.requests import RowError
from flyteplugins_batcher.jobs._table.schema import arrow_type, structured_value
from flyteplugins_batcher.replica import EmbeddingResult, ItemResult

ERROR_COLUMN = "error"
INPUT_TOKENS = "num_input_tokens"
OUTPUT_TOKENS = "num_generated_tokens"
PART_NAME = "part-{:09d}.parquet"


@dataclass
class ChunkRows:
    """One part's input rows, held while their requests run (in one chunk, or several), and what became of each
    before it was sent.

    Attributes:
        index: The part's number (its name).
        start: The number of its first row in the table (from 0).
        table: Its input rows, as read.
        errors: The rows that failed before they were sent, by position in the part.
        sent: The positions of the rows that were sent, in the order of their items.
    """

    index: int
    start: int
    table: pa.Table
    errors: dict[int, str] = field(default_factory=dict)
    sent: list[int] = field(default_factory=list)


@dataclass
class RowAnswer:
    """One row's answer: its value for the answer column, its token counts, and its error (None: it succeeded).

    `cached_tokens` (of `input_tokens`, those the engine found in its prefix cache) is counted in the
    run's summary, not written as a column.
    """

    value: Any = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    error: str | None = None
    truncated: int = 0
    added: dict[str, Any] = field(default_factory=dict)
    cached_tokens: int = 0
    probs: list[float] | None = None


class TableParts:
    """Writes the output dataset's parts, each once all of its rows have their answers, in a folder.

    Args:
        folder: Where the parts go.
        options: What the rows asked (the task, the answer column, the schema).
        input_columns: The table's own columns (your `postprocess` cannot replace them).
        postprocess: Your function from a row and its answer to the columns to add.

    Example:
        ```python
        parts = TableParts(work, TableOptions(prompt="{q}"), ["q"], None)
        answers = [parts.answer(row, result, reason="") for row, result in zip(rows_read, results)]
        parts.write(rows, answers)
        ```
    """

    def __init__(
        self, folder: Path, options: TableOptions, input_columns: list[str], postprocess: RowFunction | None
    ) -> None:
        self.folder = folder
        self.options = options
        self.schema = options.schema()
        self.postprocess = postprocess
        self.own_columns = {*input_columns, *job_columns(options)}
        self.dimensions = 0
        self.paths: list[Path] = []

    def answer(self, row: Row | None, result: ItemResult | EmbeddingResult | None, reason: str) -> RowAnswer:
        """A sent row's answer from its result (`None`: its chunk failed, for `reason`); your `postprocess` runs here,
        on `row` (its input columns), when the row succeeded."""
        answer = self._answer(result, reason)
        if self.postprocess is not None and answer.error is None:
            assert row is not None
            self._postprocess(row, answer)
        return answer

    def write(self, rows: ChunkRows, answers: list[RowAnswer]) -> Path:
        """Write the chunk's part: its input rows, then the answers' columns."""
        table = rows.table.replace_schema_metadata(_without_pandas(rows.table.schema.metadata))
        for name, column in self._columns(answers).items():
            table = table.append_column(name, column)
        path = self.folder / PART_NAME.format(rows.index)
        pq.write_table(table, path)
        self.paths.append(path)
        return path

    def _answer(self, result: ItemResult | EmbeddingResult | None, reason: str) -> RowAnswer:
        if result is None:
            return RowAnswer(error=f"inference_failed: {reason}")
        if result.error_code:
            return RowAnswer(error=f"{result.error_code}: {result.error_message}")
        if isinstance(result, EmbeddingResult) and self.options.task_type == "score":
            return RowAnswer(result.scores[0], result.prompt_tokens)
        if isinstance(result, EmbeddingResult) and self.options.task_type == "classify":
            return RowAnswer(result.labels[0] or None, result.prompt_tokens, probs=result.outputs()[0])
        if isinstance(result, EmbeddingResult):
            vector = _floats(result.vectors[0])
            self.dimensions = self.dimensions or len(vector)
            return RowAnswer(vector, result.prompt_tokens, truncated=result.truncated)
        answer = RowAnswer(
            result.text, result.prompt_tokens, result.completion_tokens, cached_tokens=result.cached_tokens
        )
        if self.schema is not None:
            try:
                answer.value = structured_value(result.text, self.schema, result.finish_reason)
            except RowError as error:
                answer.value, answer.error = None, str(error)
        return answer

    def _postprocess(self, row: dict[str, Any], answer: RowAnswer) -> None:
        """Your `postprocess`'s columns for a row that succeeded (a failure fails the row, its answer kept)."""
        assert self.postprocess is not None
        row[self.options.answer_column], row[INPUT_TOKENS] = answer.value, answer.input_tokens
        if self.options.task_type == "generate":
            row[OUTPUT_TOKENS] = answer.output_tokens
        if self.options.task_type == "classify":
            row[PROBS_COLUMN] = answer.probs
        try:
            added = self.postprocess(row)
            if not isinstance(added, Mapping):
                raise TypeError(f"postprocess must return a dict, got {type(added).__name__}")
        except Exception as error:  # your function's failure fails its row, not the run
            answer.error = f"postprocess_failed: {type(error).__name__}: {error}"
            return
        # The input's and the job's own columns are written as they are: Ray's `dict(answer=..., **row)` works.
        answer.added = {name: value for name, value in added.items() if name not in self.own_columns}

    def _columns(self, answers: list[RowAnswer]) -> dict[str, pa.Array]:
        columns = {self.options.answer_column: pa.array([answer.value for answer in answers], self._answer_type())}
        if self.options.task_type == "classify":
            columns[PROBS_COLUMN] = pa.array([answer.probs for answer in answers], pa.list_(pa.float32()))
        columns[INPUT_TOKENS] = pa.array([answer.input_tokens for answer in answers], pa.int64())
        if self.options.task_type == "generate":
            columns[OUTPUT_TOKENS] = pa.array([answer.output_tokens for answer in answers], pa.int64())
        added = list(dict.fromkeys(name for answer in answers for name in answer.added))
        for name in added:
            columns[name] = _added_column(name, [answer.added.get(name) for answer in answers])
        columns[ERROR_COLUMN] = pa.array([answer.error for answer in answers], pa.string())
        return columns

    def _answer_type(self) -> pa.DataType:
        if self.options.task_type == "score":
            return pa.float64()
        if self.options.task_type == "embed":
            # Before the first vector its size is unknown: null, made the vector's type when the parts are joined.
            return pa.list_(pa.float32(), self.dimensions) if self.dimensions else pa.null()
        return arrow_type(self.schema) if self.schema is not None else pa.string()


def job_columns(options: TableOptions) -> list[str]:
    """The columns the job adds to every row (beside your `postprocess`'s)."""
    tokens = [INPUT_TOKENS, OUTPUT_TOKENS] if options.task_type == "generate" else [INPUT_TOKENS]
    probs = [PROBS_COLUMN] if options.task_type == "classify" else []
    return [options.answer_column, *probs, *tokens, ERROR_COLUMN]


def _added_column(name: str, values: list[Any]) -> pa.Array:
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise ValueError(f"postprocess column {name!r} mixes values of different types ({error})") from None


def _floats(encoded: str) -> list[float]:
    """A vector sent as base64 of little-endian float32 bytes (how the embedding replica answers)."""
    values = array.array("f", base64.b64decode(encoded))
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


def _without_pandas(metadata: dict[bytes, bytes] | None) -> dict[bytes, bytes] | None:
    # pandas' metadata describes the whole frame it came from (its index's length, say), not one part of it.
    return {key: value for key, value in metadata.items() if key != b"pandas"} if metadata else None


def unify_parts(paths: list[Path]) -> None:
    """Give every part the same columns and types, rewriting those that differ, so the folder reads as one table.

    Parts differ where a chunk could not know a type (the vectors' size before the first vector) or
    where your `postprocess` added columns to some chunks only; `error` stays the last column.

    Raises:
        ValueError: Two parts hold one column in types that cannot be one (the message names it).
    """
    distinct: list[pa.Schema] = []  # not one schema per part: a big table has thousands of parts
    for path in paths:
        schema = pq.read_schema(path)
        if not any(schema.equals(known) for known in distinct):
            distinct.append(schema)
    if len(distinct) <= 1:
        return
    try:
        unified = pa.unify_schemas(distinct, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise ValueError(f"the output's parts do not agree on their columns' types: {error}") from None
    error_field = unified.field(ERROR_COLUMN)
    unified = unified.remove(unified.get_field_index(ERROR_COLUMN)).append(error_field)
    for path in paths:
        if not pq.read_schema(path).equals(unified):
            table = pq.read_table(path)
            columns = [_column_as(table, unified.field(name)) for name in unified.names]
            pq.write_table(pa.Table.from_arrays(columns, schema=unified), path)


def _column_as(table: pa.Table, wanted: pa.Field) -> pa.ChunkedArray:
    """The part's column as the unified type, or nulls of it where the part lacks the column."""
    if wanted.name not in table.column_names:
        return pa.chunked_array([pa.nulls(table.num_rows, wanted.type)], wanted.type)
    return table.column(wanted.name).cast(wanted.type)
