"""`ForcedTokens`: vLLM's structured output written in whole tokens where the grammar forces the text.

vLLM's grammar masks what a schema forbids, but where it allows one text only (a key, `":`, `,"`)
the model still picks the token: kept from the newline and indent it would write after `{`, a small
model spells keys a piece at a time (`"`, `s`, `te`, `p`, `s`), and compact JSON ends up costing
more tokens than its whitespace saved. This logits processor (vLLM's per-request kind, run in its
engine core after the grammar's mask) follows each JSON request with its own `xgrammar` matcher
and, where the text is forced, masks the tokens shorter than the tokenizer's own first token of it
(`engines._structured.forced_token`), as the Transformers engine's grammar processor does. It only
ever masks more than the grammar does, never every token, and what the model was free to choose
stays its choice.

It is installed with compact JSON (`with_compact_json`), whose grammar it compiles the same way.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from flyteplugins_batcher.engines._response_format import ResponseFormat
from flyteplugins_batcher.engines._structured import Grammars, forced_token, without_shorter

logger = logging.getLogger("flyteplugins_batcher")


class ForcedTokens(AdapterLogitsProcessor):
    """Where a request's grammar forces the text, no token that splits it finer than the tokenizer (module notes).

    vLLM builds it in its engine core from the class named in `logits_processors`.

    Example:
        ```python
        llm = vllm.LLM(model, structured_outputs_config=config, logits_processors=[ForcedTokens])
        ```
    """

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(vllm_config, device, is_pin_memory)
        from vllm.tokenizers import cached_tokenizer_from_config

        tokenizer = cached_tokenizer_from_config(model_config=vllm_config.model_config)
        vocab_size = vllm_config.model_config.get_vocab_size()
        self._grammars = Grammars(tokenizer, vocab_size, stop_token_ids=[tokenizer.eos_token_id])
        self._lengths: torch.Tensor | None = None

    def is_argmax_invariant(self) -> bool:
        """It changes which token greedy decoding picks."""
        return False

    def new_req_logits_processor(self, params: Any) -> _RequestForcing | None:
        """A request's follower, or None for a request without a JSON format or one it cannot compile."""
        response_format = _response_format(params.structured_outputs)
        if response_format is None:
            return None
        try:
            matcher = self._grammars.matcher(response_format)
            if self._lengths is None:
                self._lengths = torch.tensor(self._grammars.token_lengths, dtype=torch.int32)
        except Exception as error:  # vLLM's own grammar still constrains the request; only this is off
            logger.debug("no forced tokens for a request: %s", error)
            return None
        return _RequestForcing(matcher, self._grammars.tokenizer, self._lengths)


def _response_format(structured: Any) -> ResponseFormat | None:
    """The JSON format a request's `StructuredOutputsParams` ask for (compiled as vLLM's compact grammar), or None."""
    if structured is None:
        return None
    if structured.json is not None:
        return ResponseFormat.json_schema(structured.json)
    if structured.json_object:
        return ResponseFormat.json_object()
    return None


class _RequestForcing:
    """One request's matcher, fed the tokens it generated; where the text is forced, shorter tokens are masked."""

    def __init__(self, matcher: Any, tokenizer: Any, token_lengths: torch.Tensor) -> None:
        self.matcher, self.tokenizer, self.token_lengths = matcher, tokenizer, token_lengths
        self.seen = 0
        self.live = True

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        if not self.live or not self._follow(output_ids):
            return logits
        return without_shorter(logits, self.token_lengths, forced_token(self.matcher, self.tokenizer))

    def _follow(self, output_ids: list[int]) -> bool:
        """Feed the matcher the tokens generated since the last step; False once it cannot follow the request."""
        if len(output_ids) < self.seen:  # the request started over (preempted): stop rather than guess
            self.live = False
            return False
        for token in output_ids[self.seen :]:
            if not self.matcher.accept_token(token):
                self.live = False  # its text left the grammar (a reasoning part, say): vLLM's grammar alone decides
                return False
        self.seen = len(output_ids)
        return not self.matcher.is_terminated()
