"""What the corpus embedding job passes to its replicas: chunks of documents, and their vectors as Parquet files."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from flyte.io import File

from flyteplugins_batcher.replica import ItemOutcomes, ReplicaSnapshot


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
