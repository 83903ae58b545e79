"""Telling async process functions from plain ones, and catching async ones that block the event loop.

An `async def` is awaited on the loop, step by step under a stopwatch: a step that holds the loop
for long means the function calls blocking code directly, and we say so once, naming the fix.
"""

from __future__ import annotations

import inspect
import logging
import time
import types
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any

logger = logging.getLogger("flyteplugins_batcher")

BLOCKING_WARNING_S = 0.1
"""An `async def` process function that holds the event loop this long in one step gets a warning."""


class BlockingProcessFnWarning(RuntimeWarning):
    """An `async def` process function blocked the event loop (it calls blocking code directly)."""


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """Whether calling `fn` returns a coroutine: `async def` functions, methods, partials and callables."""
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - objects with an async __call__ count too
    return call is not None and inspect.iscoroutinefunction(call)


class BlockingStepMonitor:
    """Watches an `async def` process function for steps that hold the event loop, and warns once.

    Args:
        fn: The process function (named in the warning).
        batcher_name: The batcher's name.
    """

    def __init__(self, fn: Callable[..., Any], batcher_name: str) -> None:
        self._fn = fn
        self._batcher_name = batcher_name
        self._warned = False

    def watch(self, awaitable: Awaitable[Any]) -> Awaitable[Any]:
        """`awaitable`, timed step by step while it is awaited."""
        return _StopwatchAwaitable(awaitable, self._on_blocking_step)

    def _on_blocking_step(self, seconds: float) -> None:
        if self._warned:
            return
        self._warned = True
        name = getattr(self._fn, "__qualname__", repr(self._fn))
        message = (
            f"{self._batcher_name}: the async process function {name!r} blocked the event loop for "
            f"{seconds:.2f}s in one step, so no producer could load or submit data meanwhile. Make it a plain "
            "`def` (the batcher runs plain functions in a worker thread) or wrap the blocking call in "
            "`await asyncio.to_thread(...)`."
        )
        logger.warning(message)
        warnings.warn(message, BlockingProcessFnWarning, stacklevel=2)


class _StopwatchAwaitable:
    """Awaits a coroutine while timing each synchronous step it takes on the event loop."""

    __slots__ = ("_coroutine", "_on_blocking_step")

    def __init__(self, coroutine: Awaitable[Any], on_blocking_step: Callable[[float], None]) -> None:
        self._coroutine = coroutine
        self._on_blocking_step = on_blocking_step

    def __await__(self) -> Generator[Any, Any, Any]:
        coroutine = self._coroutine
        if not isinstance(coroutine, (types.CoroutineType, Coroutine)):
            return (yield from _await_plain(coroutine))
        return (yield from _stepped(coroutine, self._on_blocking_step))


def _await_plain(awaitable: Awaitable[Any]) -> Generator[Any, Any, Any]:
    return (yield from awaitable.__await__())


def _stepped(
    coroutine: Coroutine[Any, Any, Any], on_blocking_step: Callable[[float], None]
) -> Generator[Any, Any, Any]:
    # Drives the coroutine by hand (as asyncio.Task does) so each step can be timed.
    send_value: Any = None
    error: BaseException | None = None
    while True:
        started = time.perf_counter()
        try:
            yielded = coroutine.send(send_value) if error is None else coroutine.throw(error)
        except StopIteration as stop:
            _check(started, on_blocking_step)
            return stop.value
        _check(started, on_blocking_step)
        try:
            send_value, error = (yield yielded), None
        except BaseException as thrown:  # cancellation and friends go into the coroutine, as a Task would
            send_value, error = None, thrown


def _check(started: float, on_blocking_step: Callable[[float], None]) -> None:
    elapsed = time.perf_counter() - started
    if elapsed >= BLOCKING_WARNING_S:
        on_blocking_step(elapsed)
