"""Mirror of `vllm.exceptions` (vLLM 0.33.0), reduced to the classes the fake raises."""


class VLLMError(Exception):
    """Base class of vLLM's own errors."""


class VLLMValidationError(VLLMError):
    """A request failed validation (for example a prompt longer than `max_model_len`)."""


class GenerationError(VLLMError):
    """A request failed inside the engine; the engine itself stays healthy."""
