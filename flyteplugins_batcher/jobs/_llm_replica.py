"""The GPU side of the LLM workflows: reusable replicas, each one process with one engine and one batcher.

`batch_llm.py` (gsm8k) and `batch_jsonl.py` (your own request files) both send chunks of prompts to
`infer_chunk` here. Up to `concurrency` calls run on a replica at once and all feed the replica's
one batcher (`LLMReplica`, around a `SharedBatcher`), which assembles token-budgeted batches and
keeps the model busy while the calls load and post-process.

- A configuration that cannot work (a missing model, an unknown engine argument, a KV cache that
  does not fit) fails the chunk with `flyte.errors.NonRecoverableError`: Flyte does not retry it,
  and the driver stops the run at once with that message.
- Anything else that fails a whole chunk (the engine died, say) is retried by Flyte; a dead engine
  is replaced on the replica by the next call.
- A finished chunk is cached by its content and settings, so re-running a job after a crash
  recomputes only the chunks that had not finished.

`infer_chunk` is a thin Flyte task around `run_chunk`, a plain async function that runs a chunk on
this process's replica (`process_replica()`): the same code path runs outside Flyte too.

Replicas, per-replica concurrency and the GPU type are environment-level settings (`LLM_POOL`),
fixed when the module is imported: set `BATCH_LLM_REPLICAS`, `BATCH_LLM_CONCURRENCY` and
`BATCH_LLM_GPU` (for example `A100:1`, or `none` for CPU replicas) before `flyte run` / `flyte deploy`.
The default concurrency (and the workflows' default chunk size, `LLM_SIZING`) comes from
`size_in_flight` for the engine's `max_num_seqs`: `BATCH_LLM_MAX_NUM_SEQS`, else vLLM's default for
the GPU type (1024 on H100-class GPUs, 256 elsewhere).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import flyte.errors

from flyteplugins_batcher import DeviceMonitor, InFlight, SharedBatcher, TokenBatcher, size_in_flight
from flyteplugins_batcher.batch_api import error_code
from flyteplugins_batcher.engines import (
    CancellationToken,
    Completion,
    Engine,
    EngineConfigError,
    InvalidPromptError,
    Request,
    RequestCancelledError,
    create_engine,
    parse_engine_args,
)
from flyteplugins_batcher.images import gpu_image
from flyteplugins_batcher.jobs._environments import ReplicaPool
from flyteplugins_batcher.jobs._model_loading import loading_model
from flyteplugins_batcher.jobs._schema import (
    ChunkOutcome,
    EngineSettings,
    ItemResult,
    ReplicaSnapshot,
    RequestChunk,
    RequestItem,
)

logger = logging.getLogger("flyteplugins_batcher.jobs._llm_replica")

DEFAULT_GPU = "L4:1"
_LARGE_GPUS = ("H100", "H200", "H20", "GH200", "B200", "B300", "GB200", "MI300")
"""GPUs of 70 GiB or more (other than the A100), to which vLLM (0.9+) gives 1024 sequences by default."""


def vllm_default_max_num_seqs(gpu: str | None) -> int:
    """vLLM's default `max_num_seqs` on a GPU requested as `"H100:1"`: 1024 on H100-class GPUs, else 256."""
    kind = (gpu or "").split(":")[0].upper()
    return 1024 if kind.startswith(_LARGE_GPUS) else 256


def sizing_from_environment() -> InFlight:
    """In-flight work sized for `BATCH_LLM_MAX_NUM_SEQS`, else for vLLM's default on `BATCH_LLM_GPU`."""
    capacity = os.environ.get("BATCH_LLM_MAX_NUM_SEQS") or vllm_default_max_num_seqs(
        os.environ.get("BATCH_LLM_GPU", DEFAULT_GPU)
    )
    return size_in_flight(int(capacity))


LLM_SIZING = sizing_from_environment()
LLM_POOL = ReplicaPool.from_environment("BATCH_LLM", replicas=2, concurrency=LLM_SIZING.concurrency, gpu=DEFAULT_GPU)
CHUNK_RETRIES = 2

gpu_env = LLM_POOL.environment("batch_llm_gpu", image=gpu_image)

_VLLM_ONLY = ("vllm_mode", "max_model_len", "kv_cache_gb", "gpu_memory_utilization", "tensor_parallel_size")
_NOT_SIMULATED = (*_VLLM_ONLY, "dtype", "enforce_eager")

BatcherFactory = Callable[[Engine, EngineSettings], TokenBatcher]
"""Builds a replica's batcher around its loaded engine: `make_batcher(engine, settings)`."""


def engine_kwargs(settings: EngineSettings) -> dict[str, Any]:
    """`create_engine` keywords for the settings: the vLLM ones only for vLLM, `engine_args` as options for "simulated".

    Raises:
        EngineConfigError: A vLLM-only setting given for another engine, or bad JSON in `engine_args`.
    """
    if settings.engine == "simulated":
        given = [name for name in _NOT_SIMULATED if getattr(settings, name)]
        if given:
            raise EngineConfigError(
                f"{', '.join(given)} do not apply to engine='simulated' (give its options as engine_args)"
            )
        return parse_engine_args(settings.engine_args)
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


def load_engine(settings: EngineSettings) -> Engine:
    """Build and load an engine for the settings (blocking: a replica calls it in a worker thread)."""
    engine_name = settings.engine
    kwargs = engine_kwargs(settings)
    if engine_name == "auto" and any(name != "dtype" for name in kwargs):
        engine_name = "vllm"  # vLLM settings were given: the user means vLLM
    try:
        engine = create_engine(
            engine_name,  # type: ignore[arg-type]
            settings.model or None,
            generation=settings.generation(),
            system_prompt=settings.system_prompt or None,
            **kwargs,
        )
    except EngineConfigError:
        raise
    except (TypeError, ValueError) as error:  # an unknown engine, option or option value: no retry can fix it
        raise EngineConfigError(f"cannot build the {engine_name!r} engine with these settings: {error}") from error
    with loading_model():
        engine.load()
    logger.info("loaded %s (%s) in %.1f s", engine.model_name, engine.name, engine.stats.load_time_s)
    return engine


def make_batcher(engine: Engine, settings: EngineSettings, **extra: object) -> TokenBatcher:
    """The replica's batcher, from the engine's defaults, the run's overrides and `extra` batcher keywords."""
    # "split": a record that breaks a whole batch must not fail the other tasks' records batched with it.
    overrides: dict[str, object] = {"batch_timeout_s": settings.batch_timeout_s, "on_error": "split", "name": "llm"}
    overrides.update(extra)
    if settings.target_batch_tokens:
        overrides["target_batch_tokens"] = settings.target_batch_tokens
    if settings.max_batch_size:
        overrides["max_batch_size"] = settings.max_batch_size
    if settings.max_queue_size:
        overrides["max_queue_size"] = settings.max_queue_size
    return engine.batcher(**overrides)


class LLMReplica:
    """One process's engine, shared batcher and GPU monitor, and the code that runs a chunk through them.

    Args:
        make_batcher: Builds the batcher around the loaded engine (wrap the engine here to observe
            or instrument what reaches it).

    Example:
        ```python
        replica = LLMReplica()
        outcome = await replica.run_chunk(chunk, EngineSettings(max_new_tokens=64))
        await replica.aclose()
        ```
    """

    def __init__(self, make_batcher: BatcherFactory = make_batcher) -> None:
        self.device = DeviceMonitor()
        self.shared: SharedBatcher[Engine, TokenBatcher] = SharedBatcher(self._load, make_batcher, name="llm")
        self.settings: EngineSettings | None = None
        """The settings the loaded engine was built with."""

    def _load(self, settings: EngineSettings) -> Engine:
        engine = load_engine(settings)
        self.settings = settings
        self.device.start()
        return engine

    async def run_chunk(
        self, chunk: RequestChunk, settings: EngineSettings, *, stop: asyncio.Event | None = None
    ) -> ChunkOutcome:
        """Generate a completion for every prompt of a chunk through the shared batcher.

        A prompt the engine cannot run (empty, too long) gets an error in its result.

        Args:
            chunk: The prompts.
            settings: The engine's settings.
            stop: Once set, the chunk's unfinished prompts are cancelled (a queued one never runs, a
                running one stops where the engine can stop it); they get `CANCELLED` as their error code.

        Raises:
            EngineConfigError: The settings cannot work (retrying cannot help).
            RuntimeError: Inference failed for the chunk (another attempt may succeed).
        """
        batcher = await self.shared.get(settings)
        engine = self.shared.loaded_model
        assert engine is not None
        defaults = settings.generation()
        requests = [item.engine_request(defaults) for item in chunk.items]
        if stop is None:
            outcomes = await batcher.run(requests, return_exceptions=True)
        else:
            outcomes = await run_until(batcher, [replace(r, cancellation=CancellationToken()) for r in requests], stop)
        stopped = stop is not None and stop.is_set()
        answers = zip(chunk.items, outcomes, strict=True)
        results = [_item_result(chunk, item, outcome, stopped=stopped) for item, outcome in answers]
        return ChunkOutcome(chunk.index, results, self.snapshot(batcher, engine), finished_at=time.time())

    def snapshot(self, batcher: TokenBatcher, engine: Engine) -> ReplicaSnapshot:
        """The batcher, engine and device statistics, labelled with the pod (host) and process."""
        device = self.device.utilization()
        return ReplicaSnapshot.of_batcher(
            batcher.stats,
            replica=f"{socket.gethostname()}/{os.getpid()}",
            model=engine.model_name,
            device_utilization=device.mean if device.available else -1.0,
            device_note=device.note,
            **ReplicaSnapshot.engine_fields(engine.stats),
        )

    async def aclose(self) -> None:
        """Stop the batcher, close the engine and stop the GPU monitor."""
        await self.shared.aclose()
        self.device.stop()


CANCELLED = "cancelled"
"""The error code of a prompt cancelled by `run_chunk`'s `stop` before it finished."""


def _item_result(chunk: RequestChunk, item: RequestItem, outcome: object, *, stopped: bool) -> ItemResult:
    """A prompt's result: its completion, its own error, or `CANCELLED` (only when the chunk was told to stop).

    Raises:
        RuntimeError: Inference failed (another attempt may succeed), or the batcher cancelled the
            prompt without the chunk being told to stop (it was stopped: another attempt may run it).
    """
    if isinstance(outcome, Completion):
        return ItemResult.of(item.key, outcome)
    if isinstance(outcome, InvalidPromptError):
        return ItemResult(item.key, error_code=error_code(outcome), error_message=str(outcome))
    if stopped and isinstance(outcome, (asyncio.CancelledError, RequestCancelledError)):
        return ItemResult(item.key, error_code=CANCELLED, error_message="The request was cancelled before it finished.")
    raise RuntimeError(f"chunk {chunk.index}: inference failed: {outcome!r}") from (
        outcome if isinstance(outcome, BaseException) else None
    )


async def run_until(batcher: TokenBatcher, records: list[Request], stop: asyncio.Event) -> list[object]:
    """Each record's outcome, its error in its place; once `stop` is set, those not finished are cancelled.

    A cancelled record's place holds a `CancelledError`: the batcher drops it if it was queued, and
    tells it to stop (`Request.cancel`) if it was running.
    """
    futures: list[asyncio.Future[Any]] = []
    for record in records:
        if stop.is_set():
            break
        futures.append(await batcher.submit(record))
    batcher.flush()
    answered = asyncio.gather(*futures, return_exceptions=True)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({answered, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        for future in futures:
            future.cancel()  # nothing happens to those that have their outcome
    outcomes: list[object] = [_outcome(future) for future in futures]
    return outcomes + [asyncio.CancelledError() for _ in records[len(futures) :]]


def _outcome(future: asyncio.Future[Any]) -> object:
    if future.cancelled():
        return asyncio.CancelledError()
    return future.exception() or future.result()


_replica: LLMReplica | None = None
_replica_lock = threading.Lock()


def process_replica() -> LLMReplica:
    """This process's replica: one engine and one batcher, shared by every chunk the process runs."""
    global _replica
    with _replica_lock:
        if _replica is None:
            _replica = LLMReplica()
        return _replica


def set_process_replica(replica: LLMReplica | None) -> LLMReplica | None:
    """Run this process's chunks on `replica` from now on (`None`: a fresh default one on first use).

    Returns:
        The replica it replaces (not closed), if there was one.
    """
    global _replica
    with _replica_lock:
        previous, _replica = _replica, replica
    return previous


async def run_chunk(chunk: RequestChunk, settings: EngineSettings) -> ChunkOutcome:
    """Run a chunk on this process's replica: the body of `infer_chunk`, with no Flyte in it.

    Raises:
        EngineConfigError: The settings cannot work.
        RuntimeError: Inference failed for the chunk.
    """
    return await process_replica().run_chunk(chunk, settings)


@gpu_env.task(retries=CHUNK_RETRIES, cache="auto")
async def infer_chunk(chunk: RequestChunk, settings: EngineSettings, cache_salt: str = "") -> ChunkOutcome:
    """Run a chunk on this replica (`run_chunk`); a configuration that cannot work fails without retries.

    Args:
        chunk: The prompts.
        settings: The engine, generation and batcher settings (the replica's engine is keyed on them).
        cache_salt: Part of the cache key only: a fresh value makes the chunk run again instead of
            reusing an earlier run's result.
    """
    try:
        return await run_chunk(chunk, settings)
    except EngineConfigError as error:
        raise flyte.errors.NonRecoverableError(f"the engine cannot start: {error}") from error
