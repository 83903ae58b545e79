"""The dispatcher: one per start of a batcher, from `start` to `stop`, on its event loop.

The staging area (`_staging`) decides what may go; the dispatcher acts on its plans: it starts
runners (`_runners`), ends the records that were dropped on the way, arms the batch timer, lets
waiting producers in (`_backpressure`) and drops records whose deadline passed (`_deadlines`). The
runners report back through hooks. Once it is over (stopped or failed), it starts nothing
more, and only ends the records that the late reports of a thread still finishing concern.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

from flyteplugins_batcher._errors import BatcherFailedError
from flyteplugins_batcher._measure.stats import StatsRecorder
from flyteplugins_batcher._pipeline.backpressure import Backpressure
from flyteplugins_batcher._pipeline.deadlines import DeadlineWatch
from flyteplugins_batcher._pipeline.envelope import CANCELLED, COMPLETED, FAILED, Envelope, tell_when_cancelled
from flyteplugins_batcher._pipeline.invoke import is_async_callable
from flyteplugins_batcher._pipeline.runners import RunnerHooks, RunnerPool
from flyteplugins_batcher._pipeline.settle import Settler
from flyteplugins_batcher._pipeline.slo_control import SloController, SloStagingArea
from flyteplugins_batcher._pipeline.staging import Batch, Plan, StagingArea
from flyteplugins_batcher._settings import BatcherSettings
from flyteplugins_batcher._types import ProcessFn

_monotonic = time.monotonic


class Dispatcher:
    """One run of a batcher: its staging area, runners, timers and waiting producers.

    Args:
        loop: The event loop it lives on.
        process_fn: The user's process function.
        settings: The batcher's settings.
        batcher_name: For thread names, warnings and error notes.
        stats: The batcher's statistics (they span its runs).
        settler: Ends the records.
        on_failure: Told when the process function raised something no batch survives; returns
            the batcher's failure (`_lifecycle.Lifecycle.fail`).
        slo: With a latency target, its controller (it spans the batcher's runs, as the statistics do).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        process_fn: ProcessFn[Any, Any],
        settings: BatcherSettings,
        *,
        batcher_name: str,
        stats: StatsRecorder,
        settler: Settler,
        on_failure: Callable[[BaseException], BatcherFailedError],
        slo: SloController | None = None,
    ) -> None:
        self.loop = loop
        self.active = True  # may start runners and arm timers: false once it stopped or failed
        threads = not is_async_callable(process_fn)
        self.staging = (
            StagingArea(settings, threads=threads) if slo is None else SloStagingArea(settings, slo, threads=threads)
        )
        self._slo = slo
        self.pending = self.staging.pending
        self.backpressure = Backpressure(loop, self.pending, settings.queue_capacity)
        self.deadlines = DeadlineWatch(loop, self._expire)
        self.runners = RunnerPool(
            process_fn,
            batcher_name=batcher_name,
            staging=self.staging,
            busy=stats.busy,
            hooks=RunnerHooks(self._on_dispatched, self._on_outcome, self._on_done, self._on_retired, self._on_fatal),
            split=settings.on_error == "split",
            max_runners=settings.max_concurrent_batches,
        )
        self.runners.attach(loop)
        self._budget = settings.batch_budget
        self._stats = stats
        self._settler = settler
        self._on_failure = on_failure
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._drained: asyncio.Future[None] | None = None

    # -- acting on changes -------------------------------------------------------------------------

    def pump(self) -> None:
        """Let the staging area act on a change (a completion, a timeout, a flush)."""
        self.act(self.staging.plan(_monotonic()))

    def act(self, plan: Plan | None) -> None:
        """Start runners, end dropped records, arm the timer, let waiting producers in."""
        if plan is not None:
            if plan.runners_to_start:
                self.runners.start_runners(plan.runners_to_start)
            if plan.skipped:
                self._settler.settle_dropped(plan.skipped)
            if plan.wake_at is not None and plan.wake_at < self._timer_at:
                self._arm_timer(plan.wake_at)
        if self.backpressure.waiters:
            self.backpressure.wake()

    def flush(self, upto_seq: int) -> None:
        """Let every record up to submission `upto_seq` go without waiting for the timeout."""
        self.staging.flush(upto_seq)
        self.pump()

    def drop_dead(self) -> None:
        """End the waiting records that were cancelled or passed their deadline now, not when their batch would go."""
        if self.active:
            self._settler.settle_dropped(self.staging.remove_dead(_monotonic()))
            self.pump()

    def _arm_timer(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self.loop.call_later(max(when - _monotonic(), 0.0), self._on_timer)

    def _on_timer(self) -> None:
        if self._slo is not None:
            self._slo.own_time.timer_fired(_monotonic() - self._timer_at)
        self._timer, self._timer_at = None, math.inf
        if self.active:
            self.pump()

    def _expire(self, envelope: Envelope) -> None:
        if self.staging.drop_expired(envelope):
            self._settler.settle_dropped([envelope])
            self.act(None)  # its place in the queue is free
            self._check_drained()

    # -- the runners' reports (on the event loop) ----------------------------------------------------

    def _on_dispatched(self, batch: Batch, skipped: list[Envelope]) -> None:
        if skipped:
            self._settler.settle_dropped(skipped)
        envelopes = batch.envelopes
        tell_when_cancelled(envelopes)  # a caller who leaves from now on stops the work, where the record can
        self._stats.record_dispatch(
            _monotonic(),
            [envelope.submitted_at for envelope in envelopes],
            batch.cost,
            batch.reason,
            oversized=len(envelopes) == 1 and batch.cost > self._budget,
        )
        if self.active:
            self.pump()  # a staged batch's place is free: stage the next full batch, let waiting producers in

    def _on_outcome(self, records: list[Envelope], outcome: Any) -> None:
        self._settler.settle(records, COMPLETED, outcome)

    def _on_done(self, batch: Batch) -> None:
        if self._slo is not None:
            self._slo.batch_done(batch, self.loop)
        self.deadlines.trim(self._stats.in_system)
        if self.active:
            self.pump()
        self._check_drained()

    def _on_retired(self, skipped: list[Envelope]) -> None:
        if skipped:
            self._settler.settle_dropped(skipped)
        if self.active and self.staging.has_waiting():
            self.pump()  # records wait that may go later (a timeout): arm the timer
        self._check_drained()

    def _on_fatal(self, error: BaseException, batch: Batch) -> None:
        """No batch can run any more: fail everything unresolved (the lifecycle fails later submits).

        A dispatcher that is over already (a thread finished after `stop` gave up on it) fails no batcher.
        """
        self.staging.finish(batch)
        failure = self._on_failure(error) if self.active else None
        self.active = False
        record_error = failure if failure is not None and not isinstance(error, Exception) else error
        self._settler.settle(batch.envelopes, COMPLETED, record_error)
        self._settler.settle(self.staging.remove_waiting(with_running=True), FAILED, record_error)
        self.runners.cancel_runners()
        self._check_drained()

    # -- stopping --------------------------------------------------------------------------------------

    async def drain(self, timeout: float | None) -> bool:
        """Let every waiting record go now, and wait until none is left; whether that happened within `timeout`."""
        self.staging.start_draining()
        self.pump()
        if not self._stats.in_system:
            return True
        drained = self._drained = self.loop.create_future()
        done, _ = await asyncio.wait({drained}, timeout=timeout)
        return bool(done)

    def cancel_waiting(self) -> None:
        """Cancel the records no runner took yet (`stop(cancel_pending=True)`)."""
        self._settler.settle(self.staging.remove_waiting(), CANCELLED)

    def abort(self) -> None:
        """Cancel every record left, running ones included, and the runners on the event loop."""
        self.active = False
        self._settler.settle(self.staging.remove_waiting(with_running=True), CANCELLED)
        self.runners.cancel_runners()

    def close(self) -> None:
        """The dispatcher is over: stop the timers and release the worker threads."""
        self.active = False
        self.deadlines.close()
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf
        self.runners.shutdown()

    @property
    def records_left(self) -> int:
        """Records accepted and not ended yet."""
        return self._stats.in_system

    def _check_drained(self) -> None:
        drained = self._drained
        if drained is not None and not drained.done() and not self._stats.in_system:
            drained.set_result(None)
