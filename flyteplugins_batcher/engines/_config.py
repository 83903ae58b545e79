"""`GenerationConfig`: the generation settings every engine understands, for a run or for one request."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from flyteplugins_batcher.engines._response_format import ResponseFormat

MAX_SAMPLES = 128
"""Most samples (`n`) one request may ask for, as OpenAI's API allows."""

MAX_TOP_LOGPROBS = 20
"""Most alternatives per token a request may ask for (`logprobs`), as OpenAI's API and vLLM's default allow."""

MAX_PENALTY = 2.0
"""`presence_penalty` and `frequency_penalty` lie within +-this, as OpenAI's API takes them."""

MAX_LOGIT_BIAS = 100.0
"""A `logit_bias` value lies within +-this, as OpenAI's API takes it."""

LogitBias = tuple[tuple[int, float], ...]
"""Token id and the bias added to its logit, by token id."""


@dataclass(frozen=True)
class GenerationConfig:
    """Generation settings shared by every engine.

    An engine has one as its default; a `Request` may carry its own, which applies to that record
    alone. Values are validated at construction. It is hashable (engines cache per-setting objects).
    An engine that cannot honour a setting fails the record that asks for it, naming the setting.

    Args:
        max_new_tokens: Upper bound on generated tokens per record (per sample).
        temperature: 0 means greedy decoding (deterministic); > 0 samples.
        top_p: Nucleus-sampling mass, used only when sampling.
        stop: Strings that end a completion; the stop string is not included in the text.
        seed: Seed for sampling, so that sampled runs can be repeated.
        n: Samples per record, 1 to `MAX_SAMPLES`; the completion carries them all. Greedy samples
            are identical, so engines decode one and repeat it.
        response_format: Constrain the output (`ResponseFormat`: JSON, a schema, a regex, a choice, a grammar).
        logprobs: Return each generated token's log-probability (`Sample.logprobs`) with this many
            most likely alternatives (0 to 20); `None`: none.
        presence_penalty: Subtracted from the logit of every token already generated (-2 to 2), as vLLM does.
        frequency_penalty: Subtracted from a token's logit once per time it was generated (-2 to 2).
        logit_bias: Added to the logits of these token ids (-100 to 100 each); a mapping is accepted.

    Example:
        ```python
        config = GenerationConfig(max_new_tokens=128, stop=("\\n\\n",))
        three_json_samples = GenerationConfig(temperature=0.8, n=3, response_format=ResponseFormat.json_object())
        scored = GenerationConfig(max_new_tokens=8, logprobs=3, logit_bias={50256: -100})
        ```
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    n: int = 1
    response_format: ResponseFormat | None = None
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: LogitBias = ()

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
        if self.logprobs is not None and (not _is_integer(self.logprobs) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise ValueError(f"logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {self.logprobs!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not _within(getattr(self, name), MAX_PENALTY):
                raise ValueError(f"{name} must be a number from {-MAX_PENALTY:g} to {MAX_PENALTY:g}")
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))

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

    @property
    def shapes_logits(self) -> bool:
        """Whether penalties or a logit bias change the logits before a token is chosen."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)


def _logit_bias(value: object) -> LogitBias:
    """`logit_bias` as sorted `(token id, bias)` pairs (hashable), from pairs or a mapping.

    Raises:
        ValueError: A token id that is not an integer >= 0, or a bias out of range.
    """
    pairs = list(value.items()) if isinstance(value, Mapping) else list(value)  # type: ignore[call-overload]
    checked: dict[int, float] = {}
    for pair in pairs:
        token, bias = pair
        if not _is_integer(token) or token < 0:
            raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
        if not _within(bias, MAX_LOGIT_BIAS):
            raise ValueError(f"logit_bias values must be numbers from -100 to 100, got {bias!r} for token {token}")
        checked[token] = float(bias)
    return tuple(sorted(checked.items()))


def _within(value: object, bound: float) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and -bound <= value <= bound
    )


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
