"""The GPU side of the LLM workflows: reusable replicas, each one process with one engine and one batcher.

`batch_llm.py` (gsm8k) and `batch_jsonl.py` (your own request files) both send chunks of prompts to
`infer_chunk` here. Up to `concurrency` calls run on a replica at once and all feed the replica's
one batcher (`SharedBatcher`), which assembles token-budgeted batches and keeps the model busy
while the calls load and post-process.

- A configuration that cannot work (a missing model, an unknown engine argument, a KV cache that
  does not fit) fails the chunk with `flyte.errors.NonRecoverableError`: Flyte does not retry it,
  and the driver stops the run at once with that message.
- Anything else that fails a whole chunk (the engine died, say) is retried by Flyte; a dead engine
  is replaced on the replica by the next call.
- A finished chunk is cached by its content and settings, so re-running a job after a crash
  recomputes only the chunks that had not finished.

Replicas, per-replica concurrency and the GPU type are environment-level settings, fixed when the
module is imported: set `BATCH_LLM_REPLICAS`, `BATCH_LLM_CONCURRENCY` and `BATCH_LLM_GPU` (for
example `A100:1`, or `none` for CPU replicas) before `flyte run` / `flyte deploy`.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import replace
from typing import Any

import flyte
import flyte.errors

from flyteplugins_batcher import DeviceMonitor, SharedBatcher, TokenBatcher, inference_environment
from flyteplugins_batcher.engines import (
    Completion,
    Engine,
    EngineConfigError,
    GenerationConfig,
    InvalidPromptError,
    Request,
    create_engine,
    parse_engine_args,
)
from images import gpu_image
from workflows.schema import ChunkOutcome, EngineSettings, ItemResult, ReplicaSnapshot, RequestChunk, RequestItem

logger = logging.getLogger("workflows.llm_replica")

REPLICAS = int(os.environ.get("BATCH_LLM_REPLICAS", "2"))
CONCURRENCY = int(os.environ.get("BATCH_LLM_CONCURRENCY", "10"))
GPU = os.environ.get("BATCH_LLM_GPU", "L4:1")
CHUNK_RETRIES = 2

gpu_env = inference_environment(
    "batch_llm_gpu",
    image=gpu_image,
    gpu=None if GPU.lower() == "none" else GPU,
    replicas=REPLICAS,
    concurrency=CONCURRENCY,
)

DEVICE = DeviceMonitor()
"""The replica's GPU, as NVML sees it (started with the engine)."""

_VLLM_ONLY = ("vllm_mode", "max_model_len", "kv_cache_gb", "gpu_memory_utilization", "tensor_parallel_size")


def engine_kwargs(settings: EngineSettings) -> dict[str, Any]:
    """`create_engine` keywords for the settings: the vLLM ones only for vLLM.

    Raises:
        EngineConfigError: A vLLM-only setting given for the Transformers engine, or bad JSON in
            `engine_args`.
    """
    if settings.engine == "transformers":
        given = [name for name in _VLLM_ONLY if getattr(settings, name)] + (
            ["engine_args"] if settings.engine_args else []
        )
        if given:
            raise EngineConfigError(f"{', '.join(given)} apply to engine='vllm' only, not 'transformers'")
        return {"dtype": settings.dtype} if settings.dtype else {}
    kwargs: dict[str, Any] = parse_engine_args(settings.engine_args)
    explicit = {
        "mode": settings.vllm_mode,
        "max_model_len": settings.max_model_len,
        "kv_cache_memory_bytes": int(settings.kv_cache_gb * 2**30),
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "dtype": settings.dtype,
        "tensor_parallel_size": settings.tensor_parallel_size,
    }
    kwargs.update({name: value for name, value in explicit.items() if value})
    if settings.enforce_eager:
        kwargs["enforce_eager"] = settings.enforce_eager.strip().lower() in ("1", "true", "yes")
    return kwargs


def generation(settings: EngineSettings) -> GenerationConfig:
    """The run's default generation settings."""
    return GenerationConfig(
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        seed=settings.seed if settings.seed >= 0 else None,
    )


def load_engine(settings: EngineSettings) -> Engine:
    """Build and load the replica's engine (once per process, in a worker thread)."""
    engine_name = settings.engine
    kwargs = engine_kwargs(settings)
    if engine_name == "auto" and any(name != "dtype" for name in kwargs):
        engine_name = "vllm"  # vLLM settings were given: the user means vLLM
    engine = create_engine(
        engine_name,  # type: ignore[arg-type]
        settings.model or None,
        generation=generation(settings),
        system_prompt=settings.system_prompt or None,
        **kwargs,
    )
    engine.load()
    DEVICE.start()
    logger.info("loaded %s (%s) in %.1f s", engine.model_name, engine.name, engine.stats.load_time_s)
    return engine


def make_batcher(engine: Engine, settings: EngineSettings) -> TokenBatcher:
    """The replica's batcher, from the engine's defaults and the run's overrides."""
    # "split": a record that breaks a whole batch must not fail the other tasks' records batched with it.
    overrides: dict[str, object] = {"batch_timeout_s": settings.batch_timeout_s, "on_error": "split", "name": "llm"}
    if settings.target_batch_tokens:
        overrides["target_batch_tokens"] = settings.target_batch_tokens
    if settings.max_batch_size:
        overrides["max_batch_size"] = settings.max_batch_size
    return engine.batcher(**overrides)


LLM: SharedBatcher[Engine, TokenBatcher] = SharedBatcher(load_engine, make_batcher, name="llm")


@gpu_env.task(retries=CHUNK_RETRIES, cache="auto")
async def infer_chunk(chunk: RequestChunk, settings: EngineSettings) -> ChunkOutcome:
    """Generate a completion for every prompt of a chunk through the replica's shared batcher.

    A prompt the engine cannot run (empty, too long) gets an error in its result. A configuration
    that cannot work fails without retries; any other failure fails the chunk so Flyte retries it.
    """
    try:
        batcher = await LLM.get(settings)
    except EngineConfigError as error:
        raise flyte.errors.NonRecoverableError(f"the engine cannot start: {error}") from error
    engine = LLM.loaded_model
    assert engine is not None
    defaults = generation(settings)
    outcomes = await batcher.run([to_request(item, defaults) for item in chunk.items], return_exceptions=True)
    results = []
    for item, outcome in zip(chunk.items, outcomes, strict=True):
        if isinstance(outcome, Completion):
            results.append(
                ItemResult(
                    item.key,
                    outcome.text,
                    outcome.finish_reason,
                    outcome.prompt_tokens,
                    outcome.completion_tokens,
                )
            )
        elif isinstance(outcome, InvalidPromptError):
            code = "context_length_exceeded" if "too long" in str(outcome) else "invalid_prompt"
            results.append(ItemResult(item.key, error_code=code, error_message=str(outcome)))
        else:
            raise RuntimeError(f"chunk {chunk.index}: inference failed: {outcome!r}") from outcome
    return ChunkOutcome(chunk.index, results, replica_snapshot(batcher, engine), finished_at=time.time())


def to_request(item: RequestItem, defaults: GenerationConfig) -> Request:
    """An engine `Request` for a chunk item, with its own settings over the run's."""
    overrides: dict[str, Any] = {}
    if item.max_tokens >= 0:
        overrides["max_new_tokens"] = item.max_tokens
    if item.temperature >= 0:
        overrides["temperature"] = item.temperature
    if item.top_p >= 0:
        overrides["top_p"] = item.top_p
    if item.stop:
        overrides["stop"] = tuple(item.stop)
    if item.seed >= 0:
        overrides["seed"] = item.seed
    prompt: Any = [{"role": m.role, "content": m.content} for m in item.messages] if item.messages else item.prompt
    return Request(prompt, replace(defaults, **overrides) if overrides else defaults, id=item.key)


def replica_snapshot(batcher: TokenBatcher, engine: Engine) -> ReplicaSnapshot:
    """This replica's batcher, engine and device statistics, labelled with the pod (host) and process."""
    stats = batcher.stats
    engine_stats = engine.stats
    device = DEVICE.utilization()
    return ReplicaSnapshot(
        replica=f"{socket.gethostname()}/{os.getpid()}",
        model=engine.model_name,
        load_time_s=engine_stats.load_time_s,
        records=stats.total_completed,
        batches=stats.total_batches,
        avg_batch_size=stats.avg_batch_size,
        avg_batch_tokens=stats.avg_batch_cost,
        utilization=stats.utilization,
        device_utilization=device.mean if device.available else -1.0,
        device_note=device.note,
        records_per_s=stats.records_per_s,
        latency_p50_s=stats.latency_s.p50,
        latency_p99_s=stats.latency_s.p99,
        queue_wait_p99_s=stats.queue_wait_s.p99,
        batches_by_reason=dict(stats.batches_by_reason),
        padding_efficiency=engine_stats.padding_efficiency,
        completion_tokens_per_s=engine_stats.completion_tokens_per_s,
    )
