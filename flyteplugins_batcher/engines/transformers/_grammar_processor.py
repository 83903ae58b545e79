"""`GrammarLogitsProcessor`: per-row grammar constraints inside one Hugging Face `generate` call.

Each batch row has its own `xgrammar` matcher, or none (an unconstrained record). Before every
decoding step the processor feeds each constrained row the token it sampled last, then masks the
tokens its grammar forbids next; where the grammar forces the text (a schema's keys and
punctuation), also the tokens shorter than the tokenizer's own first token of it (`forced_token`:
the same text in fewer tokens, as vLLM's `ForcedTokens` does). Rows without a matcher are left alone, so one
`generate` call serves records with and without a response format.

Rows that stop being constrained:
- the grammar finished (its matcher accepted a stop token): `generate` finishes the row itself;
- the row was ended by a stop string: `generate` then feeds it the pad token, which the grammar
  rejects; the row is done, so it is released rather than failed.

Order matters with nucleus sampling: `generate` applies its own logits processors before custom
ones, and a top-p cut made before the grammar mask can leave no allowed token at all. So a pass
that constrains rows asks `generate` for no top-p and this processor applies it after the mask.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from transformers import LogitsProcessor, TopPLogitsWarper

from flyteplugins_batcher.engines._structured import forced_token, without_shorter

logger = logging.getLogger("flyteplugins_batcher")


class GrammarLogitsProcessor(LogitsProcessor):
    """Constrains each row of a batch by its own grammar matcher (or not at all, for `None`).

    Use a new one for each `generate` call: it follows the rows from their first generated token.

    Args:
        matchers: One `xgrammar.GrammarMatcher` per batch row, or `None` for a free row.
        vocab_size: Width of the model's logits.
        top_p: Nucleus-sampling mass applied after the mask (1.0: none); see the module notes.
        tokenizer: The model's tokenizer, and `token_lengths` each token's length in bytes: where the grammar
            forces the text, tokens shorter than the tokenizer's first token of it are masked too (None: the
            grammar's mask alone).

    Example:
        ```python
        matchers = [grammars.matcher(person_format), None]  # row 0 constrained, row 1 free
        processor = GrammarLogitsProcessor(matchers, grammars.vocab_size)
        model.generate(input_ids, logits_processor=LogitsProcessorList([processor]))
        ```
    """

    def __init__(
        self,
        matchers: Sequence[Any | None],
        vocab_size: int,
        *,
        top_p: float = 1.0,
        tokenizer: Any = None,
        token_lengths: Sequence[int] = (),
    ) -> None:
        import xgrammar as xgr

        self._matchers: list[Any | None] = list(matchers)
        self._bitmask = xgr.allocate_token_bitmask(len(self._matchers), vocab_size)
        self._top_p = TopPLogitsWarper(top_p) if top_p < 1.0 else None
        self._started = False
        self._tokenizer = tokenizer if token_lengths else None
        self._token_lengths = torch.tensor(list(token_lengths), dtype=torch.int32)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if len(self._matchers) != input_ids.shape[0]:
            raise ValueError(f"the processor has {len(self._matchers)} rows, the batch {input_ids.shape[0]}")
        if self._started:
            self._advance(input_ids[:, -1].tolist())
        self._started = True
        self._mask(scores)
        if self._top_p is not None:
            scores = self._top_p(input_ids, scores)
        return scores

    def _advance(self, last_tokens: list[int]) -> None:
        """Feed each constrained row the token it just sampled; release rows that are done."""
        for row, token in enumerate(last_tokens):
            matcher = self._matchers[row]
            if matcher is None:
                continue
            if not matcher.accept_token(token):
                # Only a finished row (a stop string ended it; it is fed padding now) samples a
                # token outside its mask.
                logger.debug("row %d left its grammar with token %d: released", row, token)
                self._matchers[row] = None
            elif matcher.is_terminated():
                self._matchers[row] = None

    def _mask(self, scores: torch.Tensor) -> None:
        import xgrammar as xgr

        rows = [row for row, matcher in enumerate(self._matchers) if matcher is not None]
        if not rows:
            return
        for row in rows:
            self._matchers[row].fill_next_token_bitmask(self._bitmask, row)  # type: ignore[union-attr]
        xgr.apply_token_bitmask_inplace(scores, self._bitmask.to(scores.device), indices=rows)
        if self._tokenizer is not None:
            for row in rows:
                self._force(row, scores)

    def _force(self, row: int, scores: torch.Tensor) -> None:
        """Where the row's grammar forces the text, mask the tokens that would split it finer than the tokenizer."""
        token = forced_token(self._matchers[row], self._tokenizer)
        if token is not None:
            scores[row] = without_shorter(scores[row], self._token_lengths, token)
