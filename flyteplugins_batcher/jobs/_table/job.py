"""The table job on the driver: rows read a batch at a time, cut into chunks, each chunk's part written as it finishes.

`TableJob` knows where rows come from and where their answers go, and nothing of where chunks
run: `fan_out(job.chunks(), infer, job.on_chunk, ...)` runs them. A chunk is a range of rows: its
input rows wait here (as Arrow) while its requests run, so the driver holds at most the chunks in
flight and the one being cut, whatever the table's size. A row that cannot make its request fails
at once, in its chunk's part; a chunk whose rows all failed so is written without being sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pyarrow as pa

from flyteplugins_batcher.jobs._driver import Counts
from flyteplugins_batcher.jobs._report import Progress
from flyteplugins_batcher.jobs._table.parts import ChunkRows, RowAnswer, TableParts
from flyteplugins_batcher.jobs._table.requests import RowError, RowItem, RowRequests
from flyteplugins_batcher.jobs._table.source import TableSource
from flyteplugins_batcher.replica import EmbeddingChunk, EmbeddingItem, JobChunk, JobOutcome, RequestChunk, RequestItem

READ_ROWS = 4096
"""Rows per record batch read from the table (a chunk takes rows from one or more of them)."""


class TableJob:
    """One table job on the driver: reads rows lazily, writes each finished chunk's part, counts and shows progress.

    Args:
        source: The table.
        requests: How a row becomes its request.
        parts: Where the finished chunks' parts are written.
        chunk_size: Rows per chunk.
        noun: What a row is, for the progress line and messages ("rows", "documents").

    Example:
        ```python
        job = TableJob(open_table("questions.parquet"), requests, parts, chunk_size=8)
        await fan_out(job.chunks(), infer, job.on_chunk, max_in_flight=16)
        ```
    """

    def __init__(
        self, source: TableSource, requests: RowRequests, parts: TableParts, *, chunk_size: int, noun: str = "rows"
    ) -> None:
        self.source = source
        self.requests = requests
        self.parts = parts
        self.chunk_size = chunk_size
        self.counts = Counts()
        self.truncated = 0
        self.first_failure = ""
        """The first failed row and why, for the run's closing message."""
        total = source.num_rows
        self.progress = Progress(f"Table {source.description}", total or 0, noun=noun, total_known=total is not None)
        self.started = time.time()
        """When the job started (epoch seconds): a chunk that finished before was reused from an earlier run."""
        self._waiting: dict[int, ChunkRows] = {}

    async def chunks(self) -> AsyncIterator[JobChunk]:
        """Each chunk of rows as its requests, read from the table as they are needed (in a worker thread)."""
        prepared = self._prepared()
        while (chunk := await asyncio.to_thread(next, prepared, None)) is not None:
            yield chunk
        self.progress.total_known = True

    def _prepared(self) -> Iterator[JobChunk]:
        """Read and cut the table, and make each row's request: blocking work, kept off the event loop."""
        for rows in self._chunk_rows():
            items = self._items(rows)
            self._waiting[rows.index] = rows
            if self.requests.options.task_type == "embed":
                yield EmbeddingChunk(rows.index, [item for item in items if isinstance(item, EmbeddingItem)])
            else:
                yield RequestChunk(rows.index, [item for item in items if isinstance(item, RequestItem)])

    async def on_chunk(self, chunk: JobChunk, outcome: JobOutcome | None, reason: str) -> None:
        """Write a finished chunk's part (`None`: the chunk failed, for `reason`), and count its rows."""
        rows = self._waiting.pop(chunk.index)
        answers = await asyncio.to_thread(self._write, rows, outcome, reason)
        sent = {position: item for item, position in enumerate(rows.sent)}
        for position, answer in enumerate(answers):
            item = sent.get(position)
            failed = answer.error is not None
            fresh = item is None or outcome is None or failed or outcome.computed_since(item, self.started)
            retried = item is not None and outcome is not None and outcome.was_retried(item)
            self.counts.count(
                failed=failed,
                completion_tokens=answer.output_tokens or 0,
                prompt_tokens=answer.input_tokens or 0,
                cached_tokens=answer.cached_tokens,
                fresh=fresh,
                retried=retried,
            )
            self.truncated += answer.truncated
            if answer.error is not None and not self.first_failure:
                self.first_failure = f"row {rows.start + position}: {answer.error}"
        await self.progress.update(self.counts.done, self.counts.failed)

    def _write(self, rows: ChunkRows, outcome: JobOutcome | None, reason: str) -> list[RowAnswer]:
        answers = self.parts.answers(rows, outcome, reason)
        self.parts.write(rows, answers)
        return answers

    def _chunk_rows(self) -> Iterator[ChunkRows]:
        start = 0
        for index, table in enumerate(cut(self.source.batches(max(READ_ROWS, self.chunk_size)), self.chunk_size)):
            if not self.progress.total_known:
                self.progress.total += table.num_rows
            yield ChunkRows(index, start, table)
            start += table.num_rows

    def _items(self, rows: ChunkRows) -> list[RowItem]:
        """The requests of the chunk's rows; a row that cannot make one fails now."""
        items = []
        for position, row in enumerate(rows.table.to_pylist()):
            try:
                items.append(self.requests.item(row, rows.start + position))
            except RowError as error:
                rows.errors[position] = str(error)
                continue
            rows.sent.append(position)
        return items


def cut(batches: Iterator[pa.RecordBatch], size: int) -> Iterator[pa.Table]:
    """Tables of `size` rows (the last one shorter) from a stream of record batches, in order."""
    held: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        offset = 0
        while offset < batch.num_rows:
            take = min(size - count, batch.num_rows - offset)
            held.append(batch.slice(offset, take))
            count, offset = count + take, offset + take
            if count == size:
                yield pa.Table.from_batches(held)
                held, count = [], 0
    if held:
        yield pa.Table.from_batches(held)
