"""LLM engines for the batcher: a batch of prompt records in, completions in the same order out.

Importing this package needs neither torch, transformers nor vllm: each engine imports its
dependencies when it is built or loaded.

Example:
    ```python
    from flyteplugins_batcher.engines import GenerationConfig, Request, ResponseFormat, create_engine

    engine = create_engine(generation=GenerationConfig(max_new_tokens=64))  # SmolLM2 on CPU, vLLM on GPU
    engine.load()
    async with engine.batcher() as batcher:
        short = Request("Name a prime.", GenerationConfig(max_new_tokens=8))
        as_json = Request("Invent a user.", GenerationConfig(response_format=ResponseFormat.json_object()))
        three = Request("Name a color.", GenerationConfig(temperature=0.8, n=3))  # three samples
        completions = await batcher.run(["What is 2 + 2?", short, as_json, three])
    ```
"""

from __future__ import annotations

from flyteplugins_batcher.engines._base import BatchEngine, Engine, LoadedModel, StreamingEngine
from flyteplugins_batcher.engines._completion import Completion, FinishReason, Sample, trim_at_stop
from flyteplugins_batcher.engines._config import MAX_SAMPLES, GenerationConfig
from flyteplugins_batcher.engines._engine_errors import (
    ContextLengthExceededError,
    EngineConfigError,
    EngineDeadError,
    EngineNotLoadedError,
    InvalidModelReferenceError,
    InvalidPromptCode,
    InvalidPromptError,
    InvalidResponseFormatError,
    ModelNotFoundError,
    RequestCancelledError,
)
from flyteplugins_batcher.engines._engine_stats import EngineCounters, EngineStats
from flyteplugins_batcher.engines._factory import (
    DEFAULT_VLLM_MODE,
    ENGINE_NAMES,
    EngineName,
    create_engine,
    vllm_usable,
)
from flyteplugins_batcher.engines._live import CancellationToken, DeltaListener
from flyteplugins_batcher.engines._model_reference import check_model_reference, model_display_name
from flyteplugins_batcher.engines._model_thread import ModelThread
from flyteplugins_batcher.engines._prompts import ChatMessages, PreparedPrompt, PromptRecord, Request
from flyteplugins_batcher.engines._response_format import ResponseFormat
from flyteplugins_batcher.engines._smollm2 import (
    BUNDLED_MODEL_NAME,
    CACHE_DIR_ENV,
    bundled_smollm2_gguf,
    bundled_smollm2_path,
    cache_root,
    publish_directory,
)
from flyteplugins_batcher.engines.simulated import (
    ContinuousBatchScheduler,
    OfflineRun,
    OutputLengths,
    SequenceJob,
    SimulatedEngine,
    SimulatedGpu,
    StepResult,
    run_all_at_once,
)
from flyteplugins_batcher.engines.transformers import TransformersEngine
from flyteplugins_batcher.engines.vllm import ENGINE_EXIT_GRACE_S, VLLMEngine, VLLMStreamEngine, parse_engine_args

__all__ = [
    "BUNDLED_MODEL_NAME",
    "CACHE_DIR_ENV",
    "DEFAULT_VLLM_MODE",
    "ENGINE_EXIT_GRACE_S",
    "ENGINE_NAMES",
    "MAX_SAMPLES",
    "BatchEngine",
    "CancellationToken",
    "ChatMessages",
    "Completion",
    "ContextLengthExceededError",
    "ContinuousBatchScheduler",
    "DeltaListener",
    "Engine",
    "EngineConfigError",
    "EngineCounters",
    "EngineDeadError",
    "EngineName",
    "EngineNotLoadedError",
    "EngineStats",
    "FinishReason",
    "GenerationConfig",
    "InvalidModelReferenceError",
    "InvalidPromptCode",
    "InvalidPromptError",
    "InvalidResponseFormatError",
    "LoadedModel",
    "ModelNotFoundError",
    "ModelThread",
    "OfflineRun",
    "OutputLengths",
    "PreparedPrompt",
    "PromptRecord",
    "Request",
    "RequestCancelledError",
    "ResponseFormat",
    "Sample",
    "SequenceJob",
    "SimulatedEngine",
    "SimulatedGpu",
    "StepResult",
    "StreamingEngine",
    "TransformersEngine",
    "VLLMEngine",
    "VLLMStreamEngine",
    "bundled_smollm2_gguf",
    "bundled_smollm2_path",
    "cache_root",
    "check_model_reference",
    "create_engine",
    "model_display_name",
    "parse_engine_args",
    "publish_directory",
    "run_all_at_once",
    "trim_at_stop",
    "vllm_usable",
]
