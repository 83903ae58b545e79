"""What engines raise: a record that cannot run, a configuration that cannot work, and an engine that died."""

from __future__ import annotations

from typing import ClassVar, Literal

from flyteplugins_batcher import BatcherError, UnrecoverableError


def shown(value: object, limit: int = 80) -> str:
    """`value` as a message names a record: its repr, its head only past `limit` characters."""
    try:
        text = repr(value)
    except Exception as error:  # a broken __repr__ must not hide the error being reported
        return f"<{type(value).__name__} with failing repr: {error!r}>"
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


InvalidPromptCode = Literal["invalid_prompt", "context_length_exceeded", "invalid_request", "model_mismatch"]
"""The machine-readable reason an `InvalidPromptError` carries (`code`), as OpenAI's batch error lines name it."""


class InvalidPromptError(BatcherError, ValueError):
    """A record an engine cannot run (empty, too long for the context, wrong type).

    Engines return it in the record's place among the results, so only that record's future fails. Its
    message names the record: `"<engine>: record <i> (<id or repr>): <reason>"`. Its `code` says
    why for a program, so that nothing has to read the message: each subclass has its own.

    Example:
        ```python
        if isinstance(outcome, InvalidPromptError):
            print(outcome.code)  # "invalid_prompt", "context_length_exceeded" or "invalid_request"
        ```
    """

    code: ClassVar[InvalidPromptCode] = "invalid_prompt"


class ContextLengthExceededError(InvalidPromptError):
    """A record whose prompt tokens plus `max_new_tokens` do not fit in the model's context."""

    code: ClassVar[InvalidPromptCode] = "context_length_exceeded"


class InvalidResponseFormatError(InvalidPromptError):
    """A record whose `response_format` cannot be enforced: its JSON schema does not compile to a grammar.

    The message names the schema and what the grammar compiler said about it.
    """

    code: ClassVar[InvalidPromptCode] = "invalid_request"


class UnsupportedSettingError(InvalidPromptError):
    """A record asks for a setting this engine cannot honour (a grammar, a logit bias, ...): it fails, never ignored.

    The message names the setting and the engine. Not exported: read its `code` (`invalid_request`).
    """

    code: ClassVar[InvalidPromptCode] = "invalid_request"


class UnknownAdapterError(InvalidPromptError):
    """A record names a LoRA adapter the engine was not given (`lora_modules`). Not exported: its `code` is
    `model_mismatch`, as a request line naming a model nobody serves."""

    code: ClassVar[InvalidPromptCode] = "model_mismatch"


class EngineConfigError(BatcherError):
    """A configuration that cannot work, whatever the retry: a missing model, an unknown engine
    argument, a KV cache that does not fit. Raised before any long start-up where possible;
    workflows should fail at once instead of retrying."""


class ModelNotFoundError(EngineConfigError, FileNotFoundError):
    """The model is a path, and nothing is there."""


class InvalidModelReferenceError(EngineConfigError, ValueError):
    """The model reference is neither an existing path nor a possible Hugging Face hub id."""


class EngineNotLoadedError(BatcherError, RuntimeError):
    """The engine was used before `load()` (or after `close()`)."""


class EngineDeadError(UnrecoverableError):
    """The engine died (its process was killed, or it crashed): nothing can run on it any more.

    Every pending record fails with it; `SharedBatcher` closes the engine and loads a new one on
    its next `get()`.
    """


class RequestCancelledError(BatcherError):
    """A record whose caller cancelled it (`Request.cancellation`): the engine stopped it, or never ran it.

    An engine returns it in the record's place among the results; `completion_tokens` says how many tokens the
    engine made for it before it stopped (counted in `EngineStats.completion_tokens`, as work done).

    Example:
        ```python
        if isinstance(outcome, RequestCancelledError):
            print(f"stopped after {outcome.completion_tokens} tokens")
        ```
    """

    def __init__(self, message: str, *, completion_tokens: int = 0) -> None:
        super().__init__(message)
        self.completion_tokens = completion_tokens
