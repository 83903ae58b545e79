"""The replicas: the models a process serves and the one batcher each shares, under both the jobs and the server.

A replica is a process-level singleton: every Flyte task call running on a reusable container (or
every request a server answers) feeds its one batcher, which keeps the model busy.

- `LLMReplica`: an engine and its shared `TokenBatcher`; `run_chunk` answers a `RequestChunk`.
- `EmbeddingReplica`: an embedding model and its shared batched function; `run_chunk` answers an
  `EmbeddingChunk`.
- `EngineSettings`: what the LLM replica's engine and batcher are built from.
- A request line's way (`LineRules`, `ChunkCutter`, `FinishedLine`): read, cut into chunks, answered.
- `LLMReplica.live_records()`: the records this process's replicas finished so far, one by one (a local
  driver's progress).

Example:
    ```python
    from flyteplugins_batcher.replica import EngineSettings, LLMReplica, RequestChunk, RequestItem

    replica = LLMReplica.of_process()
    chunk = RequestChunk(0, [RequestItem("q1", prompt="What is 2 + 2?")])
    outcome = await replica.run_chunk(chunk, EngineSettings(engine="simulated"))
    print(outcome.results[0].text)
    ```
"""

from __future__ import annotations

from flyteplugins_batcher.replica._chunks import (
    ChatMessage,
    ChunkOutcome,
    EmbeddingChunk,
    EmbeddingItem,
    EmbeddingOutcome,
    EmbeddingResult,
    ItemOutcomes,
    ItemResult,
    JobChunk,
    JobOutcome,
    RequestChunk,
    RequestItem,
)
from flyteplugins_batcher.replica._embed import EmbeddingReplica
from flyteplugins_batcher.replica._lines import ChunkCutter, FinishedLine, LineRules
from flyteplugins_batcher.replica._llm import LLMReplica
from flyteplugins_batcher.replica._settings import EngineSettings
from flyteplugins_batcher.replica._snapshot import ReplicaSnapshot

__all__ = [
    "ChatMessage",
    "ChunkCutter",
    "ChunkOutcome",
    "EmbeddingChunk",
    "EmbeddingItem",
    "EmbeddingOutcome",
    "EmbeddingReplica",
    "EmbeddingResult",
    "EngineSettings",
    "FinishedLine",
    "ItemOutcomes",
    "ItemResult",
    "JobChunk",
    "JobOutcome",
    "LLMReplica",
    "LineRules",
    "ReplicaSnapshot",
    "RequestChunk",
    "RequestItem",
]
