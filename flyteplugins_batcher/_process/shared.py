"""Process-level singletons: one model and one running batcher per process, shared by every task.

On a reusable Flyte container, many concurrent task invocations run in one Python process. They
must share one model (loading it twice wastes minutes and GPU memory) and feed one batcher (two
batchers would split the traffic and halve the batch sizes). The usual answer is a pair of
`@alru_cache(maxsize=1)` functions; this module packages that pair and fixes its blind spots:

- async-lru's cache belongs to one event loop. Here each loop gets its own `alru_cache` of running
  batchers, and a loop change is handled in one place (`_serve`): the batchers of the old loop
  are stopped on that loop, or released if it is gone, so none is orphaned with its threads.
- The model is loaded once per process and key, independent of event loops.
- A batcher that failed (its model died: `UnrecoverableError`) is replaced on the next call, and
  its model closed and loaded again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

from async_lru import alru_cache

from flyteplugins_batcher._batcher import DynamicBatcher

logger = logging.getLogger("flyteplugins_batcher")

ModelT = TypeVar("ModelT")
BatcherT = TypeVar("BatcherT", bound=DynamicBatcher[Any, Any])

_RETIRE_TIMEOUT_S = 30.0


class SharedBatcher(Generic[ModelT, BatcherT]):
    """Loads a model once per process and serves one running batcher for it to every caller.

    Replaces the hand-written pair of `@alru_cache(maxsize=1)` functions (one loading the model,
    one starting the batcher) with one object that is safe across event loops and configurations:

    - `load(key)` runs once per process and key, in a worker thread when it is a plain `def`
      (loading weights must not freeze the tasks already running on the replica). Concurrent
      first callers wait for the same load.
    - `make_batcher(model, key)` builds the batcher; it is started on the caller's event loop.
      If a later call comes from another loop, the old batcher is stopped and a new one built
      around the same model.
    - A call with a different key replaces the model (one model per process, as GPU memory
      allows): the old batcher is stopped and the old model's `close()` is called if it has one.
    - A batcher that failed (its process function raised `UnrecoverableError`, say the engine
      process died) is replaced on the next call, around a freshly loaded model.

    Args:
        load: `load(key) -> model`, sync or async.
        make_batcher: `make_batcher(model, key) -> batcher` (not started).
        name: For logs.

    Example:
        ```python
        llm = SharedBatcher(
            load=lambda cfg: create_engine(cfg.engine, cfg.model),
            make_batcher=lambda engine, cfg: engine.batcher(target_batch_tokens=cfg.budget),
        )

        @env.task
        async def infer(chunk: Chunk, cfg: Config) -> list[str]:
            batcher = await llm.get(cfg)  # the replica's one batcher
            return await batcher.run(chunk.prompts)
        ```
    """

    def __init__(
        self,
        load: Callable[[Any], ModelT | Awaitable[ModelT]],
        make_batcher: Callable[[ModelT, Any], BatcherT],
        *,
        name: str | None = None,
    ) -> None:
        self.name = name or getattr(load, "__qualname__", "SharedBatcher")
        self._load = load
        self._make_batcher = make_batcher
        self._lock = threading.Lock()
        self._model_key: Hashable | None = None
        self._model: ModelT | None = None
        self._model_loaded = False
        self._load_done: threading.Event | None = None
        self._serving_loop: asyncio.AbstractEventLoop | None = None
        self._started = alru_cache(maxsize=1)(self._start)  # this loop's running batcher, by key
        self._live: list[BatcherT] = []  # started and not yet retired, newest last
        self.loads = 0
        self.batchers_built = 0

    def __getstate__(self) -> dict[str, Any]:
        """Pickled as its settings: a copy in another process loads its own model and starts its own batcher.

        A module-level `SharedBatcher` is reachable from the tasks that use it, and `flyte deploy`
        (deriving a version) or a remote `flyte run` pickles those tasks; its lock, model and
        running batchers belong to this process and cannot travel.
        """
        return {"load": self._load, "make_batcher": self._make_batcher, "name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["load"], state["make_batcher"], name=state["name"])  # type: ignore[misc]

    @property
    def loaded_model(self) -> ModelT | None:
        """The model loaded in this process, if any."""
        return self._model if self._model_loaded else None

    @property
    def batcher(self) -> BatcherT | None:
        """The batcher started most recently, if it still serves."""
        return self._live[-1] if self._live else None

    async def get(self, key: Hashable = None) -> BatcherT:
        """The running batcher for `key` on the caller's event loop (loading the model if needed).

        A batcher that was stopped, or that failed, is replaced; a failed one's model is closed
        and loaded again, since whatever killed the batcher (a dead engine) lives in the model.
        """
        loop = asyncio.get_running_loop()
        if loop is not self._serving_loop:
            await self._serve(loop)
        batcher = await self._started(key)
        if batcher.is_running:
            return batcher
        self._started.cache_invalidate(key)
        await self._retire(batcher)
        if batcher.is_failed:
            # The failure was logged when it happened; this is the recovery.
            logger.info("%s: the batcher failed (%s); loading the model again", self.name, batcher.failure)
            with self._lock:
                self._unload_locked()
        return await self._started(key)

    def preload(self, key: Hashable = None) -> concurrent.futures.Future[ModelT]:
        """Start loading the model for `key` in a background thread, so that the first `get(key)` finds it loaded.

        For a process that knows its model before its first call (a command line, a server
        starting up): the load overlaps whatever else the process does meanwhile. A `get` that
        comes while the load runs waits for it; a load that fails is tried again by the next
        `get`, which raises its error where it belongs.

        Returns:
            The load's future: its model, or its exception.

        Example:
            ```python
            llm.preload(settings)  # vLLM starts while the input is read
            batcher = await llm.get(settings)
            ```
        """
        future: concurrent.futures.Future[ModelT] = concurrent.futures.Future()

        def load() -> None:
            try:
                if inspect.iscoroutinefunction(self._load):
                    future.set_result(asyncio.run(self._load_async(key)))
                else:
                    future.set_result(self._load_blocking(key))
            except BaseException as error:  # the caller's `get` meets it again, where it is reported
                logger.info("%s: preloading the model for %r failed: %s", self.name, key, error)
                future.set_exception(error)

        threading.Thread(target=load, name=f"{self.name}-preload", daemon=True).start()
        return future

    async def model(self, key: Hashable = None) -> ModelT:
        """The loaded model for `key`, loading it (once per process) if needed."""
        if self._model_loaded and self._model_key == key:
            return self._model  # type: ignore[return-value]
        if inspect.iscoroutinefunction(self._load):
            return await self._load_async(key)
        return await asyncio.to_thread(self._load_blocking, key)

    async def aclose(self) -> None:
        """Stop the batchers and close the model (for tests and clean shutdown)."""
        for batcher in list(self._live):
            await self._retire(batcher)
        self._started.cache_clear()
        with self._lock:
            self._unload_locked()

    # -- internals ---------------------------------------------------------------------------------

    async def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        """The one place a new event loop is handled: retire the old loop's batchers, start a fresh cache."""
        for batcher in list(self._live):
            await self._retire(batcher)
        self._started = alru_cache(maxsize=1)(self._start)
        self._serving_loop = loop

    async def _start(self, key: Hashable) -> BatcherT:
        for batcher in list(self._live):  # a new key: one model, one batcher per process
            await self._retire(batcher)
        model = await self.model(key)
        batcher = self._make_batcher(model, key)
        await batcher.start()
        self._live.append(batcher)
        self.batchers_built += 1
        logger.info("%s: started %s on this event loop", self.name, batcher.name)
        return batcher

    def _load_blocking(self, key: Hashable) -> ModelT:
        with self._lock:
            if self._model_loaded and self._model_key == key:
                return self._model  # type: ignore[return-value]
            self._unload_locked()
            model = self._load(key)
            if inspect.isawaitable(model):
                raise TypeError(f"{self.name}: load returned an awaitable from a plain def; make load `async def`")
            self._set_model_locked(key, model)
            return model

    async def _load_async(self, key: Hashable) -> ModelT:
        while True:
            with self._lock:
                if self._model_loaded and self._model_key == key:
                    return self._model  # type: ignore[return-value]
                waiting_on = self._load_done
                if waiting_on is None:  # nobody is loading: we do
                    self._load_done = threading.Event()
                    self._unload_locked()
                    break
            await asyncio.to_thread(waiting_on.wait)
        try:
            model = await self._load(key)  # type: ignore[misc]
            with self._lock:
                self._set_model_locked(key, model)
            return model
        finally:
            with self._lock:
                done, self._load_done = self._load_done, None
            if done is not None:
                done.set()

    def _set_model_locked(self, key: Hashable, model: ModelT) -> None:
        self._model, self._model_key, self._model_loaded = model, key, True
        self.loads += 1
        logger.info("%s: loaded the model for %r (load #%d in this process)", self.name, key, self.loads)

    def _unload_locked(self) -> None:
        if not self._model_loaded:
            return
        model, self._model, self._model_loaded = self._model, None, False
        close = getattr(model, "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                logger.exception("%s: closing the previous model failed", self.name)

    async def _retire(self, batcher: BatcherT) -> None:
        """Stop a batcher that no longer serves: drain it on its own loop if that still runs, else release it."""
        if batcher in self._live:
            self._live.remove(batcher)
        loop = batcher.loop
        if loop is asyncio.get_running_loop():
            await batcher.stop(timeout=_RETIRE_TIMEOUT_S)
        elif loop is not None and loop.is_running():
            # Another thread runs that loop; let it drain there without making this loop wait.
            asyncio.run_coroutine_threadsafe(batcher.stop(timeout=_RETIRE_TIMEOUT_S), loop)
        else:
            batcher.release()
        logger.info("%s: retired %s", self.name, batcher.name)
