"""LLM engines for the batcher: a batch of prompt records in, completions in the same order out.

Importing this package needs neither torch, transformers nor vllm: each engine imports its
dependencies when it is built or loaded, and `VLLMEngine` is resolved only when first accessed.

Example:
    ```python
    from flyteplugins_batcher.engines import GenerationConfig, create_engine

    engine = create_engine(generation=GenerationConfig(max_new_tokens=64))  # SmolLM2 on CPU, vLLM on GPU
    engine.load()
    async with engine.batcher() as batcher:
        completions = await batcher.run(["What is 2 + 2?", "Name a prime number."])
    ```
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flyteplugins_batcher.engines._base import (
    ChatMessages,
    Completion,
    Engine,
    EngineStats,
    FinishReason,
    GenerationConfig,
    InvalidPromptError,
    PromptRecord,
)
from flyteplugins_batcher.engines._factory import ENGINE_NAMES, EngineName, create_engine, vllm_usable
from flyteplugins_batcher.engines._smollm2 import bundled_smollm2_gguf, bundled_smollm2_path
from flyteplugins_batcher.engines._transformers import TransformersEngine

if TYPE_CHECKING:
    from flyteplugins_batcher.engines._vllm import VLLMEngine

__all__ = [
    "ENGINE_NAMES",
    "ChatMessages",
    "Completion",
    "Engine",
    "EngineName",
    "EngineStats",
    "FinishReason",
    "GenerationConfig",
    "InvalidPromptError",
    "PromptRecord",
    "TransformersEngine",
    "VLLMEngine",
    "bundled_smollm2_gguf",
    "bundled_smollm2_path",
    "create_engine",
    "vllm_usable",
]


def __getattr__(name: str) -> Any:
    # The vLLM module is imported only on first use, so that CPU installs never pay for (or
    # trip over) vllm.
    if name == "VLLMEngine":
        from flyteplugins_batcher.engines._vllm import VLLMEngine

        return VLLMEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
