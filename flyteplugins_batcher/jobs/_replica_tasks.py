"""The replicas' Flyte tasks: chunks of work run on this process's LLM or embedding replica.

- `infer_chunk` (`gpu_env`): a chunk of prompts through the LLM replica's shared batcher; the gsm8k
  and JSONL jobs send theirs here.
- `embed_requests` (`embed_env`): a chunk of a batch file's embeddings requests; each request's vectors.
- `embed_chunk` (`embed_env`): a chunk of a corpus's documents; their vectors in a Parquet file.

A configuration that cannot work (a missing model, an unknown engine argument, a KV cache that does
not fit) fails the chunk with `flyte.errors.NonRecoverableError`: Flyte does not retry it, and the
driver stops the run at once with that message. Anything else that fails a whole chunk (the engine
died, say) is retried by Flyte; a dead engine is replaced on the replica by the next call. A finished
chunk is cached by its content and settings, so re-running a job after a crash recomputes only the
chunks that had not finished.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import flyte.errors
from flyte.io import File

from flyteplugins_batcher.batch_api import error_code
from flyteplugins_batcher.engines import EngineConfigError
from flyteplugins_batcher.jobs._corpus.chunks import ChunkVectors, DocumentChunk, DocumentResult
from flyteplugins_batcher.jobs._environments import embed_env, gpu_env
from flyteplugins_batcher.replica import (
    ChunkOutcome,
    EmbeddingChunk,
    EmbeddingOutcome,
    EmbeddingReplica,
    EngineSettings,
    LLMReplica,
    RequestChunk,
)

CHUNK_RETRIES = 2


@gpu_env.task(retries=CHUNK_RETRIES, cache="auto")
async def infer_chunk(chunk: RequestChunk, settings: EngineSettings, cache_salt: str = "") -> ChunkOutcome:
    """Run a chunk on this process's LLM replica; a configuration that cannot work fails without retries.

    Args:
        chunk: The prompts.
        settings: The engine, generation and batcher settings (the replica's engine is keyed on them).
        cache_salt: Part of the cache key only: a fresh value makes the chunk run again instead of
            reusing an earlier run's result.
    """
    try:
        return await LLMReplica.of_process().run_chunk(chunk, settings)
    except EngineConfigError as error:
        raise flyte.errors.NonRecoverableError(f"the engine cannot start: {error}") from error


EMBED_RETRIES = 2


@embed_env.task(retries=EMBED_RETRIES, cache="auto")
async def embed_chunk(chunk: DocumentChunk) -> ChunkVectors:
    """Embed one chunk through the replica's shared, length-aware `@batched` function."""
    replica = EmbeddingReplica.of_process()
    outcomes = await replica.embed_texts(chunk.texts)
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
        documents_per_s=replica.model.stats.documents_per_s,
        avg_batch_size=replica.embed.stats.avg_batch_size,
        padding_efficiency=replica.model.stats.padding_efficiency,
        model_seconds=replica.model.stats.generate_time_s,
        finished_at=time.time(),
        replica=replica.snapshot(),
    )


@embed_env.task(retries=EMBED_RETRIES, cache="auto")
async def embed_requests(chunk: EmbeddingChunk, model: str, cache_salt: str = "") -> EmbeddingOutcome:
    """Embed every text of a chunk of embeddings requests through the replica's shared `@batched` function.

    Args:
        chunk: The requests.
        model: The embedding model the driver answers with (`EmbeddingModel().name`); a replica serving another one
            fails the run without retries. Part of the cache key, so another model's vectors are never reused.
        cache_salt: Part of the cache key only: a fresh value makes the chunk run again.
    """
    replica = EmbeddingReplica.of_process()
    if model != replica.model.name:
        raise flyte.errors.NonRecoverableError(
            f"the driver answers with embedding model {model!r} but this replica serves {replica.model.name!r}: "
            "set EMBED_MODEL alike for both"
        )
    return await replica.run_chunk(chunk)


def write_parquet(path: Path, ids: list[str], vectors: list[list[float]]) -> None:
    """`id` and `vector` (a list of float32) columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": pa.array(ids, pa.string()), "vector": pa.array(vectors, pa.list_(pa.float32()))})
    pq.write_table(table, path)
