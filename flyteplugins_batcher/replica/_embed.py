"""The embedding replica: one process's encoder model and the `@batched` functions every caller feeds.

Every concurrent call on a replica (the `embed_requests` task of
`flyteplugins_batcher.jobs`, or a server's online requests and batch lines) feeds the replica's one
batched function, which forms batches of texts of similar length from everything waiting: a padded
model pays for every row of a batch as if it were as long as the longest (`grouping="by_cost"`, a
text's cost its token count). Texts keep their place in the results whatever batch they ran in.

The model answers the encoder tasks its kind does (`EmbeddingModel.tasks`). An embedder embeds, and
scores a (query, document) pair by the cosine similarity of the two texts' vectors, as vLLM does
(each distinct text of a request embedded once, through `embed`). A classifier answers a text's
class probabilities and, a cross-encoder, a pair's score, through `classify`: pairs are batched by
their tokens together, as texts are. A text or pair longer than the model reads fails its request
(`context_length_exceeded`): a score is never made from a cut text.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import threading
import time
from typing import Any

from flyteplugins_batcher import BatchedFunction
from flyteplugins_batcher.batch_api import encode_vector, error_code
from flyteplugins_batcher.engines import ContextLengthExceededError, Embedding, EmbeddingModel
from flyteplugins_batcher.replica._chunks import EmbeddingChunk, EmbeddingItem, EmbeddingOutcome, EmbeddingResult
from flyteplugins_batcher.replica._per_process import PerProcess
from flyteplugins_batcher.replica._settings import EngineSettings, engine_kwargs
from flyteplugins_batcher.replica._snapshot import ReplicaSnapshot

PoolingInput = str | tuple[str, str]


class EmbeddingReplica:
    """One process's encoder model, and the batched functions its callers share.

    Args:
        model: The model (`EmbeddingModel()`: `EMBED_MODEL`, else the bundled all-MiniLM-L6-v2; or a
            classifier, for `for_settings`).

    Example:
        ```python
        replica = EmbeddingReplica.of_process()
        outcomes = await replica.embed_texts(["a document", "another one"])  # an Embedding or a ValueError each
        reranker = EmbeddingReplica.for_settings(EngineSettings(model="cross-encoder/ms-marco-MiniLM-L6-v2"))
        outcome = await reranker.run_chunk(chunk)  # its score, rerank and classify requests
        ```
    """

    def __init__(self, model: EmbeddingModel | None = None) -> None:
        self.model = model or EmbeddingModel()
        self.embed: BatchedFunction[str, Embedding | Exception] = BatchedFunction(
            self._encode,
            name="embed",
            max_batch_size=self.model.batch_size,
            batch_timeout_s=0.02,
            grouping="by_cost",
            cost_estimator=self.model.token_count,
        )
        """One document's embedding, batched with every concurrent caller's in this process (by length)."""
        self.classify: BatchedFunction[PoolingInput, Embedding | Exception] = BatchedFunction(
            self._classify,
            name="classify",
            max_batch_size=self.model.batch_size,
            batch_timeout_s=0.02,
            grouping="by_cost",
            cost_estimator=self.model.token_count,
        )
        """A classifier's raw logits for one text or (query, document) pair, batched by tokens with every caller's."""

    def _classify(self, items: list[PoolingInput]) -> list[Embedding | Exception]:
        return self.model.classify(items)

    def _encode(self, texts: list[str]) -> list[Embedding | Exception]:
        return self.model.encode(texts)  # looked up per batch, so that the model can be watched once it runs

    @classmethod
    def of_process(cls) -> EmbeddingReplica:
        """This process's replica (made on first use): the one the embedding tasks run on."""
        return _PROCESS.get()

    @classmethod
    def for_settings(cls, settings: EngineSettings) -> EmbeddingReplica:
        """This process's replica of the settings' model as an encoder (a classifier or cross-encoder given as a
        job's model), on the settings' engine, made on first use.

        Raises:
            EngineConfigError: The settings cannot work (a vLLM-only setting for Transformers, say).
        """
        kwargs = {name: value for name, value in engine_kwargs(settings).items() if name not in _NOT_POOLING}
        key = json.dumps([settings.model, settings.engine, kwargs], sort_keys=True, default=str)
        with _BY_SETTINGS_LOCK:
            replica = _BY_SETTINGS.get(key)
            if replica is None:
                model = EmbeddingModel(settings.model, engine=settings.engine, engine_args=kwargs)
                replica = _BY_SETTINGS[key] = cls(model)
            return replica

    def install(self) -> None:
        """Make this the process's replica until it closes: a local Flyte run in this process (a server's) uses it."""
        _PROCESS.install(self)

    async def load(self) -> None:
        """Load the model, off the event loop (once)."""
        await asyncio.to_thread(self.model.load)

    async def embed_texts(
        self, texts: list[str], *, priority: int = 0, wait_for_room: bool = True
    ) -> list[Embedding | ValueError]:
        """Each text's embedding through the shared batched function (the model loads on first use).

        A text that has no embedding (an empty one) gets its `ValueError`.

        Args:
            texts: The texts.
            priority: Their priority in the shared batcher (a server puts online requests ahead of batch lines).
            wait_for_room: `False`: raise `QueueFullError` at once when the batcher's queue is full.

        Raises:
            Exception: Anything else that failed, which is not the text's fault (Flyte retries the chunk).
        """
        if not self.model.loaded:
            await self.load()
        outcomes = await asyncio.gather(
            *(self.embed(text, priority=priority, wait_for_room=wait_for_room) for text in texts),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, ValueError):
                raise outcome
        return outcomes  # type: ignore[return-value]

    async def run_chunk(self, chunk: EmbeddingChunk, *, priority: int = 0) -> EmbeddingOutcome:
        """Each request's answer (vectors, scores or classes): the body of the `embed_requests` task, without Flyte.

        Every request's texts and pairs go in at once, so that the batchers form batches across them.

        Raises:
            Exception: Anything that failed and is not a text's own fault.
        """
        await self.load()
        results = await asyncio.gather(*(self.answer(item, priority=priority) for item in chunk.items))
        return EmbeddingOutcome(chunk.index, list(results), self.snapshot(), finished_at=time.time())

    async def answer(self, item: EmbeddingItem, *, priority: int = 0, wait_for_room: bool = True) -> EmbeddingResult:
        """One request's answer: its vectors, its pairs' scores, or its texts' classes (or the error that fails it).

        Raises:
            QueueFullError: `wait_for_room=False` and a batcher's queue is full.
            Exception: Anything that failed and is not the request's own fault.
        """
        if item.task not in self.model.tasks:
            message = f"{self.model.name} cannot {item.task} (it does {', '.join(self.model.tasks)})"
            return EmbeddingResult(item.key, error_code="invalid_request", error_message=message)
        if item.task == "embed":
            return request_result(
                item, await self.embed_texts(item.inputs, priority=priority, wait_for_room=wait_for_room)
            )
        if self.model.classifier:
            inputs: list[PoolingInput] = list(item.inputs) if item.task == "classify" else list(item.pairs)
            outcomes = await self._gather(self.classify, inputs, priority, wait_for_room)
            return self._classes(item, outcomes)
        texts = list(dict.fromkeys([*item.queries, *item.inputs]))  # each distinct text embedded once
        vectors = dict(
            zip(texts, await self.embed_texts(texts, priority=priority, wait_for_room=wait_for_room), strict=True)
        )
        return cosine_result(item, vectors)

    async def _gather(
        self, function: BatchedFunction[Any, Embedding | Exception], inputs: list[Any], priority: int, wait: bool
    ) -> list[Embedding | Exception]:
        outcomes = await asyncio.gather(
            *(function(value, priority=priority, wait_for_room=wait) for value in inputs), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, ValueError):
                raise outcome
        return outcomes  # type: ignore[return-value]

    def _classes(self, item: EmbeddingItem, outcomes: list[Embedding | Exception]) -> EmbeddingResult:
        """A classifier's answer: each pair's score, or each text's class probabilities and label."""
        failed = next((outcome for outcome in outcomes if isinstance(outcome, Exception)), None)
        if failed is not None:
            where = f"{'pair' if item.task != 'classify' else 'input'} {outcomes.index(failed)}: "
            return EmbeddingResult(item.key, error_code=error_code(failed), error_message=where + str(failed))
        outputs = [
            self.model.activated(outcome.vector) if item.activation else list(outcome.vector)
            for outcome in outcomes
            if isinstance(outcome, Embedding)
        ]
        tokens = sum(outcome.tokens for outcome in outcomes if isinstance(outcome, Embedding))
        if item.task != "classify":
            return EmbeddingResult(item.key, prompt_tokens=tokens, scores=[output[0] for output in outputs])
        labels = [self.model.labels.get(max(range(len(output)), key=output.__getitem__), "") for output in outputs]
        vectors = [str(encode_vector(output, "base64")) for output in outputs]
        return EmbeddingResult(item.key, vectors, prompt_tokens=tokens, labels=labels)

    def snapshot(self) -> ReplicaSnapshot:
        """This replica's batching and model statistics since it started."""
        stats = self.model.stats
        return ReplicaSnapshot.of_batcher(
            self.embed.stats,
            replica=f"{socket.gethostname()}/{os.getpid()} (embeddings)",
            model=self.model.name,
            load_time_s=stats.load_time_s,
            loaded_at=stats.loaded_at,
            padding_efficiency=stats.padding_efficiency,
        )

    async def aclose(self) -> None:
        """Stop the batched functions' batchers and free a classifier; the process's next replica is a fresh one."""
        _PROCESS.release(self)
        with _BY_SETTINGS_LOCK:
            for key, replica in list(_BY_SETTINGS.items()):
                if replica is self:
                    del _BY_SETTINGS[key]
        await self.embed.aclose()
        await self.classify.aclose()
        await asyncio.to_thread(self.model.close)


def request_result(item: EmbeddingItem, outcomes: list[Embedding | ValueError]) -> EmbeddingResult:
    """A request's result from its texts' outcomes: every vector, or the first text's error."""
    failed = next((outcome for outcome in outcomes if isinstance(outcome, ValueError)), None)
    if failed is not None:
        return EmbeddingResult(item.key, error_code=error_code(failed), error_message=str(failed))
    embeddings = [outcome for outcome in outcomes if isinstance(outcome, Embedding)]
    vectors = [str(encode_vector(embedding.vector, "base64")) for embedding in embeddings]
    return EmbeddingResult(
        item.key,
        vectors,
        prompt_tokens=sum(embedding.tokens for embedding in embeddings),
        truncated=sum(embedding.truncated for embedding in embeddings),
    )


def cosine_result(item: EmbeddingItem, vectors: dict[str, Embedding | ValueError]) -> EmbeddingResult:
    """A score's or rerank's answer from an embedder: each pair's cosine similarity, as vLLM scores with one.

    Its tokens count each query and document as the request gave them (as vLLM's usage does); a text
    the model would cut fails the request (`context_length_exceeded`), as does a text with no vector.
    """
    for text, outcome in vectors.items():
        where = "queries" if text in item.queries else "documents"
        if isinstance(outcome, ValueError):
            return EmbeddingResult(item.key, error_code=error_code(outcome), error_message=str(outcome))
        if outcome.truncated:
            index = (item.queries if where == "queries" else item.inputs).index(text)
            message = (
                f"{where}[{index}] is longer than the model reads ({outcome.tokens} tokens): it is not cut to score"
            )
            error = ContextLengthExceededError(message)
            return EmbeddingResult(item.key, error_code=error_code(error), error_message=message)
    embeddings = {text: outcome for text, outcome in vectors.items() if isinstance(outcome, Embedding)}
    scores = [_cosine(embeddings[query].vector, embeddings[document].vector) for query, document in item.pairs]
    tokens = sum(embeddings[text].tokens for text in [*item.queries, *item.inputs])
    return EmbeddingResult(item.key, prompt_tokens=tokens, scores=scores)


def _cosine(first: list[float], second: list[float]) -> float:
    dot = math.fsum(a * b for a, b in zip(first, second, strict=True))
    norms = math.sqrt(math.fsum(a * a for a in first)) * math.sqrt(math.fsum(b * b for b in second))
    return dot / norms if norms else 0.0


_NOT_POOLING = ("mode", "lora_modules")
"""Engine keywords of an LLM's that a classifier does not take (vLLM's stream mode, LoRA adapters)."""

_PROCESS: PerProcess[EmbeddingReplica] = PerProcess(EmbeddingReplica)
_BY_SETTINGS: dict[str, EmbeddingReplica] = {}
"""This process's replicas of classifiers given as a job's model, by their settings (`for_settings`)."""
_BY_SETTINGS_LOCK = threading.Lock()
