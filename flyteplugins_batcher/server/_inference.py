"""The models the server answers with: this process's LLM replica and embedding function.

They are the replicas the jobs' tasks use (`flyteplugins_batcher.replica`: `LLMReplica` around a
`SharedBatcher`, `EmbeddingReplica` around a batched function), so an online request and a batch line
are records in the same batchers, batched with every other request in flight. The server makes its
own and installs them as the process's, so that a local Flyte run in this process uses them too.
Online requests are submitted with a higher priority than batch lines: when the queue backs up,
a user waiting on an answer goes first, and a waiting batch line gains a priority level per
`priority_aging_s`, so batches are slowed, not starved (a line that has waited 5 minutes goes before
new online requests). An online request never waits for room
in the queue: a full queue is a `QueueFullError`, which the server answers with 429.

With an online target (`online_ttft_slo_s`, `online_tpot_slo_s`), an online request's record carries an
`OnlineTimer`, which notes its first token, and batch lines wait for the room the target leaves them
(`_online_slo.OnlineSlo`); online requests beyond what the engine serves within it are refused
(`OnlineOverloadedError`, answered 429).

An online request is an `OnlineRecord`: its future, and the cancellation token its `Request`
carries. When its client leaves, `OnlineRecord.cancel` cancels both: a queued record never reaches
the engine, and a running one stops at the engine's next step where the engine can stop it (vLLM
stream mode, the simulated engine, Transformers); it then counts as `cancelled` in the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from flyteplugins_batcher import BatchObserver, BatchStats, TokenBatcher
from flyteplugins_batcher.batch_api import BatchRequest, EmbeddingRequest
from flyteplugins_batcher.engines import (
    CancellationToken,
    Completion,
    DeltaListener,
    Embedding,
    Engine,
    EngineNotLoadedError,
)
from flyteplugins_batcher.replica import (
    EmbeddingChunk,
    EmbeddingReplica,
    EngineSettings,
    JobChunk,
    JobOutcome,
    LLMReplica,
)
from flyteplugins_batcher.server._online_slo import (
    OnlineSlo,
    OnlineTarget,
    OnlineTimer,
    OnlineTimes,
    times_of,
    tokens_per_choice,
)

ONLINE_PRIORITY = 30
"""Online requests' priority in the shared batchers; batch lines have 0.

A waiting record gains a level per `priority_aging_s` (10 s), so a batch line overtakes new online
requests only after waiting 5 minutes: batches are slowed, not starved. At 1, a batch of a few
thousand lines (each waiting over 10 s in the queue) caught up with online requests at once, and
they waited behind it: the online p99 beside a batch was 16x its idle value."""

ENGINE_QUEUE_SHARE = 0.25
"""Records a self-scheduling engine may hold waiting, beyond those it runs, as a share of its capacity."""


def server_admission(engine: Engine) -> dict[str, object]:
    """Batcher keywords that keep a server's queue in its batcher, where online requests go first.

    An engine that schedules requests itself (vLLM stream mode, the simulated engine) gets records
    the moment they arrive, and a batch job keeps up to 4x its capacity inside it
    (`engines/_stream_defaults.py`), in the engine's own first-come queue. An online request would
    wait behind all of them: on the GPU-timed engine, a batch running beside online traffic made
    the online p99 24x its idle value. A server lets the engine hold its capacity and a quarter
    more (enough to refill the slots freed at each step), and keeps the rest in the batcher, where
    `ONLINE_PRIORITY` puts a user's request ahead of batch lines.
    """
    slots = engine_slots(engine)
    return {} if slots is None else {"max_concurrent_batches": engine_holds(slots)}


def engine_slots(engine: Engine) -> int | None:
    """The sequences an engine that schedules requests itself runs at once (`None`: one that takes whole batches)."""
    capacity = engine.stats.max_num_seqs
    if not capacity or engine.batcher_defaults().max_batch_size != 1:
        return None
    return capacity


def engine_holds(slots: int) -> int:
    """The records a server lets a self-scheduling engine hold: its slots and `ENGINE_QUEUE_SHARE` more."""
    return math.ceil(slots * (1 + ENGINE_QUEUE_SHARE))


@dataclass(frozen=True)
class OnlineRecord:
    """One online request in the LLM's batcher: its future, and the token that stops it where it runs.

    Attributes:
        future: Resolves with its `Completion` (or its error).
        cancellation: The token its `Request` carries.
        choices: How many choices it asked for (`n`).

    Example:
        ```python
        record = await inference.start(request)
        try:
            completion = await record.future
        finally:
            record.cancel()  # nothing happens once it has its answer
        ```
    """

    future: asyncio.Future[Completion]
    cancellation: CancellationToken
    choices: int = 1

    def cancel(self) -> None:
        """Its client left: a queued record never runs, a running one stops where the engine can stop it.

        Nothing happens once it has its answer (or its error).
        """
        if self.future.done() and not self.future.cancelled():
            return
        self.future.cancel()
        self.cancellation.cancel()


class Inference:
    """This process's LLM and embedding model, as the server's endpoints and batch runner use them.

    Args:
        engine: The LLM engine's settings.
        embeddings: Whether to serve embeddings (the embedding model loads with `load`).
        llm_observers: Told of every batch of the LLM's batcher (the metrics).
        embedding_observers: Told of every batch of the embedding batcher.
        online_target: The online requests' latency target (none set: online requests and batch
            lines share the engine with no room kept).
        on_online_times: Told each timed online request's times (a streamed one's, and with a
            target every one's): the metrics.

    Example:
        ```python
        inference = Inference(EngineSettings(engine="simulated"), embeddings=False)
        await inference.load()
        completion = await inference.complete(request)
        ```
    """

    def __init__(
        self,
        engine: EngineSettings,
        *,
        embeddings: bool,
        llm_observers: Sequence[BatchObserver] = (),
        embedding_observers: Sequence[BatchObserver] = (),
        online_target: OnlineTarget | None = None,
        on_online_times: Callable[[OnlineTimes], None] | None = None,
    ) -> None:
        self.engine_settings = engine
        self.embeddings = embeddings
        self._llm_observers = list(llm_observers)
        self._embedding_observers = list(embedding_observers)
        self.slo = OnlineSlo(online_target) if online_target is not None and online_target.is_set else None
        self._on_online_times = on_online_times
        self._judging: asyncio.Task[None] | None = None
        admit = self.slo.room.admitted if self.slo is not None else None
        self.replica = LLMReplica(make_batcher=self._observed_batcher, admit=admit)
        self.embedding_replica = EmbeddingReplica() if embeddings else None

    @property
    def engine(self) -> Engine | None:
        """The loaded LLM engine, if one is."""
        return self.replica.shared.loaded_model

    @property
    def context_length(self) -> int:
        """The loaded LLM's context in tokens; 0 (unknown) while none is loaded."""
        engine = self.engine
        try:
            return engine.context_length if engine is not None else 0
        except EngineNotLoadedError:  # closed meanwhile
            return 0

    @property
    def llm_stats(self) -> BatchStats | None:
        """The LLM batcher's statistics, once it runs."""
        batcher = self.replica.shared.batcher
        return batcher.stats if batcher is not None else None

    @property
    def embedding_stats(self) -> BatchStats | None:
        """The embedding batcher's statistics, once it runs."""
        replica = self.embedding_replica
        return replica.embed.stats if replica is not None and replica.embed.batcher is not None else None

    @property
    def served_model(self) -> str:
        """The LLM's name, as requests name it and answers carry it."""
        engine = self.engine
        return engine.model_name if engine is not None else ""

    @property
    def adapters(self) -> tuple[str, ...]:
        """The LoRA adapters served beside the LLM (`EngineSettings.lora_modules`): a request's `model` may name one."""
        return tuple(self.engine_settings.adapters())

    @property
    def embedding_model(self) -> str | None:
        """The embedding model's name, or `None` when embeddings are not served."""
        return self.embedding_replica.model.name if self.embedding_replica is not None else None

    async def load(self) -> None:
        """Load the LLM (and the embedding model), and start the LLM's batcher on this event loop.

        They are this process's replicas from now on: a local Flyte run in this process runs its chunks on them.
        """
        self.replica.install()
        await self.replica.shared.get(self.engine_settings)
        if self.slo is not None and self._judging is None:
            engine = self.engine
            slots = engine_slots(engine) if engine is not None else None
            self.slo.set_engine(slots, engine_holds(slots) if slots is not None else None)
            self._judging = asyncio.create_task(self.slo.run(), name="online-slo")
        if self.embedding_replica is not None:
            self.embedding_replica.install()
            await self.embedding_replica.load()
            for observer in self._embedding_observers:
                self.embedding_replica.embed.add_observer(observer)

    async def complete(self, request: BatchRequest) -> Completion:
        """One online request's completion, batched with everything else in flight; cancelled if this is.

        Raises:
            QueueFullError: The batcher's queue is full (answer 429).
            InvalidPromptError: The request cannot run (too long, a schema that does not compile, ...).
            Exception: The engine failed (it died, say).
        """
        record = await self.start(request)
        try:
            return await record.future
        finally:
            record.cancel()

    def check(self, request: BatchRequest) -> None:
        """Raise the `InvalidPromptError` the engine would answer `request` with (`Engine.check`).

        Nothing is checked before the engine loads.
        """
        engine = self.engine
        if engine is not None:
            engine.check(request.engine_request(self.engine_settings.generation()))

    async def start(self, request: BatchRequest, *, on_delta: DeltaListener | None = None) -> OnlineRecord:
        """Submit one online request, ahead of batch lines; `on_delta` hears its text as a streaming engine makes it.

        Raises:
            QueueFullError: The batcher's queue is full (answer 429).
            OnlineOverloadedError: Online requests alone are more than the online target allows (answer 429).
        """
        batcher = await self.replica.shared.get(self.engine_settings)
        timer = self._timer(on_delta)
        token = CancellationToken()
        record = dataclasses.replace(
            request.engine_request(self.engine_settings.generation()),
            cancellation=token,
            on_delta=timer or on_delta,
        )
        try:
            future = await batcher.submit(record, priority=ONLINE_PRIORITY, wait_for_room=False)
        except BaseException:
            if timer is not None and self.slo is not None:
                self.slo.finished(timer, None)
            raise
        if timer is not None:
            future.add_done_callback(functools.partial(self._timed, timer))
        return OnlineRecord(future, token, record.generation.n if record.generation is not None else 1)

    def _timer(self, on_delta: DeltaListener | None) -> OnlineTimer | None:
        """The timer an online record carries: every one's with a target (which may refuse it), a stream's without."""
        if self.slo is not None:
            return self.slo.admit(on_delta)
        return OnlineTimer(time.monotonic(), on_delta, time.monotonic) if on_delta is not None else None

    def _timed(self, timer: OnlineTimer, future: asyncio.Future[Completion]) -> None:
        """An online record ended: its times to the target's judge and the metrics (none when it failed or left)."""
        answered = not future.cancelled() and future.exception() is None
        tokens = tokens_per_choice(future.result()) if answered else None
        if self.slo is not None:
            times = self.slo.finished(timer, tokens)
        else:
            times = times_of(timer, tokens, time.monotonic()) if tokens is not None else None
        if times is not None and self._on_online_times is not None:
            self._on_online_times(times)

    async def embed(self, request: EmbeddingRequest) -> list[Embedding]:
        """One online request's vectors, each text batched with everything else in flight.

        Raises:
            QueueFullError: The embedding batcher's queue is full (answer 429).
            EmptyDocumentError: A text has no embedding (the client's mistake).
            Exception: The model failed (the server's: not the text's fault, whatever its type).
        """
        replica = self._embedding()
        outcomes = await replica.embed_texts(list(request.inputs), priority=ONLINE_PRIORITY, wait_for_room=False)
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome
        return outcomes  # type: ignore[return-value]

    async def run_chunk(self, chunk: JobChunk, *, stop: asyncio.Event | None = None) -> JobOutcome:
        """A chunk of a batch job's lines, as the workflows' replicas run one; once `stop` is set, the rest stops.

        A line stopped so (queued: it never runs; running: it stops where the engine can stop it) has
        no answer (`ItemResult.was_stopped`).
        """
        if isinstance(chunk, EmbeddingChunk):
            return await self._embedding().run_chunk(chunk)
        return await self.replica.run_chunk(chunk, self.engine_settings, stop=stop)

    async def aclose(self) -> None:
        """Stop the batchers and close the models."""
        if self._judging is not None:
            self._judging.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._judging
            self._judging = None
        await self.replica.aclose()
        if self.embedding_replica is not None:
            await self.embedding_replica.aclose()

    def _embedding(self) -> EmbeddingReplica:
        if self.embedding_replica is None:
            raise RuntimeError("this server does not serve embeddings")
        return self.embedding_replica

    def _observed_batcher(self, engine: Engine, settings: EngineSettings) -> TokenBatcher:
        keywords = settings.batcher_keywords()
        if "latency_slo_s" in keywords:  # the online requests' target: batch lines have none
            keywords["latency_slo_s"] = {ONLINE_PRIORITY: keywords["latency_slo_s"]}
        batcher = engine.batcher(**keywords, **server_admission(engine))
        for observer in self._llm_observers:
            batcher.add_observer(observer)
        return batcher
