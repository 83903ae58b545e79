"""A tiny deterministic tokenizer for the simulated engine: nothing to download, lengths you can predict.

Text becomes one token per 4 characters (the last one may be shorter), so a prompt of `4 * n`
characters is `n` tokens. Ids come from a CRC of each piece, the same in every process. The chat
template starts each message with a 4-character role marker and ends it with a newline.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

CHARS_PER_TOKEN = 4
"""Characters per token, about what real tokenizers give for English."""

VOCAB_SIZE = 32_000
BOS_TOKEN_ID = 1
_ROLE_MARKERS = {"system": "SYS:", "user": "USR:", "assistant": "AST:"}


class SimulatedTokenizer:
    """Splits text into 4-character tokens; a Hugging Face-style `encode` and `apply_chat_template`.

    Example:
        ```python
        tokenizer = SimulatedTokenizer()
        assert len(tokenizer.encode("abcdefgh", add_special_tokens=False)) == 2
        ```
    """

    chat_template = "one line per message: a role marker, then the content"
    """Truthy, so engines render records through `apply_chat_template`."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`: one per 4 characters, plus BOS when `add_special_tokens`."""
        ids = [
            2 + zlib.crc32(text[start : start + CHARS_PER_TOKEN].encode()) % (VOCAB_SIZE - 2)
            for start in range(0, len(text), CHARS_PER_TOKEN)
        ]
        return [BOS_TOKEN_ID, *ids] if add_special_tokens else ids

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        tokenize: bool = False,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str | list[int]:
        """Each message as `<role marker><content>` on its own line, then the assistant's marker.

        Like many real templates, it ignores what it has no place for (`tools`, other keywords).
        """
        lines = [_ROLE_MARKERS.get(message["role"], "???:") + message["content"] for message in messages]
        if add_generation_prompt:
            lines.append(_ROLE_MARKERS["assistant"])
        text = "\n".join(lines)
        return self.encode(text, add_special_tokens=False) if tokenize else text


_FILLER = "lorem ipsum dolor sit amet, " * 1200


def text_of_tokens(count: int) -> str:
    """Filler text that `SimulatedTokenizer` counts as `count` tokens (a completion's text)."""
    characters = count * CHARS_PER_TOKEN
    filler = _FILLER if characters <= len(_FILLER) else _FILLER * (characters // len(_FILLER) + 1)
    return filler[:characters]
