"""A stream-mode request's outputs as vLLM hands them out: each new piece of text told, the whole kept.

With `RequestOutputKind.DELTA` (a record with a text listener) every output carries only what the
step added to one or more samples; with `FINAL_ONLY` the one output carries everything. Either
way `StreamedSamples` adds them up per sample, tells the prompt's listener of each new piece, and
gives `completion()` what a final output would hold. An aborted request (its caller cancelled it)
ends with vLLM's finish reason `"abort"` and the tokens made until then.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from flyteplugins_batcher.engines._prompts import PreparedPrompt
from flyteplugins_batcher.engines.vllm._engine import token_logprobs
from flyteplugins_batcher.engines.vllm._engine_loop import EngineLoop

ABORT_RETRY_S = 0.2
"""How often an abort is sent again while the request has not ended: one sent while vLLM was still
adding the request (before it knew the id) is lost."""


@dataclass
class _Sample:
    """One sample so far, with the attributes of vLLM's `CompletionOutput` that `completion()` reads."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    logprobs: list[Any] | None = None
    stop_reason: str | int | None = None


@dataclass
class _Final:
    """What `completion()` reads of a final `RequestOutput`."""

    request_id: str
    outputs: list[_Sample]
    num_cached_tokens: int | None = None


class StreamedSamples:
    """A request's samples, added up from vLLM's outputs, each new piece of text handed to the prompt's listener.

    Args:
        prompt: The record (its `stream` tells its listener, if it has one).
        request_id: The request's id in vLLM.
        tokenizer: Decodes a token vLLM left undecoded (for logprobs).

    Example:
        ```python
        samples = StreamedSamples(prompt, request_id, tokenizer)
        async for output in llm.generate(inputs, sampling_params(config, deltas=True), request_id):
            samples.add(output)
        outcome = completion(samples.final(), len(prompt.token_ids), config, tokenizer)
        ```
    """

    def __init__(self, prompt: PreparedPrompt, request_id: str, tokenizer: Any = None) -> None:
        self.prompt = prompt
        self.request_id = request_id
        self.tokenizer = tokenizer
        self.finished = False
        self.num_cached_tokens: int | None = None  # vLLM's, known once the prompt is prefilled; each output has it
        self._samples: dict[int, _Sample] = {}

    def add(self, output: Any) -> None:
        """Take one of vLLM's outputs for the request."""
        top = self.prompt.generation.logprobs
        for piece in output.outputs:
            sample = self._samples.get(piece.index)
            if sample is None:
                sample = self._samples[piece.index] = _Sample(piece.index)
            sample.text += piece.text
            sample.token_ids.extend(piece.token_ids)
            sample.finish_reason = piece.finish_reason or sample.finish_reason
            sample.stop_reason = piece.stop_reason if piece.stop_reason is not None else sample.stop_reason
            new_logprobs = list(piece.logprobs or []) if top is not None else []
            if top is not None:
                sample.logprobs = (sample.logprobs or []) + new_logprobs
            shaped = token_logprobs(piece.token_ids, new_logprobs, top, self.tokenizer) if new_logprobs else ()
            self.prompt.stream(piece.index, piece.text, shaped)
        self.finished = output.finished
        self.num_cached_tokens = output.num_cached_tokens

    @property
    def aborted(self) -> bool:
        """Whether vLLM ended the request as aborted (its caller cancelled it)."""
        return any(sample.finish_reason == "abort" for sample in self._samples.values())

    @property
    def tokens(self) -> int:
        """Tokens generated so far, all samples together."""
        return sum(len(sample.token_ids) for sample in self._samples.values())

    def final(self) -> _Final:
        """Everything so far, shaped as vLLM's final `RequestOutput` (for `completion()`)."""
        samples = sorted(self._samples.values(), key=lambda sample: sample.index)
        return _Final(self.request_id, samples, self.num_cached_tokens)


def abort_when_cancelled(loop: EngineLoop, llm: Any, prompt: PreparedPrompt, request_id: str) -> asyncio.Event:
    """Abort the request in vLLM (from any thread) once the prompt's caller cancels it; set the event when it ends.

    Returns:
        The event to set once the request has ended (created on, and set from, the engine loop).
    """
    ended = asyncio.Event()
    if prompt.cancellation is not None:
        prompt.cancellation.add_callback(lambda: _submit(loop, _abort_until_ended(llm, request_id, ended)))
    return ended


async def _abort_until_ended(llm: Any, request_id: str, ended: asyncio.Event) -> None:
    while not ended.is_set():
        await llm.abort(request_id)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ended.wait(), ABORT_RETRY_S)


def _submit(loop: EngineLoop, coroutine: Coroutine[Any, Any, None]) -> None:
    try:
        loop.submit(coroutine)
    except RuntimeError:  # the engine loop is closed: the request has ended with it
        coroutine.close()
