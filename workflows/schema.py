"""The typed inputs and outputs the LLM workflows pass between the driver and the GPU replicas.

Chunks are dataclasses rather than bare lists: Flyte serializes a top-level list element by element,
which is several times slower than one dataclass holding the list.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, fields

from flyte.io import File


@dataclass(frozen=True)
class EngineSettings:
    """Engine, generation and batcher settings: the key of the replica's shared engine.

    Zero or empty means "the engine's default". The vLLM fields apply to `engine="vllm"` (or "auto"
    on a GPU); `engine_args` is a JSON object of any other vLLM engine argument.
    """

    engine: str = "auto"
    model: str = ""
    vllm_mode: str = ""
    max_model_len: int = 0
    kv_cache_gb: float = 0.0
    gpu_memory_utilization: float = 0.0
    dtype: str = ""
    tensor_parallel_size: int = 0
    enforce_eager: str = ""
    engine_args: str = ""
    system_prompt: str = ""
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = -1
    target_batch_tokens: int = 0
    max_batch_size: int = 0
    batch_timeout_s: float = 0.05
    cache_salt: str = ""  # a fresh value makes every chunk run again instead of reusing finished ones

    @classmethod
    def from_options(cls, options: dict[str, object], *, resume: bool, **overrides: object) -> EngineSettings:
        """The settings among a workflow's options (its `locals()`), with `overrides`; a fresh salt unless resuming."""
        names = {field.name for field in fields(cls)}
        chosen = {name: value for name, value in options.items() if name in names}
        return cls(**{**chosen, **overrides, "cache_salt": "" if resume else uuid.uuid4().hex})  # type: ignore[arg-type]


@dataclass
class ChatMessage:
    """One chat message."""

    role: str
    content: str


@dataclass
class RequestItem:
    """One prompt for the engine, with settings of its own where the request gave any (else -1 / empty)."""

    key: str
    prompt: str = ""
    messages: list[ChatMessage] = field(default_factory=list)
    max_tokens: int = -1
    temperature: float = -1.0
    top_p: float = -1.0
    stop: list[str] = field(default_factory=list)
    seed: int = -1


@dataclass
class RequestChunk:
    """A slice of the job sent to one `infer_chunk` call."""

    index: int
    items: list[RequestItem]


@dataclass
class ItemResult:
    """One prompt's outcome: a completion, or an error code and message."""

    key: str
    text: str = ""
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error_code: str = ""
    error_message: str = ""


@dataclass
class ReplicaSnapshot:
    """One replica's engine and shared batcher, as seen at the end of a chunk (since the replica started)."""

    replica: str = ""
    model: str = ""
    load_time_s: float = 0.0
    records: int = 0
    batches: int = 0
    avg_batch_size: float = 0.0
    avg_batch_tokens: float = 0.0
    utilization: float = 0.0
    device_utilization: float = -1.0  # the GPU's own (NVML); -1 where it cannot be asked
    device_note: str = ""
    records_per_s: float = 0.0
    latency_p50_s: float = 0.0
    latency_p99_s: float = 0.0
    queue_wait_p99_s: float = 0.0
    batches_by_reason: dict[str, int] = field(default_factory=dict)
    padding_efficiency: float = 1.0
    completion_tokens_per_s: float = 0.0


@dataclass
class ChunkOutcome:
    """What one `infer_chunk` call returns: an `ItemResult` per prompt, in order, and its replica's state."""

    index: int
    results: list[ItemResult]
    replica: ReplicaSnapshot
    finished_at: float = 0.0  # epoch seconds; a chunk reused from an earlier run finished before this one began


@dataclass
class RunSummary:
    """What a batch LLM run prints: counts, accuracy where there is gold, throughput, and where the rest is.

    Throughput counts inference only: `load_time_s` (the slowest replica's model load) is excluded.
    """

    source: str
    requests: int
    answered: int
    failed: int
    reused_chunks: int
    accuracy: float
    scored: int
    load_time_s: float
    inference_s: float
    requests_per_s: float
    output_tokens_per_s: float
    results: File
    errors: File
