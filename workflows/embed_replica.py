"""The embedding replicas: reusable GPU workers that embed chunks of documents through one `@batched` function.

Every concurrent `embed_chunk` call on a replica feeds the process's `embed` function
(`workflows/embeddings.py`), which forms batches of documents of similar length from everything
waiting. Each chunk writes its vectors to a Parquet file of `id` and `vector` columns.

Replicas, per-replica concurrency and the GPU type are environment-level settings (`EMBED_POOL`),
fixed when the module is imported: set `EMBED_REPLICAS`, `EMBED_CONCURRENCY` and `EMBED_GPU`
before `flyte run` / `flyte deploy`.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass
from pathlib import Path

from flyte.io import File

from images import embed_image
from workflows.embeddings import EMBED_STATS, embed, load_model, model_reference
from workflows.environments import ReplicaPool

EMBED_POOL = ReplicaPool.from_environment("EMBED", replicas=2, concurrency=8)

embed_env = EMBED_POOL.environment("embed_gpu", image=embed_image)


@dataclass
class DocumentChunk:
    """Documents for one `embed_chunk` call."""

    index: int
    ids: list[str]
    texts: list[str]
    cache_salt: str = ""  # a fresh value makes the chunk run again instead of reusing an earlier run's vectors


@dataclass
class ChunkVectors:
    """A chunk's vectors (a Parquet file of `id`, `vector`), its failures, and its replica's batching."""

    index: int
    vectors: File
    failed_ids: list[str]
    failures: list[str]
    documents_per_s: float
    avg_batch_size: float
    padding_efficiency: float
    truncated: int  # documents of this chunk cut at the model's max_seq_length
    model_seconds: float


@embed_env.task(retries=2, cache="auto")
async def embed_chunk(chunk: DocumentChunk) -> ChunkVectors:
    """Embed one chunk through the replica's shared, length-aware `@batched` function."""
    await asyncio.to_thread(load_model, model_reference())  # once per replica, off the event loop
    outcomes = await asyncio.gather(*(embed(text) for text in chunk.texts), return_exceptions=True)
    ids, vectors, failed_ids, failures = [], [], [], []
    truncated = 0
    for doc_id, outcome in zip(chunk.ids, outcomes, strict=True):
        if isinstance(outcome, ValueError):
            failed_ids.append(doc_id)
            failures.append(str(outcome))
        elif isinstance(outcome, BaseException):
            raise outcome  # not this document's fault: let Flyte retry the chunk
        else:
            ids.append(doc_id)
            vectors.append(outcome.vector)
            truncated += outcome.truncated
    path = Path(tempfile.mkdtemp(prefix="embed-chunk-")) / f"chunk-{chunk.index:06d}.parquet"
    await asyncio.to_thread(write_parquet, path, ids, vectors)
    stats = embed.stats
    return ChunkVectors(
        index=chunk.index,
        vectors=await File.from_local(str(path)),
        failed_ids=failed_ids,
        failures=failures,
        documents_per_s=EMBED_STATS.documents_per_s,
        avg_batch_size=stats.avg_batch_size,
        padding_efficiency=EMBED_STATS.padding_efficiency,
        truncated=truncated,
        model_seconds=EMBED_STATS.generate_time_s,
    )


def write_parquet(path: Path, ids: list[str], vectors: list[list[float]]) -> None:
    """`id` and `vector` (a list of float32) columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": pa.array(ids, pa.string()), "vector": pa.array(vectors, pa.list_(pa.float32()))})
    pq.write_table(table, path)
