"""A private event loop on its own thread, for an async engine that must outlive the callers' loops.

vLLM's `AsyncLLM` binds its sockets, queues and output task to the event loop it starts on. Run on
the callers' loop, it would die with that loop (Flyte's local runner, tests and `asyncio.run` each
bring their own) and its output processing would compete with the producers for that loop. Here
it lives on a loop of its own, and callers on any loop reach it through thread-safe futures.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class EngineLoop:
    """An event loop running in a daemon thread.

    Args:
        name: The thread's name.

    Example:
        ```python
        loop = EngineLoop("my-engine")
        engine = loop.call(make_async_engine())  # built on the private loop
        result = await loop.wrap(engine.generate(prompt))  # awaited from any caller loop
        loop.close()
        ```
    """

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name=name)
        self._thread.start()

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coroutine` on the private loop and wait for it (from a thread that is not that loop)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `coroutine` on the private loop."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    async def wrap(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Await `coroutine` (run on the private loop) from the caller's loop; cancelling this cancels it."""
        return await asyncio.wrap_future(self.submit(coroutine))

    def close(self, timeout: float = 30.0) -> None:
        """Stop the loop and its thread (pending work is cancelled)."""
        if self._loop.is_closed():
            return

        def stop() -> None:
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.stop()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()
