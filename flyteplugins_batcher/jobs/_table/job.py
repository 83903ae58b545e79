"""The table job on the driver: rows read a part at a time, placed in chunks, each part written once it is answered.

`TableJob` knows where rows come from and where their answers go, and nothing of where chunks
run: `fan_out(job.chunks(), infer, job.on_chunk, ...)` runs them. A part is a range of rows: its
input rows wait here (as Arrow) while its chunks run, so the driver holds at most the parts whose
chunks are in flight and the one being cut, whatever the table's size. A row that cannot make its
request fails at once, in its part; a part whose rows all failed so is written without being sent.
"""

from __future__ import annotations

import asyncio
import ctypes
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from flyteplugins_batcher.jobs._report import Progress
from flyteplugins_batcher.jobs._summary import Counts
from flyteplugins_batcher.jobs._table.parts import ChunkRows, RowAnswer, TableParts
from flyteplugins_batcher.jobs._table.requests import RowError, RowItem, RowRequests
from flyteplugins_batcher.jobs._table.source import TableSource
from flyteplugins_batcher.replica import (
    ChunkCutter,
    EmbeddingChunk,
    EmbeddingItem,
    JobChunk,
    JobOutcome,
    RequestChunk,
    RequestItem,
)

READ_ROWS = 4096
"""Rows per record batch read from the table (a part takes rows from one or more of them)."""


@dataclass
class _Part:
    """A part being answered: its rows, each row's answer so far, and its chunks still out."""

    rows: ChunkRows
    answers: list[RowAnswer | None]
    outstanding: int = 0


class TableJob:
    """One table job on the driver: reads rows lazily, writes each part once its rows are answered, counts them.

    The rows are read a part at a time: `chunk_size` rows in "file" order (a part is a chunk), or
    `window` rows in "prefix" order, whose requests are placed in chunks by shared prompt prefix
    (`ChunkCutter.placed`) and whose part is written when its last chunk finishes.

    Args:
        source: The table.
        requests: How a row becomes its request.
        parts: Where the finished parts are written.
        chunk_size: Rows per chunk (at most).
        noun: What a row is, for the progress line and messages ("rows", "documents").
        order: "prefix" or "file" (`RunOptions.order`); an encoder's rows (embed, score, classify) always run in
            file order.
        window: Rows placed together in "prefix" order (`RunOptions.order_window`).

    Example:
        ```python
        job = TableJob(open_table("questions.parquet"), requests, parts, chunk_size=8)
        await fan_out(job.chunks(), infer, job.on_chunk, max_in_flight=16)
        ```
    """

    def __init__(
        self,
        source: TableSource,
        requests: RowRequests,
        parts: TableParts,
        *,
        chunk_size: int,
        noun: str = "rows",
        order: str = "prefix",
        window: int = ChunkCutter.WINDOW,
    ) -> None:
        self.source = source
        self.requests = requests
        self.parts = parts
        self.chunk_size = chunk_size
        self.order = "file" if requests.options.encoder else order
        self.part_rows = max(window, chunk_size) if self.order == "prefix" else chunk_size
        self.counts = Counts()
        self.truncated = 0
        self.first_failure = ""
        """The first failed row and why, for the run's closing message."""
        total = source.num_rows
        self.progress = Progress(f"Table {source.description}", total or 0, noun=noun, total_known=total is not None)
        self.started = time.time()
        """When the job started (epoch seconds): a chunk that finished before was reused from an earlier run."""
        self._parts: dict[int, _Part] = {}
        self._chunks: dict[int, tuple[int, list[int]]] = {}  # chunk -> its part, and the items of the part it holds

    async def chunks(self) -> AsyncIterator[JobChunk]:
        """Each chunk of rows as its requests, read from the table as they are needed (in a worker thread)."""
        prepared = self._prepared()
        while (made := await asyncio.to_thread(next, prepared, None)) is not None:
            part, chunks = made
            del made  # each chunk is let go once it is handed out: a finished one's requests are freed at once
            for position, error in part.rows.errors.items():
                self._count(part.rows, position, RowAnswer(error=error), fresh=True, retried=False)
            if not chunks:  # every row failed before it could be sent
                await self._finish(part)
            del part
            while chunks:
                yield chunks.popleft()
        self.progress.total_known = True

    def _prepared(self) -> Iterator[tuple[_Part, deque[JobChunk]]]:
        """Read and cut the table, make each row's request and place them: blocking work, kept off the event loop.

        Nothing of a part is kept here once it is handed on (its rows, requests and chunks), so that the
        driver holds one part being cut and the parts whose chunks are out, however long the table.
        """
        number = 0
        for rows in self._part_rows():
            chunks = self._placed(rows, number)  # first: a row whose request fails joins `rows.errors`
            answers = [
                RowAnswer(error=rows.errors[p]) if p in rows.errors else None for p in range(rows.table.num_rows)
            ]
            part = _Part(rows, answers, outstanding=len(chunks))
            self._parts[rows.index] = part
            number += len(chunks)
            del rows, answers
            yield part, chunks
            del part, chunks

    def _placed(self, rows: ChunkRows, first: int) -> deque[JobChunk]:
        """The part's rows as chunks numbered from `first`, placed in `self.order`."""
        items = self._items(rows)
        chunks: deque[JobChunk] = deque()
        for number, members in enumerate(ChunkCutter.placed(items, self.chunk_size, self.order), first):  # type: ignore[arg-type]
            chosen = [items[member] for member in members]
            if self.requests.options.encoder:
                chunks.append(EmbeddingChunk(number, [item for item in chosen if isinstance(item, EmbeddingItem)]))
            else:
                chunks.append(RequestChunk(number, [item for item in chosen if isinstance(item, RequestItem)]))
            self._chunks[number] = (rows.index, members)
        return chunks

    async def on_chunk(self, chunk: JobChunk, outcome: JobOutcome | None, reason: str) -> None:
        """Answer a finished chunk's rows (`None`: the chunk failed, for `reason`), and write their part once
        its last chunk is in."""
        part_index, members = self._chunks.pop(chunk.index)
        part = self._parts[part_index]
        answers = await asyncio.to_thread(self._answers, part.rows, members, outcome, reason)
        for item, (member, answer) in enumerate(zip(members, answers, strict=True)):
            position = part.rows.sent[member]
            part.answers[position] = answer
            fresh = outcome is None or answer.error is not None or outcome.computed_since(item, self.started)
            self._count(
                part.rows, position, answer, fresh=fresh, retried=outcome is not None and outcome.was_retried(item)
            )
        part.outstanding -= 1
        if not part.outstanding:
            await self._finish(part)
        await self.progress.update(self.counts)

    def _answers(self, rows: ChunkRows, members: list[int], outcome: JobOutcome | None, reason: str) -> list[RowAnswer]:
        """The answers of a chunk's rows (your `postprocess` runs here, off the event loop)."""
        answers = []
        for item, member in enumerate(members):
            result = outcome.results[item] if outcome is not None else None
            row = rows.table.slice(rows.sent[member], 1).to_pylist()[0] if self.parts.postprocess else None
            answers.append(self.parts.answer(row, result, reason))
        return answers

    def _count(self, rows: ChunkRows, position: int, answer: RowAnswer, *, fresh: bool, retried: bool) -> None:
        failed = answer.error is not None
        self.counts.count(
            failed=failed,
            completion_tokens=answer.output_tokens or 0,
            prompt_tokens=answer.input_tokens or 0,
            cached_tokens=answer.cached_tokens,
            fresh=fresh,
            retried=retried,
        )
        self.truncated += answer.truncated
        if failed and not self.first_failure:
            self.first_failure = f"row {rows.start + position}: {answer.error}"

    async def _finish(self, part: _Part) -> None:
        """Write a part whose rows all have their answers."""
        del self._parts[part.rows.index]
        answers = [answer if answer is not None else RowAnswer(error="unanswered") for answer in part.answers]
        await asyncio.to_thread(self._write, part.rows, answers)

    def _write(self, rows: ChunkRows, answers: list[RowAnswer]) -> None:
        """Write a part, then hand back what its rows' making freed (one trip to the worker thread)."""
        self.parts.write(rows, answers)
        _release_freed_memory()

    def _part_rows(self) -> Iterator[ChunkRows]:
        start = 0
        batches = self.source.batches(max(READ_ROWS, self.part_rows))
        for index, table in enumerate(cut(batches, self.part_rows)):
            if not self.progress.total_known:
                self.progress.total += table.num_rows
            yield ChunkRows(index, start, table)
            start += table.num_rows

    def _items(self, rows: ChunkRows) -> list[RowItem]:
        """The requests of the part's rows; a row that cannot make one fails now."""
        items = []
        for position, row in enumerate(self._python_rows(rows.table)):
            try:
                items.append(self.requests.item(row, rows.start + position))
            except RowError as error:
                rows.errors[position] = str(error)
                continue
            rows.sent.append(position)
        return items

    @staticmethod
    def _python_rows(table: pa.Table) -> Iterator[dict[str, Any]]:
        """The table's rows as Python dicts, converted `READ_ROWS` at a time: a window's rows are never all
        Python objects at once beside their requests."""
        for batch in table.to_batches(max_chunksize=READ_ROWS):
            yield from batch.to_pylist()


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


def _release_freed_memory() -> None:
    """Hand the memory a written part's rows held back to the system (Arrow's pool, glibc's arenas).

    Allocators keep freed memory for reuse, and a driver that streams a long table frees a window's worth after
    each part: returned at once, its peak stays that of the windows it holds (`bench_table_memory.py`).
    """
    pa.default_memory_pool().release_unused()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc (macOS, musl): its allocator returns memory its own way
        return None


_LIBC = _glibc()
