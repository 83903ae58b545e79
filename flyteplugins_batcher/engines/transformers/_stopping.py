"""Stopping criteria for Hugging Face `generate`: a row hit a stop string (`trim_at_stop` trims it) or was cancelled."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import StoppingCriteria

from flyteplugins_batcher.engines._live import CancellationToken

_EXTRA_WINDOW_TOKENS = 8
"""Tokens decoded beyond the longest stop string, so that a stop string split across tokens (or
preceded by tokens that decode to nothing) is still seen whole."""


class StopTextCriteria(StoppingCriteria):
    """Marks a row done as soon as its newly generated text contains one of `stop`.

    Only the tail of each row is decoded at every step: a stop string that first appears must end
    in the newest token, and a string of `n` characters spans at most `n` tokens. A miss (for
    example a token that decodes differently in isolation) costs only extra steps, because
    `trim_at_stop` still cuts the final text.

    Args:
        tokenizer: The tokenizer that decodes the model's ids.
        stop: Stop strings; none may be empty.
        prompt_width: Width of the (left-padded) prompt block, where generation starts.

    Example:
        ```python
        criteria = StopTextCriteria(tokenizer, ("\\n\\n",), prompt_width=input_ids.shape[1])
        model.generate(input_ids, stopping_criteria=StoppingCriteriaList([criteria]))
        ```
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str], prompt_width: int) -> None:
        if not stop or not all(stop):
            raise ValueError(f"stop strings must be non-empty, got {list(stop)!r}")
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.prompt_width = prompt_width
        self.window_tokens = max(len(text) for text in self.stop) + _EXTRA_WINDOW_TOKENS

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        start = max(self.prompt_width, input_ids.shape[1] - self.window_tokens)
        tails = self.tokenizer.batch_decode(input_ids[:, start:], skip_special_tokens=True)
        done = [any(text in tail for text in self.stop) for tail in tails]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class CancelledRowsCriteria(StoppingCriteria):
    """Marks a row done once its record's caller cancelled it: the row stops at the next decoding step.

    A row whose record has no token never stops for this reason. The whole call ends once every
    row is done, so a batch whose callers all left stops at once.

    Args:
        tokens: Each row's record's cancellation token, or `None`.

    Example:
        ```python
        criteria = CancelledRowsCriteria([prompt.cancellation for prompt in rows])
        model.generate(input_ids, stopping_criteria=StoppingCriteriaList([criteria]))
        ```
    """

    def __init__(self, tokens: Sequence[CancellationToken | None]) -> None:
        self.tokens = list(tokens)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        done = [token is not None and token.cancelled for token in self.tokens]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)
