"""`GenerationConfig`: the generation settings every engine understands, for a run or for one request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GenerationConfig:
    """Generation settings shared by every engine.

    An engine has one as its default; a `Request` may carry its own, which applies to that record
    alone. Values are validated at construction.

    Args:
        max_new_tokens: Upper bound on generated tokens per record.
        temperature: 0 means greedy decoding (deterministic); > 0 samples.
        top_p: Nucleus-sampling mass, used only when sampling.
        stop: Strings that end a completion; the stop string is not included in the text.
        seed: Seed for sampling, so that sampled runs can be repeated.

    Example:
        ```python
        config = GenerationConfig(max_new_tokens=128, stop=("\\n\\n",))
        ```
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if not all(isinstance(text, str) and text for text in stop):
            raise ValueError(f"stop strings must be non-empty strings, got {list(stop)!r}")
        object.__setattr__(self, "stop", stop)
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        """Whether decoding is greedy (temperature 0)."""
        return self.temperature == 0
