"""`Completion`: one record's samples, their logprobs and token accounting; `trim_at_stop` cuts a sample."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

LOGPROB_FLOOR = -9999.0
"""The lowest log-probability written: OpenAI's (and vLLM's) stand-in for `-inf`, which JSON cannot hold."""

FinishReason = Literal["stop", "length"]
"""`"stop"`: EOS or a stop string ended generation; `"length"`: `max_new_tokens` did."""


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability, and the most likely tokens at its place (`GenerationConfig.logprobs`).

    Log-probabilities are the model's own, before sampling settings, penalties, biases and grammars
    change them (vLLM's default `raw_logprobs`), floored at -9999.0 as OpenAI writes `-inf`.

    Attributes:
        token: The token as text (each token decoded alone: a character split across tokens shows as
            its replacement character, as vLLM and OpenAI show it).
        logprob: Its natural log-probability.
        top: The most likely tokens at this place and theirs, most likely first (as many as the record
            asked for; empty for 0).

    Example:
        ```python
        [completion] = engine.generate([Request("2 + 2 =", GenerationConfig(max_new_tokens=1, logprobs=2))])
        first = completion.samples[0].logprobs[0]
        print(first.token, first.logprob, first.top)  # " 4" -0.12 ((" 4", -0.12), (" four", -2.3))
        ```
    """

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Sample:
    """One generated sample of a record (a record asking for `n` samples gets `n` of them).

    Attributes:
        text: The generated text, without the prompt and without a matched stop string; with a reasoning
            parser, the answer after the reasoning (empty when there is none).
        completion_tokens: Tokens generated for this sample.
        finish_reason: `"stop"` when EOS or a stop string ended it, `"length"` when `max_new_tokens` did.
        logprobs: Each generated token's log-probability, when the record asked for them
            (`GenerationConfig.logprobs`); `None` otherwise.
        stop_reason: The stop string that ended it (vLLM's `stop_reason`); `None` when EOS or the length did.
        reasoning: The reasoning a reasoning parser took out of the text (`<think>...</think>`, say); `None`
            without a parser, or when the text held none.
        reasoning_tokens: Of `completion_tokens`, those of the reasoning.
        token_ids: The generated token ids, where the engine gives them (a reasoning parser counts with them).
    """

    text: str
    completion_tokens: int
    finish_reason: FinishReason
    logprobs: tuple[TokenLogprob, ...] | None = None
    stop_reason: str | None = None
    reasoning: str | None = None
    reasoning_tokens: int = 0
    token_ids: tuple[int, ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class Completion:
    """One record's generated text and token accounting.

    A record that asked for several samples (`GenerationConfig.n`) has them all in `samples`;
    `text` and `finish_reason` are the first sample's, so code written for one sample keeps
    working, and `completion_tokens` counts every sample (as OpenAI's `usage` does).

    Attributes:
        text: The (first sample's) generated text, without the prompt and without a matched stop string.
        prompt_tokens: Tokens in the rendered prompt (after the chat template).
        completion_tokens: Tokens generated, all samples together.
        finish_reason: `"stop"` when EOS or a stop string ended the (first) sample, `"length"` when
            `max_new_tokens` did.
        samples: Every sample, in order; one built from the fields above when not given.
        cached_tokens: Prompt tokens the engine found already computed in its prefix cache (vLLM's
            `num_cached_tokens`), so it did not compute them again; 0 where the engine has no such cache.

    Example:
        ```python
        [completion] = engine.generate(["What is 2 + 2?"])
        print(completion.text, completion.finish_reason)
        three = Completion.from_samples(12, [Sample("4", 2, "stop"), Sample("four", 2, "stop"), Sample("4", 2, "stop")])
        assert three.completion_tokens == 6 and three.text == "4"
        ```
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason
    samples: tuple[Sample, ...] = ()
    cached_tokens: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.cached_tokens <= self.prompt_tokens:
            raise ValueError(f"cached_tokens must lie in 0..prompt_tokens, got {self.cached_tokens}")
        if not self.samples:
            object.__setattr__(self, "samples", (Sample(self.text, self.completion_tokens, self.finish_reason),))
            return
        object.__setattr__(self, "samples", tuple(self.samples))
        first = self.samples[0]
        if (first.text, first.finish_reason) != (self.text, self.finish_reason):
            raise ValueError("a completion's text and finish_reason are its first sample's")
        if sum(sample.completion_tokens for sample in self.samples) != self.completion_tokens:
            raise ValueError("a completion's completion_tokens must count every sample's tokens")

    @classmethod
    def from_samples(cls, prompt_tokens: int, samples: Sequence[Sample], cached_tokens: int = 0) -> Completion:
        """A completion of one or more samples (at least one), `cached_tokens` of its prompt found in a prefix cache.

        Raises:
            ValueError: `samples` is empty.
        """
        if not samples:
            raise ValueError("a completion needs at least one sample")
        first = samples[0]
        total = sum(sample.completion_tokens for sample in samples)
        return cls(first.text, prompt_tokens, total, first.finish_reason, tuple(samples), cached_tokens)


def trim_at_stop(text: str, stop: Sequence[str]) -> tuple[str, str | None]:
    """Cut `text` at the earliest occurrence of any stop string.

    Returns:
        The text before the stop string (all of it when none occurs), and the stop string that occurred
        (`None` when none did).

    Example:
        ```python
        assert trim_at_stop("4\\n\\nNext", ["\\n\\n"]) == ("4", "\\n\\n")
        ```
    """
    found = [(index, candidate) for candidate in stop if candidate and (index := text.find(candidate)) >= 0]
    if not found:
        return text, None
    index, candidate = min(found, key=lambda pair: pair[0])
    return text[:index], candidate
