"""`RunOptions`: how a driver runs a job (its chunks, how many are outstanding, which failures it accepts, what it
reuses), the option set every job takes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from flyteplugins_batcher.jobs._environments import ReplicaPool
from flyteplugins_batcher.replica import ChunkCutter


@dataclass(frozen=True)
class RunOptions:
    """How a driver runs a job: its chunks, how many are outstanding, which failures it accepts, what it reuses.

    Every LLM workflow takes them as inputs of their own (`flyteplugins_batcher/jobs/_options.py`), each with its own
    defaults.

    Attributes:
        chunk_size: Requests (a table's rows) per replica call (a chunk is what Flyte caches and retries).
        max_chunks_in_flight: Chunks outstanding at once over all replicas (bounds the driver's memory); 0:
            replicas x concurrency of the replicas' environment, which fills every replica's slots, so that
            adding replicas adds work in flight.
        max_failed_fraction: Share of requests (rows) that may fail before the run exits non-zero, an opt-in
            guard (everything that finished is written first); none: no threshold, the run exits 0 however many
            fail, each failure in its own line. The JSONL job (`run-batch`) has none by default, as `vllm
            run-batch`; the table job 0.0, so a pipeline stops on any failed row.
        resume: Reuse chunks finished by an earlier run with the same requests and settings (--no-resume
            computes everything again).
        output_dir: Where the output goes (the results and errors files; a table's Parquet dataset): a local
            folder, a file:// URI or a remote URI (s3://, gs://, abfs://, abfss://), checked before any
            inference; empty: the run's own Flyte storage.
        order: How requests (a table's rows) are cut into chunks: "prefix" puts those that share a prompt
            prefix (a document, a system prompt with few-shot examples) in the same chunks, so that the replica
            that runs a chunk computes the prefix once and its cache stays warm; "file" keeps the input's
            order. The answers are the same either way, and a table's output keeps its rows' order.
        order_window: Requests (rows) grouped together at most in "prefix" order: the driver holds this many
            at once, and requests further apart than this are placed apart.
    """

    chunk_size: int = 8
    max_chunks_in_flight: int = 0
    max_failed_fraction: float | None = 0.0
    resume: bool = True
    output_dir: str = ""
    order: str = "prefix"
    order_window: int = ChunkCutter.WINDOW

    def __post_init__(self) -> None:
        if self.order not in ChunkCutter.ORDERS:
            raise ValueError(f"order must be one of {', '.join(ChunkCutter.ORDERS)}, got {self.order!r}")
        if self.order_window < 1:
            raise ValueError(f"order_window must be >= 1, got {self.order_window}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.max_chunks_in_flight < 0:
            raise ValueError(
                f"max_chunks_in_flight must be >= 0 (0: replicas x concurrency), got {self.max_chunks_in_flight}"
            )
        if self.max_failed_fraction is not None and not 0 <= self.max_failed_fraction <= 1:
            raise ValueError(f"max_failed_fraction must be in [0, 1], got {self.max_failed_fraction}")

    def chunks_in_flight(self, pool: ReplicaPool) -> int:
        """The driver's cap for a run on `pool`: `max_chunks_in_flight`, or every replica's slots when it is 0."""
        return self.max_chunks_in_flight or pool.chunks_in_flight

    def cache_salt(self) -> str:
        """The chunks' cache salt for this run: empty when resuming (finished chunks are reused), else fresh."""
        return "" if self.resume else uuid.uuid4().hex
