"""DynamicBatcher: many concurrent producers, one process function, cost-budgeted batches.

The way of a record, one module per step:

1. `submit` (here) costs it (`_cost`) and queues it: producers wait when the queue is full.
2. The waiting room (`_pending`) orders records by priority, then by submission (or by similar
   cost, with `grouping="by_cost"`).
3. The staging area (`_staging`) forms batches within the cost budget and stages full ones ahead
   (`prefetch_batches`), where the device's runners take them.
4. The device (`_device`) runs batches through the process function, in a worker thread for a
   plain `def` or on the loop for an `async def`, and takes the next batch itself the moment one
   returns.
5. Settling (`_settle`) resolves each record's future, once, and counts it in the stats.

This module orchestrates them on the event loop: lifecycle, backpressure, timers for timeouts and
deadlines, and what happens when something fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from typing import Any, Generic, TypeVar

from flyteplugins_batcher._cost import CostResolver
from flyteplugins_batcher._deadlines import DeadlineWatch
from flyteplugins_batcher._device import Device, DeviceHooks
from flyteplugins_batcher._errors import (
    BatcherClosedError,
    BatcherFailedError,
    BatcherNotRunningError,
    CostBudgetExceededError,
    short_repr,
)
from flyteplugins_batcher._iterate import aiter_records, outcome
from flyteplugins_batcher._pending import Envelope
from flyteplugins_batcher._records import CostEstimatorFn, ProcessFn, RecordT, ResultT
from flyteplugins_batcher._settings import BatcherSettings, Grouping, OnError, Oversized
from flyteplugins_batcher._settle import Settler
from flyteplugins_batcher._staging import Batch, Plan, StagingArea
from flyteplugins_batcher._stats import BatchStats, Settled, StatsRecorder

logger = logging.getLogger("flyteplugins_batcher")

BatcherT = TypeVar("BatcherT", bound="DynamicBatcher[Any, Any]")


class BatcherState(enum.Enum):
    """Where a batcher is in its life."""

    NEW = "new"  # built, never started
    RUNNING = "running"  # taking records
    DRAINING = "draining"  # `stop()`: no new records; the queued ones still run
    ABORTING = "aborting"  # `stop()` ran out of time: what is left is being cancelled
    STOPPED = "stopped"  # may start again
    FAILED = "failed"  # the process function raised something no batch survives; see `failure`


_ACTIVE = (BatcherState.RUNNING, BatcherState.DRAINING, BatcherState.ABORTING)
_RUNNING = BatcherState.RUNNING
_get_running_loop = asyncio.get_running_loop
_monotonic = time.monotonic


class DynamicBatcher(Generic[RecordT, ResultT]):
    """Batches records from many concurrent producers through one process function.

    A drop-in replacement for `flyte.extras.DynamicBatcher` (same constructor keywords,
    defaults, methods and semantics) that never blocks the event loop, treats the cost budget as
    a hard limit, cannot deadlock on timeouts or `min_batch_size`, isolates failing records,
    keeps the next batch staged at the device, supports per-record priorities and deadlines, and
    reports latency percentiles and the device's own utilization.

    Type Parameters:
        RecordT: The record type producers submit.
        ResultT: The per-record result type of the process function.

    Args:
        process_fn: `f(batch: list[RecordT]) -> list[ResultT]`, results in input order. A plain
            `def` runs in a worker thread; an `async def` is awaited on the loop. A slot may hold
            an `Exception` instance to fail only that record. Raising `UnrecoverableError` fails
            the batcher (every pending record and later submit).
        cost_estimator: `f(record) -> int`. Cost precedence: explicit `estimated_cost` >
            `cost_estimator` > `record.estimate_cost()` > `default_cost`.
        target_batch_cost: Cost budget per batch, a hard limit. A single record costlier than the
            budget runs alone (or is rejected, see `oversized`).
        max_batch_size: Most records per batch.
        min_batch_size: Records to wait for before dispatching to an idle device; the batch goes
            anyway once its oldest record has waited `batch_timeout_s`.
        batch_timeout_s: Longest a record waits for its batch to fill, counted from its
            `submit`. An idle device does not wait for it (see `min_batch_size`).
        max_queue_size: Records that may wait beyond the staged batches and the batch being
            assembled; when full, `submit` awaits (backpressure). 0 or less means unbounded.
        prefetch_batches: Full batches assembled ahead and staged at the device, so the next
            batch starts the moment the previous one returns.
        default_cost: Cost of a record when nothing else estimates it.
        max_concurrent_batches: Batches that may be inside the process function at once, for
            engines that overlap work (or serve several requests). Results always reach the
            right futures.
        max_inflight_cost: Upper bound on the summed cost of all batches in flight; `None` means
            `target_batch_cost * max_concurrent_batches`.
        on_error: When the process function raises for a whole batch: `"raise"` (default) fails
            every record of the batch with that exception; `"split"` bisects the batch and re-runs
            the halves until the failing records are isolated, so healthy records still get
            results. Splitting costs about `2 * log2(batch size)` extra calls per failing record.
        oversized: A record costlier than `target_batch_cost`: `"run_alone"` (default) runs it
            in a batch of its own; `"reject"` makes `submit` raise `CostBudgetExceededError`.
        grouping: `"fifo"` (default) forms batches in submission order; `"by_cost"` groups
            records of similar cost (for padded models, where a batch costs what its longest row
            costs), always including the oldest waiting record so that nothing starves.
        priority_aging_s: A waiting record gains one priority level per this many seconds, so
            low priorities cannot starve; `None` means strict priorities.
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
        grouping: Grouping = "fifo",
        priority_aging_s: float | None = 10.0,
        name: str | None = None,
    ) -> None:
        settings = BatcherSettings(
            target_batch_cost=target_batch_cost,
            max_batch_size=max_batch_size,
            min_batch_size=min_batch_size,
            batch_timeout_s=batch_timeout_s,
            max_queue_size=max_queue_size,
            prefetch_batches=prefetch_batches,
            default_cost=default_cost,
            max_concurrent_batches=max_concurrent_batches,
            max_inflight_cost=max_inflight_cost,
            on_error=on_error,
            oversized=oversized,
            grouping=grouping,
            priority_aging_s=priority_aging_s,
        )
        self._setup(process_fn, settings, cost_estimator, name)

    @classmethod
    def from_settings(
        cls: type[BatcherT],
        process_fn: ProcessFn[Any, Any],
        settings: BatcherSettings,
        *,
        cost_estimator: CostEstimatorFn[Any] | None = None,
        name: str | None = None,
    ) -> BatcherT:
        """A batcher built from a `BatcherSettings` value.

        Example:
            ```python
            settings = BatcherSettings(max_batch_size=64, grouping="by_cost")
            batcher = DynamicBatcher.from_settings(embed, settings, cost_estimator=count_tokens)
            ```
        """
        batcher = cls.__new__(cls)
        batcher._setup(process_fn, settings, cost_estimator, name)
        return batcher

    def _setup(
        self,
        process_fn: ProcessFn[RecordT, ResultT],
        settings: BatcherSettings,
        cost_estimator: CostEstimatorFn[RecordT] | None,
        name: str | None,
    ) -> None:
        if not callable(process_fn):
            raise ValueError(f"process_fn must be callable, got {type(process_fn).__name__}")
        self.name = name or type(self).__name__
        self._settings = settings
        self._process_fn = process_fn
        self._costs = CostResolver(self.name, cost_estimator, settings.default_cost, self._cost_protocols)
        self._capacity = settings.queue_capacity or math.inf  # records that may wait unstaged
        self._reject_above = settings.target_batch_cost if settings.oversized == "reject" else math.inf
        self._state = BatcherState.NEW
        self._failure: BatcherFailedError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._seq = 0
        # Statistics describe the batcher's whole life, across restarts.
        self._stats = StatsRecorder()
        self._settler = Settler(self.name, self._stats, split_hint=settings.on_error == "raise")
        self._reset_runtime_state()

    def _reset_runtime_state(self) -> None:
        settings = self._settings
        self._staging = StagingArea(settings)
        self._device = Device(
            self._process_fn,
            owner=self.name,
            staging=self._staging,
            busy=self._stats.busy,
            hooks=DeviceHooks(self._on_dispatched, self._on_outcome, self._on_done, self._on_retired, self._on_fatal),
            split=settings.on_error == "split",
            max_runners=settings.max_concurrent_batches,
        )
        self._space_waiters: deque[asyncio.Future[None]] = deque()
        self._deadlines: DeadlineWatch | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._drained: asyncio.Future[None] | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None

    # -- properties --------------------------------------------------------------------------------

    @property
    def settings(self) -> BatcherSettings:
        """The batcher's settings."""
        return self._settings

    @property
    def stats(self) -> BatchStats:
        """A fresh `BatchStats` snapshot."""
        return self._stats.snapshot(
            time.monotonic(), queue_depth=self._staging.waiting, inflight_batches=self._staging.inflight_batches
        )

    @property
    def state(self) -> BatcherState:
        """Where the batcher is in its life."""
        return self._state

    @property
    def is_running(self) -> bool:
        """Whether the batcher has started and has not finished stopping."""
        return self._state in _ACTIVE

    @property
    def is_failed(self) -> bool:
        """Whether the process function raised something that no batch survives (see `failure`)."""
        return self._state is BatcherState.FAILED

    @property
    def failure(self) -> BatcherFailedError | None:
        """Why the batcher failed (its `__cause__` is what the process function raised), or `None`."""
        return self._failure

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the batcher runs on (set by `start`)."""
        return self._loop

    @property
    def is_async(self) -> bool:
        """Whether the process function is awaited on the loop (else it runs in a worker thread)."""
        return self._device.is_async

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start taking records on the running event loop.

        Raises:
            RuntimeError: If the batcher is already running.
        """
        if self._state in _ACTIVE:
            raise RuntimeError(f"{self.name} is already running")
        self._reset_runtime_state()
        self._failure = None
        loop = self._loop = asyncio.get_running_loop()
        self._device.attach(loop)
        self._deadlines = DeadlineWatch(loop, self._expire)
        self._state = BatcherState.RUNNING
        self._stopped = loop.create_future()
        self._watchdog = loop.create_task(self._watch_loop(self._stopped), name=f"{self.name}-watchdog")
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
        if self._state in (BatcherState.NEW, BatcherState.STOPPED):
            return
        try:
            if self._state is BatcherState.RUNNING:
                self._state = BatcherState.DRAINING
                self._release_space_waiters(BatcherClosedError(f"{self.name} is stopping and takes no new records"))
            if self._state is BatcherState.DRAINING:
                if cancel_pending:
                    self._settler.settle(self._staging.remove_waiting(), Settled.CANCELLED)
                self._staging.start_draining()
                self._pump()
                await self._wait_drained(timeout)
        except asyncio.CancelledError:
            self._abort()
            raise
        finally:
            self._finish()
        logger.info("%s stopped: %s", self.name, self.stats.summary())

    def release(self) -> None:
        """Let go of a batcher whose event loop has stopped or closed: cancel what is left, free its threads.

        Nothing can run on a loop that is gone, so nothing drains; while the loop still runs, use
        `stop()`. `SharedBatcher` calls this for a batcher whose loop went away.

        Raises:
            RuntimeError: The batcher's event loop is still running.
        """
        if self._state in (BatcherState.NEW, BatcherState.STOPPED):
            return
        loop = self._loop
        if loop is not None and loop.is_running():
            raise RuntimeError(f"{self.name}: its event loop still runs; call stop() on that loop instead")
        with contextlib.suppress(RuntimeError):  # a closed loop cannot run the futures' callbacks
            self._settler.settle(self._staging.remove_waiting(with_running=True), Settled.CANCELLED)
        if self._watchdog is not None:
            self._watchdog.cancel()  # it finishes if that loop ever runs again
        self._finish()

    async def __aenter__(self) -> DynamicBatcher[RecordT, ResultT]:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        if exc_type is None:
            await self.stop()
        else:
            # The block failed or was cancelled (a `wait_for` around `run()` timed out, say): nobody
            # will await what is left, and a stuck device must not keep the caller from leaving.
            await self.stop(timeout=0, cancel_pending=True)

    async def _wait_drained(self, timeout: float | None) -> None:
        if not self._stats.in_system:
            return
        assert self._loop is not None
        drained = self._drained = self._loop.create_future()
        done, _ = await asyncio.wait({drained}, timeout=timeout)
        if not done:
            logger.warning("%s: stop timed out after %ss; cancelling the remaining records", self.name, timeout)
            self._abort()

    def _abort(self) -> None:
        """Cancel everything left: waiting records and batches in flight."""
        if self._state not in _ACTIVE:
            return
        self._state = BatcherState.ABORTING
        self._settler.settle(self._staging.remove_waiting(with_running=True), Settled.CANCELLED)
        self._device.cancel_runners()

    def _finish(self) -> None:
        if self._deadlines is not None:
            self._deadlines.close()
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf
        self._device.shutdown()
        stopped = self._stopped
        if stopped is not None and not stopped.done():
            with contextlib.suppress(RuntimeError):
                stopped.set_result(None)
        if self._state is not BatcherState.FAILED:
            self._state = BatcherState.STOPPED

    async def _watch_loop(self, stopped: asyncio.Future[None]) -> None:
        """Waits for `stop`; if the event loop shuts down first (`asyncio.run` returning), lets go."""
        try:
            await stopped
        except asyncio.CancelledError:
            if self._state in _ACTIVE:
                left = self._stats.in_system
                self._abort()
                self._finish()
                logger.warning(
                    "%s: the event loop shut down while it was running; cancelled %d records", self.name, left
                )
            raise

    # -- submitting --------------------------------------------------------------------------------

    async def submit(
        self,
        record: RecordT,
        *,
        estimated_cost: int | None = None,
        priority: int = 0,
        deadline_s: float | None = None,
    ) -> asyncio.Future[ResultT]:
        """Queue one record; returns a future for its result.

        Awaits while the queue is full (backpressure).

        Args:
            record: The record to process.
            estimated_cost: Its cost against the batch budget; if omitted, `cost_estimator`, then
                `estimate_cost()`, then `default_cost` decide.
            priority: Higher goes first (FIFO within a level); a waiting record gains one level
                per `priority_aging_s` seconds. Batches already staged keep their records.
            deadline_s: Seconds from now after which the record must not be dispatched: it then
                fails with `RecordExpiredError` and never reaches the process function.

        Returns:
            A future resolving to this record's entry of the process function's results.

        Raises:
            BatcherNotRunningError: Before `start()` (a `RuntimeError`).
            BatcherClosedError: While stopping or after `stop()` (a `RuntimeError`).
            BatcherFailedError: After the batcher failed.
            CostBudgetExceededError: The record costs more than the budget and `oversized="reject"`.
            ValueError: `deadline_s` is not a positive number, or `priority` not an integer.
            Exception: Whatever the cost estimator raised, with a note naming the record.
        """
        # This runs once per record: module-level names and a short path for the common case.
        if self._state is not _RUNNING:
            raise self._not_accepting_error()
        loop = self._loop
        if loop is not _get_running_loop():
            raise RuntimeError(f"{self.name} runs on another event loop; submit from the loop that started it")
        if estimated_cost.__class__ is int and estimated_cost >= 0:  # type: ignore[operator]
            cost = estimated_cost  # the common explicit cost, without a call
        else:
            cost = self._costs.resolve(record, estimated_cost)
        if cost > self._reject_above:
            raise CostBudgetExceededError(
                f"{self.name}: {short_repr(record)} costs {cost}, more than target_batch_cost="
                f"{self._settings.target_batch_cost}; it can never fit a batch (oversized='reject')"
            )
        if priority.__class__ is not int:
            _check_priority(priority)
        if deadline_s is not None:
            _check_deadline(deadline_s)
        staging = self._staging
        if staging.pending.size >= self._capacity:
            await self._wait_for_space()
        now = _monotonic()
        future: asyncio.Future[ResultT] = loop.create_future()
        seq = self._seq = self._stats.record_submit(now)
        envelope = Envelope(record, cost, future, now, seq, priority)
        if deadline_s is not None:
            envelope.deadline = now + deadline_s
            assert self._deadlines is not None  # set by start()
            self._deadlines.watch(envelope)
        plan = staging.plan(now, envelope)  # this runs per record: `_pump` only when there is something to do
        if plan is not None or self._space_waiters:
            self._act(plan)
        return future

    async def submit_batch(
        self,
        records: Sequence[RecordT],
        *,
        estimated_cost: Sequence[int] | None = None,
        priority: int = 0,
        deadline_s: float | None = None,
    ) -> list[asyncio.Future[ResultT]]:
        """Submit several records; returns their futures in order.

        Args:
            records: The records.
            estimated_cost: Optional per-record costs, as long as `records`.
            priority: For every record (see `submit`).
            deadline_s: For every record, from now (see `submit`).

        Raises:
            ValueError: `estimated_cost` has a different length than `records`.
        """
        if estimated_cost is not None and len(estimated_cost) != len(records):
            raise ValueError(f"estimated_cost has {len(estimated_cost)} entries for {len(records)} records")
        costs: Sequence[int | None] = estimated_cost if estimated_cost is not None else [None] * len(records)
        return [
            await self.submit(record, estimated_cost=cost, priority=priority, deadline_s=deadline_s)
            for record, cost in zip(records, costs, strict=True)
        ]

    def flush(self) -> None:
        """Dispatch everything submitted so far without waiting for `batch_timeout_s` or `min_batch_size`."""
        self._flush_through(self._seq)

    def _flush_through(self, seq: int) -> None:
        if self._state is BatcherState.RUNNING:
            self._staging.flush(seq)
            self._pump()

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
        settings = self._settings
        window_size = max_in_flight or settings.max_batch_size * (settings.max_concurrent_batches + 1)
        if window_size < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
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
            if window:
                for future in window:
                    future.cancel()
                if self._state in _ACTIVE:  # count them now, not when their batch would have gone
                    self._settler.settle(self._staging.remove_cancelled(), Settled.CANCELLED)
                    self._pump()

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
        if self._state in (BatcherState.NEW, BatcherState.STOPPED):
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
        if self._state is BatcherState.FAILED and self._failure is not None:
            return self._failure
        if self._state is BatcherState.NEW:
            return BatcherNotRunningError(f"{self.name} is not running. Call start() or use 'async with'.")
        return BatcherClosedError(f"{self.name} is stopped and takes no new records")

    # -- backpressure ------------------------------------------------------------------------------

    async def _wait_for_space(self) -> None:
        assert self._loop is not None
        while self._staging.pending.size >= self._capacity:
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._space_waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                slot_given = waiter.done() and not waiter.cancelled() and waiter.exception() is None
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._space_waiters.remove(waiter)
                if slot_given:
                    self._wake_space_waiters()  # pass on the slot this cancelled producer will not use
                raise
            if self._state is not BatcherState.RUNNING:
                raise self._not_accepting_error()

    def _wake_space_waiters(self) -> None:
        waiters = self._space_waiters
        free = self._capacity - self._staging.pending.size
        while free > 0 and waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                free -= 1

    def _release_space_waiters(self, error: BaseException) -> None:
        while self._space_waiters:
            waiter = self._space_waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error)

    # -- dispatching -------------------------------------------------------------------------------

    def _pump(self) -> None:
        """Let the staging area act on a change (a completion, a timeout, a flush)."""
        self._act(self._staging.plan(time.monotonic()))

    def _act(self, plan: Plan | None) -> None:
        """Start runners, settle skipped records, arm the timer, let waiting producers in."""
        if plan is not None:
            if plan.runners_to_start:
                self._device.start_runners(plan.runners_to_start)
            if plan.skipped:
                self._settle_skipped(plan.skipped)
            if plan.wake_at is not None and plan.wake_at < self._timer_at:
                self._arm_timer(plan.wake_at)
        if self._space_waiters:
            self._wake_space_waiters()

    def _arm_timer(self, when: float) -> None:
        loop = self._loop
        assert loop is not None
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = loop.call_later(max(when - time.monotonic(), 0.0), self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, math.inf
        if self._state in _ACTIVE:
            self._pump()

    def _expire(self, envelope: Envelope) -> None:
        if self._staging.mark_expired(envelope):
            self._settler.settle([envelope], Settled.EXPIRED)
            self._check_drained()

    def _settle_skipped(self, skipped: list[Envelope]) -> None:
        cancelled = [envelope for envelope in skipped if envelope.future.done()]
        if cancelled:
            self._settler.settle(cancelled, Settled.CANCELLED)
        if len(cancelled) < len(skipped):
            self._settler.settle([envelope for envelope in skipped if not envelope.future.done()], Settled.EXPIRED)

    # -- device hooks (on the event loop) --------------------------------------------------------------

    def _on_dispatched(self, batch: Batch, skipped: list[Envelope]) -> None:
        if skipped:
            self._settle_skipped(skipped)
        envelopes = batch.envelopes
        now = time.monotonic()
        self._stats.record_dispatch(
            [now - envelope.submitted_at for envelope in envelopes],
            batch.cost,
            batch.reason,
            oversized=len(envelopes) == 1 and batch.cost > self._settings.target_batch_cost,
        )
        if self._state in _ACTIVE:
            self._pump()  # a staging slot is free: stage the next full batch, let waiting producers in

    def _on_outcome(self, records: list[Envelope], outcome: Any) -> None:
        self._settler.settle(records, Settled.RAN, outcome)

    def _on_done(self, batch: Batch) -> None:
        if self._deadlines is not None:
            self._deadlines.trim(self._stats.in_system)
        if self._state in _ACTIVE:
            self._pump()
        self._check_drained()

    def _on_retired(self, skipped: list[Envelope]) -> None:
        if skipped:
            self._settle_skipped(skipped)
        if self._state in _ACTIVE and self._staging.has_waiting():
            self._pump()  # records wait that may go later (a timeout): arm the timer
        self._check_drained()

    def _on_fatal(self, error: BaseException, batch: Batch) -> None:
        self._staging.finish(batch)
        self._fail(error, batch)

    def _check_drained(self) -> None:
        drained = self._drained
        if drained is not None and not drained.done() and not self._stats.in_system:
            drained.set_result(None)

    # -- failure -----------------------------------------------------------------------------------

    def _fail(self, cause: BaseException, batch: Batch) -> None:
        """No batch can run any more: fail everything unresolved, and every later submit."""
        record_error = cause if isinstance(cause, Exception) else BatcherFailedError(f"{self.name} failed: {cause!r}")
        if record_error is not cause:
            record_error.__cause__ = cause
        if self._state is not BatcherState.FAILED:
            failure = BatcherFailedError(f"{self.name} failed: {cause!r}")
            failure.__cause__ = cause
            self._failure = failure
            self._state = BatcherState.FAILED
            logger.error("%s failed; failing all pending records", self.name, exc_info=cause)
            self._release_space_waiters(failure)
        self._settler.settle(batch.envelopes, Settled.RAN, record_error)
        self._settler.settle(self._staging.remove_waiting(with_running=True), Settled.FAILED, record_error)
        self._device.cancel_runners()
        self._check_drained()


def _check_priority(priority: Any) -> None:
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ValueError(f"priority must be an int, got {priority!r}")


def _check_deadline(deadline_s: Any) -> None:
    if not isinstance(deadline_s, (int, float)) or not deadline_s > 0 or not math.isfinite(deadline_s):
        raise ValueError(f"deadline_s must be a positive number of seconds, got {deadline_s!r}")
