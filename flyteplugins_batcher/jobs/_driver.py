"""The driver side of the workflows: fan chunks out to the replicas, keep what finishes, account for the rest.

Chunks are produced lazily and at most `max_in_flight` are outstanding, so a driver reading a
million-line file holds a bounded amount of it. Each finished chunk is handed to the workflow's
`on_chunk` at once (which writes its results out), so nothing accumulates either. A chunk that fails
after Flyte's retries is reported by its records, and the run goes on; a failure that retrying
cannot fix (a missing model, say) stops the whole run at once with its message.

Nothing here imports a workload (an engine, a model, a replica): `fan_out` takes any `infer`
callable, a Flyte task or a plain async function.

How full the replicas' engines were comes back with every chunk (`ReplicaSnapshot`): the run's
summary and report give the engines' occupancy, and when it stayed below `LOW_OCCUPANCY` while
chunks waited in the driver, the run prints one warning naming the setting to raise.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import uuid
from collections.abc import AsyncIterable, Awaitable, Callable, Hashable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Generic, Protocol, TypeVar

import flyte.errors
from flyte.io import File

from flyteplugins_batcher import BatcherError, size_in_flight
from flyteplugins_batcher.jobs._environments import ReplicaPool
from flyteplugins_batcher.jobs._outputs import PublishError, WorkFolder
from flyteplugins_batcher.jobs._report import Progress, final_html, print_report_location
from flyteplugins_batcher.jobs._summary import ModelRun, RunSummary, prompt_tokens_text
from flyteplugins_batcher.replica import ChunkCutter, ReplicaSnapshot

logger = logging.getLogger("flyteplugins_batcher.jobs._driver")

LAZY_MODULES = ("pandas", "pyarrow")
"""Modules flyte imports lazily (`importlib.util.LazyLoader`): loaded at once before chunks run side by side."""

LOW_OCCUPANCY = 0.8
"""Below this share of its sequence slots, an engine that had work waiting in the driver was starved."""


class Chunk(Protocol):
    """What the driver sends to a replica: a `RequestChunk`, an `EmbeddingChunk`, ..."""

    index: int


class Outcome(Protocol):
    """What a replica answers a chunk with: when it finished, and the replica's state then."""

    finished_at: float
    replica: ReplicaSnapshot


ChunkT = TypeVar("ChunkT", bound=Chunk)
OutcomeT = TypeVar("OutcomeT", bound=Outcome)
ChunkHandler = Callable[[ChunkT, OutcomeT | None, str], Awaitable[None]]
"""Called once per chunk, as it finishes: its outcome, or `None` and why it failed."""


@dataclass(frozen=True)
class RunOptions:
    """How a driver runs a job: its chunks, how many are outstanding, which failures it accepts, what it reuses.

    Every LLM workflow takes them as inputs of their own (`flyteplugins_batcher/jobs/_options.py`), each with its own
    defaults.

    Attributes:
        chunk_size: Requests (a table's rows) per replica call (a chunk is what Flyte caches and retries).
        max_chunks_in_flight: Chunks outstanding at once over all replicas (bounds the driver's memory); 0:
            replicas x concurrency of the replicas' environment, which fills every replica's slots, so that
            adding replicas adds work in flight.
        max_failed_fraction: Share of requests (rows) that may fail before the run exits non-zero (everything
            that finished is written first).
        resume: Reuse chunks finished by an earlier run with the same requests and settings (--no-resume
            computes everything again).
        output_dir: Where the output goes (the results and errors files; a table's Parquet dataset): a local
            folder, a file:// URI or a remote URI (s3://, gs://, abfs://, abfss://), checked before any
            inference; empty: the run's own Flyte storage.
        order: How requests (a table's rows) are cut into chunks: "prefix" puts those that share a prompt
            prefix (a document, a system prompt with few-shot examples) in the same chunks, so that the replica
            that runs a chunk computes the prefix once and its cache stays warm; "file" keeps the input's
            order. The answers are the same either way, and a table's output keeps its rows' order.
        order_window: Requests (rows) grouped together at most in "prefix" order: the driver holds this many
            at once, and requests further apart than this are placed apart.
    """

    chunk_size: int = 8
    max_chunks_in_flight: int = 0
    max_failed_fraction: float = 0.0
    resume: bool = True
    output_dir: str = ""
    order: str = "prefix"
    order_window: int = ChunkCutter.WINDOW

    def __post_init__(self) -> None:
        if self.order not in ChunkCutter.ORDERS:
            raise ValueError(f"order must be one of {', '.join(ChunkCutter.ORDERS)}, got {self.order!r}")
        if self.order_window < 1:
            raise ValueError(f"order_window must be >= 1, got {self.order_window}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.max_chunks_in_flight < 0:
            raise ValueError(
                f"max_chunks_in_flight must be >= 0 (0: replicas x concurrency), got {self.max_chunks_in_flight}"
            )
        if not 0 <= self.max_failed_fraction <= 1:
            raise ValueError(f"max_failed_fraction must be in [0, 1], got {self.max_failed_fraction}")

    def chunks_in_flight(self, pool: ReplicaPool) -> int:
        """The driver's cap for a run on `pool`: `max_chunks_in_flight`, or every replica's slots when it is 0."""
        return self.max_chunks_in_flight or pool.chunks_in_flight

    def cache_salt(self) -> str:
        """The chunks' cache salt for this run: empty when resuming (finished chunks are reused), else fresh."""
        return "" if self.resume else uuid.uuid4().hex


class UnrecoverableRunError(BatcherError, RuntimeError):
    """A chunk failed in a way no retry can fix; the run stops with its message."""


Lane = tuple[str, str]
"""A replica's work on one base model: (replica, model). A replica that swaps models has a lane per model."""


@dataclass
class FanOutStats:
    """What the fan-out saw."""

    wall_s: float = 0.0
    latest: dict[Lane, ReplicaSnapshot] = field(default_factory=dict)  # each lane's latest state
    first: dict[Lane, ReplicaSnapshot] = field(default_factory=dict)  # each lane's first state in this run
    while_waiting: dict[Lane, ReplicaSnapshot] = field(default_factory=dict)  # latest while chunks were still to send
    loads: dict[Hashable, dict[str, float]] = field(default_factory=dict)  # by phase: each model's slowest load
    started_at: float = 0.0  # when the fan-out started (epoch seconds): where the report's charts begin
    reading: bool = True  # the driver still had chunks to send
    held_back: bool = False  # the driver held chunks back at its cap at least once

    @property
    def load_time_s(self) -> float:
        """Model loading in the run's wall time: the slowest load of each phase, whose models load one phase after
        the other. Only loads in this run count: reused chunks load nothing, and a warm replica (a reusable
        container's, whose batcher started before the run) loaded in an earlier run."""
        return sum(max(models.values()) for models in self.loads.values())

    @property
    def model_loads(self) -> dict[str, float]:
        """Each model's slowest load in this run, by the name its replicas report."""
        loads: dict[str, float] = {}
        for models in self.loads.values():
            for model, seconds in models.items():
                loads[model] = max(loads.get(model, 0.0), seconds)
        return loads

    @property
    def replicas(self) -> list[ReplicaSnapshot]:
        """Each lane's latest state, by replica; a replica that ran several models has a lane per model, each
        labelled with its model."""
        names = [name for name, _ in self.latest]
        lanes = sorted(self.latest.items())
        return [
            replace(state, replica=f"{name} {model}") if names.count(name) > 1 else state
            for (name, model), state in lanes
        ]

    @property
    def inference_s(self) -> float:
        """The run's wall time less model loading."""
        return max(self.wall_s - self.load_time_s, 0.0)

    def per_second(self, amount: float) -> float:
        """`amount` per second of inference."""
        return amount / self.inference_s if self.inference_s > 0 else 0.0

    def record(self, outcome: Outcome | None, started: float, phase: Hashable = None) -> None:
        """Keep a finished chunk's lane's latest state, if this run computed it (`None`: the chunk failed).

        `phase`: the fan-out's phase when it was sent (`fan_out`'s `phase`).
        """
        if outcome is None:
            return
        if outcome.finished_at < started:  # reused from an earlier run: no replica worked on it
            return
        snapshot = outcome.replica
        lane = (snapshot.replica, snapshot.model)
        self.latest[lane] = _newer(self.latest.get(lane), snapshot)
        self.first[lane] = _older(self.first.get(lane), snapshot)
        if self.reading:
            self.while_waiting[lane] = _newer(self.while_waiting.get(lane), snapshot)
        if snapshot.timeline.origin_s >= started:  # loaded in this run; a warm replica loaded in an earlier one
            models = self.loads.setdefault(phase, {})
            models[snapshot.model] = max(models.get(snapshot.model, 0.0), snapshot.load_time_s)

    def occupancy(self, *, while_waiting: bool = False) -> float | None:
        """Running sequences per engine step over `max_num_seqs`, across the replicas, in this run.

        Counted from each lane's first chunk of the run to its latest one (`while_waiting`: its
        latest while the driver still had chunks to send); a run too short for that counts each
        lane's engine since it started. `None` where the engines counted no steps: engines without
        continuous batching (Transformers) have no occupancy.
        """
        latest = self.while_waiting if while_waiting else self.latest
        windows = [last.engine_counts().since(self.first[lane].engine_counts()) for lane, last in latest.items()]
        if not any(window.steps for window in windows):
            windows = [last.engine_counts() for last in latest.values()]
        capacity = sum(window.steps * window.max_num_seqs for window in windows)
        return sum(window.running_seqs for window in windows) / capacity if capacity else None


def _newer(known: ReplicaSnapshot | None, seen: ReplicaSnapshot) -> ReplicaSnapshot:
    """The later of two states of one replica (chunks finish out of order; its counters only grow)."""
    return seen if known is None or known.records <= seen.records else known


def _older(known: ReplicaSnapshot | None, seen: ReplicaSnapshot) -> ReplicaSnapshot:
    return seen if known is None or seen.records < known.records else known


class Counts:
    """Running counts of a run's requests, for its summary and live report.

    The token counts (`fresh_tokens` generated, `fresh_prompt_tokens` read, `fresh_cached_tokens` of
    those found in the engines' prefix caches) are the answers' that this run computed.
    """

    def __init__(self) -> None:
        self.done = self.failed = self.fresh_answers = self.fresh_tokens = self.reused = self.retried = 0
        self.fresh_prompt_tokens = self.fresh_cached_tokens = 0

    def count(
        self,
        *,
        failed: bool,
        completion_tokens: int,
        prompt_tokens: int = 0,
        cached_tokens: int = 0,
        fresh: bool = True,
        retried: bool = False,
    ) -> None:
        """One request finished.

        Args:
            failed: It failed.
            completion_tokens: The tokens it generated.
            prompt_tokens: The prompt tokens the engine read for it.
            cached_tokens: Of those, the ones its engine found in its prefix cache.
            fresh: This run computed it (else its answer was reused from an earlier run).
            retried: An earlier run had failed it, and this run sent it to the engine again.
        """
        self.done += 1
        self.failed += failed
        self.reused += not fresh
        self.retried += retried
        if fresh and not failed:
            self.fresh_answers += 1
            self.fresh_tokens += completion_tokens
            self.fresh_prompt_tokens += prompt_tokens
            self.fresh_cached_tokens += cached_tokens


async def fan_out(
    chunks: AsyncIterable[ChunkT],
    infer: Callable[[ChunkT], Awaitable[OutcomeT]],
    on_chunk: ChunkHandler[ChunkT, OutcomeT],
    *,
    max_in_flight: int,
    phase: Callable[[ChunkT], Hashable] | None = None,
) -> FanOutStats:
    """Send every chunk to `infer`, at most `max_in_flight` at once, and hand each result to `on_chunk`.

    Args:
        chunks: The chunks, produced as they are needed.
        infer: Runs one chunk (a Flyte task, or any async function).
        on_chunk: Called with each finished chunk's outcome (`None` and why, when it failed).
        max_in_flight: Chunks outstanding at once.
        phase: Each chunk's phase (`None`: any): a chunk of another phase than the last one's is sent only
            once every chunk in flight has finished (a run's base models, each replica closing one model
            before it loads the next).

    Raises:
        UnrecoverableRunError: A chunk failed with an error that retrying cannot fix.
        Exception: What `on_chunk` raised: a chunk's answers that cannot be kept stop the run (no chunk
            is sent after it), rather than being lost while the rest goes on.
    """
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
    load_lazy_modules()
    fanning = _FanOut(infer, on_chunk, max_in_flight)
    await fanning.feed(chunks, phase or (lambda _chunk: None))
    return fanning.result()


def load_lazy_modules() -> None:
    """Finish loading the modules that flyte left to load on first use (`LAZY_MODULES`), in this thread.

    flyte registers pandas and pyarrow with `importlib.util.LazyLoader`, which runs the module on its
    first attribute access; on Python 3.11 that is not thread-safe, and chunks converted by flyte in
    several threads at once saw a half-loaded pandas ("module 'pandas' has no attribute 'DataFrame'")
    and failed. Touching each one here, before any chunk is sent, loads it once.
    """
    for name in LAZY_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            getattr(module, "__file__", None)  # any attribute access runs a lazy module's code


class _FanOut(Generic[ChunkT, OutcomeT]):
    """One `fan_out`: its slots, its chunks in flight, and the first error that stops it."""

    def __init__(
        self, infer: Callable[[ChunkT], Awaitable[OutcomeT]], on_chunk: ChunkHandler[ChunkT, OutcomeT], slots: int
    ) -> None:
        self.infer = infer
        self.on_chunk = on_chunk
        self.started = time.time()
        self.stats = FanOutStats(started_at=self.started)
        self.slots = asyncio.Semaphore(slots)
        self.running: set[asyncio.Task[None]] = set()
        self.fatal: list[BaseException] = []

    async def feed(self, chunks: AsyncIterable[ChunkT], phase: Callable[[ChunkT], Hashable]) -> None:
        """Start a chunk whenever a slot is free (and its phase has come), until the chunks run out or an error
        stops the run."""
        current: Hashable = None
        try:
            async for chunk in chunks:
                this = phase(chunk)
                if this is not None and this != current:
                    await self._drain()  # the last phase's chunks finish before this one's start
                    current = this
                self.stats.held_back |= self.slots.locked()
                await self.slots.acquire()
                if self.fatal:
                    self.slots.release()
                    break
                task = asyncio.create_task(self._run(chunk, current))
                self.running.add(task)
                task.add_done_callback(self.running.discard)
            self.stats.reading = False
            await self._drain()
        finally:
            for task in self.running:
                task.cancel()

    async def _drain(self) -> None:
        """Wait until no chunk is in flight, or an error stops the run."""
        while self.running and not self.fatal:
            await asyncio.wait(set(self.running), return_when=asyncio.FIRST_COMPLETED)

    async def _run(self, chunk: ChunkT, phase: Hashable) -> None:
        try:
            outcome: OutcomeT | None = await self.infer(chunk)
            reason = ""
        except Exception as error:
            if not_retryable(error):
                self.fatal.append(error)
                return
            logger.error("chunk %d failed after retries: %s", chunk.index, error)
            outcome, reason = None, f"chunk failed: {error}"
        finally:
            self.slots.release()
        self.stats.record(outcome, self.started, phase)
        try:
            await self.on_chunk(chunk, outcome, reason)
        except Exception as error:  # its answers could not be kept: going on would lose them, so the run stops
            self.fatal.append(error)

    def result(self) -> FanOutStats:
        """The run's statistics, or the error that stopped it."""
        if self.fatal:
            if not_retryable(self.fatal[0]):
                raise UnrecoverableRunError(str(self.fatal[0])) from self.fatal[0]
            raise self.fatal[0]
        self.stats.wall_s = time.time() - self.started
        return self.stats


def not_retryable(error: BaseException) -> bool:
    """Whether a chunk failed in a way that retrying cannot fix (the task raised `NonRecoverableError`)."""
    return isinstance(error, flyte.errors.NonRecoverableError) or getattr(error, "code", "") == "NonRecoverableError"


class JsonLines:
    """A JSONL file written line by line as results arrive (nothing is kept in memory).

    Args:
        path: Where to write it (its folder is created).
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.count = 0
        self._handle: IO[str] = path.open("w", encoding="utf-8")

    def write(self, line: dict[str, Any]) -> None:
        self._handle.write(json.dumps(line, ensure_ascii=False) + "\n")
        self.count += 1

    def close(self) -> None:
        self._handle.close()


def check_failures(failed: int, total: int, max_failed_fraction: float, where: str, noun: str = "requests") -> None:
    """Fail the run (non-zero exit) when more requests failed than allowed; the results are written first.

    Raises:
        RuntimeError: More than `max_failed_fraction` of `total` failed, or everything did.
    """
    if not failed:
        return
    fraction = failed / total if total else 1.0
    if failed == total or fraction > max_failed_fraction:
        raise RuntimeError(
            f"{failed} of {total} {noun} failed ({fraction:.1%}, allowed: {max_failed_fraction:.1%}); {where}. "
            "Raise max_failed_fraction (the option of that name) to accept failures."
        )


async def finish_run(
    counts: Counts,
    fanned: FanOutStats,
    *,
    source: str,
    work: WorkFolder,
    results: Path,
    errors: Path,
    run: RunOptions,
    progress: Progress,
    pool: ReplicaPool | None = None,
    noun: str = "requests",
    accuracy: float = 0.0,
    scored: int = 0,
    models: list[ModelRun] | None = None,
) -> RunSummary:
    """Publish the results and errors files, show the final report, print the summary and report lines.

    With the replicas' `pool`, also print one warning when their engines were starved (`occupancy_warning`);
    with `models` (a run that named several base models), a line per model.

    Raises:
        RuntimeError: Publishing failed (the message names the folder that holds the files), or more
            requests failed than `run.max_failed_fraction` allows (after all of the above).
    """
    summary = RunSummary(
        source=source,
        requests=counts.done,
        answered=counts.done - counts.failed,
        failed=counts.failed,
        reused=counts.reused,
        retried=counts.retried,
        accuracy=accuracy,
        scored=scored,
        load_time_s=fanned.load_time_s,
        inference_s=fanned.inference_s,
        requests_per_s=fanned.per_second(counts.fresh_answers),
        output_tokens_per_s=fanned.per_second(counts.fresh_tokens),
        prompt_tokens=counts.fresh_prompt_tokens,
        cached_tokens=counts.fresh_cached_tokens,
        results=File(path=str(results)),
        errors=File(path=str(errors)),
        occupancy=fanned.occupancy(),
        models=list(models or []),
    )
    unpublished: PublishError | None = None
    try:
        summary.results, summary.errors = await work.publish([results, errors])
    except PublishError as error:  # the files stay in the work folder, where the summary points
        unpublished = error
    warning = occupancy_warning(fanned, run, pool) if pool is not None else ""
    await progress.finish(final_html(summary, fanned.replicas, warning, started_at=fanned.started_at or None))
    _print_summary(summary, noun, warning)
    if unpublished is not None:
        raise unpublished
    check_failures(summary.failed, summary.requests, run.max_failed_fraction, f"see {summary.errors.path}", noun)
    return summary


def _print_summary(summary: RunSummary, noun: str, warning: str) -> None:
    """The summary line, a line per model (a run of several), the warning if any, and where the report is."""
    print(summary_line(summary, noun), flush=True)
    for part in summary.models:
        print(model_line(part), flush=True)
    if warning:
        logger.warning(warning)
        print(f"WARNING: {warning}", flush=True)
    print_report_location()


def summary_line(summary: RunSummary, noun: str) -> str:
    """The one line a run prints: outcome, throughput (model loading excluded) and where the results are."""
    accuracy = f"accuracy {summary.accuracy:.1%} on {summary.scored} scored | " if summary.scored else ""
    reused = f", {summary.reused} reused from an earlier run" if summary.reused else ""
    reused += f", {summary.retried} retried" if summary.retried else ""
    occupancy = f", engines {summary.occupancy:.0%} full" if summary.occupancy is not None else ""
    return (
        f"{accuracy}answered {summary.answered}/{summary.requests} {noun}, {summary.failed} failed{reused} | "
        f"{summary.requests_per_s:.2f} {noun}/s, {summary.output_tokens_per_s:.0f} output tokens/s{occupancy} "
        f"(inference {summary.inference_s:.1f} s, model load {summary.load_time_s:.1f} s) | "
        f"{prompt_tokens_text(summary.prompt_tokens, summary.cached_tokens)} | "
        f"results: {summary.results.path} | errors: {summary.errors.path}"
    )


def model_line(part: ModelRun) -> str:
    """The line a run that named several base models prints for each: its lines, its load and its share of the run."""
    failed = f", {part.failed} failed" if part.failed else ""
    return (
        f"model {part.model}: {part.requests} requests{failed} | model load {part.load_time_s:.1f} s | "
        f"{part.wall_s:.1f} s, {part.share:.0%} of the run"
    )


def occupancy_warning(fanned: FanOutStats, run: RunOptions, pool: ReplicaPool) -> str:
    """One line naming the setting to raise when the engines ran under `LOW_OCCUPANCY` while chunks waited here.

    The driver's cap binds first when it is below every replica's slots; otherwise the replicas
    take too few calls (or too small ones) to fill their engines. Empty when there is nothing to say.
    """
    occupancy = fanned.occupancy(while_waiting=True)
    # An engine that counted no steps (vLLM with its statistics off) says nothing of its occupancy.
    capacity = max((replica.max_num_seqs for replica in fanned.replicas if replica.engine_steps), default=0)
    if not fanned.held_back or not capacity or occupancy is None or occupancy >= LOW_OCCUPANCY:
        return ""
    cap = run.chunks_in_flight(pool)
    starved = (
        f"the engines were {occupancy:.0%} full (running sequences over max_num_seqs={capacity}) while chunks "
        f"waited in the driver"
    )
    if cap < pool.chunks_in_flight:
        return (
            f"{starved}: raise --max_chunks_in_flight (now {cap}; 0 fills every replica's slots: "
            f"{pool.replicas} replicas x {pool.concurrency} = {pool.chunks_in_flight})"
        )
    setting = f"{pool.prefix}_CONCURRENCY" if pool.prefix else "the replicas' concurrency"
    sized = size_in_flight(capacity, pool.replicas, chunk_size=run.chunk_size).concurrency
    advice = f"size_in_flight gives {sized}" if sized > pool.concurrency else f"try {2 * pool.concurrency}"
    return (
        f"{starved}: raise {setting} (now {pool.concurrency} calls of {run.chunk_size} requests per replica; "
        f"{advice} for max_num_seqs={capacity})"
    )
