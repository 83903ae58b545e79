"""A sample's logprobs in OpenAI's shapes: a chat choice's `logprobs.content`, a text completion's `logprobs`.

Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}`,
`bytes` the token's UTF-8. Text completion: `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`,
each `top_logprobs` entry a `{token: logprob}` object holding the chosen token too (as vLLM writes
it), `text_offset` each token's start in the text. A streamed answer's events carry the logprobs of
the tokens they carry (`start` counts those already sent).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flyteplugins_batcher.engines import TokenLogprob


def chat_logprobs(logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's `logprobs` object for these tokens.

    Example:
        ```python
        chat_logprobs([TokenLogprob("4", -0.1, (("4", -0.1),))])
        # {"content": [{"token": "4", "logprob": -0.1, "bytes": [52], "top_logprobs": [{...}]}]}
        ```
    """
    return {
        "content": [
            {
                **_entry(item.token, item.logprob),
                "top_logprobs": [_entry(token, logprob) for token, logprob in item.top],
            }
            for item in logprobs
        ]
    }


def completion_logprobs(logprobs: Sequence[TokenLogprob], start: int = 0) -> dict[str, Any]:
    """A text completion's `logprobs` object for these tokens, their offsets counted from `start` characters.

    Example:
        ```python
        completion_logprobs([TokenLogprob(" 4", -0.1)])
        # {"tokens": [" 4"], "token_logprobs": [-0.1], "top_logprobs": [{" 4": -0.1}], "text_offset": [0]}
        ```
    """
    offsets, position = [], start
    for item in logprobs:
        offsets.append(position)
        position += len(item.token)
    return {
        "tokens": [item.token for item in logprobs],
        "token_logprobs": [item.logprob for item in logprobs],
        "top_logprobs": [{item.token: item.logprob, **dict(item.top)} for item in logprobs],
        "text_offset": offsets,
    }


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8", errors="replace"))}
