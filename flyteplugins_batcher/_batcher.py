"""DynamicBatcher: many concurrent producers, one process function, cost-budgeted batches.

How a batch is formed (all decisions run on the event loop, in one dispatcher task):

- Records wait in one FIFO list, bounded by `max_queue_size` (`submit` awaits when it is full).
- A batch is taken from the head of the list in submission order and never costs more than
  `target_batch_cost` (a record that would cross the budget waits for the next batch), nor holds
  more than `max_batch_size` records.
- It is dispatched as soon as a slot is free (fewer than `max_concurrent_batches` in flight) and
  one of these holds: it is full (size or budget); nothing is in flight and at least
  `min_batch_size` records wait (the engine must not idle while work waits); the oldest waiting
  record was submitted `batch_timeout_s` ago; or the batcher is draining (`stop`, `flush`, the end
  of `run`/`map`).
- Records are never put back: a record cancelled by its caller is dropped before dispatch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from typing import Any, Generic, Literal

from flyteplugins_batcher._cost import CostResolver
from flyteplugins_batcher._errors import (
    BatcherClosedError,
    BatcherFailedError,
    BatcherNotRunningError,
    CostBudgetExceededError,
    ProcessFnCancelledError,
    ResultCountError,
    UnrecoverableError,
    add_note,
    short_repr,
)
from flyteplugins_batcher._invoke import ProcessFnCaller
from flyteplugins_batcher._iterate import aiter_records, outcome
from flyteplugins_batcher._pending import Envelope, PendingQueue
from flyteplugins_batcher._records import CostEstimatorFn, ProcessFn, RecordT, ResultT
from flyteplugins_batcher._stats import BatchStats, DispatchReason, StatsRecorder

logger = logging.getLogger("flyteplugins_batcher")

OnError = Literal["raise", "split"]
Oversized = Literal["run_alone", "reject"]

_NEW, _RUNNING, _STOPPING, _STOPPED, _FAILED = "new", "running", "stopping", "stopped", "failed"


class DynamicBatcher(Generic[RecordT, ResultT]):
    """Batches records from many concurrent producers through one process function.

    A drop-in replacement for `flyte.extras.DynamicBatcher` (same constructor keywords,
    defaults, methods and semantics) that never blocks the event loop, treats the cost budget as
    a hard limit, cannot deadlock on timeouts or `min_batch_size`, isolates failing records,
    and reports latency percentiles and utilization.

    Type Parameters:
        RecordT: The record type producers submit.
        ResultT: The per-record result type of the process function.

    Args:
        process_fn: `f(batch: list[RecordT]) -> list[ResultT]`, results in input order. A plain
            `def` runs in a worker thread; an `async def` is awaited on the loop. A slot may hold
            an `Exception` instance to fail only that record.
        cost_estimator: `f(record) -> int`. Cost precedence: explicit `estimated_cost` >
            `cost_estimator` > `record.estimate_cost()` > `default_cost`.
        target_batch_cost: Cost budget per batch, a hard limit. A single record costlier than the
            budget runs alone (or is rejected, see `oversized`).
        max_batch_size: Most records per batch.
        min_batch_size: Records to wait for before dispatching to an idle engine; the batch goes
            anyway once its oldest record has waited `batch_timeout_s`.
        batch_timeout_s: Longest a record waits for its batch to fill, counted from its
            `submit`. An idle engine does not wait for it (see `min_batch_size`).
        max_queue_size: Records that may wait; when full, `submit` awaits (backpressure).
            0 or less means unbounded.
        prefetch_batches: Accepted for compatibility. Batches are assembled just in time, when
            the engine has room, so records that arrive meanwhile still join them; there is
            nothing to prefetch.
        default_cost: Cost of a record when nothing else estimates it.
        max_concurrent_batches: Batches that may be inside the process function at once, for
            engines that overlap work (or serve several requests). Results always reach the
            right futures.
        max_inflight_cost: Upper bound on the summed cost of all batches in flight; `None` means
            `target_batch_cost * max_concurrent_batches`. With many tiny concurrent batches this
            bounds what a streaming engine holds at once.
        on_error: When the process function raises for a whole batch: `"raise"` (default) fails
            every record of the batch with that exception; `"split"` bisects the batch and re-runs
            the halves until the failing records are isolated, so healthy records still get
            results. Splitting costs about `2 * log2(batch size)` extra calls per failing record.
        oversized: A record costlier than `target_batch_cost`: `"run_alone"` (default) runs it
            in a batch of its own; `"reject"` makes `submit` raise `CostBudgetExceededError`.
        name: Used in logs, warnings and thread names.

    Example:
        ```python
        def embed(batch: list[str]) -> list[list[float]]:
            return model.encode(batch)  # blocking is fine: it runs in a worker thread

        async with DynamicBatcher(embed, max_batch_size=64) as batcher:
            vectors = await batcher.run(texts)
            print(batcher.stats.summary())
        ```
    """

    _cost_protocols: tuple[str, ...] = ("estimate_cost",)

    def __init__(
        self,
        process_fn: ProcessFn[RecordT, ResultT],
        *,
        cost_estimator: CostEstimatorFn[RecordT] | None = None,
        target_batch_cost: int = 32_000,
        max_batch_size: int = 256,
        min_batch_size: int = 1,
        batch_timeout_s: float = 0.05,
        max_queue_size: int = 5_000,
        prefetch_batches: int = 2,
        default_cost: int = 1,
        max_concurrent_batches: int = 1,
        max_inflight_cost: int | None = None,
        on_error: OnError = "raise",
        oversized: Oversized = "run_alone",
        name: str | None = None,
    ) -> None:
        _require(callable(process_fn), f"process_fn must be callable, got {type(process_fn).__name__}")
        _require(target_batch_cost > 0, f"target_batch_cost must be > 0, got {target_batch_cost}")
        _require(max_batch_size >= 1, f"max_batch_size must be >= 1, got {max_batch_size}")
        _require(
            1 <= min_batch_size <= max_batch_size,
            f"min_batch_size must be between 1 and max_batch_size ({max_batch_size}), got {min_batch_size}",
        )
        _require(batch_timeout_s >= 0, f"batch_timeout_s must be >= 0, got {batch_timeout_s}")
        _require(prefetch_batches >= 0, f"prefetch_batches must be >= 0, got {prefetch_batches}")
        _require(default_cost >= 0, f"default_cost must be >= 0, got {default_cost}")
        _require(max_concurrent_batches >= 1, f"max_concurrent_batches must be >= 1, got {max_concurrent_batches}")
        _require(
            max_inflight_cost is None or max_inflight_cost > 0,
            f"max_inflight_cost must be > 0, got {max_inflight_cost}",
        )
        _require(on_error in ("raise", "split"), f"on_error must be 'raise' or 'split', got {on_error!r}")
        _require(oversized in ("run_alone", "reject"), f"oversized must be 'run_alone' or 'reject', got {oversized!r}")

        self.name = name or type(self).__name__
        self._target_batch_cost = target_batch_cost
        self._max_batch_size = max_batch_size
        self._min_batch_size = min_batch_size
        self._batch_timeout_s = batch_timeout_s
        self._max_queue_size = max_queue_size if max_queue_size > 0 else 0
        self._max_concurrent_batches = max_concurrent_batches
        self._max_inflight_cost = (
            max_inflight_cost if max_inflight_cost is not None else target_batch_cost * max_concurrent_batches
        )
        self._on_error = on_error
        self._oversized = oversized
        self._caller = ProcessFnCaller(process_fn, max_workers=max_concurrent_batches, owner=self.name)
        self._costs = CostResolver(self.name, cost_estimator, default_cost, self._cost_protocols)
        self._stats = StatsRecorder()
        self._state = _NEW
        self._failure: BatcherFailedError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._seq = 0
        self._reset_runtime_state()

    def _reset_runtime_state(self) -> None:
        self._pending = PendingQueue(self._max_queue_size, self._stats)
        self._wakeup: asyncio.Future[None] | None = None
        self._inflight_batches: dict[asyncio.Task[None], tuple[list[Envelope], int]] = {}
        self._inflight_cost = 0
        self._flush_upto = -1
        self._aborting = False
        self._dispatcher: asyncio.Task[None] | None = None

    # -- properties --------------------------------------------------------------------------------

    @property
    def stats(self) -> BatchStats:
        """A fresh `BatchStats` snapshot."""
        return self._stats.snapshot(time.monotonic(), queue_depth=len(self._pending))

    @property
    def is_running(self) -> bool:
        """Whether the batcher has started and has not finished stopping."""
        return self._state in (_RUNNING, _STOPPING)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the batcher runs on (set by `start`)."""
        return self._loop

    @property
    def is_async(self) -> bool:
        """Whether the process function is awaited on the loop (else it runs in a worker thread)."""
        return self._caller.is_async

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the dispatcher on the running event loop.

        Raises:
            RuntimeError: If the batcher is already running.
        """
        if self._state in (_RUNNING, _STOPPING):
            raise RuntimeError(f"{self.name} is already running")
        self._reset_runtime_state()
        self._failure = None
        self._loop = asyncio.get_running_loop()
        self._state = _RUNNING
        self._dispatcher = self._loop.create_task(self._dispatch_loop(), name=f"{self.name}-dispatcher")
        logger.debug("%s started", self.name)

    async def stop(self, timeout: float | None = None, *, cancel_pending: bool = False) -> None:
        """Stop taking records, finish the queued ones, and shut down.

        Producers waiting for queue space get `BatcherClosedError` at once, so `stop` never
        hangs on a full queue.

        Args:
            timeout: Seconds to wait for queued and in-flight records. When it runs out, what
                is left is cancelled (a plain-`def` process function already running in a
                thread finishes on its own; its results are discarded). `None` waits for all.
            cancel_pending: Cancel queued records that have not been dispatched instead of
                running them; batches already in flight still finish.
        """
        if self._state in (_NEW, _STOPPED):
            return
        if self._state == _RUNNING:
            self._state = _STOPPING
            self._pending.release_waiters(BatcherClosedError(f"{self.name} is stopping and takes no new records"))
        if cancel_pending:
            self._drop_pending()
        self._wake()
        dispatcher = self._dispatcher
        try:
            if dispatcher is not None and not dispatcher.done():
                done, _ = await asyncio.wait({dispatcher}, timeout=timeout)
                if not done:
                    logger.warning("%s: stop timed out after %ss; cancelling the remaining records", self.name, timeout)
                    self._abort()
                    await asyncio.wait({dispatcher})
        except asyncio.CancelledError:
            self._abort()
            raise
        finally:
            self._caller.shutdown()
            if self._state != _FAILED:
                self._state = _STOPPED
        logger.info("%s stopped: %s", self.name, self.stats.summary())

    async def __aenter__(self) -> DynamicBatcher[RecordT, ResultT]:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- submitting --------------------------------------------------------------------------------

    async def submit(self, record: RecordT, *, estimated_cost: int | None = None) -> asyncio.Future[ResultT]:
        """Queue one record; returns a future for its result.

        Awaits while the queue is full (backpressure).

        Args:
            record: The record.
            estimated_cost: Its cost; when omitted, the `cost_estimator`, then the record's
                `estimate_cost()`, then `default_cost` decide.

        Returns:
            A future resolving to this record's entry of the process function's results.

        Raises:
            BatcherNotRunningError: Before `start()` (a `RuntimeError`).
            BatcherClosedError: While stopping or after `stop()` (a `RuntimeError`).
            BatcherFailedError: After the batcher died.
            CostBudgetExceededError: The record costs more than the budget and `oversized="reject"`.
            Exception: Whatever the cost estimator raised, with a note naming the record.
        """
        if self._state != _RUNNING:
            raise self._not_accepting_error()
        loop = self._loop
        if loop is not asyncio.get_running_loop():
            raise RuntimeError(f"{self.name} runs on another event loop; submit from the loop that started it")
        cost = self._costs.resolve(record, estimated_cost)
        if cost > self._target_batch_cost and self._oversized == "reject":
            raise CostBudgetExceededError(
                f"{self.name}: {short_repr(record)} costs {cost}, more than target_batch_cost="
                f"{self._target_batch_cost}; it can never fit a batch (oversized='reject')"
            )
        while self._pending.is_full():
            await self._pending.wait_for_space()
            if self._state != _RUNNING:
                raise self._not_accepting_error()
        future: asyncio.Future[ResultT] = loop.create_future()
        now = time.monotonic()
        self._seq += 1
        self._pending.append(Envelope(record, cost, future, now, self._seq))
        self._stats.record_submit(now)
        if self._wakeup is not None:
            self._wake()
        return future

    async def submit_batch(
        self,
        records: Sequence[RecordT],
        *,
        estimated_cost: Sequence[int] | None = None,
    ) -> list[asyncio.Future[ResultT]]:
        """Submit several records; returns their futures in order.

        Args:
            records: The records.
            estimated_cost: Optional per-record costs, as long as `records`.

        Raises:
            ValueError: `estimated_cost` has a different length than `records`.
        """
        if estimated_cost is not None and len(estimated_cost) != len(records):
            raise ValueError(f"estimated_cost has {len(estimated_cost)} entries for {len(records)} records")
        costs: Sequence[int | None] = estimated_cost if estimated_cost is not None else [None] * len(records)
        return [await self.submit(record, estimated_cost=cost) for record, cost in zip(records, costs, strict=True)]

    def flush(self) -> None:
        """Dispatch everything submitted so far without waiting for `batch_timeout_s` or `min_batch_size`."""
        self._flush_through(self._seq)

    def _flush_through(self, seq: int) -> None:
        if seq > self._flush_upto:
            self._flush_upto = seq
            self._wake()

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
        window_size = max_in_flight or self._max_batch_size * (self._max_concurrent_batches + 1)
        _require(window_size >= 1, f"max_in_flight must be >= 1, got {max_in_flight}")
        window: deque[asyncio.Future[ResultT]] = deque()
        last_seq = -1
        try:
            async for record in aiter_records(records):
                window.append(await self._submit_or_failed_future(record))
                last_seq = self._seq
                while len(window) >= window_size:
                    yield await outcome(window.popleft(), return_exceptions)
            self._flush_through(last_seq)  # the input ended: its tail need not wait for batch_timeout_s
            while window:
                yield await outcome(window.popleft(), return_exceptions)
        finally:
            for future in window:
                future.cancel()

    async def run(
        self, records: Iterable[RecordT] | AsyncIterable[RecordT], *, return_exceptions: bool = False
    ) -> list:
        """Process all records and return their results in input order.

        Starts and stops the batcher around the call if it is not running yet.

        Args:
            records: A sync or async iterable of records.
            return_exceptions: Put a failed record's exception in its slot instead of raising.

        Example:
            ```python
            answers = await DynamicBatcher(model.predict).run(inputs)
            ```
        """
        if self._state == _NEW or self._state == _STOPPED:
            async with self:
                return [result async for result in self.map(records, return_exceptions=return_exceptions)]
        return [result async for result in self.map(records, return_exceptions=return_exceptions)]

    async def _submit_or_failed_future(self, record: RecordT) -> asyncio.Future[ResultT]:
        try:
            return await self.submit(record)
        except (BatcherClosedError, BatcherFailedError, BatcherNotRunningError):
            raise
        except Exception as exc:  # a bad record fails at its own position, not the whole stream
            failed: asyncio.Future[ResultT] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed

    def _not_accepting_error(self) -> BaseException:
        if self._state == _FAILED and self._failure is not None:
            return self._failure
        if self._state == _NEW:
            return BatcherNotRunningError(f"{self.name} is not running. Call start() or use 'async with'.")
        return BatcherClosedError(f"{self.name} is stopped and takes no new records")

    # -- dispatching -------------------------------------------------------------------------------

    def _wake(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    async def _dispatch_loop(self) -> None:
        try:
            while True:
                deadline = self._dispatch_ready_batches()
                if self._state != _RUNNING and not self._pending and not self._inflight_batches:
                    return
                await self._sleep_until(deadline)
        except asyncio.CancelledError:
            if not self._aborting:
                # Only the event loop shutting down (asyncio.run's exit) cancels the dispatcher:
                # nothing can run any more, so cancel what is left and free the worker threads.
                pending = len(self._pending)
                self._release_without_loop()
                logger.warning(
                    "%s: the event loop shut down while it was running; cancelled %d queued records",
                    self.name,
                    pending,
                )
            raise
        except GeneratorExit:  # the loop was dropped with the task pending (interpreter exit): nothing to tell
            raise
        except (KeyboardInterrupt, SystemExit) as exc:
            self._fail(exc)
            raise
        except BaseException as exc:  # a bug here must not leave futures hanging
            self._fail(exc)

    def _dispatch_ready_batches(self) -> float | None:
        """Dispatch every batch that may go now; return when to look again (None: on the next event)."""
        while self._pending:
            if len(self._inflight_batches) >= self._max_concurrent_batches:
                return None
            self._pending.drop_cancelled_head()
            if not self._pending:
                return None
            head = self._pending.head
            room = self._max_inflight_cost - self._inflight_cost
            if self._inflight_batches and head.cost > room:
                return None  # the in-flight bound is reached; a completion will wake us
            budget = min(self._target_batch_cost, room)
            reason = self._dispatch_reason(head, budget)
            if reason is None:
                return head.submitted_at + self._batch_timeout_s
            self._launch(self._pending.take_batch(budget, self._max_batch_size), reason)
        return None

    def _dispatch_reason(self, head: Envelope, budget: int) -> DispatchReason | None:
        if len(self._pending) >= self._max_batch_size:
            return "full"
        if self._pending.cost >= budget:
            return "budget"
        if self._state != _RUNNING or head.seq <= self._flush_upto:
            return "drain"
        if time.monotonic() - head.submitted_at >= self._batch_timeout_s:
            return "timeout"
        if not self._inflight_batches and len(self._pending) >= self._min_batch_size:
            return "idle"
        return None

    def _launch(self, batch: list[Envelope], reason: DispatchReason) -> None:
        cost = sum(envelope.cost for envelope in batch)
        if len(batch) == 1 and cost > self._target_batch_cost:
            self._stats.oversized += 1
        self._stats.record_dispatch(time.monotonic(), [envelope.submitted_at for envelope in batch], cost, reason)
        self._inflight_cost += cost
        assert self._loop is not None
        task = self._loop.create_task(self._run_batch(batch), name=f"{self.name}-batch")
        self._inflight_batches[task] = (batch, cost)
        # The batch task settles its own accounting before its callers resume; this callback only
        # covers a task cancelled before its first step, whose body (and `finally`) never ran.
        task.add_done_callback(self._finish_batch)

    def _finish_batch(self, task: asyncio.Task[None]) -> None:
        entry = self._inflight_batches.pop(task, None)
        if entry is None:
            return
        batch, cost = entry
        self._inflight_cost -= cost
        for envelope in batch:
            future = envelope.future
            if not future.done():  # the batch task died before resolving it
                if self._aborting:
                    future.cancel()
                else:
                    future.set_exception(
                        self._failure
                        or BatcherFailedError(f"{self.name}: no result came back for {envelope.describe()}")
                    )
        self._settle(batch)
        self._stats.record_batch_done(time.monotonic())
        self._wake()

    async def _sleep_until(self, deadline: float | None) -> None:
        loop = self._loop
        assert loop is not None
        wakeup: asyncio.Future[None] = loop.create_future()
        self._wakeup = wakeup
        timer = None
        if deadline is not None:
            timer = loop.call_later(max(deadline - time.monotonic(), 0.0), _resolve, wakeup)
        try:
            await wakeup
        finally:
            self._wakeup = None
            if timer is not None:
                timer.cancel()

    # -- running a batch ---------------------------------------------------------------------------

    async def _run_batch(self, batch: list[Envelope]) -> None:
        try:
            await self._process_guarded(batch)
        finally:
            task = asyncio.current_task()
            if task is not None:
                self._finish_batch(task)

    async def _process_guarded(self, batch: list[Envelope]) -> None:
        try:
            await self._process(batch)
        except asyncio.CancelledError:
            if self._aborting or _cancel_requested():
                for envelope in batch:
                    envelope.future.cancel()
                raise
            self._fail_batch(batch, ProcessFnCancelledError(f"{self.name}: the process function raised CancelledError"))
        except GeneratorExit:
            raise
        except (KeyboardInterrupt, SystemExit) as exc:
            self._fail(exc)
            raise
        except BaseException as exc:  # anything else that is not an Exception kills the batcher, loudly
            self._fail(exc)

    async def _process(self, batch: list[Envelope]) -> None:
        live = [envelope for envelope in batch if not envelope.future.done()]
        if len(live) < len(batch):  # cancelled by their callers since dispatch: they never run
            self._settle_cancelled([envelope for envelope in batch if envelope.future.done()])
        if not live:
            return
        try:
            results = await self._caller([envelope.record for envelope in live])
            _check_result_count(results, len(live))
        except ResultCountError as exc:
            self._fail_batch(live, exc)
            return
        except UnrecoverableError as exc:
            self._fail(exc)
            return
        except Exception as exc:
            if self._on_error == "split" and len(live) > 1:
                await self._bisect(live)
            else:
                self._fail_batch(live, exc)
            return
        self._resolve(live, results)

    async def _bisect(self, batch: list[Envelope]) -> None:
        middle = len(batch) // 2
        for half in (batch[:middle], batch[middle:]):
            await self._process(half)

    def _resolve(self, batch: list[Envelope], results: Sequence[Any]) -> None:
        for envelope, result in zip(batch, results, strict=True):
            future = envelope.future
            if future.done():
                continue
            if isinstance(result, Exception):
                add_note(result, f"{self.name}: failed {envelope.describe()}")
                future.set_exception(result)
            else:
                future.set_result(result)
        self._settle(batch)

    def _fail_batch(self, batch: list[Envelope], error: BaseException) -> None:
        if len(batch) == 1:
            add_note(error, f"{self.name}: failed {batch[0].describe()}")
        else:
            hint = "" if self._on_error == "split" else "; on_error='split' isolates the failing records"
            add_note(
                error,
                f"{self.name}: failed a batch of {len(batch)} records (#{batch[0].seq}..#{batch[-1].seq}, first "
                f"{short_repr(batch[0].record)}){hint}",
            )
        logger.error("%s: batch of %d records failed: %r", self.name, len(batch), error)
        for envelope in batch:
            if not envelope.future.done():
                envelope.future.set_exception(error)
        self._settle(batch)

    def _settle(self, envelopes: list[Envelope]) -> None:
        """Count records whose futures are resolved as finished, each once, as they resolve.

        Counting per record rather than per batch keeps the stats true while a batch is still
        being split, or while its other records are still running.
        """
        fresh = [envelope for envelope in envelopes if not envelope.settled]
        if not fresh:
            return
        failed = 0
        for envelope in fresh:
            envelope.settled = True
            future = envelope.future
            failed += not future.cancelled() and future.exception() is not None
        self._stats.record_settled(time.monotonic(), [envelope.submitted_at for envelope in fresh], failed)

    def _settle_cancelled(self, envelopes: list[Envelope]) -> None:
        fresh = [envelope for envelope in envelopes if not envelope.settled]
        for envelope in fresh:
            envelope.settled = True
        if fresh:
            self._stats.record_dropped(time.monotonic(), len(fresh), cancelled=True)

    # -- failure and abort -------------------------------------------------------------------------

    def _fail(self, cause: BaseException) -> None:
        """The batcher cannot go on: fail everything unresolved and every later submit."""
        if self._state == _FAILED:
            return
        failure = (
            cause if isinstance(cause, BatcherFailedError) else BatcherFailedError(f"{self.name} failed: {cause!r}")
        )
        if failure is not cause:
            failure.__cause__ = cause
        logger.error("%s failed; failing all pending records", self.name, exc_info=cause)
        self._failure = failure
        self._state = _FAILED
        self._pending.release_waiters(failure)
        for batch, _ in self._inflight_batches.values():
            for envelope in batch:
                if not envelope.future.done():
                    envelope.future.set_exception(failure)
        self._drop_pending(failure)
        self._wake()

    def _abort(self) -> None:
        """Cancel everything left: queued records and in-flight batches."""
        self._aborting = True
        self._drop_pending()
        for task in list(self._inflight_batches):
            task.cancel()
        if self._dispatcher is not None:
            self._dispatcher.cancel()

    def _release_without_loop(self) -> None:
        """Let go of a batcher whose event loop stopped or closed: free its worker threads.

        Nothing can run on a loop that is gone, so this cannot drain; what the loop still allows
        (it is stopped but not closed) is cancelled.
        """
        loop = self._loop
        if loop is not None and not loop.is_closed():
            self._abort()
        self._caller.shutdown()
        if self._state != _FAILED:
            self._state = _STOPPED

    def _drop_pending(self, error: BaseException | None = None) -> None:
        """Cancel every queued record, or fail it with `error`."""
        dropped = self._pending.clear(error)
        if dropped:
            self._stats.record_dropped(time.monotonic(), dropped, cancelled=error is None)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _check_result_count(results: Any, expected: int) -> None:
    try:
        count = len(results)
    except TypeError:
        raise ResultCountError(
            f"process_fn must return a list with one result per record, got {type(results).__name__}"
        ) from None
    if count != expected:
        raise ResultCountError(f"process_fn returned {count} results for batch of {expected} records")


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _cancel_requested() -> bool:
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling and cancelling())
