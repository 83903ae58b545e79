"""One long-lived thread for all of an engine's torch work.

Why not simply run the model in whichever thread calls `generate`: torch's CPU kernels use OpenMP,
and every OS thread that runs a parallel region gets its own pool of OpenMP workers. Once the
process holds more OpenMP threads than cores (say the main thread loaded the model and the
batcher's worker thread generates), GNU OpenMP stops spin-waiting between parallel regions and
puts its workers to sleep instead; each of the thousands of small ops per decoding step then pays
a wake-up. Measured with SmolLM2 on 2 cores: about 115,000 context switches and 25-30 % longer
batches than when the same thread loads and generates. Funnelling loading and generation through
one thread keeps a single OpenMP pool, whatever thread the caller is on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class ModelThread:
    """Runs callables one at a time on a dedicated thread, started on first use.

    Calls from several threads queue up, so the model is never used concurrently. A call made
    from the model thread itself runs inline (no deadlock). A batcher with one worker thread needs
    none (it gives its event-loop thread's OpenMP pool up, `release_openmp_pool`); use one for a
    torch model of your own on CPU that several threads call (`max_concurrent_batches > 1`, threads
    of your own), and the process keeps a single OpenMP pool (see the module notes for what two cost).

    Args:
        name: Thread name, shown in debuggers and thread dumps.

    Example:
        ```python
        thread = ModelThread("my-model")
        model = thread.run(load_model)  # loaded on the model thread

        def generate(batch: list[str]) -> list[str]:  # the batcher's worker thread calls it
            return thread.run(model.generate, batch)  # and the model runs on the model thread

        async with TokenBatcher(generate, max_batch_size=16) as batcher:
            answers = await batcher.run(prompts)
        ```
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._executor: ThreadPoolExecutor | None = None
        self._thread_id: int | None = None
        self._lock = threading.Lock()

    def run(self, fn: Callable[..., T], *args: object) -> T:
        """Call `fn(*args)` on the model thread and return its result (or raise its exception)."""
        if threading.get_ident() == self._thread_id:
            return fn(*args)
        return self._ensure_executor().submit(fn, *args).result()

    def shutdown(self) -> None:
        """Let queued calls finish, then stop the thread; a later `run` starts a new one."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=threading.get_ident() != self._thread_id)

    def _ensure_executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=self.name, initializer=self._remember_thread
                )
            return self._executor

    def _remember_thread(self) -> None:
        self._thread_id = threading.get_ident()
