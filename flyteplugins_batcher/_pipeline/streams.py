"""Many records at once: `submit_batch`, `map` and `run`, built on a batcher's `submit`.

`map` keeps a window of submitted, unresolved records, so that endless inputs run in constant
memory, and yields results in input order. When its input ends it flushes its tail rather than
waiting for `batch_timeout_s`; when its consumer stops early it cancels what is left.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Generic

from flyteplugins_batcher._errors import BatcherClosedError, BatcherFailedError, BatcherNotRunningError
from flyteplugins_batcher._pipeline.settle import Settler
from flyteplugins_batcher._settings import BatcherSettings
from flyteplugins_batcher._types import RecordT, ResultT


class RecordStreams(Generic[RecordT, ResultT]):
    """The many-records half of a batcher's API, built on its `submit` (`DynamicBatcher` inherits it)."""

    if TYPE_CHECKING:  # what the batcher provides
        settings: BatcherSettings
        _startable: bool  # new or stopped: `run` starts and stops it around the call
        _submitted: int  # the submission number of the last record accepted

        submit: Callable[..., Awaitable[asyncio.Future[ResultT]]]  # `DynamicBatcher.submit`

        async def __aenter__(self) -> Any: ...

        async def __aexit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None: ...

        def _flush_through(self, seq: int) -> None: ...

        def _abandon(self, futures: Collection[asyncio.Future[Any]]) -> None:
            """Its consumer went away: cancel these futures and count their records."""

    async def submit_batch(
        self,
        records: Sequence[RecordT],
        *,
        estimated_cost: Sequence[int] | None = None,
        priority: int = 0,
        deadline_s: float | None = None,
        latency_slo_s: float | None = None,
    ) -> list[asyncio.Future[ResultT]]:
        """Submit several records; returns their futures in order.

        Args:
            records: The records.
            estimated_cost: Optional per-record costs, as long as `records`.
            priority: For every record (see `submit`).
            deadline_s: For every record, from now (see `submit`).
            latency_slo_s: Every record's own latency target (see `submit`).

        Raises:
            ValueError: `estimated_cost` has a different length than `records`.
        """
        if estimated_cost is not None and len(estimated_cost) != len(records):
            raise ValueError(f"estimated_cost has {len(estimated_cost)} entries for {len(records)} records")
        costs: Sequence[int | None] = estimated_cost if estimated_cost is not None else [None] * len(records)
        return [
            await self.submit(
                record, estimated_cost=cost, priority=priority, deadline_s=deadline_s, latency_slo_s=latency_slo_s
            )
            for record, cost in zip(records, costs, strict=True)
        ]

    async def map(
        self,
        records: Iterable[RecordT] | AsyncIterable[RecordT],
        *,
        return_exceptions: bool = False,
        max_in_flight: int | None = None,
    ) -> AsyncIterator[ResultT | BaseException]:
        """Submit records as they come and yield their results in input order.

        At most `max_in_flight` records of this call are submitted and unresolved at once
        (default: enough to fill `max_concurrent_batches` + 1 batches), so huge or endless inputs
        run in constant memory. When the input ends, its tail is flushed instead of waiting
        for `batch_timeout_s`. If the consumer stops early, its unfinished records are cancelled.

        Args:
            records: A sync or async iterable of records.
            return_exceptions: Yield a failed record's exception in its place instead of raising.
            max_in_flight: Bound on this call's submitted-but-unresolved records.

        Example:
            ```python
            async for answer in batcher.map(load_questions()):
                write(answer)
            ```
        """
        settings = self.settings
        window_size = max_in_flight or settings.max_batch_size * (settings.max_concurrent_batches + 1)
        if window_size < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        window: deque[asyncio.Future[ResultT]] = deque()
        last_seq = -1
        try:
            async for record in aiter_records(records):
                window.append(await self._submit_or_refused(record))
                last_seq = self._submitted
                while len(window) >= window_size:
                    yield await next_outcome(window, return_exceptions)
            self._flush_through(last_seq)  # the input ended: its tail need not wait for batch_timeout_s
            while window:
                yield await next_outcome(window, return_exceptions)
        finally:
            if window:
                self._abandon(window)

    async def run(
        self, records: Iterable[RecordT] | AsyncIterable[RecordT], *, return_exceptions: bool = False
    ) -> list:
        """Process all records and return their results in input order.

        Starts and stops the batcher around the call if it is not running yet.

        Args:
            records: A sync or async iterable of records.
            return_exceptions: Put a failed record's exception in its place instead of raising.

        Example:
            ```python
            answers = await DynamicBatcher(model.predict).run(inputs)
            ```
        """
        if self._startable:
            async with self:
                return [result async for result in self.map(records, return_exceptions=return_exceptions)]
        return [result async for result in self.map(records, return_exceptions=return_exceptions)]

    async def _submit_or_refused(self, record: RecordT) -> asyncio.Future[ResultT]:
        try:
            return await self.submit(record)
        except (BatcherClosedError, BatcherFailedError, BatcherNotRunningError):
            raise
        except Exception as exc:  # a bad record fails at its own position, not the whole stream
            return Settler.refused(exc)


async def aiter_records(records: Iterable[Any] | AsyncIterable[Any]) -> AsyncIterator[Any]:
    """Iterate a sync or an async iterable alike."""
    if isinstance(records, AsyncIterable):
        async for record in records:
            yield record
    else:
        for record in records:
            yield record


async def next_outcome(window: deque[asyncio.Future[Any]], return_exceptions: bool) -> Any:
    """The first future's outcome (see `outcome`), which leaves the window only once it has one: a consumer
    cancelled meanwhile leaves it there, for `map` to abandon with the rest."""
    answer = await outcome(window[0], return_exceptions)
    window.popleft()
    return answer


async def outcome(future: asyncio.Future[Any], return_exceptions: bool) -> Any:
    """The future's result; with `return_exceptions`, its exception instead of raising it.

    As with `asyncio.gather(..., return_exceptions=True)`, a cancelled record yields its
    `CancelledError` rather than cancelling the consumer; a cancelled consumer is cancelled
    (its own cancel is not mistaken for the record's).
    """
    if not return_exceptions:
        return await future
    if not future.done():
        await asyncio.wait({future})  # unlike `await future`, a cancel of the consumer raises here, not in the record
    if future.cancelled():
        return asyncio.CancelledError()
    error = future.exception()
    if error is None:
        return future.result()
    if isinstance(error, Exception):
        return error
    raise error
