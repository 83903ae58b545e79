"""The typed inputs and outputs the LLM workflows pass between the driver and the GPU replicas.

Chunks are dataclasses rather than bare lists: Flyte serializes a top-level list element by element,
which is several times slower than one dataclass holding the list.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from flyte.io import File

from flyteplugins_batcher import BatchStats, Timeline
from flyteplugins_batcher.engines import Completion, EngineStats, GenerationConfig, Request, ResponseFormat, Sample
from flyteplugins_batcher.jobs._reruns import ItemOutcomes


@dataclass(frozen=True)
class EngineSettings:
    """Engine, generation and batcher settings: what the replica's shared engine is keyed on.

    Every LLM workflow takes them as inputs of their own (`flyteplugins_batcher/jobs/_options.py`): a field added
    here, with its help below, is an option of each of them. Zero or empty means "the engine's
    default". The vLLM fields apply to `engine="vllm"` (or "auto" on a GPU).

    Attributes:
        engine: "auto" (vLLM on a GPU, else Transformers), "vllm", "transformers", or "simulated"
            (no model: vLLM's scheduling with an H100's step times, to dry-run capacity planning;
            its options as engine_args, e.g. {"time_scale": 4, "gpu": {"max_num_seqs": 1024},
            "output_lengths": {"mean": 200, "long_fraction": 0.05}}).
        model: Hub id or local path; empty for the bundled SmolLM2-135M-Instruct.
        vllm_mode: "stream" (the default: each prompt is its own request to vLLM's continuous
            batching) or "batch" (whole batches through `LLM.generate`).
        max_model_len: vLLM's context length (0: the model's).
        kv_cache_gb: vLLM's KV cache in GiB (0: 2 GiB at most on CPU, vLLM's default on GPU).
        gpu_memory_utilization: vLLM's share of GPU memory (on CPU: of host memory), instead of
            kv_cache_gb.
        dtype: Model dtype ("float32", "bfloat16", ...; empty: the engine's choice for the device).
        tensor_parallel_size: GPUs per replica for vLLM (0: one).
        enforce_eager: "true" to skip vLLM's graph compilation (empty: the default for the device).
        engine_args: Any other vLLM engine argument (or the simulated engine's options), as a JSON object.
        system_prompt: Added to prompts that do not bring their own system message.
        max_new_tokens: Generation budget per answer (a request's own max_tokens wins).
        temperature: 0 for greedy decoding (a request's own temperature wins).
        top_p: Nucleus-sampling mass, when sampling (a request's own top_p wins).
        seed: Seed for sampling, so that a sampled run can be repeated (a request's own seed wins).
        target_batch_tokens: Token budget per batch (0: the engine's default).
        max_batch_size: Records per batch (0: the engine's default).
        batch_timeout_s: Longest a prompt waits for its batch to fill.
        max_queue_size: Prompts that may wait in the replica's queue (0: the batcher's default, 5000); a
            server answers 429 past it.
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
    seed: int | None = None
    target_batch_tokens: int = 0
    max_batch_size: int = 0
    batch_timeout_s: float = 0.05
    max_queue_size: int = 0

    def generation(self) -> GenerationConfig:
        """The run's default generation settings (requests may set their own).

        Raises:
            ValueError: A setting is out of range.
        """
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p, seed=self.seed
        )


@dataclass
class ChatMessage:
    """One chat message."""

    role: str
    content: str


@dataclass
class OutputFormat:
    """A request's `response_format` as it crosses the task boundary (`ResponseFormat`'s fields).

    Attributes:
        schema: The JSON schema as JSON text, or `None` for any JSON object (`json_object`).
        name: The schema's name, for messages.
    """

    schema: str | None = None
    name: str | None = None

    @classmethod
    def of(cls, response_format: ResponseFormat) -> OutputFormat:
        return cls(response_format.schema, response_format.name)

    def response_format(self) -> ResponseFormat:
        return ResponseFormat(self.schema, self.name)


@dataclass
class RequestItem:
    """One prompt for the engine, with the generation settings its request set for itself (`None`: the run's).

    The settings are named as in `GenerationConfig`; `generation` is the one place they become one.
    """

    key: str
    prompt: str = ""
    messages: list[ChatMessage] = field(default_factory=list)
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    seed: int | None = None
    n: int | None = None
    output_format: OutputFormat | None = None
    raw_prompt: bool = False  # an OpenAI /v1/completions prompt: no chat template

    def generation(self, defaults: GenerationConfig) -> GenerationConfig:
        """The run's `defaults` with this item's own settings over them.

        Raises:
            ValueError: A setting is out of range.
        """
        own = {name: getattr(self, name) for name in _OWN_SETTINGS if getattr(self, name) is not None}
        if self.output_format is not None:
            own["response_format"] = self.output_format.response_format()
        return replace(defaults, **own) if own else defaults

    def engine_request(self, defaults: GenerationConfig) -> Request:
        """The engine `Request` for this item: its prompt (or chat messages) and its generation settings."""
        prompt: str | list[dict[str, str]] = (
            [{"role": message.role, "content": message.content} for message in self.messages]
            if self.messages
            else self.prompt
        )
        return Request(prompt, self.generation(defaults), id=self.key, chat_template=False if self.raw_prompt else None)


_OWN_SETTINGS = ("max_new_tokens", "temperature", "top_p", "stop", "seed", "n")


@dataclass
class RequestChunk:
    """A slice of the job sent to one `infer_chunk` call."""

    index: int
    items: list[RequestItem]

    def only(self, positions: list[int]) -> RequestChunk:
        """This chunk with only the items at `positions` (a rerun's retry of the items that failed)."""
        return RequestChunk(self.index, [self.items[position] for position in positions])


@dataclass
class SampleResult:
    """One sample of a completion (`engines.Sample`'s fields)."""

    text: str
    finish_reason: str
    completion_tokens: int


@dataclass
class ItemResult:
    """One prompt's outcome: a completion, or an error code and message.

    `text` and `finish_reason` are the first sample's and `completion_tokens` counts every sample, as
    in `Completion`; `samples` holds every sample when the request asked for more than one.
    """

    key: str
    text: str = ""
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error_code: str = ""
    error_message: str = ""
    samples: list[SampleResult] = field(default_factory=list)

    @classmethod
    def of(cls, key: str, completion: Completion) -> ItemResult:
        """The result for a completion (its samples kept only when there are several)."""
        samples = [SampleResult(s.text, s.finish_reason, s.completion_tokens) for s in completion.samples]
        return cls(
            key,
            completion.text,
            completion.finish_reason,
            completion.prompt_tokens,
            completion.completion_tokens,
            samples=samples if len(samples) > 1 else [],
        )

    def completion(self) -> Completion:
        """The completion this result carries, every sample included."""
        if not self.samples:
            return Completion(self.text, self.prompt_tokens, self.completion_tokens, self.finish_reason)  # type: ignore[arg-type]
        samples = [Sample(s.text, s.completion_tokens, s.finish_reason) for s in self.samples]  # type: ignore[arg-type]
        return Completion.from_samples(self.prompt_tokens, samples)


@dataclass
class ReplicaSnapshot:
    """One replica's engine and shared batcher, as seen at the end of a chunk (since the replica started).

    The engine counters (`engine_steps`, `running_seqs`, `max_num_seqs`, `engine_busy_s`) are
    cumulative, so how full the engine was between two snapshots of a replica is
    `later.engine_counts().since(earlier.engine_counts()).occupancy`.
    `timeline` is the batcher's (`BatchStats.timeline`): when each batch was at the model, since the
    replica started (bounded; the report draws it).
    """

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
    engine_steps: int = 0  # steps of an engine that schedules sequences itself (vLLM, simulated); 0 for others
    running_seqs: int = 0  # sequences running in each step, summed over the steps
    max_num_seqs: int = 0  # the engine's capacity (0 where it has none)
    occupancy: float | None = None  # running sequences per step over max_num_seqs since it started; None: no steps
    engine_busy_s: float = 0.0  # seconds with at least one request in the engine
    timeline: Timeline = field(default_factory=Timeline)

    def engine_counts(self) -> EngineStats:
        """The engine counters as `EngineStats`, for `since()` and `occupancy`."""
        return EngineStats(
            steps=self.engine_steps,
            running_seqs=self.running_seqs,
            max_num_seqs=self.max_num_seqs,
            generate_time_s=self.engine_busy_s,
        )

    @staticmethod
    def engine_fields(stats: EngineStats) -> dict[str, Any]:
        """A snapshot's fields taken from the replica's engine `stats` (pass them to `of_batcher`)."""
        return {
            "load_time_s": stats.load_time_s,
            "padding_efficiency": stats.padding_efficiency,
            "completion_tokens_per_s": stats.completion_tokens_per_s,
            "engine_steps": stats.steps,
            "running_seqs": stats.running_seqs,
            "max_num_seqs": stats.max_num_seqs,
            "occupancy": stats.occupancy if stats.steps else None,
            "engine_busy_s": stats.generate_time_s,
        }

    @classmethod
    def of_batcher(cls, stats: BatchStats, **fields: Any) -> ReplicaSnapshot:
        """A snapshot with the batching fields taken from the replica's batcher `stats`, and `fields` for the rest."""
        return cls(
            records=stats.total_completed,
            batches=stats.total_batches,
            avg_batch_size=stats.avg_batch_size,
            avg_batch_tokens=stats.avg_batch_cost,
            utilization=stats.utilization,
            records_per_s=stats.records_per_s,
            latency_p50_s=stats.latency_s.p50,
            latency_p99_s=stats.latency_s.p99,
            queue_wait_p99_s=stats.queue_wait_s.p99,
            batches_by_reason=dict(stats.batches_by_reason),
            timeline=stats.timeline,
            **fields,
        )


@dataclass
class ChunkOutcome(ItemOutcomes):
    """What one `infer_chunk` call returns: an `ItemResult` per prompt, in order, and its replica's state.

    `finished_at` (epoch seconds) tells a chunk reused from an earlier run (it finished before this run
    began); `fresh` is set on an outcome that merges an earlier run's answers with this run's retry of
    its failures (`flyteplugins_batcher/jobs/_reruns.py`).
    """

    index: int
    results: list[ItemResult]
    replica: ReplicaSnapshot
    finished_at: float = 0.0
    fresh: list[int] | None = None


@dataclass
class RunSummary:
    """What a batch LLM run prints: counts, accuracy where there is gold, throughput, and where the rest is.

    Throughput counts inference only: `load_time_s` (the slowest replica's model load) is excluded.
    `reused`: requests answered by an earlier run of the same job (Flyte's cache); `retried`: requests
    an earlier run failed, which this run sent to the engine again.
    `occupancy` says how full the engines were: running sequences per engine step over
    `max_num_seqs`, across the replicas; `None` for engines without continuous batching (Transformers),
    which have no occupancy.
    """

    source: str
    requests: int
    answered: int
    failed: int
    reused: int
    accuracy: float
    scored: int
    load_time_s: float
    inference_s: float
    requests_per_s: float
    output_tokens_per_s: float
    results: File
    errors: File
    occupancy: float | None = None
    retried: int = 0
