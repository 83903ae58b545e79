"""`Completion`: one record's samples and their token accounting; `trim_at_stop` cuts a sample at a stop string."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

FinishReason = Literal["stop", "length"]
"""`"stop"`: EOS or a stop string ended generation; `"length"`: `max_new_tokens` did."""


@dataclass(frozen=True)
class Sample:
    """One generated sample of a record (a record asking for `n` samples gets `n` of them).

    Attributes:
        text: The generated text, without the prompt and without a matched stop string.
        completion_tokens: Tokens generated for this sample.
        finish_reason: `"stop"` when EOS or a stop string ended it, `"length"` when `max_new_tokens` did.
    """

    text: str
    completion_tokens: int
    finish_reason: FinishReason


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

    def __post_init__(self) -> None:
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
    def from_samples(cls, prompt_tokens: int, samples: Sequence[Sample]) -> Completion:
        """A completion of one or more samples (at least one).

        Raises:
            ValueError: `samples` is empty.
        """
        if not samples:
            raise ValueError("a completion needs at least one sample")
        first = samples[0]
        total = sum(sample.completion_tokens for sample in samples)
        return cls(first.text, prompt_tokens, total, first.finish_reason, tuple(samples))


def trim_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Cut `text` at the earliest occurrence of any stop string.

    Returns:
        The text before the stop string (all of it when none occurs), and whether one occurred.

    Example:
        ```python
        assert trim_at_stop("4\\n\\nNext", ["\\n\\n"]) == ("4", True)
        ```
    """
    positions = [index for index in (text.find(candidate) for candidate in stop if candidate) if index >= 0]
    if not positions:
        return text, False
    return text[: min(positions)], True
