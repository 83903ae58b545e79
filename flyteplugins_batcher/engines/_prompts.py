"""What engines accept per record, and what a valid record becomes before it reaches the model."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flyteplugins_batcher import Prompt
from flyteplugins_batcher.engines._completion import TokenLogprob
from flyteplugins_batcher.engines._config import GenerationConfig
from flyteplugins_batcher.engines._engine_errors import InvalidPromptError, shown
from flyteplugins_batcher.engines._live import CancellationToken, DeltaListener

_ADAPTER = "\x1d"  # around a LoRA adapter's name, at the start of a key
_MESSAGE = "\x1e"  # before each chat message in a key
_ROLE = "\x1f"  # between a message's role and its content in a key

ChatMessages = Sequence[Mapping[str, Any]]
"""A chat conversation: `[{"role": "user", "content": "..."}, ...]`; an assistant message may carry
`tool_calls` (OpenAI's shape, `arguments` as a JSON object or its text) and a tool message its `tool_call_id`."""


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
        cancellation: Set when nobody wants the answer any more (a client left): a record cancelled
            before it runs never reaches the model, and an engine that can stop a running record
            stops it at its next step and answers it with `RequestCancelledError`. `None`: it
            cannot be cancelled once it runs.
        on_delta: Called with `(choice_index, text, logprobs)` for each new piece of text (and its
            tokens' `TokenLogprob`s when the record asked for them, else `()`), as an engine that
            streams makes it (vLLM stream mode, the simulated engine), from the engine's thread;
            engines that answer whole records never call it. The completion still comes whole, at the end.
        adapter: The LoRA adapter to generate with (a name the engine was given in `lora_modules`);
            `None`: the base model.
        tools: Tool definitions (OpenAI's `tools`), handed to the chat template (`tools=`).
        template_kwargs: More keyword arguments for the chat template (vLLM's `chat_template_kwargs`,
            e.g. `{"enable_thinking": False}`).

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
    cancellation: CancellationToken | None = field(default=None, compare=False, repr=False)
    on_delta: DeltaListener | None = field(default=None, compare=False, repr=False)
    adapter: str | None = None
    tools: Sequence[Mapping[str, Any]] | None = None
    template_kwargs: Mapping[str, Any] | None = None

    @property
    def cancelled(self) -> bool:
        """Whether its cancellation token was cancelled."""
        return self.cancellation is not None and self.cancellation.cancelled

    @property
    def cancellable(self) -> bool:
        """Whether it has a cancellation token (else the batcher need not watch it: see `Cancellable`)."""
        return self.cancellation is not None

    def cancel(self) -> None:
        """Cancel its token, if it has one (the batcher calls this when its future is cancelled while it runs)."""
        if self.cancellation is not None:
            self.cancellation.cancel()

    def estimate_tokens(self) -> int:
        """About 4 characters per token plus `max_new_tokens` per decoded sample, when no engine tokenizer can count."""
        extra = self.generation.generated_tokens if self.generation is not None else 0
        return approximate_tokens(self.prompt) + extra

    def prefix_key(self) -> str | None:
        """What its prompt begins with, as the engine will see it, for a batcher's `grouping="by_prefix"` and for
        the drivers' prefix-aware placement.

        Its adapter's name first (another adapter's cached prefix is of no use), then its tools and chat
        template keywords (a template renders them before the messages), then its prompt's
        `prompt_prefix_key`; `None` when the prompt is not one an engine takes.
        """
        body = prompt_prefix_key(self.prompt)
        if body is None:
            return None
        head = [self.adapter] if self.adapter is not None else []
        if self.tools or self.template_kwargs:
            head.append(json.dumps([self.tools, self.template_kwargs], sort_keys=True, default=str))
        return "".join(f"{_ADAPTER}{part}{_ADAPTER}" for part in head) + body


PromptRecord = str | Prompt | ChatMessages | Request
"""What an engine accepts per record: plain text, a `Prompt`, chat messages, or a `Request`."""


@dataclass(frozen=True)
class PreparedPrompt:
    """A valid record, rendered and tokenized: what an engine's model call receives.

    Attributes:
        index: The record's position in the batch given to `generate`.
        token_ids: The prompt's token ids, exactly as the model sees them.
        generation: The settings that apply to it (its own, or the engine's).
        cancellation: Its `Request`'s cancellation token, if any.
        on_delta: Its `Request`'s text listener, if any (`stream` calls it).
        adapter: Its `Request`'s LoRA adapter, if any (checked: one the engine has).
    """

    index: int
    token_ids: list[int]
    generation: GenerationConfig
    cancellation: CancellationToken | None = field(default=None, compare=False, repr=False)
    on_delta: DeltaListener | None = field(default=None, compare=False, repr=False)
    adapter: str | None = None

    @property
    def cancelled(self) -> bool:
        """Whether its caller cancelled it (an engine that can stops it)."""
        return self.cancellation is not None and self.cancellation.cancelled

    def stream(self, sample: int, text: str, logprobs: Sequence[TokenLogprob] = ()) -> None:
        """Hand the listener a decoded sample's new text (and its tokens' logprobs); a greedy record's one
        sample stands for all `n` choices."""
        listener = self.on_delta
        if listener is None or not (text or logprobs):
            return
        pieces = tuple(logprobs) if self.generation.logprobs is not None else ()
        if self.generation.decoded_samples < self.generation.n:
            for choice in range(self.generation.n):
                listener(choice, text, pieces)
        else:
            listener(sample, text, pieces)


def describe(index: int, record: object) -> str:
    """Names a record in error messages: its position, its id if it has one, and a short repr."""
    if isinstance(record, Request):
        label = f"id={record.id!r}, " if record.id is not None else ""
        return f"record {index} ({label}{shown(record.prompt, 60)})"
    return f"record {index} ({shown(record, 60)})"


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
                    f"chat messages must be mappings with 'role' and string 'content'; got {shown(message)}"
                )
        if not any(message["content"].strip() or message.get("tool_calls") for message in messages):
            raise InvalidPromptError("empty prompt: every chat message is empty")
        return messages
    raise InvalidPromptError(
        f"a prompt record must be a str, a Prompt, chat messages or a Request; got {type(record).__name__}: "
        f"{shown(record)}"
    )


def prompt_prefix_key(record: object) -> str | None:
    """A cheap stand-in for a prompt record's rendered text, that begins alike where the rendered prompts do.

    Plain text (or a `Prompt`) is its text. Chat messages are their roles and contents in order,
    each behind a control character that no chat text holds: the chat template writes them in
    that order, around markup that is the same for every record, so two conversations that
    share their first messages share the beginning of their keys as they share that of their
    rendered prompts (tokenizing or rendering every record again would cost far more). A `Request`
    gives its own (`Request.prefix_key`: its adapter first). `None` for a record that is not a
    prompt: `generate` fails it, alone.

    Example:
        ```python
        system = {"role": "system", "content": "Answer from this document: ..."}
        first = prompt_prefix_key([system, {"role": "user", "content": "Who wrote it?"}])
        second = prompt_prefix_key([system, {"role": "user", "content": "When?"}])
        assert first.startswith(prompt_prefix_key([system]))  # so does `second`
        ```
    """
    if isinstance(record, Request):
        return record.prefix_key()
    if isinstance(record, Prompt):
        return record.text
    if isinstance(record, str):
        return record
    if not isinstance(record, Sequence) or isinstance(record, (bytes, bytearray)):
        return None
    parts: list[str] = []
    for message in record:
        if not isinstance(message, Mapping):
            return None
        content = message.get("content")
        parts += (_MESSAGE, str(message.get("role")), _ROLE, content if isinstance(content, str) else "")
    return "".join(parts)


def approximate_tokens(record: object) -> int:
    """About 4 characters per token, for when no tokenizer can count (as `Prompt.estimate_tokens`)."""
    try:
        content = normalize_record(record)
    except InvalidPromptError:
        return 1
    text = content if isinstance(content, str) else "".join(str(message["content"]) for message in content)
    return len(text) // 4 + 1
