"""The replicas' Flyte tasks: chunks of work run on this process's LLM or embedding replica.

- `infer_chunk` (`gpu_env`): a chunk of prompts through the LLM replica's shared batcher; the gsm8k,
  JSONL and table jobs send theirs here.
- `embed_requests` (`embed_env`): a chunk of embeddings requests (a batch file's, or a table's rows,
  `embed_corpus`'s documents included); each request's vectors, or scores by cosine similarity.
- `pool_chunk` (`gpu_env`): a chunk of score, rerank and classify requests for the run's model when it is
  a sequence classifier (a cross-encoder), on the settings' engine (vLLM's pooling runner, or Transformers).

A configuration that cannot work (a missing model, an unknown engine argument, a KV cache that does
not fit) fails the chunk with `flyte.errors.NonRecoverableError`: Flyte does not retry it, and the
driver stops the run at once with that message. Anything else that fails a whole chunk (the engine
died, say) is retried by Flyte; a dead engine is replaced on the replica by the next call. A finished
chunk is cached by its content and settings, so re-running a job after a crash recomputes only the
chunks that had not finished.
"""

from __future__ import annotations

import flyte.errors

from flyteplugins_batcher.engines import EngineConfigError
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


@gpu_env.task(retries=CHUNK_RETRIES, cache="auto")
async def pool_chunk(chunk: EmbeddingChunk, settings: EngineSettings, cache_salt: str = "") -> EmbeddingOutcome:
    """Run a chunk of score, rerank and classify requests on the settings' model as a classifier (a cross-encoder).

    Args:
        chunk: The requests.
        settings: The engine settings: the classifier, its engine and vLLM's arguments (part of the cache key).
        cache_salt: Part of the cache key only: a fresh value makes the chunk run again.
    """
    try:
        return await EmbeddingReplica.for_settings(settings).run_chunk(chunk)
    except EngineConfigError as error:
        raise flyte.errors.NonRecoverableError(f"the classifier cannot start: {error}") from error
