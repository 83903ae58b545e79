"""The simulated GPU in real time: a thread that steps the scheduler and sleeps each step's duration.

The thread plays the GPU. Between steps it takes the requests that arrived (as vLLM's engine
core does), runs one `ContinuousBatchScheduler.step()`, sleeps until the step's end on a clock
that runs `time_scale` times faster than the wall clock, then hands the finished requests their
completions on their callers' event loops. Sleeping releases the GIL, so a simulated GPU costs little
CPU: many replicas' GPUs fit on a few cores.

Step ends are deadlines on that clock, not sleeps added one after another: the thread's own work
and the sleep's overshoot are absorbed by the next sleep, so wall time stays `virtual / time_scale`
for as long as the thread keeps up; how far it ever fell behind is `lag_s`.

A request may be streamed (after each step, its listener hears how many tokens it has, as vLLM
hands out each step's new tokens) and cancelled (its cancellation reaches the thread with the
arrivals, and the thread drops the sequence from the scheduler before the next step, as vLLM
aborts a request).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from flyteplugins_batcher.engines._engine_errors import EngineDeadError, EngineNotLoadedError, RequestCancelledError
from flyteplugins_batcher.engines._live import CancellationToken
from flyteplugins_batcher.engines.simulated._continuous_batching import (
    ContinuousBatchScheduler,
    SequenceJob,
    StepResult,
)
from flyteplugins_batcher.engines.simulated._gpu import SimulatedGpu

_STOP = object()
_JOIN_TIMEOUT_S = 10.0

TokensListener = Callable[[int, int], None]
"""Receives `(start, end)`: a request's tokens `start` to `end` (exclusive) were made; called on the GPU thread."""

logger = logging.getLogger("flyteplugins_batcher")


@dataclass(frozen=True)
class Served:
    """What a finished request's future gets: its answer, and its prompt tokens found in the prefix cache."""

    outcome: Any
    cached_tokens: int = 0


@dataclass(frozen=True, eq=False)
class _Ticket:
    """A submitted request's answer and where to deliver it."""

    outcome: Any
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop
    on_tokens: TokensListener | None = None


@dataclass(frozen=True, eq=False)
class _Cancel:
    """Its caller cancelled `job`: drop it before the next step."""

    job: SequenceJob


class SimulatedGpuThread:
    """A daemon thread that runs a `ContinuousBatchScheduler` in (scaled) real time.

    Args:
        gpu: Capacity and step timing.
        time_scale: How much faster than the wall clock the GPU runs (10: a 7 ms step sleeps 0.7 ms).
        on_step: Called on the GPU thread after each step (for statistics).
        name: The thread's name.

    Example:
        ```python
        gpu = SimulatedGpuThread(SimulatedGpu(), time_scale=10, on_step=print)
        served = await gpu.submit(SequenceJob(100, 20), outcome="done")
        assert served.outcome == "done"
        gpu.close()
        ```
    """

    def __init__(
        self, gpu: SimulatedGpu, time_scale: float, on_step: Callable[[StepResult], None], name: str = "simulated-gpu"
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.time_scale = time_scale
        self.lag_s = 0.0
        self.cpu_s = 0.0
        """CPU seconds the GPU thread has used (updated every step)."""
        self._scheduler = ContinuousBatchScheduler(gpu)
        self.prefix_cache_stats = self._scheduler.cache.stats
        """What the prefix cache found and evicted (a snapshot, updated every step)."""
        self._on_step = on_step
        self._arrivals: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._failure: EngineDeadError | None = None
        self._streams: dict[SequenceJob, list[int]] = {}  # streamed jobs: [tokens told, step of the first token]
        self._submit_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run_thread, daemon=True, name=name)
        self._thread.start()

    def submit(
        self,
        job: SequenceJob,
        outcome: Any,
        *,
        on_tokens: TokensListener | None = None,
        cancellation: CancellationToken | None = None,
    ) -> asyncio.Future[Any]:
        """Queue `job`; the returned future (on the calling loop) gets `Served(outcome, ...)` at its last token.

        Args:
            job: The request.
            outcome: Its answer.
            on_tokens: Told after each step that made tokens for it.
            cancellation: Once cancelled, the job leaves the scheduler before the next step and its
                future fails with `RequestCancelledError` (carrying the tokens it got).

        Raises:
            ValueError: The job could never run (see `ContinuousBatchScheduler.check`).
            EngineNotLoadedError: The GPU thread was closed.
            EngineDeadError: The GPU thread failed.
        """
        self._scheduler.check(job)
        loop = asyncio.get_running_loop()
        ticket = _Ticket(outcome, loop.create_future(), loop, on_tokens)
        queued = replace(job, tag=ticket)
        with self._submit_lock:
            if self._failure is not None:
                raise self._failure
            if self._closed:
                raise EngineNotLoadedError("simulated: the engine is closed")
            self._arrivals.put(queued)
        if cancellation is not None:  # after the job: the thread takes arrivals in order
            cancellation.add_callback(lambda: self._arrivals.put(_Cancel(queued)))
        return ticket.future

    def close(self) -> None:
        """Stop the thread; requests not finished fail with `EngineNotLoadedError`. Idempotent."""
        with self._submit_lock:
            if self._closed:
                return
            self._closed = True
            self._arrivals.put(_STOP)
        self._thread.join(_JOIN_TIMEOUT_S)
        if self._failure is None:
            closed = EngineNotLoadedError("simulated: the engine was closed while the request was running")
            self._fail_unfinished(closed)

    @property
    def is_alive(self) -> bool:
        """Whether the GPU thread runs (not closed, not failed)."""
        return self._thread.is_alive() and self._failure is None

    def _fail_unfinished(self, error: Exception) -> None:
        unfinished = [job.tag for job in self._scheduler.unfinished()]
        while not self._arrivals.empty():
            item = self._arrivals.get_nowait()
            if isinstance(item, SequenceJob):
                unfinished.append(item.tag)
        _deliver([(ticket, error) for ticket in unfinished])

    def _run_thread(self) -> None:
        try:
            self._serve()
        except BaseException as error:  # a bug here must fail the requests, not leave them waiting forever
            with self._submit_lock:
                self._failure = EngineDeadError(f"simulated: the GPU thread failed: {error!r}")
                self._failure.__cause__ = error
            self._fail_unfinished(self._failure)
            raise

    def _serve(self) -> None:
        scheduler, deadline = self._scheduler, 0.0
        while True:
            if scheduler.idle:
                if not self._take(self._arrivals.get()):
                    return
                deadline = time.perf_counter()  # the GPU was idle: its clock restarts now
            if not self._take_arrived():
                return
            if scheduler.idle:  # only cancellations arrived
                continue
            result = scheduler.step()
            deadline += result.step_s / self.time_scale
            delay = deadline - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            else:
                self.lag_s = max(self.lag_s, -delay)
            self.prefix_cache_stats = scheduler.cache.stats
            self._on_step(result)
            if self._streams:
                self._tell_streams(result)
            _deliver([(job.tag, Served(job.tag.outcome, result.cached_tokens[job])) for job in result.finished])
            self.cpu_s = time.thread_time()

    def _take_arrived(self) -> bool:
        """Queue everything that arrived; False once told to stop."""
        while True:
            try:
                item = self._arrivals.get_nowait()
            except queue.Empty:
                return True
            if not self._take(item):
                return False

    def _take(self, item: Any) -> bool:
        if item is _STOP:
            return False
        if isinstance(item, _Cancel):
            self._drop(item.job)
            return True
        self._scheduler.submit(item)
        if item.tag.on_tokens is not None:
            self._streams[item] = [0, 0]
        return True

    def _drop(self, job: SequenceJob) -> None:
        """Take a cancelled job out of the scheduler and fail its future (nothing, if it has finished)."""
        made = self._scheduler.cancel(job)
        if made is None:
            return
        self._streams.pop(job, None)
        stopped = RequestCancelledError("simulated: the request was cancelled", completion_tokens=made)
        _deliver([(job.tag, stopped)])

    def _tell_streams(self, result: StepResult) -> None:
        """Tell each streamed job's listener of the tokens this step made for it."""
        for job in result.started:
            if job in self._streams:
                self._streams[job][1] = result.index
        for job, (told, first_step) in list(self._streams.items()):
            if not first_step:
                continue
            made = min(result.index - first_step + 1, job.output_tokens)
            if made > told:
                self._tell(job, told, made)
            if made == job.output_tokens:
                del self._streams[job]

    def _tell(self, job: SequenceJob, told: int, made: int) -> None:
        try:
            job.tag.on_tokens(told, made)
        except Exception:  # a listener's bug must not stop the GPU: its request still gets its answer
            logger.exception("simulated: a token listener raised; it is no longer told")
            del self._streams[job]
            return
        self._streams[job][0] = made


def _deliver(answers: list[tuple[_Ticket, Any]]) -> None:
    """Settle futures on their own loops, one wake-up per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Ticket, Any]]] = {}
    for ticket, value in answers:
        by_loop.setdefault(ticket.loop, []).append((ticket, value))
    for loop, settled in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody awaits these any more
            loop.call_soon_threadsafe(_settle, settled)


def _settle(answers: list[tuple[_Ticket, Any]]) -> None:
    for ticket, value in answers:
        if ticket.future.done():  # cancelled by its caller
            continue
        if isinstance(value, BaseException):
            ticket.future.set_exception(value)
        else:
            ticket.future.set_result(value)
