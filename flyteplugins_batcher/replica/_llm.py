"""The LLM replica: one process's engine and shared batcher, and the code that runs a chunk of prompts through them.

Every chunk a process runs (up to a replica's `concurrency` Flyte task calls at once, or a server's
batch lines and online requests) feeds the replica's one batcher, a `SharedBatcher` around the
engine, which assembles token-budgeted batches and keeps the model busy while the callers load and
post-process. `infer_chunk` (`flyteplugins_batcher.jobs`) is a thin Flyte task around
`LLMReplica.of_process().run_chunk`, so the same code path runs outside Flyte too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import socket
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import Any

from flyteplugins_batcher import (
    BatcherClosedError,
    BatcherFailedError,
    BatcherNotRunningError,
    DeviceMonitor,
    SharedBatcher,
    TokenBatcher,
)
from flyteplugins_batcher.batch_api import error_code
from flyteplugins_batcher.engines import (
    CancellationToken,
    Completion,
    Engine,
    EngineConfigError,
    InvalidPromptError,
    Request,
    RequestCancelledError,
    create_engine,
    loading_model,
)
from flyteplugins_batcher.replica._chunks import ChunkOutcome, ItemResult, RequestChunk, RequestItem
from flyteplugins_batcher.replica._live import LiveRecords, count_finished, count_submitted, live_records
from flyteplugins_batcher.replica._per_process import PerProcess
from flyteplugins_batcher.replica._settings import EngineSettings, engine_kwargs
from flyteplugins_batcher.replica._snapshot import ReplicaSnapshot

logger = logging.getLogger("flyteplugins_batcher.replica")

BatcherFactory = Callable[[Engine, EngineSettings], TokenBatcher]
"""Builds a replica's batcher around its loaded engine: `make_batcher(engine, settings)`."""


AdmitLine = Callable[[], AbstractAsyncContextManager[object]]
"""Admits one batch line, holding its place while its record is in the batcher (`async with admit(): ...`): a
server's online latency target lets lines in only as far as its quota allows (`server/_admission.py`)."""


def make_batcher(engine: Engine, settings: EngineSettings) -> TokenBatcher:
    """The replica's batcher: the engine's defaults with the settings' batcher keywords over them."""
    return engine.batcher(**settings.batcher_keywords())


def load_engine(settings: EngineSettings) -> Engine:
    """Build and load an engine for the settings (blocking: a replica calls it in a worker thread).

    Raises:
        EngineConfigError: The settings cannot work, or name several base models (an engine runs one:
            `settings.for_model` picks it).
    """
    declared = settings.base_models()
    if len(declared) > 1:
        raise EngineConfigError(
            f"model names {len(declared)} base models ({', '.join(declared)}) and an engine runs one: run-batch "
            "(the JSONL job) runs a file's lines model by model; run-table and the server take one model"
        )
    engine_name = settings.engine
    kwargs = engine_kwargs(settings)
    if engine_name == "auto" and any(name not in ("dtype", "lora_modules") for name in kwargs):
        engine_name = "vllm"  # vLLM settings were given: the user means vLLM
    try:
        engine = create_engine(
            engine_name,  # type: ignore[arg-type]
            settings.model or None,
            generation=settings.generation(),
            system_prompt=settings.system_prompt or None,
            reasoning_parser=settings.reasoning_parser or None,
            **kwargs,
        )
    except EngineConfigError:
        raise
    except (TypeError, ValueError) as error:  # an unknown engine, option or option value: no retry can fix it
        raise EngineConfigError(f"cannot build the {engine_name!r} engine with these settings: {error}") from error
    with loading_model():
        engine.load()
    logger.info("loaded %s (%s) in %.1f s", engine.model_name, engine.name, engine.stats.load_time_s)
    return engine


class LLMReplica:
    """One process's engine (or engines) and shared batcher, its GPU monitor, and the code that runs a chunk.

    A replica holds one base model at a time: a chunk for another model (its settings' `model`) closes
    the engine it holds, then loads that model's, so a run that names several models time-shares its
    replicas. `EngineSettings.models_per_replica` lets it hold that many at once (the least recently
    used one closes first).

    Args:
        make_batcher: Builds the batcher around a loaded engine (wrap the engine here to observe
            or instrument what reaches it).
        admit: When given, each line of a chunk waits to be admitted (`AdmitLine`) before its record goes
            to the batcher, and holds its place until its answer; without it a chunk's records go in at once.

    Example:
        ```python
        replica = LLMReplica.of_process()  # the one every chunk of this process runs on
        outcome = await replica.run_chunk(chunk, EngineSettings(max_new_tokens=64))
        await replica.aclose()
        ```
    """

    @classmethod
    def of_process(cls) -> LLMReplica:
        """This process's replica (made on first use): the one `infer_chunk` runs its chunks on."""
        return _PROCESS.get()

    @staticmethod
    def live_records() -> LiveRecords:
        """The records the LLM replicas of this process finished so far, each counted as it finished (cumulative).

        A driver in the same process (flyte's local runner) shows progress per record from them; on a cluster
        its own process runs no replica, they stay at zero, and its progress moves per chunk.
        """
        return live_records()

    def install(self) -> None:
        """Make this the process's replica until it closes: a local Flyte run in this process (a server's) uses it."""
        _PROCESS.install(self)

    def __init__(self, make_batcher: BatcherFactory = make_batcher, *, admit: AdmitLine | None = None) -> None:
        self.admit = admit
        self.device = DeviceMonitor()
        self._make_batcher = make_batcher
        self._engines: list[_HeldEngine] = [self._new_engine()]  # the engines it holds, least recently used first
        self.settings: EngineSettings | None = None
        """The settings the engine loaded last was built with."""
        self.loads: dict[str, int] = {}
        """Engines loaded in this process, by base model (its reference as the settings give it)."""

    @property
    def shared(self) -> SharedBatcher[Engine, TokenBatcher]:
        """The shared batcher of the model used last (a server's, a command line's preload)."""
        return self._engines[-1].shared

    def preload(self, settings: EngineSettings) -> concurrent.futures.Future[Engine]:
        """Start loading the settings' engine in a background thread (`SharedBatcher.preload`)."""
        return self._engine_for(settings).shared.preload(settings)

    def _new_engine(self) -> _HeldEngine:
        return _HeldEngine(SharedBatcher(self._load, self._make_batcher, name="llm"))

    def _engine_for(self, settings: EngineSettings) -> _HeldEngine:
        """The held engine of the settings' model: the one that holds it, an unused one, a new one while the replica
        may hold more, else the least recently used one (its engine closes before this model's loads)."""
        held = next((held for held in self._engines if held.model == settings.model), None)
        held = held or next((held for held in self._engines if held.model is None), None)
        if held is None and len(self._engines) < settings.models_per_replica:
            held = self._new_engine()
        held = held or self._engines[0]
        if held in self._engines:
            self._engines.remove(held)
        self._engines.append(held)
        held.model = settings.model
        return held

    def _load(self, settings: EngineSettings) -> Engine:
        engine = load_engine(settings)
        self.settings = settings
        self.loads[settings.model] = self.loads.get(settings.model, 0) + 1
        self.device.start()
        return engine

    async def run_chunk(
        self, chunk: RequestChunk, settings: EngineSettings, *, stop: asyncio.Event | None = None
    ) -> ChunkOutcome:
        """Generate a completion for every prompt of a chunk through the shared batcher.

        A prompt the engine cannot run (empty, too long) gets an error in its result.

        Args:
            chunk: The prompts.
            settings: The engine's settings.
            stop: Once set, the chunk's unfinished prompts are cancelled (a queued one never runs, a
                running one stops where the engine can stop it); their results say so (`ItemResult.stopped`).

        Raises:
            EngineConfigError: The settings cannot work (retrying cannot help).
            RuntimeError: Inference failed for the chunk (another attempt may succeed).
        """
        shared = self._engine_for(settings).shared
        batcher = await shared.get(settings)
        engine = shared.loaded_model
        assert engine is not None
        defaults = settings.generation()
        # Each record carries a token, whichever way it goes: a chunk stopped (`stop`) or cancelled (its task:
        # a Flyte task cancelled, a local run aborted) has the engine stop its running records, not only forget them.
        requests = [replace(item.engine_request(defaults), cancellation=CancellationToken()) for item in chunk.items]
        if self.admit is not None:
            outcomes = await run_admitted(batcher, requests, self.admit, stop)
        else:  # never stopped without `stop`; each record counted as it finishes (`live_records`)
            outcomes = await run_until(batcher, requests, stop or asyncio.Event())
        stopped = stop is not None and stop.is_set()
        answers = zip(chunk.items, outcomes, strict=True)
        results = [_item_result(chunk, item, outcome, stopped=stopped) for item, outcome in answers]
        return ChunkOutcome(chunk.index, results, self.snapshot(batcher, engine), finished_at=time.time())

    def snapshot(self, batcher: TokenBatcher, engine: Engine) -> ReplicaSnapshot:
        """The batcher, engine and device statistics, labelled with the pod (host) and process."""
        device = self.device.utilization()
        return ReplicaSnapshot.of_batcher(
            batcher.stats,
            replica=f"{socket.gethostname()}/{os.getpid()}",
            model=engine.model_name,
            device_utilization=device.mean if device.available else -1.0,
            device_note=device.note,
            **ReplicaSnapshot.engine_fields(engine.stats),
        )

    async def aclose(self) -> None:
        """Stop the batcher, close the engine and stop the GPU monitor; the process's next replica is a fresh one."""
        _PROCESS.release(self)
        for held in self._engines:
            await held.shared.aclose()
        self.device.stop()


@dataclass
class _HeldEngine:
    """One engine a replica holds (or loads): its shared batcher, and the base model it is for."""

    shared: SharedBatcher[Engine, TokenBatcher]
    model: str | None = None  # None: not used yet


def _item_result(chunk: RequestChunk, item: RequestItem, outcome: object, *, stopped: bool) -> ItemResult:
    """A prompt's result: its completion, its own error, or stopped (only when the chunk was told to stop).

    Raises:
        RuntimeError: Inference failed (another attempt may succeed), or the batcher cancelled the
            prompt without the chunk being told to stop (it was stopped: another attempt may run it).
    """
    if isinstance(outcome, Completion):
        return ItemResult.of(item.key, outcome)
    if isinstance(outcome, InvalidPromptError):
        return ItemResult(item.key, error_code=error_code(outcome), error_message=str(outcome))
    if stopped and isinstance(outcome, (asyncio.CancelledError, RequestCancelledError)):
        return ItemResult.stopped(item.key)
    raise RuntimeError(f"chunk {chunk.index}: inference failed: {outcome!r}") from (
        outcome if isinstance(outcome, BaseException) else None
    )


async def run_until(batcher: TokenBatcher, records: list[Request], stop: asyncio.Event) -> list[object]:
    """Each record's outcome, its error in its place; once `stop` is set, those not finished are cancelled.

    A cancelled record's place holds a `CancelledError`: the batcher drops it if it was queued, and
    tells it to stop (`Request.cancel`) if it was running. A record `submit` refuses (one it cannot cost)
    holds its error. Each record is counted in `live_records` as it finishes.
    """
    futures: list[asyncio.Future[Any]] = []
    for record in records:
        if stop.is_set():
            break
        futures.append(_counted(await _submit_or_refused(batcher, record)))
    batcher.flush()
    await _until_answered_or_stopped(asyncio.gather(*futures, return_exceptions=True), stop, futures)
    outcomes: list[object] = [_outcome(future) for future in futures]
    return outcomes + [asyncio.CancelledError() for _ in records[len(futures) :]]


async def run_admitted(
    batcher: TokenBatcher, records: list[Request], admit: AdmitLine, stop: asyncio.Event | None
) -> list[object]:
    """Each record's outcome, its error in its place, each submitted once admitted (`admit`) and in order.

    Once `stop` is set, those not finished are cancelled: a record waiting to be admitted never goes in,
    a queued one is dropped, a running one is told to stop.
    """

    async def admitted(record: Request) -> object:
        async with admit():
            future = _counted(await _submit_or_refused(batcher, record))
            try:
                await asyncio.wait({future})
            except asyncio.CancelledError:
                future.cancel()  # stopped: a queued record is dropped, a running one told to stop
                raise
            return _outcome(future)

    tasks = [asyncio.ensure_future(admitted(record)) for record in records]
    answered = asyncio.gather(*tasks, return_exceptions=True)
    if stop is not None:
        await _until_answered_or_stopped(answered, stop, tasks)
    return list(await answered)


async def _until_answered_or_stopped(
    answered: asyncio.Future[Any], stop: asyncio.Event, pending: list[asyncio.Future[Any]] | list[asyncio.Task[Any]]
) -> None:
    """Wait for `answered` or for `stop`, whichever comes first; then cancel what in `pending` has no outcome."""
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({answered, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        for future in pending:
            future.cancel()  # nothing happens to those that have their outcome


async def _submit_or_refused(batcher: TokenBatcher, record: Request) -> asyncio.Future[Any]:
    """The record's future, or one failed with the error `submit` raised for this record alone (as `map` does)."""
    try:
        return await batcher.submit(record)
    except (BatcherClosedError, BatcherFailedError, BatcherNotRunningError):
        raise
    except Exception as error:
        refused: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        refused.set_exception(error)
        return refused


def _counted(future: asyncio.Future[Any]) -> asyncio.Future[Any]:
    """The future, counted in `live_records` now and again when it finishes (a driver in this process shows it)."""
    count_submitted(1)
    future.add_done_callback(lambda done: count_finished(_outcome(done)))
    return future


def _outcome(future: asyncio.Future[Any]) -> object:
    if future.cancelled():
        return asyncio.CancelledError()
    return future.exception() or future.result()


_PROCESS: PerProcess[LLMReplica] = PerProcess(LLMReplica)
