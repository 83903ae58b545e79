"""Mirror of `vllm.v1.engine.exceptions` (vLLM 0.33.0)."""

from vllm.exceptions import VLLMError


class EngineGenerateError(VLLMError):
    """Raised when an `AsyncLLM.generate()` call fails. Recoverable."""


class EngineDeadError(VLLMError):
    """Raised when the engine core has shut down or died. Unrecoverable."""
