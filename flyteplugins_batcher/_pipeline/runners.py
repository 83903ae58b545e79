"""The runners: they take batches from the staging area and call the process function.

A runner is a worker thread for a plain `def` process function (model calls such as
`llm.generate` or a CUDA forward pass release the GIL, so producers keep loading meanwhile), or a
task on the event loop for an `async def` one. After each batch it takes the next one itself, so
the device never waits for the event loop; results travel back to the loop to be settled while
the next batch already runs. Up to `max_concurrent_batches` runners exist at a time; one retires
when nothing can go, and the event loop starts another when something can.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from flyteplugins_batcher._errors import (
    BatcherError,
    ProcessFnCancelledError,
    ResultCountError,
    UnrecoverableError,
)
from flyteplugins_batcher._measure.stats import BatchClock
from flyteplugins_batcher._pipeline.envelope import Envelope
from flyteplugins_batcher._pipeline.invoke import BlockingStepMonitor, is_async_callable
from flyteplugins_batcher._pipeline.openmp import release_openmp_pool
from flyteplugins_batcher._pipeline.staging import Batch, StagingArea

logger = logging.getLogger("flyteplugins_batcher")

Deliver = Callable[[list[Envelope], Any], None]
"""Receives part of a batch with its outcome: the process function's results, or one exception for all."""
Outcomes = list[tuple[list[Envelope], Any]]
"""Parts of a batch with their outcomes, as a worker thread holds them until it tells the event loop."""


@dataclass(frozen=True)
class RunnerHooks:
    """What the batcher does, on its event loop, as batches move through the runners.

    Attributes:
        on_dispatched: `(batch, skipped)`: a runner took `batch`; `skipped` records were left out
            (cancelled, or past their deadline).
        on_outcome: `(records, outcome)`: part of a batch has its outcome (the process function's
            results, or one exception for all); delivered as soon as it is known, even while the
            rest of a split batch still runs.
        on_done: `(batch)`: `batch` is out of the process function.
        on_retired: `(skipped)`: a runner found nothing it may take and stopped.
        on_fatal: `(error, batch)`: the process function raised something after which no batch can run.
    """

    on_dispatched: Callable[[Batch, list[Envelope]], None]
    on_outcome: Callable[[list[Envelope], Any], None]
    on_done: Callable[[Batch], None]
    on_retired: Callable[[list[Envelope]], None]
    on_fatal: Callable[[BaseException, Batch], None]


class _Fatal(BatcherError):
    """Carries an error that ends the batcher out of a runner."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(repr(error))
        self.error = error


class RunnerPool:
    """Runs batches through the process function, in up to `max_runners` runners.

    Args:
        process_fn: The user's process function.
        batcher_name: For thread names and warnings.
        staging: Where runners take their batches.
        busy: Times every call of the process function, and puts it on the timeline.
        hooks: The batcher's callbacks (called on its event loop).
        split: Bisect a batch whose call raised, to isolate the failing records.
        max_runners: Most runners at once (`max_concurrent_batches`).
    """

    def __init__(
        self,
        process_fn: Callable[[list[Any]], Any],
        *,
        batcher_name: str,
        staging: StagingArea,
        busy: BatchClock,
        hooks: RunnerHooks,
        split: bool,
        max_runners: int,
    ) -> None:
        self.fn = process_fn
        self.is_async = is_async_callable(process_fn)
        self._batcher_name = batcher_name
        self._blocking = BlockingStepMonitor(process_fn, batcher_name)
        self._staging = staging
        self._busy = busy
        self._hooks = hooks
        self._split = split
        self._max_runners = max_runners
        self._executor: ThreadPoolExecutor | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._context = contextvars.Context()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind to the batcher's event loop; runners see the context variables of this moment."""
        self._loop = loop
        self._context = contextvars.copy_context()

    def start_runners(self, count: int) -> None:
        """Start `count` runners (the staging area has already counted them).

        They begin on the event loop's next turn, so that records submitted together in this turn
        (a burst from `submit_batch`, `map`, or many tasks woken at once) go in one batch.
        """
        loop = self._loop
        assert loop is not None
        if self.is_async:
            for _ in range(count):
                task = self._context.run(loop.create_task, self._run_tasks(), name=f"{self._batcher_name}-runner")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        else:
            loop.call_soon(self._start_threads, count)

    def _start_threads(self, count: int) -> None:
        # On the loop's thread: a pool of OpenMP workers it kept from warming a model up would make
        # every pool sleep between parallel regions once the model runs in a worker thread.
        release_openmp_pool()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self._max_runners, thread_name_prefix=self._batcher_name)
        for _ in range(count):
            self._executor.submit(self._run_thread, self._context.copy())

    def cancel_runners(self) -> None:
        """Cancel the runners on the event loop (a thread's call cannot be interrupted; it finishes on its own)."""
        for task in list(self._tasks):
            task.cancel()

    def shutdown(self) -> None:
        """Release the worker threads; a batch still running in one finishes on its own."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    # -- runners -------------------------------------------------------------------------------

    def _run_thread(self, context: contextvars.Context) -> None:
        loop = self._loop
        assert loop is not None
        post = loop.call_soon_threadsafe
        hooks = self._hooks
        finished: Batch | None = None
        try:
            while True:
                batch, skipped = self._staging.next_batch(finished, time.monotonic())
                if batch is None:
                    post(hooks.on_retired, skipped)
                    return
                if finished is not None:
                    batch.after_s = finished.ended_at
                post(hooks.on_dispatched, batch, skipped)
                outcomes: Outcomes = []
                try:
                    self._drive_sync(batch, context, outcomes)
                except _Fatal as fatal:
                    post(self._report_outcomes, outcomes)
                    post(hooks.on_fatal, fatal.error, batch)
                    return
                post(self._report_done, batch, outcomes)
                finished = batch
        except RuntimeError:
            if not loop.is_closed():
                raise
            # The event loop is gone (its program ended while a batch ran): nobody is left to tell.

    async def _run_tasks(self) -> None:
        hooks = self._hooks
        finished: Batch | None = None
        while True:
            batch, skipped = self._staging.next_batch(finished, time.monotonic())
            if batch is None:
                hooks.on_retired(skipped)
                return
            if finished is not None:
                batch.after_s = finished.ended_at  # the time between is the batcher's own (settling, planning)
            hooks.on_dispatched(batch, skipped)
            try:
                await self._drive_async(batch, hooks.on_outcome)
            except _Fatal as fatal:
                hooks.on_fatal(fatal.error, batch)
                if isinstance(fatal.error, (KeyboardInterrupt, SystemExit)):
                    raise fatal.error from None
                return
            hooks.on_done(batch)
            finished = batch

    # -- calling the process function ----------------------------------------------------------

    def _report_outcomes(self, outcomes: Outcomes) -> None:
        for part, outcome in outcomes:
            self._hooks.on_outcome(part, outcome)

    def _report_done(self, batch: Batch, outcomes: Outcomes) -> None:
        self._report_outcomes(outcomes)
        self._hooks.on_done(batch)

    def _drive_sync(self, batch: Batch, context: contextvars.Context, outcomes: Outcomes) -> None:
        """Run `batch` in this worker thread; the outcomes of its last call are left in `outcomes` for the caller.

        Each wake-up of the event loop from a thread costs a write to its self-pipe and a handoff of
        the GIL: a batch's last outcomes travel with its end (`_report_done`), in one wake-up, while
        the parts of a split batch that end before its last call are told at once.
        """
        post = self._loop.call_soon_threadsafe  # type: ignore[union-attr]
        calls = _Calls(self._attempts(batch.envelopes, lambda part, outcome: outcomes.append((part, outcome))))
        while (part := calls.part) is not None:
            started, results = self._busy.enter(), None
            try:
                results = context.run(self.fn, [envelope.record for envelope in part])
                if inspect.isawaitable(results):  # a plain def that returns a coroutine (e.g. a lambda)
                    assert self._loop is not None
                    results = asyncio.run_coroutine_threadsafe(_awaited(results), self._loop).result()
                reply: tuple[Any, BaseException | None] = (results, None)
            except Exception as error:
                reply = (None, error)
            except BaseException as error:  # KeyboardInterrupt and friends end the batcher
                raise _Fatal(error) from error
            finally:
                self._time_call(batch, part, started, results)
            calls.answer(reply)
            if calls.part is not None and outcomes:  # more calls to come: what is known now goes now
                post(self._report_outcomes, outcomes[:])
                outcomes.clear()

    async def _drive_async(self, batch: Batch, deliver: Deliver) -> None:
        calls = _Calls(self._attempts(batch.envelopes, deliver))
        while (part := calls.part) is not None:
            started, results = self._busy.enter(), None
            try:
                results = await self._blocking.watch(self.fn([envelope.record for envelope in part]))
                reply: tuple[Any, BaseException | None] = (results, None)
            except asyncio.CancelledError:
                if _cancel_requested():
                    raise  # the batcher is aborting: the batch's records are cancelled on the loop
                reply = (
                    None,
                    ProcessFnCancelledError(f"{self._batcher_name}: the process function raised CancelledError"),
                )
            except Exception as error:
                reply = (None, error)
            except BaseException as error:
                raise _Fatal(error) from error
            finally:
                self._time_call(batch, part, started, results)
            calls.answer(reply)

    def _time_call(self, batch: Batch, part: list[Envelope], started: float, results: Any) -> None:
        """`part` of `batch` (all of it, unless a failing batch was split) left the process function with `results`."""
        cost = batch.cost if part is batch.envelopes else sum(envelope.cost for envelope in part)
        seconds = self._busy.exit_call(started, len(part), cost, results)
        batch.device_s += seconds  # what a latency target learns from, with the time between batches
        if not batch.calls:
            batch.started_at = started
        batch.ended_at = started + seconds
        batch.calls += 1

    def _attempts(
        self, envelopes: list[Envelope], deliver: Deliver
    ) -> Generator[list[Envelope], tuple[Any, Any], None]:
        """The calls a batch needs: the whole batch, then (with `on_error="split"`) the halves of a failing part.

        Yields each part to run and is sent `(results, None)` or `(None, exception)`; hands every
        part whose outcome is final to `deliver`. Raises `UnrecoverableError` when a call raised one.
        """
        todo = [envelopes]
        while todo:
            part = todo.pop()
            results, error = yield part
            if error is None:
                try:
                    _check_result_count(results, len(part))
                except ResultCountError as mismatch:
                    error = mismatch
                else:
                    deliver(part, results)
                    continue
            if isinstance(error, UnrecoverableError):
                raise error
            if self._split and len(part) > 1 and not isinstance(error, ResultCountError):
                middle = len(part) // 2
                todo.extend((part[middle:], part[:middle]))  # the first half runs first
                continue
            deliver(part, error)


class _Calls:
    """A batch's calls in turn, shared by the sync and async drivers: `part` runs next (None once done)."""

    __slots__ = ("_attempts", "part")

    def __init__(self, attempts: Generator[list[Envelope], tuple[Any, Any], None]) -> None:
        self._attempts = attempts
        self.part: list[Envelope] | None = next(attempts)

    def answer(self, reply: tuple[Any, Any]) -> None:
        """Hand the call's outcome `(results, None)` or `(None, error)` to the plan, which picks the next part."""
        try:
            self.part = self._attempts.send(reply)
        except StopIteration:
            self.part = None
        except UnrecoverableError as error:
            raise _Fatal(error) from error


def _check_result_count(results: Any, expected: int) -> None:
    try:
        count = len(results)
    except TypeError:
        raise ResultCountError(
            f"process_fn must return a list with one result per record, got {type(results).__name__}"
        ) from None
    if count != expected:
        raise ResultCountError(f"process_fn returned {count} results for batch of {expected} records")


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _cancel_requested() -> bool:
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling and cancelling())
