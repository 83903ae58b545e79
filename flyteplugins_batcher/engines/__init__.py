"""LLM engines for the batcher: a batch of prompt records in, completions in the same order out.

Importing this package needs neither torch, transformers nor vllm: each engine imports its
dependencies when it is built or loaded. Each engine has a folder of its own, which exports it:
`engines.vllm` (`VLLMEngine`, `VLLMStreamEngine`), `engines.transformers` (`TransformersEngine`) and
`engines.simulated` (`SimulatedEngine`, the GPU-timed engine, and its `SimulatedGpu`);
`create_engine` builds any of them by name. `EmbeddingModel` is the sentence-embedding model beside them.

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
from flyteplugins_batcher.engines._completion import Completion, Sample, TokenLogprob
from flyteplugins_batcher.engines._config import MAX_SAMPLES, GenerationConfig
from flyteplugins_batcher.engines._embeddings import Embedding, EmbeddingModel, EmptyDocumentError
from flyteplugins_batcher.engines._engine_errors import (
    ContextLengthExceededError,
    EngineConfigError,
    EngineDeadError,
    EngineNotLoadedError,
    InvalidModelReferenceError,
    InvalidPromptError,
    InvalidResponseFormatError,
    ModelNotFoundError,
    RequestCancelledError,
)
from flyteplugins_batcher.engines._engine_stats import EngineStats
from flyteplugins_batcher.engines._factory import create_engine
from flyteplugins_batcher.engines._live import CancellationToken, DeltaListener
from flyteplugins_batcher.engines._model_loading import loading_model
from flyteplugins_batcher.engines._model_reference import model_display_name
from flyteplugins_batcher.engines._model_thread import ModelThread
from flyteplugins_batcher.engines._prompts import PreparedPrompt, Request
from flyteplugins_batcher.engines._response_format import ResponseFormat
from flyteplugins_batcher.engines._smollm2 import bundled_smollm2_path

__all__ = [
    "MAX_SAMPLES",
    "BatchEngine",
    "CancellationToken",
    "Completion",
    "ContextLengthExceededError",
    "DeltaListener",
    "Embedding",
    "EmbeddingModel",
    "EmptyDocumentError",
    "Engine",
    "EngineConfigError",
    "EngineDeadError",
    "EngineNotLoadedError",
    "EngineStats",
    "GenerationConfig",
    "InvalidModelReferenceError",
    "InvalidPromptError",
    "InvalidResponseFormatError",
    "LoadedModel",
    "ModelNotFoundError",
    "ModelThread",
    "PreparedPrompt",
    "Request",
    "RequestCancelledError",
    "ResponseFormat",
    "Sample",
    "StreamingEngine",
    "TokenLogprob",
    "bundled_smollm2_path",
    "create_engine",
    "loading_model",
    "model_display_name",
]
