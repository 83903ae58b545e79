"""`Completion`: one record's generated text and its token accounting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FinishReason = Literal["stop", "length"]
"""`"stop"`: EOS or a stop string ended generation; `"length"`: `max_new_tokens` did."""


@dataclass(frozen=True)
class Completion:
    """One record's generated text and token accounting.

    Attributes:
        text: The generated text, without the prompt and without a matched stop string.
        prompt_tokens: Tokens in the rendered prompt (after the chat template).
        completion_tokens: Tokens generated.
        finish_reason: `"stop"` when EOS or a stop string ended generation, `"length"` when
            `max_new_tokens` did.

    Example:
        ```python
        [completion] = engine.generate(["What is 2 + 2?"])
        print(completion.text, completion.finish_reason)
        ```
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason
