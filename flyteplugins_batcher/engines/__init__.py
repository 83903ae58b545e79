"""LLM engines for the batcher: a batch of prompt records in, completions in the same order out.

Importing this package needs neither torch, transformers nor vllm: each engine imports its
dependencies when it is built or loaded, and the vLLM engines are resolved only when first accessed.

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

from typing import TYPE_CHECKING, Any

from flyteplugins_batcher.engines._base import BatchEngine, Engine, StreamingEngine
from flyteplugins_batcher.engines._completion import Completion, FinishReason, Sample
from flyteplugins_batcher.engines._config import MAX_SAMPLES, GenerationConfig
from flyteplugins_batcher.engines._continuous_batching import (
    ContinuousBatchScheduler,
    OfflineRun,
    SequenceJob,
    StepResult,
    run_all_at_once,
)
from flyteplugins_batcher.engines._errors import (
    ContextLengthExceededError,
    EngineConfigError,
    EngineDeadError,
    EngineNotLoadedError,
    InvalidModelReferenceError,
    InvalidPromptError,
    InvalidResponseFormatError,
    ModelNotFoundError,
)
from flyteplugins_batcher.engines._factory import (
    DEFAULT_VLLM_MODE,
    ENGINE_NAMES,
    EngineName,
    create_engine,
    vllm_usable,
)
from flyteplugins_batcher.engines._model_reference import model_display_name
from flyteplugins_batcher.engines._records import ChatMessages, PreparedPrompt, PromptRecord, Request
from flyteplugins_batcher.engines._response_format import ResponseFormat
from flyteplugins_batcher.engines._simulated import SimulatedEngine
from flyteplugins_batcher.engines._simulated_gpu import OutputLengths, SimulatedGpu
from flyteplugins_batcher.engines._smollm2 import BUNDLED_MODEL_NAME, bundled_smollm2_gguf, bundled_smollm2_path
from flyteplugins_batcher.engines._stats import EngineStats
from flyteplugins_batcher.engines._transformers import TransformersEngine
from flyteplugins_batcher.engines._vllm_args import parse_engine_args

if TYPE_CHECKING:
    from flyteplugins_batcher.engines._vllm import VLLMEngine
    from flyteplugins_batcher.engines._vllm_stream import VLLMStreamEngine

__all__ = [
    "BUNDLED_MODEL_NAME",
    "DEFAULT_VLLM_MODE",
    "ENGINE_NAMES",
    "MAX_SAMPLES",
    "BatchEngine",
    "ChatMessages",
    "Completion",
    "ContextLengthExceededError",
    "ContinuousBatchScheduler",
    "Engine",
    "EngineConfigError",
    "EngineDeadError",
    "EngineName",
    "EngineNotLoadedError",
    "EngineStats",
    "FinishReason",
    "GenerationConfig",
    "InvalidModelReferenceError",
    "InvalidPromptError",
    "InvalidResponseFormatError",
    "ModelNotFoundError",
    "OfflineRun",
    "OutputLengths",
    "PreparedPrompt",
    "PromptRecord",
    "Request",
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
    "create_engine",
    "model_display_name",
    "parse_engine_args",
    "run_all_at_once",
    "vllm_usable",
]


def __getattr__(name: str) -> Any:
    # The vLLM modules are imported only on first use, so that CPU installs never pay for (or trip
    # over) vllm.
    if name == "VLLMEngine":
        from flyteplugins_batcher.engines._vllm import VLLMEngine

        return VLLMEngine
    if name == "VLLMStreamEngine":
        from flyteplugins_batcher.engines._vllm_stream import VLLMStreamEngine

        return VLLMStreamEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
