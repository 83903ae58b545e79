"""What engines accept per record, and what a valid record becomes before it reaches the model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flyteplugins_batcher._errors import short_repr
from flyteplugins_batcher._records import Prompt
from flyteplugins_batcher.engines._config import GenerationConfig
from flyteplugins_batcher.engines._engine_errors import InvalidPromptError

ChatMessages = Sequence[Mapping[str, str]]
"""A chat conversation: `[{"role": "user", "content": "..."}, ...]`."""


@dataclass(frozen=True)
class Request:
    """A prompt with its own generation settings; engines accept it wherever they accept a prompt.

    Attributes:
        prompt: Plain text, a `Prompt`, or chat messages.
        generation: Settings for this record alone; `None` uses the engine's.
        id: Names the record in error messages (for example an OpenAI batch `custom_id`).
        chat_template: `False`: the prompt text goes to the model exactly as written (no template, no
            system prompt), as OpenAI's `/v1/completions` does; `None`: the engine's choice (its
            chat template, if it has one).

    Example:
        ```python
        request = Request("Summarize: ...", GenerationConfig(max_new_tokens=64, temperature=0.7, seed=1), id="r-17")
        [completion] = engine.generate([request])
        ```
    """

    prompt: str | Prompt | ChatMessages
    generation: GenerationConfig | None = None
    id: str | None = None
    chat_template: bool | None = None

    def estimate_tokens(self) -> int:
        """About 4 characters per token plus `max_new_tokens` per decoded sample, when no engine tokenizer can count."""
        extra = self.generation.generated_tokens if self.generation is not None else 0
        return approximate_tokens(self.prompt) + extra


PromptRecord = str | Prompt | ChatMessages | Request
"""What an engine accepts per record: plain text, a `Prompt`, chat messages, or a `Request`."""


@dataclass(frozen=True)
class PreparedPrompt:
    """A valid record, rendered and tokenized: what an engine's model call receives.

    Attributes:
        index: The record's position in the batch given to `generate`.
        token_ids: The prompt's token ids, exactly as the model sees them.
        generation: The settings that apply to it (its own, or the engine's).
    """

    index: int
    token_ids: list[int]
    generation: GenerationConfig


def describe(index: int, record: object) -> str:
    """Names a record in error messages: its position, its id if it has one, and a short repr."""
    if isinstance(record, Request):
        label = f"id={record.id!r}, " if record.id is not None else ""
        return f"record {index} ({label}{short_repr(record.prompt, 60)})"
    return f"record {index} ({short_repr(record, 60)})"


def normalize_record(record: object) -> str | list[Mapping[str, str]]:
    """Validate a prompt record and return its text, or its chat messages as a list.

    Raises:
        InvalidPromptError: Saying what is wrong with it.
    """
    if isinstance(record, Request):
        record = record.prompt
    if isinstance(record, Prompt):
        record = record.text
    if isinstance(record, str):
        if not record.strip():
            raise InvalidPromptError("empty prompt: the record has no text")
        return record
    if isinstance(record, Sequence) and not isinstance(record, (bytes, bytearray)):
        messages = list(record)
        if not messages:
            raise InvalidPromptError("empty prompt: the chat record has no messages")
        for message in messages:
            if not isinstance(message, Mapping) or not isinstance(message.get("content"), str) or "role" not in message:
                raise InvalidPromptError(
                    f"chat messages must be mappings with 'role' and string 'content'; got {short_repr(message)}"
                )
        if not any(message["content"].strip() for message in messages):
            raise InvalidPromptError("empty prompt: every chat message is empty")
        return messages
    raise InvalidPromptError(
        f"a prompt record must be a str, a Prompt, chat messages or a Request; got {type(record).__name__}: "
        f"{short_repr(record)}"
    )


def approximate_tokens(record: object) -> int:
    """About 4 characters per token, for when no tokenizer can count (as `Prompt.estimate_tokens`)."""
    try:
        content = normalize_record(record)
    except InvalidPromptError:
        return 1
    text = content if isinstance(content, str) else "".join(message["content"] for message in content)
    return len(text) // 4 + 1
