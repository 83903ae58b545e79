"""DynamicBatcher: many concurrent producers, one process function, cost-budgeted batches.

The way of a record, one module per step:

1. `submit` (here) costs it (`_cost`) and puts it in an envelope (`_envelope`, which also holds
   the record's one state); producers wait while the queue is full (`_backpressure`).
2. The queue (`_pending`) orders records by priority, then by submission (or by similar
   cost, with `grouping="by_cost"`, or by shared prefix, with `grouping="by_prefix"`: `_grouping`).
3. The staging area (`_staging`) forms batches within the cost budget and stages full ones ahead
   (`prefetch_batches`), where the runners take them.
4. The runners (`_runners`) run batches through the process function, in a worker thread for a
   plain `def` or on the loop for an `async def`, and take the next batch themselves the moment
   one returns.
5. The Settler (`_settle`) ends each record: resolves its future, once, and counts it.

The dispatcher (`_dispatch`, one from each `start` to its `stop`) acts on the staging area's plans and
the runners' reports on the event loop; the lifecycle (`_lifecycle`) starts, stops and fails it. This module is the
public face: construction, state and `submit`; `_streams` adds `submit_batch`, `map` and `run`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import threading
import time
from collections.abc import Collection
from typing import Any, TypeVar

from typing_extensions import Unpack

from flyteplugins_batcher._errors import BatcherFailedError
from flyteplugins_batcher._keywords import SettingsKeywords, with_settings_signature
from flyteplugins_batcher._measure.observers import BatchObserver
from flyteplugins_batcher._measure.stats import BatchStats, StatsRecorder
from flyteplugins_batcher._pipeline.cost import CostResolver
from flyteplugins_batcher._pipeline.dispatch import Dispatcher
from flyteplugins_batcher._pipeline.envelope import new_envelope
from flyteplugins_batcher._pipeline.invoke import is_async_callable
from flyteplugins_batcher._pipeline.lifecycle import ACTIVE, BatcherState, Lifecycle
from flyteplugins_batcher._pipeline.prefix import KeyFn, PrefixResolver
from flyteplugins_batcher._pipeline.settle import Settler
from flyteplugins_batcher._pipeline.slo_control import SloController
from flyteplugins_batcher._pipeline.streams import RecordStreams
from flyteplugins_batcher._settings import BatcherOptions, BatcherSettings
from flyteplugins_batcher._types import CostEstimatorFn, ProcessFn, RecordT, ResultT

logger = logging.getLogger("flyteplugins_batcher")

BatcherT = TypeVar("BatcherT", bound="DynamicBatcher[Any, Any]")

_get_running_loop = asyncio.get_running_loop
_get_ident = threading.get_ident
# `submit` asks whether its loop runs here: asyncio's own loops say which thread runs them (`_thread_id`,
# set and cleared with the running loop), and a thread runs one loop at a time, so the same thread is the
# same loop. That is six times cheaper than `get_running_loop()`, which decides for any other loop.
_monotonic = time.monotonic


class DynamicBatcher(RecordStreams[RecordT, ResultT]):
    """Batches records from many concurrent producers through one process function.

    A drop-in replacement for `flyte.extras.DynamicBatcher` (same keywords, defaults, methods and
    semantics) that never blocks the event loop, treats the cost budget as a hard limit, cannot
    deadlock, isolates failing records, keeps the next batch staged at the device, supports
    priorities and deadlines, and reports latency percentiles and the device's utilization. It is generic
    in `RecordT`, the record type producers submit, and `ResultT`, the process function's per record.

    Args:
        process_fn: `f(batch: list[RecordT]) -> list[ResultT]`, results in input order. A plain
            `def` runs in a worker thread; an `async def` is awaited on the loop. A result may be
            an `Exception` instance to fail only that record. Raising `UnrecoverableError` fails
            the batcher (every pending record and later submit).
        cost_estimator: `f(record) -> int`. Cost precedence: explicit `estimated_cost` >
            `cost_estimator` > `record.estimate_cost()` > `default_cost`.
        name: Used in logs, warnings and thread names.
        prefix_key: `f(record) -> str | bytes | None`, what a record's prompt begins with, for
            `grouping="by_prefix"`: it wins over `record.prefix_key()` and a `str` record's text.
        **settings: The fields of `BatcherSettings`, which gives their defaults and meaning:
            flyte.extras' (`target_batch_cost`, `max_batch_size`, `batch_timeout_s`, ...) and ours
            (`max_concurrent_batches`, `on_error`, `grouping`, a latency target: `latency_slo_s`, ...).

    Raises:
        TypeError: A keyword is not a setting (the message names the closest one).
        ValueError: A setting is out of range, or `process_fn` is not callable.

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

    @with_settings_signature()
    def __init__(
        self,
        process_fn: ProcessFn[RecordT, ResultT],
        *,
        cost_estimator: CostEstimatorFn[RecordT] | None = None,
        name: str | None = None,
        prefix_key: KeyFn | None = None,
        **settings: Unpack[SettingsKeywords],
    ) -> None:
        options = BatcherOptions(BatcherSettings.from_keywords(**settings), cost_estimator, name, prefix_key)
        self._setup(process_fn, options)

    @classmethod
    def from_settings(
        cls: type[BatcherT],
        process_fn: ProcessFn[Any, Any],
        settings: BatcherSettings,
        *,
        cost_estimator: CostEstimatorFn[Any] | None = None,
        name: str | None = None,
        prefix_key: KeyFn | None = None,
    ) -> BatcherT:
        """A batcher built from a `BatcherSettings` value.

        Example:
            ```python
            settings = BatcherSettings(max_batch_size=64, grouping="by_cost")
            batcher = DynamicBatcher.from_settings(embed, settings, cost_estimator=count_tokens)
            ```
        """
        batcher = cls.__new__(cls)
        batcher._setup(process_fn, BatcherOptions(settings, cost_estimator, name, prefix_key))
        return batcher

    def _setup(self, process_fn: ProcessFn[RecordT, ResultT], options: BatcherOptions) -> None:
        if not callable(process_fn):
            raise ValueError(f"process_fn must be callable, got {type(process_fn).__name__}")
        self.name = options.name or type(self).__name__
        self._settings = settings = options.settings
        self._is_async = is_async_callable(process_fn)
        self._costs = CostResolver(self.name, options.cost_estimator, settings.default_cost, self._cost_protocols)
        self._prefixes = PrefixResolver.of(settings, self.name, options.prefix_key)
        self._reject_above = settings.batch_budget if settings.oversized == "reject" else math.inf
        slo = SloController.of(settings, self.name)  # learns, as the statistics count, across restarts
        self._stats = StatsRecorder(slo.tally if slo is not None else None)  # the batcher's whole life
        self._settler = Settler(self.name, self._stats, split_hint=settings.on_error == "raise")
        new_dispatcher = functools.partial(
            Dispatcher,
            process_fn=process_fn,
            settings=settings,
            batcher_name=self.name,
            stats=self._stats,
            settler=self._settler,
            slo=slo,
        )
        self._lifecycle = Lifecycle(self.name, new_dispatcher)

    # -- properties --------------------------------------------------------------------------------

    @property
    def settings(self) -> BatcherSettings:
        """The batcher's settings."""
        return self._settings

    @property
    def stats(self) -> BatchStats:
        """A fresh `BatchStats` snapshot."""
        dispatcher = self._lifecycle.dispatcher
        return self._stats.snapshot(
            time.monotonic(),
            queue_depth=dispatcher.staging.waiting if dispatcher is not None else 0,
            in_flight_batches=dispatcher.staging.in_flight_batches if dispatcher is not None else 0,
        )

    @property
    def state(self) -> BatcherState:
        """Where the batcher is in its life."""
        return self._lifecycle.state

    @property
    def is_running(self) -> bool:
        """Whether the batcher has started and has not finished stopping."""
        return self._lifecycle.state in ACTIVE

    @property
    def is_failed(self) -> bool:
        """Whether the process function raised something that no batch survives (see `failure`)."""
        return self._lifecycle.state is BatcherState.FAILED

    @property
    def failure(self) -> BatcherFailedError | None:
        """Why the batcher failed (its `__cause__` is what the process function raised), or `None`."""
        return self._lifecycle.failure

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the batcher runs on (set by `start`)."""
        return self._lifecycle.loop

    def add_observer(self, observer: BatchObserver) -> None:
        """Tell `observer` of every batch and every settled record from now on (see `BatchObserver`)."""
        self._stats.observers.add(observer)

    def remove_observer(self, observer: BatchObserver) -> None:
        """Stop telling `observer` (nothing happens if it was not added)."""
        self._stats.observers.remove(observer)

    @property
    def is_async(self) -> bool:
        """Whether the process function is awaited on the loop (else it runs in a worker thread)."""
        return self._is_async

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start taking records on the running event loop.

        Raises:
            RuntimeError: If the batcher is already running.
        """
        self._lifecycle.start()

    async def stop(self, timeout: float | None = None, *, cancel_pending: bool = False) -> None:
        """Stop taking records, finish the queued ones, and shut down.

        Producers waiting for queue space get `BatcherClosedError` at once: it never hangs on a full queue.

        Args:
            timeout: Seconds to wait for queued and in-flight records. When it runs out, what
                is left is cancelled (a plain-`def` process function already running in a
                thread finishes on its own; its results are discarded). `None` waits for all.
            cancel_pending: Cancel queued records that have not been dispatched instead of
                running them; batches already in flight still finish.
        """
        if await self._lifecycle.stop(timeout, cancel_pending):
            logger.info("%s stopped: %s", self.name, self.stats.summary())

    def release(self) -> None:
        """Let go of a batcher whose event loop has stopped or closed: cancel what is left, free its threads.

        Nothing drains on a loop that is gone (while it runs, use `stop()`); `SharedBatcher` calls this.

        Raises:
            RuntimeError: The batcher's event loop is still running.
        """
        self._lifecycle.release()

    async def __aenter__(self) -> DynamicBatcher[RecordT, ResultT]:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        if exc_type is None:
            await self.stop()
        else:
            # The block failed or was cancelled: nobody awaits what is left, nor waits for a stuck device.
            await self.stop(timeout=0, cancel_pending=True)

    # -- submitting --------------------------------------------------------------------------------

    async def submit(
        self,
        record: RecordT,
        *,
        estimated_cost: int | None = None,
        priority: int = 0,
        deadline_s: float | None = None,
        wait_for_room: bool = True,
        latency_slo_s: float | None = None,
    ) -> asyncio.Future[ResultT]:
        """Queue one record; returns a future for its result.

        Awaits while the queue is full (backpressure), unless `wait_for_room=False`.

        Args:
            record: The record to process.
            estimated_cost: Its cost against the batch budget; if omitted, `cost_estimator`, then
                `estimate_cost()`, then `default_cost` decide.
            priority: Higher goes first (FIFO within a level); a waiting record gains one level
                per `priority_aging_s` seconds. Batches already staged keep their records.
            deadline_s: Seconds from now after which the record must not be dispatched: it then
                fails with `RecordExpiredError` and never reaches the process function.
            wait_for_room: `False`: when the queue is full, raise `QueueFullError` at once instead of
                waiting (a server answers 429 with it).
            latency_slo_s: This record's own latency target (seconds from now to its result), on a
                batcher with one: its priority is kept within the tightest its records lately carried.

        Returns:
            A future resolving to this record's entry of the process function's results.

        Raises:
            BatcherNotRunningError: Before `start()` (a `RuntimeError`).
            BatcherClosedError: While stopping or after `stop()` (a `RuntimeError`).
            BatcherFailedError: After the batcher failed.
            CostBudgetExceededError: The record costs more than the budget and `oversized="reject"`.
            QueueFullError: The queue is full and `wait_for_room=False`.
            ValueError: `deadline_s` or `latency_slo_s` is not seconds > 0 (or the batcher has no
                target for `latency_slo_s` to tighten), `priority` is not an integer, or its prefix key is not text.
            Exception: Whatever the cost estimator or `prefix_key` raised, with a note naming the record.
        """
        # This runs once per record: local names, module-level names, and a short common path.
        dispatcher = self._lifecycle.accepting
        if dispatcher is None:
            raise self._lifecycle.not_accepting_error()
        loop = dispatcher.loop
        if getattr(loop, "_thread_id", None) != _get_ident() and loop is not _get_running_loop():
            raise RuntimeError(f"{self.name} runs on another event loop; submit from the loop that started it")
        if estimated_cost.__class__ is int and estimated_cost >= 0:  # type: ignore[operator]
            cost = estimated_cost  # the common explicit cost, without a call
        else:
            cost = self._costs.resolve(record, estimated_cost)
        if cost > self._reject_above:
            raise self._costs.over_budget(record, cost, self._settings.batch_budget)
        if priority.__class__ is not int:
            _check_priority(priority)
        if deadline_s is not None or latency_slo_s is not None:
            _check_seconds(self.name, self._settings, deadline_s, latency_slo_s)
        prefix = self._prefixes.resolve(record) if self._prefixes is not None else None
        backpressure = dispatcher.backpressure
        if dispatcher.pending.size >= backpressure.capacity or (backpressure.waiters and not wait_for_room):
            if not wait_for_room:
                raise backpressure.refusal(self.name, self._stats.records_per_s(_monotonic()))
            await backpressure.wait_for_space()
        now = _monotonic()
        future: asyncio.Future[ResultT] = loop.create_future()
        deadline = None if deadline_s is None else now + deadline_s
        seq = self._stats.record_submit(now)
        envelope = new_envelope(record, cost, future, now, seq, priority, latency_slo_s, prefix, deadline)
        if deadline is not None:
            dispatcher.deadlines.watch(envelope)
        plan = dispatcher.staging.plan(now, envelope)  # once per record: act only when there is something to do
        if plan is not None or backpressure.waiters:
            dispatcher.act(plan)
        return future

    def flush(self) -> None:
        """Dispatch everything submitted so far without waiting for `batch_timeout_s` or `min_batch_size`."""
        self._flush_through(self._stats.submitted)

    # -- what `map` and `run` build on ---------------------------------------------------------------

    @property
    def _startable(self) -> bool:
        return self._lifecycle.state in (BatcherState.NEW, BatcherState.STOPPED)

    @property
    def _submitted(self) -> int:
        return self._stats.submitted

    def _flush_through(self, seq: int) -> None:
        dispatcher = self._lifecycle.accepting
        if dispatcher is not None:
            dispatcher.flush(seq)

    def _abandon(self, futures: Collection[asyncio.Future[Any]]) -> None:
        self._settler.abandon(futures)
        dispatcher = self._lifecycle.dispatcher
        if dispatcher is not None:
            dispatcher.drop_dead()  # count them now, not when their batch would have gone


def _check_priority(priority: Any) -> None:
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ValueError(f"priority must be an int, got {priority!r}")


def _check_seconds(name: str, settings: BatcherSettings, deadline_s: Any, latency_slo_s: Any) -> None:
    """`submit`'s times: a positive number of seconds each, and a record's own target only where there is one."""
    for keyword, seconds in (("deadline_s", deadline_s), ("latency_slo_s", latency_slo_s)):
        if seconds is not None and (
            not isinstance(seconds, (int, float)) or not seconds > 0 or not math.isfinite(seconds)
        ):
            raise ValueError(f"{keyword} must be a positive number of seconds, got {seconds!r}")
    if latency_slo_s is not None and settings.latency_slo_s is None:
        raise ValueError(
            f"{name}: a record's latency_slo_s needs a batcher with a latency target, "
            "e.g. DynamicBatcher(..., latency_slo_s=60.0): the records' own targets then tighten it"
        )
