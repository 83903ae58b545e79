"""The typed inputs and outputs of the batch LLM workflow.

Chunks are dataclasses rather than bare `list[str]`: Flyte serializes a top-level list element by
element, which is several times slower than one dataclass holding the list.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class InferenceSettings:
    """Engine, generation and batcher settings; also the key of the replica's shared engine.

    Zero means "the engine's default" for `target_batch_tokens` and `max_batch_size`.
    """

    engine: str = "auto"
    model: str = ""
    system_prompt: str = ""
    max_new_tokens: int = 256
    temperature: float = 0.0
    seed: int | None = None
    target_batch_tokens: int = 0
    max_batch_size: int = 0
    batch_timeout_s: float = 0.05


@dataclass
class Chunk:
    """A slice of the dataset sent to one `infer_batch` call."""

    index: int
    question_ids: list[int]
    prompts: list[str]


@dataclass
class ReplicaSnapshot:
    """One replica's shared batcher and engine, as seen at the end of a chunk (since the replica started)."""

    replica: str = ""
    records: int = 0
    batches: int = 0
    avg_batch_size: float = 0.0
    avg_batch_tokens: float = 0.0
    utilization: float = 0.0
    records_per_s: float = 0.0
    latency_p50_s: float = 0.0
    latency_p99_s: float = 0.0
    queue_wait_p99_s: float = 0.0
    batches_by_reason: dict[str, int] = field(default_factory=dict)
    padding_efficiency: float = 1.0
    completion_tokens_per_s: float = 0.0


@dataclass
class ChunkResult:
    """What one `infer_batch` call returns: a completion or an error per prompt, in order."""

    chunk_index: int
    completions: list[str]
    errors: list[str]
    prompt_tokens: int
    completion_tokens: int
    replica: ReplicaSnapshot


@dataclass
class Answer:
    """One question's outcome."""

    index: int
    question: str
    completion: str
    predicted: float | None
    gold: float | None
    correct: bool
    error: str = ""


@dataclass
class RunResult:
    """The whole run: answers, accuracy, throughput and per-replica batching."""

    source: str
    questions: int
    answered: int
    failed_questions: list[int]
    accuracy: float
    scored: int
    wall_s: float
    questions_per_s: float
    tokens_per_s: float
    replicas: list[ReplicaSnapshot]
    answers: list[Answer]
