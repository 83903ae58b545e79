"""The vLLM engines: `VLLMEngine` (offline `LLM.generate`, batch mode) and `VLLMStreamEngine` (`AsyncLLM`, stream mode).

Importing this package does not import vLLM: the engines import it when they load.

Example:
    ```python
    from flyteplugins_batcher.engines.vllm import VLLMStreamEngine

    engine = VLLMStreamEngine("Qwen/Qwen2.5-0.5B-Instruct", max_model_len=4096)
    engine.load()
    ```
"""

from __future__ import annotations

from flyteplugins_batcher.engines.vllm._args import parse_engine_args
from flyteplugins_batcher.engines.vllm._engine import ENGINE_EXIT_GRACE_S, VLLMEngine
from flyteplugins_batcher.engines.vllm._stream import VLLMStreamEngine

__all__ = ["ENGINE_EXIT_GRACE_S", "VLLMEngine", "VLLMStreamEngine", "parse_engine_args"]
