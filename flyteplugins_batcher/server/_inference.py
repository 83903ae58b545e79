"""The models the server answers with: this process's LLM replica and embedding function, or a classifier.

They are the replicas the jobs' tasks use (`flyteplugins_batcher.replica`: `LLMReplica` around a
`SharedBatcher`, `EmbeddingReplica` around a batched function), so an online request and a batch line
are records in the same batchers, batched with every other request in flight. The server makes its
own and installs them as the process's, so that a local Flyte run in this process uses them too.
What decides whether and when a record goes in (an online request's priority, the engine's hold,
429s for a full queue or past the online latency target, batch lines' quota) is `_admission.py`.

A model that is a sequence classifier (a cross-encoder, say) is served as an encoder, not an LLM:
`classifier` holds its replica (`EmbeddingReplica.for_settings`: on the engine's settings), which
answers score, rerank and classify requests, and no LLM loads.

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
    EmbeddingModel,
    Engine,
    EngineNotLoadedError,
)
from flyteplugins_batcher.replica import (
    EmbeddingChunk,
    EmbeddingItem,
    EmbeddingReplica,
    EmbeddingResult,
    EngineSettings,
    JobChunk,
    JobOutcome,
    LLMReplica,
)
from flyteplugins_batcher.server._admission import (
    ONLINE_PRIORITY,
    OnlineAdmission,
    OnlineTarget,
    OnlineTimer,
    OnlineTimes,
    engine_holds,
    engine_slots,
    server_batcher_keywords,
    times_of,
    tokens_per_choice,
)


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
            lines share the engine with no quota kept).
        on_online_times: Told each timed online request's times (a streamed one's, and with a
            target every one's): the metrics.

    Example:
        ```python
        inference = Inference(EngineSettings(engine="simulated"), embeddings=False)
        await inference.load()
        record = await inference.start(request)
        completion = await record.future
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
        self.admission: OnlineAdmission | None = None  # online requests' target and batch lines' quota: with a target
        if online_target is not None and online_target.is_set:
            self.admission = OnlineAdmission(online_target)
        self._on_online_times = on_online_times
        self._judging: asyncio.Task[None] | None = None
        admit = self.admission.quota.admit_line if self.admission is not None else None
        self.replica = LLMReplica(make_batcher=self._observed_batcher, admit=admit)
        self.embedding_replica = EmbeddingReplica() if embeddings else None
        self.classifier = _classifier(engine)
        """The model as an encoder, when it is a sequence classifier (a cross-encoder): it answers score, rerank and
        classify requests, and there is no LLM."""

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
        """The LLM's (or the classifier's) name, as requests name it and answers carry it."""
        if self.classifier is not None:
            return self.classifier.model.name
        engine = self.engine
        return engine.model_name if engine is not None else ""

    def encoder_tasks(self) -> dict[str, tuple[str, ...]]:
        """The encoder models served, by name, with what each does (`EmbeddingModel.tasks`)."""
        replicas = [replica for replica in (self.embedding_replica, self.classifier) if replica is not None]
        return {replica.model.name: replica.model.tasks for replica in replicas}

    def encoder_for(self, request: EmbeddingRequest) -> EmbeddingReplica:
        """The encoder that answers a request: the one it names, else the classifier when it does the task (it is
        the server's model), else the embedding model."""
        classifier, embedding = self.classifier, self.embedding_replica
        if classifier is None:
            return self._embedding()
        if embedding is None or request.model == classifier.model.name:
            return classifier
        named_embedding = request.model == embedding.model.name
        return classifier if not named_embedding and request.task in classifier.model.tasks else embedding

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
        if self.classifier is not None:
            await self.classifier.load()
        else:
            self.replica.install()
            await self.replica.shared.get(self.engine_settings)
        if self.admission is not None and self._judging is None:
            engine = self.engine
            slots = engine_slots(engine) if engine is not None else None
            self.admission.set_engine(slots, engine_holds(slots) if slots is not None else None)
            self._judging = asyncio.create_task(self.admission.run(), name="online-admission")
        if self.embedding_replica is not None:
            self.embedding_replica.install()
            await self.embedding_replica.load()
            for observer in self._embedding_observers:
                self.embedding_replica.embed.add_observer(observer)

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
            if timer is not None and self.admission is not None:
                self.admission.finished(timer, None)
            raise
        if timer is not None:
            future.add_done_callback(functools.partial(self._timed, timer))
        return OnlineRecord(future, token, record.generation.n if record.generation is not None else 1)

    def _timer(self, on_delta: DeltaListener | None) -> OnlineTimer | None:
        """The timer an online record carries: every one's with a target (which may refuse it), a stream's without."""
        if self.admission is not None:
            return self.admission.admit_online(on_delta)
        return OnlineTimer(time.monotonic(), on_delta, time.monotonic) if on_delta is not None else None

    def _timed(self, timer: OnlineTimer, future: asyncio.Future[Completion]) -> None:
        """An online record ended: its times to the target's judge and the metrics (none when it failed or left)."""
        answered = not future.cancelled() and future.exception() is None
        tokens = tokens_per_choice(future.result()) if answered else None
        if self.admission is not None:
            times = self.admission.finished(timer, tokens)
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
            replica = self.classifier if chunk.model and self.classifier is not None else self._embedding()
            return await replica.run_chunk(chunk)
        return await self.replica.run_chunk(chunk, self.engine_settings, stop=stop)

    async def pool(self, request: EmbeddingRequest) -> tuple[EmbeddingResult, str]:
        """One online score, rerank or classify request's answer (or its error), ahead of batch lines, and the name
        of the model that answered.

        Raises:
            QueueFullError: The encoder's queue is full (answer 429).
        """
        replica = self.encoder_for(request)
        result = await replica.answer(EmbeddingItem.of(request), priority=ONLINE_PRIORITY, wait_for_room=False)
        return result, replica.model.name

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
        if self.classifier is not None:
            await self.classifier.aclose()

    def _embedding(self) -> EmbeddingReplica:
        if self.embedding_replica is None:
            raise RuntimeError("this server does not serve embeddings")
        return self.embedding_replica

    def _observed_batcher(self, engine: Engine, settings: EngineSettings) -> TokenBatcher:
        batcher = engine.batcher(**server_batcher_keywords(engine, settings))
        for observer in self._llm_observers:
            batcher.add_observer(observer)
        return batcher


def _classifier(settings: EngineSettings) -> EmbeddingReplica | None:
    """The replica of the settings' model as an encoder, when it is a sequence classifier; else None (an LLM)."""
    if not settings.model or settings.engine == "simulated" or "\n" in settings.model or "," in settings.model:
        return None
    return EmbeddingReplica.for_settings(settings) if EmbeddingModel(settings.model).classifier else None
