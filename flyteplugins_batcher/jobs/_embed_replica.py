"""The embedding replicas: reusable GPU workers that embed chunks of texts through one `@batched` function.

Every concurrent call on a replica feeds the process's `embed` function (`flyteplugins_batcher/jobs/_embeddings.py`),
which forms batches of texts of similar length from everything waiting. Two tasks call it:

- `embed_chunk` (`workflows/embed.py`): a chunk of documents; it writes their vectors to a Parquet
  file of `id` and `vector` columns.
- `embed_requests` (`workflows/batch_jsonl.py`): a chunk of embeddings requests of a batch job
  (`/v1/embeddings` lines); it returns each request's vectors and token count.

Replicas, per-replica concurrency and the GPU type are environment-level settings (`EMBED_POOL`),
fixed when the module is imported: set `EMBED_REPLICAS`, `EMBED_CONCURRENCY` and `EMBED_GPU`
before `flyte run` / `flyte deploy`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import flyte.errors
from flyte.io import File

from flyteplugins_batcher.batch_api import encode_vector, error_code
from flyteplugins_batcher.images import embed_image
from flyteplugins_batcher.jobs._embeddings import EMBED_STATS, Embedding, embed, load_model, model_name, model_reference
from flyteplugins_batcher.jobs._environments import ReplicaPool
from flyteplugins_batcher.jobs._reruns import ItemOutcomes
from flyteplugins_batcher.jobs._schema import ReplicaSnapshot

EMBED_POOL = ReplicaPool.from_environment("EMBED", replicas=2, concurrency=8)
EMBED_RETRIES = 2

embed_env = EMBED_POOL.environment("embed_gpu", image=embed_image)


@dataclass
class DocumentChunk:
    """Documents for one `embed_chunk` call."""

    index: int
    ids: list[str]
    texts: list[str]
    cache_salt: str = ""  # a fresh value makes the chunk run again instead of reusing an earlier run's vectors

    def only(self, positions: list[int]) -> DocumentChunk:
        """This chunk with only the documents at `positions` (a rerun's retry of the documents that failed)."""
        return replace(self, ids=[self.ids[p] for p in positions], texts=[self.texts[p] for p in positions])


@dataclass
class DocumentResult:
    """One document's outcome: embedded (its vector is in its chunk's Parquet files), or an error."""

    error_code: str = ""
    error_message: str = ""
    truncated: bool = False  # cut at the model's max_seq_length


@dataclass
class ChunkVectors(ItemOutcomes):
    """A chunk's vectors (Parquet files of `id`, `vector`), each document's outcome, and its replica's batching.

    `finished_at` and `fresh` as in `ChunkOutcome`; an outcome that merges a rerun's retry holds the
    earlier run's Parquet file and the retry's.
    """

    index: int
    vectors: list[File]
    results: list[DocumentResult]
    documents_per_s: float
    avg_batch_size: float
    padding_efficiency: float
    model_seconds: float
    finished_at: float = 0.0
    fresh: list[int] | None = None
    replica: ReplicaSnapshot | None = None  # the replica's batching when the chunk finished (its timeline: the report)

    @property
    def truncated(self) -> int:
        """Documents of this chunk cut at the model's max_seq_length."""
        return sum(result.truncated for result in self.results)

    def with_retried(self, positions: Sequence[int], retried: ChunkVectors, started: float) -> ChunkVectors:
        merged = super().with_retried(positions, retried, started)
        return replace(merged, vectors=[*self.vectors, *retried.vectors])


@embed_env.task(retries=EMBED_RETRIES, cache="auto")
async def embed_chunk(chunk: DocumentChunk) -> ChunkVectors:
    """Embed one chunk through the replica's shared, length-aware `@batched` function."""
    outcomes = await embed_texts(chunk.texts)
    ids, vectors, results = [], [], []
    for doc_id, outcome in zip(chunk.ids, outcomes, strict=True):
        if isinstance(outcome, ValueError):
            results.append(DocumentResult(error_code(outcome), str(outcome)))
        else:
            ids.append(doc_id)
            vectors.append(outcome.vector)
            results.append(DocumentResult(truncated=outcome.truncated))
    path = Path(tempfile.mkdtemp(prefix="embed-chunk-")) / f"chunk-{chunk.index:06d}.parquet"
    await asyncio.to_thread(write_parquet, path, ids, vectors)
    return ChunkVectors(
        index=chunk.index,
        vectors=[await File.from_local(str(path))],
        results=results,
        documents_per_s=EMBED_STATS.documents_per_s,
        avg_batch_size=embed.stats.avg_batch_size,
        padding_efficiency=EMBED_STATS.padding_efficiency,
        model_seconds=EMBED_STATS.generate_time_s,
        finished_at=time.time(),
        replica=replica_snapshot(),
    )


async def embed_texts(
    texts: list[str], *, priority: int = 0, wait_for_room: bool = True
) -> list[Embedding | ValueError]:
    """Each text's embedding through the replica's shared `@batched` function (the model loads on first use).

    A text that has no embedding (an empty one) gets its `ValueError`.

    Args:
        texts: The texts.
        priority: Their priority in the shared batcher (a server puts online requests ahead of batch lines).
        wait_for_room: `False`: raise `QueueFullError` at once when the batcher's queue is full.

    Raises:
        Exception: Anything else that failed, which is not the text's fault (Flyte retries the chunk).
    """
    await asyncio.to_thread(load_model, model_reference())  # once per replica, off the event loop
    outcomes = await asyncio.gather(
        *(embed(text, priority=priority, wait_for_room=wait_for_room) for text in texts), return_exceptions=True
    )
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, ValueError):
            raise outcome
    return outcomes  # type: ignore[return-value]


@dataclass
class EmbeddingItem:
    """One embeddings request of a batch job: its texts (`input`), answered with one vector each."""

    key: str
    inputs: list[str]


@dataclass
class EmbeddingChunk:
    """A slice of a batch job's embeddings requests, sent to one `embed_requests` call."""

    index: int
    items: list[EmbeddingItem]

    def only(self, positions: list[int]) -> EmbeddingChunk:
        """This chunk with only the requests at `positions` (a rerun's retry of the requests that failed)."""
        return EmbeddingChunk(self.index, [self.items[position] for position in positions])


@dataclass
class EmbeddingResult:
    """One embeddings request's outcome: a vector per text, or an error code and message.

    Vectors travel as base64 of their little-endian float32 bytes (OpenAI's `encoding_format="base64"`):
    exact, and a third of the size of JSON numbers.
    """

    key: str
    vectors: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    error_code: str = ""
    error_message: str = ""


@dataclass
class EmbeddingOutcome(ItemOutcomes):
    """What one `embed_requests` call returns: an `EmbeddingResult` per request, in order, and its replica's state.

    `finished_at` and `fresh` as in `ChunkOutcome`.
    """

    index: int
    results: list[EmbeddingResult]
    replica: ReplicaSnapshot
    finished_at: float = 0.0
    fresh: list[int] | None = None


@embed_env.task(retries=EMBED_RETRIES, cache="auto")
async def embed_requests(chunk: EmbeddingChunk, model: str, cache_salt: str = "") -> EmbeddingOutcome:
    """Embed every text of a chunk of embeddings requests through the replica's shared `@batched` function.

    Args:
        chunk: The requests.
        model: The embedding model the driver answers with (`model_name()`); a replica serving another one
            fails the run without retries. Part of the cache key, so another model's vectors are never reused.
        cache_salt: Part of the cache key only: a fresh value makes the chunk run again.
    """
    if model != model_name():
        raise flyte.errors.NonRecoverableError(
            f"the driver answers with embedding model {model!r} but this replica serves {model_name()!r}: "
            "set EMBED_MODEL alike for both"
        )
    return await embed_request_chunk(chunk)


async def embed_request_chunk(chunk: EmbeddingChunk, *, priority: int = 0) -> EmbeddingOutcome:
    """Each request's vectors through this process's `@batched` function: the body of `embed_requests`, without Flyte.

    Raises:
        Exception: Anything that failed and is not a text's own fault.
    """
    texts = [text for item in chunk.items for text in item.inputs]
    outcomes = iter(await embed_texts(texts, priority=priority))
    results = [request_result(item, [next(outcomes) for _ in item.inputs]) for item in chunk.items]
    return EmbeddingOutcome(chunk.index, results, replica_snapshot(), finished_at=time.time())


def request_result(item: EmbeddingItem, outcomes: list[Embedding | ValueError]) -> EmbeddingResult:
    """A request's result from its texts' outcomes: every vector, or the first text's error."""
    failed = next((outcome for outcome in outcomes if isinstance(outcome, ValueError)), None)
    if failed is not None:
        return EmbeddingResult(item.key, error_code=error_code(failed), error_message=str(failed))
    embeddings = [outcome for outcome in outcomes if isinstance(outcome, Embedding)]
    vectors = [str(encode_vector(embedding.vector, "base64")) for embedding in embeddings]
    return EmbeddingResult(item.key, vectors, prompt_tokens=sum(embedding.tokens for embedding in embeddings))


def replica_snapshot() -> ReplicaSnapshot:
    """This embedding replica's batching and model statistics since it started."""
    return ReplicaSnapshot.of_batcher(
        embed.stats,
        replica=f"{socket.gethostname()}/{os.getpid()} (embeddings)",
        model=model_name(),
        load_time_s=EMBED_STATS.load_time_s,
        padding_efficiency=EMBED_STATS.padding_efficiency,
    )


def write_parquet(path: Path, ids: list[str], vectors: list[list[float]]) -> None:
    """`id` and `vector` (a list of float32) columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": pa.array(ids, pa.string()), "vector": pa.array(vectors, pa.list_(pa.float32()))})
    pq.write_table(table, path)
