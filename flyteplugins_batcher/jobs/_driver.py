"""The driver side of the jobs: fan chunks out to the replicas, keep what finishes, account for the rest.

Chunks are produced lazily and at most `max_in_flight` are outstanding, so a driver reading a
million-line file holds a bounded amount of it. Each finished chunk is handed to the workflow's
`on_chunk` at once (which writes its results out), so nothing accumulates either. A chunk that fails
after Flyte's retries is reported by its records, and the run goes on; a failure that retrying
cannot fix (a missing model, say) stops the whole run at once with its message.

Nothing here imports a workload (an engine, a model, a replica): `fan_out` takes any `infer`
callable, a Flyte task or a plain async function. What the fan-out saw (`FanOutStats`: each
replica's latest state, model loads, how full the engines were) goes to the run's end
(`flyteplugins_batcher/jobs/_finish.py`).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterable, Awaitable, Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import Generic, Protocol, TypeVar

import flyte.errors

from flyteplugins_batcher import BatcherError
from flyteplugins_batcher.replica import ReplicaSnapshot

logger = logging.getLogger("flyteplugins_batcher.jobs._driver")

LAZY_MODULES = ("pandas", "pyarrow")
"""Modules flyte imports lazily (`importlib.util.LazyLoader`): loaded at once before chunks run side by side."""


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


class UnrecoverableRunError(BatcherError, RuntimeError):
    """A chunk failed in a way no retry can fix; the run stops with its message."""


Lane = tuple[str, str]
"""A replica's work on one base model: (replica, model). A replica that swaps models has a lane per model."""

Span = tuple[float, float]
"""A stretch of time: when it began and ended, epoch seconds."""


@dataclass
class FanOutStats:
    """What the fan-out saw."""

    wall_s: float = 0.0
    latest: dict[Lane, ReplicaSnapshot] = field(default_factory=dict)  # each lane's latest state
    first: dict[Lane, ReplicaSnapshot] = field(default_factory=dict)  # each lane's first state in this run
    while_waiting: dict[Lane, ReplicaSnapshot] = field(default_factory=dict)  # latest while chunks were still to send
    loads: dict[Hashable, dict[str, set[Span]]] = field(default_factory=dict)  # by phase and model: the loads seen
    unplaced_load: bool = False  # a replica reported a load without saying when it was
    started_at: float = 0.0  # when the fan-out started (epoch seconds): where the report's charts begin
    reading: bool = True  # the driver still had chunks to send
    held_back: bool = False  # the driver held chunks back at its cap at least once

    @property
    def load_time_s(self) -> float:
        """Model loading in the run's wall time: the slowest load of each phase (whose models load one phase after
        the other), each cut to the run, overlapping ones counted once.

        Only what fell inside the run counts: a load that began before it (a command line's preload) from the run's
        start; one that ended before it (a warm replica's, a model the process had loaded) not at all; reused chunks
        load nothing.
        """
        return _covered([max(models.values(), key=_length) for models in self._loads_in_run().values()])

    @property
    def model_loads(self) -> dict[str, float]:
        """Each model's slowest load in this run (its part inside the run), by the name its replicas report."""
        loads: dict[str, float] = {}
        for models in self._loads_in_run().values():
            for model, span in models.items():
                loads[model] = max(loads.get(model, 0.0), _length(span))
        return loads

    def _loads_in_run(self) -> dict[Hashable, dict[str, Span]]:
        """Each phase's slowest load of each model, cut to the run's wall time."""
        end = self.started_at + self.wall_s

        def inside(span: Span) -> Span:
            start = min(max(span[0], self.started_at), end)
            return start, max(min(span[1], end), start)

        return {
            phase: {model: max(map(inside, spans), key=_length) for model, spans in models.items()}
            for phase, models in self.loads.items()
        }

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
    def inference_s(self) -> float | None:
        """The run's wall time less model loading (`load_time_s`).

        `None` where it cannot be known: a replica reported a load without saying when it was, or the loads, as
        the replicas' clocks place them, fill the whole run (a replica's clock ahead of the driver's).
        """
        left = self.wall_s - self.load_time_s
        return None if self.unplaced_load or left <= 0 else left

    def per_second(self, amount: float) -> float | None:
        """`amount` per second of inference; `None` where the inference time is not known."""
        seconds = self.inference_s
        return None if seconds is None else amount / seconds

    def record(self, outcome: Outcome | None, started: float, phase: Hashable = None) -> None:
        """Count a finished chunk (`None`: it failed) and keep its lane's latest state, if this run computed it.

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
        if snapshot.load_time_s and not snapshot.loaded_at:
            self.unplaced_load = True
        load = (snapshot.loaded_at - snapshot.load_time_s, snapshot.loaded_at)  # cut to the run at its end
        self.loads.setdefault(phase, {}).setdefault(snapshot.model, set()).add(load)

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


def _length(span: Span) -> float:
    return span[1] - span[0]


def _covered(spans: list[Span]) -> float:
    """The time the spans cover, overlaps counted once."""
    covered, reached = 0.0, float("-inf")
    for start, end in sorted(spans):
        covered += max(end - max(start, reached), 0.0)
        reached = max(reached, end)
    return covered


def _newer(known: ReplicaSnapshot | None, seen: ReplicaSnapshot) -> ReplicaSnapshot:
    """The later of two states of one replica (chunks finish out of order; its counters only grow)."""
    return seen if known is None or known.records <= seen.records else known


def _older(known: ReplicaSnapshot | None, seen: ReplicaSnapshot) -> ReplicaSnapshot:
    return seen if known is None or seen.records < known.records else known


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
        self.clock = time.monotonic()  # the wall time, by a clock that no adjustment of the system's moves
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
        self.stats.wall_s = time.monotonic() - self.clock
        return self.stats


def not_retryable(error: BaseException) -> bool:
    """Whether a chunk failed in a way that retrying cannot fix (the task raised `NonRecoverableError`)."""
    return isinstance(error, flyte.errors.NonRecoverableError) or getattr(error, "code", "") == "NonRecoverableError"
