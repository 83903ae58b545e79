"""`GenerationConfig`: the generation settings every engine understands, for a run or for one request."""

from __future__ import annotations

from dataclasses import dataclass

from flyteplugins_batcher.engines._response_format import ResponseFormat

MAX_SAMPLES = 128
"""Most samples (`n`) one request may ask for, as OpenAI's API allows."""


@dataclass(frozen=True)
class GenerationConfig:
    """Generation settings shared by every engine.

    An engine has one as its default; a `Request` may carry its own, which applies to that record
    alone. Values are validated at construction. It is hashable (engines cache per-setting objects).

    Args:
        max_new_tokens: Upper bound on generated tokens per record (per sample).
        temperature: 0 means greedy decoding (deterministic); > 0 samples.
        top_p: Nucleus-sampling mass, used only when sampling.
        stop: Strings that end a completion; the stop string is not included in the text.
        seed: Seed for sampling, so that sampled runs can be repeated.
        n: Samples per record, 1 to `MAX_SAMPLES`; the completion carries them all. Greedy samples
            are identical, so engines decode one and repeat it.
        response_format: Constrain the output to JSON, or to a JSON schema (`ResponseFormat`).

    Example:
        ```python
        config = GenerationConfig(max_new_tokens=128, stop=("\\n\\n",))
        three_json_samples = GenerationConfig(temperature=0.8, n=3, response_format=ResponseFormat.json_object())
        ```
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    n: int = 1
    response_format: ResponseFormat | None = None

    def __post_init__(self) -> None:
        if not _is_integer(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if not all(isinstance(text, str) and text for text in stop):
            raise ValueError(f"stop strings must be non-empty strings, got {list(stop)!r}")
        object.__setattr__(self, "stop", stop)
        if self.seed is not None and not _is_integer(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not _is_integer(self.n) or not 1 <= self.n <= MAX_SAMPLES:
            raise ValueError(f"n must be an integer from 1 to {MAX_SAMPLES}, got {self.n!r}")
        if self.response_format is not None and not isinstance(self.response_format, ResponseFormat):
            raise ValueError(f"response_format must be a ResponseFormat, got {self.response_format!r}")

    @property
    def greedy(self) -> bool:
        """Whether decoding is greedy (temperature 0)."""
        return self.temperature == 0

    @property
    def decoded_samples(self) -> int:
        """Sequences an engine decodes per record: `n` when sampling, 1 when greedy (its samples are equal)."""
        return 1 if self.greedy else self.n

    @property
    def generated_tokens(self) -> int:
        """Most tokens a record generates: `max_new_tokens` per decoded sample (the batcher's budget counts them)."""
        return self.decoded_samples * self.max_new_tokens


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
