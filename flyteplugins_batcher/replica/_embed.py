"""The embedding replica: one process's embedding model and the `@batched` function every caller feeds.

Every concurrent call on a replica (the `embed_requests` task of
`flyteplugins_batcher.jobs`, or a server's online requests and batch lines) feeds the replica's one
batched function, which forms batches of texts of similar length from everything waiting: a padded
model pays for every row of a batch as if it were as long as the longest (`grouping="by_cost"`, a
text's cost its token count). Texts keep their place in the results whatever batch they ran in.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

from flyteplugins_batcher import BatchedFunction
from flyteplugins_batcher.batch_api import encode_vector, error_code
from flyteplugins_batcher.engines import Embedding, EmbeddingModel
from flyteplugins_batcher.replica._chunks import EmbeddingChunk, EmbeddingItem, EmbeddingOutcome, EmbeddingResult
from flyteplugins_batcher.replica._per_process import PerProcess
from flyteplugins_batcher.replica._snapshot import ReplicaSnapshot


class EmbeddingReplica:
    """One process's embedding model, and the batched function its callers share.

    Args:
        model: The model (`EmbeddingModel()`: `EMBED_MODEL`, else the bundled all-MiniLM-L6-v2).

    Example:
        ```python
        replica = EmbeddingReplica.of_process()
        outcomes = await replica.embed_texts(["a document", "another one"])  # an Embedding or a ValueError each
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

    def _encode(self, texts: list[str]) -> list[Embedding | Exception]:
        return self.model.encode(texts)  # looked up per batch, so that the model can be watched once it runs

    @classmethod
    def of_process(cls) -> EmbeddingReplica:
        """This process's replica (made on first use): the one the embedding tasks run on."""
        return _PROCESS.get()

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
        """Each request's vectors: the body of the `embed_requests` task, without Flyte.

        Raises:
            Exception: Anything that failed and is not a text's own fault.
        """
        texts = [text for item in chunk.items for text in item.inputs]
        outcomes = iter(await self.embed_texts(texts, priority=priority))
        results = [request_result(item, [next(outcomes) for _ in item.inputs]) for item in chunk.items]
        return EmbeddingOutcome(chunk.index, results, self.snapshot(), finished_at=time.time())

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
        """Stop the batched function's batcher; the process's next replica is a fresh one (its model loads again)."""
        _PROCESS.release(self)
        await self.embed.aclose()


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


_PROCESS: PerProcess[EmbeddingReplica] = PerProcess(EmbeddingReplica)
