"""A fleet of replica processes behind a router that queues calls the way Flyte does, fed by the real JSONL job.

- `ReplicaProcess`: one spawned process running the real replica code path
  (`LLMReplica.run_chunk`, `flyteplugins_batcher.replica`: the shared batcher, the engine's `TokenBatcher` settings,
  stream mode) around whichever engine the settings name (the simulated GPU, or real vLLM).
  Calls and their results travel over pipes; `kill()` ends it with SIGKILL.
- `Router`: Flyte's queue in front of reusable replicas. A call waits (FIFO) until any live
  replica has one of its `concurrency` slots free, travels there for `latency_s`, runs, and its
  result travels back for `latency_s` (the slot frees when the replica finishes). A call whose
  replica died is retried on the others, as Flyte retries a chunk whose task died.
- `run_job`: the real driver (`flyteplugins_batcher.jobs._driver.fan_out` over
  `flyteplugins_batcher.jobs._jsonl.job.Job`'s chunks, results written to `results.jsonl` by the job)
  through a `Router`, optionally killing one replica halfway; it returns what happened, with every replica state
  the chunks brought back.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flyteplugins_batcher import BlockingProcessFnWarning
from flyteplugins_batcher.batch_api import parse_request_line
from flyteplugins_batcher.engines import Request
from flyteplugins_batcher.jobs._driver import fan_out
from flyteplugins_batcher.jobs._jsonl.job import Job
from flyteplugins_batcher.replica import (
    ChatMessage,
    ChunkOutcome,
    EngineSettings,
    ReplicaSnapshot,
    RequestChunk,
    RequestItem,
)

_STOP_TIMEOUT_S = 20.0


class ReplicaDiedError(RuntimeError):
    """The replica process running a call ended before answering it."""


# -- the request file ------------------------------------------------------------------------------


def questions_from(path: Path | None) -> list[str]:
    """gsm8k-style questions from a JSONL file with a "question" field; synthetic text when there is none."""
    if path is not None and path.is_file():
        with path.open(encoding="utf-8") as lines:
            questions = [json.loads(line)["question"] for line in lines if line.strip()]
        if questions:
            return questions
    from benchmarks.bench_sim_timescale import synthetic_prompts

    return synthetic_prompts(997, min_chars=120, max_chars=600)


def write_requests(path: Path, count: int, questions: Sequence[str], *, max_tokens: int) -> Path:
    """`count` OpenAI batch lines, the questions repeated with varied ids (each line's text differs too)."""
    with path.open("w", encoding="utf-8") as lines:
        for number in range(count):
            question = questions[number % len(questions)]
            body = {
                "messages": [{"role": "user", "content": f"Problem {number}: {question}"}],
                "max_tokens": max_tokens,
            }
            request = {"custom_id": f"req-{number:06d}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            lines.write(json.dumps(request) + "\n")
    return path


def request_items(path: Path) -> list[RequestItem]:
    """The chunk item of every line, as the JSONL job makes it."""
    with path.open(encoding="utf-8") as lines:
        return [
            RequestItem.of(parse_request_line(text, number))
            for number, text in enumerate(lines, start=1)
            if text.strip()
        ]


def engine_requests(path: Path, settings: EngineSettings) -> list[Request]:
    """The engine `Request` of every line, as a replica builds it (for the offline ideal)."""
    defaults = settings.generation()
    return [item.engine_request(defaults) for item in request_items(path)]


# -- the replica process ---------------------------------------------------------------------------


def serve_replica(calls: multiprocessing.connection.Connection, answers: multiprocessing.connection.Connection) -> None:
    """A replica process's body: answer calls until told to stop (`None`) or the driver goes away."""
    logging.basicConfig(level=logging.WARNING)
    # A replica process descheduled by the CPU's other work looks like a blocking step; `lag_s` reports it.
    warnings.simplefilter("ignore", BlockingProcessFnWarning)
    logging.getLogger("flyteplugins_batcher").setLevel(logging.ERROR)
    asyncio.run(_serve(calls, answers))


async def _serve(calls: multiprocessing.connection.Connection, answers: multiprocessing.connection.Connection) -> None:
    from flyteplugins_batcher.replica import LLMReplica

    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[Any] = asyncio.Queue()

    def read() -> None:  # a thread: the pipe blocks
        while True:
            try:
                message = calls.recv()
            except (EOFError, OSError):
                message = None
            loop.call_soon_threadsafe(inbox.put_nowait, message)
            if message is None:
                return

    threading.Thread(target=read, daemon=True, name="calls").start()
    running: set[asyncio.Task[None]] = set()
    while (message := await inbox.get()) is not None:
        task = asyncio.create_task(_answer(message, answers))
        running.add(task)
        task.add_done_callback(running.discard)
    await LLMReplica.of_process().aclose()


async def _answer(message: tuple[str, int, Any], answers: multiprocessing.connection.Connection) -> None:
    from flyteplugins_batcher.replica import LLMReplica

    kind, call_id, payload = message
    try:
        if kind == "chunk":
            value: Any = await LLMReplica.of_process().run_chunk(*payload)
        elif kind == "load":  # load the engine; its state before any work
            replica = LLMReplica.of_process()
            batcher = await replica.shared.get(payload)
            value = replica.snapshot(batcher, replica.shared.loaded_model)
        else:  # "probe": what the harness itself costs
            engine = LLMReplica.of_process().shared.loaded_model
            value = {"cpu_s": time.process_time(), "lag_s": getattr(engine, "lag_s", 0.0)}
        answers.send((call_id, True, value))
    except Exception as error:
        answers.send((call_id, False, f"{type(error).__name__}: {error}"))


class ReplicaProcess:
    """One replica process and the driver's end of its pipes; start `listen()` on the driver's loop.

    Args:
        index: Its number in the fleet.
        context: A multiprocessing context (spawn: a fresh interpreter, as a replica container is).
    """

    def __init__(self, index: int, context: Any) -> None:
        self.index = index
        calls_in, self._calls = context.Pipe(duplex=False)
        self._answers, answers_out = context.Pipe(duplex=False)
        # Not a daemon: a replica may start processes of its own (vLLM's engine core).
        self.process = context.Process(target=serve_replica, args=(calls_in, answers_out), name=f"replica-{index}")
        self.process.start()
        calls_in.close()
        answers_out.close()
        self.alive = True
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None

    def listen(self) -> None:
        """Deliver answers on the running loop, from a reader thread."""
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._read, daemon=True, name=f"answers-{self.index}").start()

    async def call(self, kind: str, payload: Any) -> Any:
        """Send a call and await its answer.

        Raises:
            ReplicaDiedError: The process is gone (before or while answering).
            RuntimeError: The call failed on the replica (its message).
        """
        if not self.alive:
            raise ReplicaDiedError(f"replica {self.index} is dead")
        assert self._loop is not None, "listen() first"
        call_id = next(self._ids)
        future = self._loop.create_future()
        self._pending[call_id] = future
        try:
            self._calls.send((kind, call_id, payload))
        except OSError:
            self._died()
        return await future

    def kill(self) -> None:
        """End the process at once (SIGKILL), as a node that disappears."""
        if self.process.pid is not None:
            os.kill(self.process.pid, signal.SIGKILL)

    def stop(self) -> None:
        """Ask the process to finish, then make sure it has."""
        with contextlib.suppress(OSError):
            self._calls.send(None)
        self.process.join(_STOP_TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(_STOP_TIMEOUT_S)

    def _read(self) -> None:
        assert self._loop is not None
        while True:
            try:
                answer = self._answers.recv()
            except (EOFError, OSError):
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                    self._loop.call_soon_threadsafe(self._died)
                return
            self._loop.call_soon_threadsafe(self._settle, answer)

    def _settle(self, answer: tuple[int, bool, Any]) -> None:
        call_id, ok, value = answer
        future = self._pending.pop(call_id, None)
        if future is None or future.done():
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(RuntimeError(f"replica {self.index}: {value}"))

    def _died(self) -> None:
        self.alive = False
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ReplicaDiedError(f"replica {self.index} died"))


def start_fleet(count: int) -> list[ReplicaProcess]:
    """`count` replica processes, started with spawn."""
    context = multiprocessing.get_context("spawn")
    return [ReplicaProcess(index, context) for index in range(count)]


# -- the router (Flyte's queue) --------------------------------------------------------------------


class Router:
    """Calls wait FIFO for a free slot on any live replica, travel `latency_s` each way, and are retried if it dies.

    Args:
        replicas: The replicas calls may go to.
        concurrency: Calls one replica runs at once.
        latency_s: One-way travel time of a call and of its result (wall seconds).
        retries: Further attempts for a call whose replica died.
    """

    def __init__(self, replicas: Sequence[ReplicaProcess], concurrency: int, latency_s: float, retries: int) -> None:
        self.replicas = list(replicas)
        self.latency_s = latency_s
        self.retries = retries
        self.retried = 0
        self.last_dispatch = 0.0
        """Epoch seconds when a call last left for a replica: after that, no work waits in the driver or here."""
        self.free = {replica.index: concurrency for replica in self.replicas}
        self.assigned: dict[int, dict[int, int]] = {replica.index: {} for replica in self.replicas}
        """Requests of the chunks each replica holds (in transit or running), by chunk index."""
        self._waiting: deque[asyncio.Future[ReplicaProcess]] = deque()

    async def infer(self, chunk: RequestChunk, settings: EngineSettings) -> ChunkOutcome:
        """Run a chunk on the first replica with a free slot.

        Raises:
            RuntimeError: Every attempt's replica died, or the chunk failed on its replica.
        """
        for attempt in itertools.count():
            replica = await self._take_slot()
            self.assigned[replica.index][chunk.index] = len(chunk.items)
            self.last_dispatch = time.time()
            try:
                await asyncio.sleep(self.latency_s)
                outcome = await replica.call("chunk", (chunk, settings))
            except ReplicaDiedError as error:
                if attempt >= self.retries:
                    raise RuntimeError(f"chunk {chunk.index}: {error}, after {attempt + 1} attempts") from error
                self.retried += 1
                continue
            finally:
                del self.assigned[replica.index][chunk.index]
                self._give_back(replica)
            await asyncio.sleep(self.latency_s)
            return outcome
        raise AssertionError("unreachable")

    def in_flight_on(self, replica: ReplicaProcess) -> int:
        """Requests a replica holds now (its work that a death would lose)."""
        return sum(self.assigned[replica.index].values())

    async def _take_slot(self) -> ReplicaProcess:
        replica = self._free_replica() if not self._waiting else None
        if replica is not None:
            self.free[replica.index] -= 1
            return replica
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        self._dispatch()  # fails the waiter at once when no replica is left
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._give_back(waiter.result())
            raise

    def _give_back(self, replica: ReplicaProcess) -> None:
        if replica.alive:
            self.free[replica.index] += 1
        self._dispatch()

    def _dispatch(self) -> None:
        while self._waiting:
            if not any(replica.alive for replica in self.replicas):
                self._waiting.popleft().set_exception(ReplicaDiedError("no replica is left"))
                continue
            replica = self._free_replica()
            if replica is None:
                return
            waiter = self._waiting.popleft()
            if not waiter.done():
                self.free[replica.index] -= 1
                waiter.set_result(replica)

    def _free_replica(self) -> ReplicaProcess | None:
        """The live replica with the most free slots, if any has one."""
        candidates = [replica for replica in self.replicas if replica.alive and self.free[replica.index] > 0]
        return max(candidates, key=lambda replica: self.free[replica.index], default=None)


# -- a job through the fleet -----------------------------------------------------------------------


@dataclass
class Kill:
    """A replica killed during a run: when (seconds into it), and the requests it held."""

    replica: int
    at_s: float
    requests_lost: int


@dataclass
class JobRun:
    """What one job through the fleet did (wall seconds; states as the replicas reported them).

    Attributes:
        started: Epoch seconds when the driver began.
        wall_s: Start to the last result back at the driver.
        driver_cpu_s: CPU seconds the driver process used meanwhile.
        last_dispatch: Epoch seconds when the last call left for a replica (no work waited anywhere after).
        baseline: Each replica's state before the job, by replica index.
        snapshots: Each replica's states, `(epoch seconds, state)`, one per chunk it finished.
        results: `custom_id`s in `results.jsonl`, in file order.
        errors: Lines in `errors.jsonl`.
        retried: Calls retried after their replica died.
        kill: The replica killed, if one was.
        folder: Where the job wrote its files.
    """

    started: float
    wall_s: float
    driver_cpu_s: float
    last_dispatch: float
    baseline: dict[int, ReplicaSnapshot]
    snapshots: dict[int, list[tuple[float, ReplicaSnapshot]]]
    results: list[str]
    errors: int
    retried: int
    kill: Kill | None
    folder: Path


async def warm_up(replicas: Sequence[ReplicaProcess], settings: EngineSettings) -> dict[int, ReplicaSnapshot]:
    """Load every replica's engine for `settings` and run a few requests on it; each one's state after that.

    The state says the engine's `max_num_seqs` (every engine reports it from its load), and is the
    baseline a job's engine counters are measured from.
    """
    await asyncio.gather(*(replica.call("load", settings) for replica in replicas))
    items = [
        RequestItem(f"warm-up-{number}", messages=[ChatMessage("user", f"Warm up {number}.")]) for number in range(4)
    ]
    outcomes = await asyncio.gather(
        *(replica.call("chunk", (RequestChunk(-1, items), settings)) for replica in replicas)
    )
    return {replica.index: outcome.replica for replica, outcome in zip(replicas, outcomes, strict=True)}


def simulated_job(requests_path: Path, folder: Path, settings: EngineSettings, order: str = "prefix") -> Job:
    """The JSONL job's driver over the file, for the simulated model (a line naming another model runs on it)."""
    served = {"served_model_name": "simulated", "served_embedding_model": "simulated"}
    return Job(requests_path, folder, settings, **served, model_mismatch="ignore", order=order)


async def run_job(
    requests_path: Path,
    folder: Path,
    replicas: Sequence[ReplicaProcess],
    settings: EngineSettings,
    *,
    baseline: dict[int, ReplicaSnapshot],
    chunk_size: int,
    concurrency: int,
    chunks_in_flight: int,
    latency_s: float,
    retries: int = 2,
    kill_at: float | None = None,
    order: str = "prefix",
) -> JobRun:
    """Run the JSONL job in `requests_path` on `replicas` through a `Router`; kill one when `kill_at` of it is done.

    `baseline`: each replica's state before the job (`warm_up`), so the timing starts with warm replicas.
    `order`: how the driver cuts the file into chunks (`RunOptions.order`).
    """
    by_name = {state.replica: index for index, state in baseline.items()}
    router = Router(replicas, concurrency, latency_s, retries)
    job = simulated_job(requests_path, folder, settings, order)
    total = sum(1 for line in requests_path.open(encoding="utf-8") if line.strip())
    snapshots: dict[int, list[tuple[float, ReplicaSnapshot]]] = {index: [] for index in baseline}
    kill: list[Kill] = []
    started, cpu_started = time.time(), time.process_time()

    async def on_chunk(chunk: RequestChunk, outcome: ChunkOutcome | None, reason: str) -> None:
        if outcome is not None:
            snapshots[by_name[outcome.replica.replica]].append((outcome.finished_at, outcome.replica))
        await job.on_chunk(chunk, outcome, reason)
        if kill_at is not None and not kill and job.counts.done >= kill_at * total:
            victim = replicas[0]
            kill.append(Kill(victim.index, time.time() - started, router.in_flight_on(victim)))
            victim.kill()

    try:
        await fan_out(
            job.chunks(chunk_size),
            lambda chunk: router.infer(chunk, settings),
            on_chunk,
            max_in_flight=chunks_in_flight,
        )
    finally:
        job.close()
    wall_s, driver_cpu_s = time.time() - started, time.process_time() - cpu_started
    results = [json.loads(line)["custom_id"] for line in _lines(job.outputs.results.path)]
    errors = sum(1 for _ in _lines(job.outputs.errors.path))
    killed = kill[0] if kill else None
    dispatch = router.last_dispatch
    return JobRun(
        started, wall_s, driver_cpu_s, dispatch, baseline, snapshots, results, errors, router.retried, killed, folder
    )


def _lines(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as lines:
        yield from (line for line in lines if line.strip())
