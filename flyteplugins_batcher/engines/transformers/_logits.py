"""Logits processors of our own for Hugging Face `generate`: logprobs as the model gave them, penalties, biases.

`generate` runs the custom processors before its own temperature and top-p warpers, and our
`GenerationConfig` for it holds no processor of its own, so the first custom processor sees the
model's raw logits: `LogprobRecorder` goes first and records each row's log-probabilities there
(vLLM's default `raw_logprobs`). `LogitShaper` then applies the presence and frequency penalties
(over the tokens a row generated, as vLLM counts them) and the logit bias.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import LogitsProcessor

from flyteplugins_batcher.engines._completion import LOGPROB_FLOOR
from flyteplugins_batcher.engines._config import GenerationConfig

RecordedStep = tuple[int, float, tuple[tuple[int, float], ...]]
"""One generated token: its id, its logprob, and the best `(id, logprob)` pairs at its place."""


class LogprobRecorder(LogitsProcessor):
    """Records, for the rows that ask, each generated token's log-probability and the best alternatives.

    At each step it keeps the rows' log-softmax; the token chosen from it is known at the next step
    (the last column of `input_ids`), or from the finished sequences (`steps`). Only one step's
    log-probabilities are held at a time.

    Args:
        tops: For each batch row, how many alternatives it wants, or `None` for no logprobs.

    Example:
        ```python
        recorder = LogprobRecorder([2, None])  # row 0 wants logprobs with 2 alternatives
        output = model.generate(input_ids, logits_processor=LogitsProcessorList([recorder]))
        steps = recorder.steps(output[:, input_ids.shape[1]:].tolist())
        ```
    """

    def __init__(self, tops: Sequence[int | None]) -> None:
        self.tops = list(tops)
        self.rows = [row for row, top in enumerate(self.tops) if top is not None]
        self._widest = max((top for top in self.tops if top is not None), default=0)
        self._recorded: dict[int, list[RecordedStep]] = {row: [] for row in self.rows}
        self._pending: torch.Tensor | None = None  # the last step's log-softmax of the recorded rows
        self._pending_top: list[tuple[tuple[int, float], ...]] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._pending is not None:
            self._settle(input_ids[:, -1].tolist())
        if self.rows:
            logprobs = torch.log_softmax(scores[self.rows].float(), dim=-1)
            self._pending = logprobs
            self._pending_top = self._best(logprobs)
        return scores

    def steps(self, generated: Sequence[Sequence[int]]) -> dict[int, list[RecordedStep]]:
        """Each recorded row's steps, the last one settled from the generated tokens (one row per batch row)."""
        if self._pending is not None:
            self._settle([row[-1] if row else 0 for row in generated])
        return self._recorded

    def _best(self, logprobs: torch.Tensor) -> list[tuple[tuple[int, float], ...]]:
        if not self._widest:
            return [() for _ in self.rows]
        values, ids = logprobs.topk(self._widest, dim=-1)
        best = []
        for position, row in enumerate(self.rows):
            top = self.tops[row] or 0
            pairs = zip(ids[position, :top].tolist(), values[position, :top].tolist(), strict=True)
            best.append(tuple((token, max(value, LOGPROB_FLOOR)) for token, value in pairs))
        return best

    def _settle(self, chosen: Sequence[int]) -> None:
        """Record each recorded row's chosen token (from the last column) with the pending step's logprobs."""
        assert self._pending is not None
        for position, row in enumerate(self.rows):
            token = int(chosen[row])
            logprob = max(float(self._pending[position, token]), LOGPROB_FLOOR)
            self._recorded[row].append((token, logprob, self._pending_top[position]))
        self._pending = None


class LogitShaper(LogitsProcessor):
    """Presence and frequency penalties over each row's generated tokens, and a bias per token id, as vLLM applies them.

    Args:
        settings: The pass's settings (`presence_penalty`, `frequency_penalty`, `logit_bias`).
        prompt_width: Where generated tokens start in `input_ids` (the left-padded prompt block's width).
        vocab_size: Width of the model's logits.

    Example:
        ```python
        shaper = LogitShaper(GenerationConfig(presence_penalty=0.5), prompt_width=input_ids.shape[1], vocab_size=49152)
        ```
    """

    def __init__(self, settings: GenerationConfig, prompt_width: int, vocab_size: int) -> None:
        self.presence = settings.presence_penalty
        self.frequency = settings.frequency_penalty
        self.prompt_width = prompt_width
        self.bias: torch.Tensor | None = None
        if settings.logit_bias:
            self.bias = torch.zeros(vocab_size)
            for token, value in settings.logit_bias:
                self.bias[token] = value

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        generated = input_ids[:, self.prompt_width :]
        if generated.shape[1] and (self.presence or self.frequency):
            counts = torch.zeros_like(scores).scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
            scores = scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)
        if self.bias is not None:
            scores = scores + self.bias.to(device=scores.device, dtype=scores.dtype)
        return scores
