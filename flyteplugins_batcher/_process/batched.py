"""`@batched`: call a batch function per record; calls from every concurrent task share its batches."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from typing import Any, Generic, overload

from typing_extensions import Unpack

from flyteplugins_batcher._batcher import DynamicBatcher
from flyteplugins_batcher._keywords import SubmitOptions
from flyteplugins_batcher._measure.observers import BatchObserver
from flyteplugins_batcher._measure.stats import BatchStats
from flyteplugins_batcher._process.shared import SharedBatcher
from flyteplugins_batcher._settings import BatcherOptions
from flyteplugins_batcher._token_batcher import TokenBatcher
from flyteplugins_batcher._types import ProcessFn, RecordT, ResultT


class BatchedFunction(Generic[RecordT, ResultT]):
    """A batch function you call one record at a time; see `batched`.

    Every call in the process (every concurrent task on a reusable replica) goes through one
    shared batcher, started on first use and rebuilt if the event loop changes.
    """

    def __init__(
        self,
        fn: ProcessFn[RecordT, ResultT],
        batcher_class: type[DynamicBatcher[Any, Any]] = DynamicBatcher,
        **batcher_options: Any,
    ) -> None:
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]
        self._definition = (fn, batcher_class, batcher_options)  # what a pickled copy is rebuilt from
        # Validated here, at decoration time, rather than inside the first task. A TokenBatcher's
        # costs are tokens: a record's length in characters is no stand-in for them.
        options = BatcherOptions.for_batched(batcher_options, length_costs=not issubclass(batcher_class, TokenBatcher))
        name = options.name or getattr(fn, "__qualname__", None)
        self.options = options
        self._observers: list[BatchObserver] = []

        def make_batcher(batch_fn: ProcessFn[RecordT, ResultT], _key: object) -> DynamicBatcher[RecordT, ResultT]:
            batcher = batcher_class.from_settings(
                batch_fn,
                options.settings,
                cost_estimator=options.cost_estimator,
                name=name,
                prefix_key=options.prefix_key,
            )
            for observer in self._observers:
                batcher.add_observer(observer)
            return batcher

        self._shared: SharedBatcher[Any, DynamicBatcher[RecordT, ResultT]] = SharedBatcher(
            load=functools.partial(_identity, fn), make_batcher=make_batcher, name=name
        )

    def __getstate__(self) -> dict[str, Any]:
        """Pickled as its function and settings, not as its batcher's threads and locks.

        A module-level `@batched` function is reachable from the tasks that call it, and
        `flyte deploy` (deriving a version) or a remote `flyte run` pickles those tasks. The copy
        starts a batcher of its own on first use, in the process that unpickled it; observers
        are this process's and stay here.
        """
        fn, batcher_class, batcher_options = self._definition
        return {"fn": fn, "batcher_class": batcher_class, "batcher_options": batcher_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["fn"], state["batcher_class"], **state["batcher_options"])  # type: ignore[misc]

    async def __call__(self, record: RecordT, **options: Unpack[SubmitOptions]) -> ResultT:
        """Process one record in whatever batch it joins; returns its result.

        Args:
            record: The record.
            **options: `estimated_cost`, `priority`, `deadline_s`, `latency_slo_s` (see `DynamicBatcher.submit`).
        """
        batcher = await self._shared.get()
        return await (await batcher.submit(record, **options))

    async def map(
        self, records: Iterable[RecordT] | AsyncIterable[RecordT], *, return_exceptions: bool = False
    ) -> AsyncIterator[ResultT | BaseException]:
        """Results for `records` in input order, as they complete (see `DynamicBatcher.map`)."""
        batcher = await self._shared.get()
        async for result in batcher.map(records, return_exceptions=return_exceptions):
            yield result

    async def run(
        self, records: Iterable[RecordT] | AsyncIterable[RecordT], *, return_exceptions: bool = False
    ) -> list:
        """All results for `records`, in input order (see `DynamicBatcher.run`)."""
        batcher = await self._shared.get()
        return await batcher.run(records, return_exceptions=return_exceptions)

    def add_observer(self, observer: BatchObserver) -> None:
        """Tell `observer` of every batch and settled record of the shared batcher, and of any that replaces it."""
        self._observers.append(observer)
        if self._shared.batcher is not None:
            self._shared.batcher.add_observer(observer)

    @property
    def batcher(self) -> DynamicBatcher[RecordT, ResultT] | None:
        """The shared batcher, once a call has started it."""
        return self._shared.batcher

    @property
    def stats(self) -> BatchStats:
        """Statistics of the shared batcher (empty before the first call)."""
        batcher = self._shared.batcher
        return batcher.stats if batcher is not None else BatchStats()

    async def aclose(self) -> None:
        """Drain and stop the shared batcher."""
        await self._shared.aclose()


def _identity(fn: Any, _key: Any) -> Any:
    return fn


@overload
def batched(fn: ProcessFn[RecordT, ResultT], /) -> BatchedFunction[RecordT, ResultT]: ...


@overload
def batched(
    *, batcher_class: type[DynamicBatcher[Any, Any]] = ..., **batcher_options: Any
) -> Callable[[ProcessFn[RecordT, ResultT]], BatchedFunction[RecordT, ResultT]]: ...


def batched(
    fn: Any = None, /, *, batcher_class: type[DynamicBatcher[Any, Any]] = DynamicBatcher, **batcher_options: Any
) -> Any:
    """Decorate a batch function so that callers invoke it per record and share its batches.

    The function takes a list of records and returns one result per record (a plain `def` runs
    in a worker thread). Calls from every concurrent task in the process feed one batcher, so on
    a reusable replica with `concurrency=10` the model sees batches built from all ten tasks.

    Batches are length-aware by default, for padded models (transformers, embedders), whose
    batch costs its longest row: `@batched` groups records of similar cost (`grouping="by_cost"`),
    and with no `cost_estimator` a record costs its length (`default_cost="length"`). A `str`
    counts its words and punctuation marks (each CJK character as one), about its token count
    and far cheaper to get; `bytes`, lists (of token ids, say), tuples and arrays count their
    `len()`. A record without a length (a dataclass; a dict, whose `len()` counts keys) costs 1,
    so such records keep their FIFO order (beside records with a length, they go with the
    shortest). No cost budget binds unless you set `target_batch_cost` (then in those units).
    With a `cost_estimator`, its costs are grouped and count against `target_batch_cost` (32,000
    unless set), as in `DynamicBatcher`. `grouping="fifo"` keeps submission order. These are
    `@batched`'s defaults alone: `DynamicBatcher` and `TokenBatcher` keep flyte.extras' (FIFO,
    `default_cost=1`), and with `batcher_class=TokenBatcher` costs stay tokens (its estimator,
    `record.estimate_tokens()`, or `default_token_estimate`) against its budget. For an LLM with a
    prefix cache, `grouping="by_prefix"` batches prompts that begin alike together (a `str` prompt
    by its text; other records by `prefix_key=f` or their own `prefix_key()`).

    Args:
        fn: The batch function (when used without parentheses).
        batcher_class: `DynamicBatcher` (default) or `TokenBatcher`.
        **batcher_options: Any keyword of the batcher class (`max_batch_size`,
            `target_batch_cost`, `batch_timeout_s`, `cost_estimator`, `grouping`, `prefix_key`,
            `on_error`, ...), validated at decoration time; any given wins over the defaults above.

    Example:
        ```python
        @batched(max_batch_size=64)  # batches of texts of similar length
        def embed(texts: list[str]) -> list[list[float]]:
            return get_model().encode(texts)

        @env.task
        async def embed_document(doc: str) -> list[float]:
            return await embed(doc)  # batched with every other task on this replica
        ```
    """

    def decorate(batch_fn: ProcessFn[RecordT, ResultT]) -> BatchedFunction[RecordT, ResultT]:
        return BatchedFunction(batch_fn, batcher_class, **batcher_options)

    return decorate(fn) if fn is not None else decorate
