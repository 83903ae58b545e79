"""A batcher's life: start, stop (drain, then cancel what is left), failure and release.

Each `start` makes a dispatcher (`_dispatch.Dispatcher`) on the caller's event loop; `stop` drains it
and ends it. A watchdog task notices when that loop shuts down under a running batcher (an
`asyncio.run` that returns) and lets go of what is left. When the process function raises
something no batch survives, the batcher fails: every later `submit` raises its failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Callable
from typing import Protocol

from flyteplugins_batcher._errors import (
    BatcherClosedError,
    BatcherFailedError,
    BatcherNotRunningError,
    UnrecoverableError,
)
from flyteplugins_batcher._pipeline.dispatch import Dispatcher

logger = logging.getLogger("flyteplugins_batcher")


class BatcherState(enum.Enum):
    """Where a batcher is in its life."""

    NEW = "new"  # built, never started
    RUNNING = "running"  # taking records
    DRAINING = "draining"  # `stop()`: no new records; the queued ones still run
    ABORTING = "aborting"  # `stop()` ran out of time: what is left is being cancelled
    STOPPED = "stopped"  # may start again
    FAILED = "failed"  # the process function raised something no batch survives; see `failure`


ACTIVE = (BatcherState.RUNNING, BatcherState.DRAINING, BatcherState.ABORTING)
"""States in which a dispatcher exists and may still hold records."""


class DispatcherFactory(Protocol):
    """Builds the dispatcher of a batcher that starts on `loop`; it reports a fatal error to `on_failure`."""

    def __call__(
        self, loop: asyncio.AbstractEventLoop, *, on_failure: Callable[[BaseException], BatcherFailedError]
    ) -> Dispatcher: ...


class Lifecycle:
    """The state of one batcher and the moves between its states.

    Args:
        batcher_name: For logs and error messages.
        new_dispatcher: Builds a dispatcher on the event loop that `start` runs on.
    """

    def __init__(self, batcher_name: str, new_dispatcher: DispatcherFactory) -> None:
        self.state = BatcherState.NEW  # changed only by `_enter`
        self.failure: BatcherFailedError | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.dispatcher: Dispatcher | None = None  # the current one, from `start` on
        self.accepting: Dispatcher | None = None  # the dispatcher while it takes records (`RUNNING`): `submit` reads it
        self._batcher_name = batcher_name
        self._new_dispatcher = new_dispatcher
        self._stopped: asyncio.Future[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Make a dispatcher on the running event loop.

        Raises:
            RuntimeError: The batcher is already running.
        """
        if self.state in ACTIVE:
            raise RuntimeError(f"{self._batcher_name} is already running")
        loop = asyncio.get_running_loop()
        self.dispatcher = self._new_dispatcher(loop, on_failure=self.fail)
        self.loop = loop
        self.failure = None
        self._enter(BatcherState.RUNNING)
        self._stopped = loop.create_future()
        self._watchdog = loop.create_task(self._watch_loop(self._stopped), name=f"{self._batcher_name}-watchdog")
        logger.debug("%s started", self._batcher_name)

    async def stop(self, timeout: float | None, cancel_pending: bool) -> bool:
        """Stop taking records, finish (or cancel) the ones left, and end the dispatcher; whether one was running."""
        if self.state in (BatcherState.NEW, BatcherState.STOPPED):
            return False
        dispatcher = self.dispatcher
        assert dispatcher is not None
        try:
            if self.state is BatcherState.RUNNING:
                self._enter(BatcherState.DRAINING)
                dispatcher.backpressure.close(self._closed_error("is stopping"))
            if self.state is BatcherState.DRAINING:
                if cancel_pending:
                    dispatcher.cancel_waiting()
                if not await dispatcher.drain(timeout):
                    logger.warning(
                        "%s: stop timed out after %ss; cancelling the remaining records", self._batcher_name, timeout
                    )
                    self._abort()
        except asyncio.CancelledError:
            self._abort()
            raise
        finally:
            self._finish()
        return True

    def release(self) -> None:
        """Let go of a dispatcher whose event loop has stopped or closed: cancel what is left, free its threads.

        Raises:
            RuntimeError: The batcher's event loop is still running.
        """
        if self.state in (BatcherState.NEW, BatcherState.STOPPED):
            return
        loop = self.loop
        if loop is not None and loop.is_running():
            raise RuntimeError(f"{self._batcher_name}: its event loop still runs; call stop() on that loop instead")
        if self.dispatcher is not None:
            with contextlib.suppress(RuntimeError):  # a closed loop cannot run the futures' callbacks
                self.dispatcher.abort()
        if self._watchdog is not None:
            self._watchdog.cancel()  # it finishes if that loop ever runs again
        self._finish()

    def fail(self, cause: BaseException) -> BatcherFailedError:
        """The process function raised something no batch survives: the batcher has failed (once).

        Returns the failure that every later `submit` raises; its `__cause__` is `cause`.
        """
        if self.state is BatcherState.FAILED and self.failure is not None:
            return self.failure
        failure = BatcherFailedError(f"{self._batcher_name} failed: {cause!r}")
        failure.__cause__ = cause
        self.failure = failure
        self._enter(BatcherState.FAILED)
        if isinstance(cause, UnrecoverableError):
            # Raised on purpose (the engine died, say): its message says what happened, and whoever
            # awaits a record gets it with its traceback; a replacement batcher may well recover.
            logger.warning("%s failed: %s; failing all pending records", self._batcher_name, cause)
        else:
            logger.error("%s failed; failing all pending records", self._batcher_name, exc_info=cause)
        if self.dispatcher is not None:
            self.dispatcher.backpressure.close(failure)
        return failure

    def not_accepting_error(self) -> BaseException:
        """What `submit` raises outside the running state."""
        if self.state is BatcherState.FAILED and self.failure is not None:
            return self.failure
        if self.state is BatcherState.NEW:
            return BatcherNotRunningError(f"{self._batcher_name} is not running. Call start() or use 'async with'.")
        return self._closed_error("is stopped")

    # -- internals ---------------------------------------------------------------------------------

    def _enter(self, state: BatcherState) -> None:
        self.state = state
        self.accepting = self.dispatcher if state is BatcherState.RUNNING else None

    def _closed_error(self, why: str) -> BatcherClosedError:
        return BatcherClosedError(f"{self._batcher_name} {why} and takes no new records")

    def _abort(self) -> None:
        """Cancel everything left: waiting records and batches in flight."""
        if self.state not in ACTIVE:
            return
        self._enter(BatcherState.ABORTING)
        assert self.dispatcher is not None
        self.dispatcher.backpressure.close(self._closed_error("is stopping"))
        self.dispatcher.abort()

    def _finish(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.close()
        stopped = self._stopped
        if stopped is not None and not stopped.done():
            with contextlib.suppress(RuntimeError):
                stopped.set_result(None)
        if self.state is not BatcherState.FAILED:
            self._enter(BatcherState.STOPPED)

    async def _watch_loop(self, stopped: asyncio.Future[None]) -> None:
        """Waits for `stop`; if the event loop shuts down first (`asyncio.run` returning), lets go."""
        try:
            await stopped
        except asyncio.CancelledError:
            if self.state in ACTIVE:
                left = self.dispatcher.records_left if self.dispatcher is not None else 0
                self._abort()
                self._finish()
                logger.warning(
                    "%s: the event loop shut down while it was running; cancelled %d records", self._batcher_name, left
                )
            raise
