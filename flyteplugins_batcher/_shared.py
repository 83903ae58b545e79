"""Process-level singletons: one model and one running batcher per process, shared by every task.

On a reusable Flyte container, many concurrent task invocations run in one Python process. They
must share one model (loading it twice wastes minutes and GPU memory) and feed one batcher (two
batchers would split the traffic and halve the batch sizes). The usual answer is a pair of
`@alru_cache(maxsize=1)` functions; this module packages that pair and fixes its blind spot:
async-lru clears its cache when the event loop changes, which drops the old batcher without
stopping it, leaving its dispatcher task and worker threads orphaned. Here the model is loaded
once per process, independent of event loops, and the batcher is rebuilt per loop: the old one
is stopped on its own loop (or released, if that loop is gone) before the new one starts.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import warnings
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
        self._current: BatcherT | None = None
        self._current_key: Hashable | None = None
        self._batcher_for_loop = alru_cache(maxsize=1)(self._start_batcher)
        self.loads = 0
        self.batchers_built = 0

    @property
    def loaded_model(self) -> ModelT | None:
        """The model loaded in this process, if any."""
        return self._model if self._model_loaded else None

    @property
    def batcher(self) -> BatcherT | None:
        """The batcher serving the current loop, if one has been started."""
        return self._current

    async def get(self, key: Hashable = None) -> BatcherT:
        """The running batcher for `key` on the caller's event loop (loading the model if needed)."""
        loop = asyncio.get_running_loop()
        current = self._current
        if current is not None:
            if current.loop is loop and current.is_running and self._current_key == key:
                return current  # the hot path: one call per record when used through `batched`
            await self._retire(current)
        with warnings.catch_warnings():
            # We handle the loop change ourselves (the old batcher was just retired above).
            warnings.filterwarnings("ignore", message=".*event loop change.*")
            return await self._batcher_for_loop(key)

    async def model(self, key: Hashable = None) -> ModelT:
        """The loaded model for `key`, loading it (once per process) if needed."""
        if self._model_loaded and self._model_key == key:
            return self._model  # type: ignore[return-value]
        if inspect.iscoroutinefunction(self._load):
            return await self._load_async(key)
        return await asyncio.to_thread(self._load_blocking, key)

    async def aclose(self) -> None:
        """Stop the batcher and close the model (for tests and clean shutdown)."""
        current, self._current = self._current, None
        if current is not None:
            await self._retire(current)
        self._batcher_for_loop.cache_clear()
        with self._lock:
            self._unload_locked()

    # -- internals ---------------------------------------------------------------------------------

    async def _start_batcher(self, key: Hashable) -> BatcherT:
        model = await self.model(key)
        batcher = self._make_batcher(model, key)
        await batcher.start()
        self._current, self._current_key = batcher, key
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
        if self._current is batcher:
            self._current = None
        self._batcher_for_loop.cache_clear()
        loop = batcher.loop
        if loop is asyncio.get_running_loop():
            await batcher.stop(timeout=_RETIRE_TIMEOUT_S)
        elif loop is not None and loop.is_running():
            # Another thread runs that loop; let it drain there without making this loop wait.
            asyncio.run_coroutine_threadsafe(batcher.stop(timeout=_RETIRE_TIMEOUT_S), loop)
        else:
            batcher._release_without_loop()
        logger.info("%s: retired %s (event loop or configuration changed)", self.name, batcher.name)
