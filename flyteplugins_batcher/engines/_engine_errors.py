"""What engines raise: a record that cannot run, a configuration that cannot work, and an engine that died.

And the helpers that word their messages: `shown` (a value, cut short), `parse_json_object`, and `redact`
(secrets kept out of what the package prints: every credential a text may hold masked).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from typing import Any, ClassVar, Literal

from flyteplugins_batcher import BatcherError, UnrecoverableError


def shown(value: object, limit: int = 80) -> str:
    """`value` as a message names a record: its repr, its head only past `limit` characters."""
    try:
        text = repr(value)
    except Exception as error:  # a broken __repr__ must not hide the error being reported
        return f"<{type(value).__name__} with failing repr: {error!r}>"
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def parse_json_object(text: str, what: str) -> dict[str, Any]:
    """The JSON object `text` holds.

    Args:
        text: JSON text.
        what: What the text is, for the error message (`"a JSON schema"`).

    Raises:
        ValueError: `text` is not JSON, or not a JSON object; the message names `what`.

    Example:
        ```python
        assert parse_json_object('{"max_model_len": 4096}', "engine arguments") == {"max_model_len": 4096}
        ```
    """
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{what} must be JSON text, got {shown(text)}: {error}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{what} must be a JSON object, got {type(parsed).__name__}: {shown(text)}")
    return parsed


_SECRET_NAME = re.compile(r"(SECRET|TOKEN|PASSWORD|API_KEY|ACCESS_KEY|SESSION|CREDENTIAL)", re.IGNORECASE)
"""Environment variables whose values are credentials (AWS_SECRET_ACCESS_KEY, OPENAI_API_KEY, HF_TOKEN, ...)."""

_SHORTEST_SECRET = 6
"""Values shorter than this are not masked: they would mask ordinary words (and no real credential is so short)."""

_SIGNATURES = re.compile(r"(Credential=|Signature=|X-Amz-Signature=|Bearer\s+|sig=|key=)[^\s&,\"'<]+", re.IGNORECASE)
"""A credential written into a request's line or headers, as an error may quote it."""

MASK = "***"


def redact(text: str, *secrets: str | None) -> str:
    """`text` with every credential masked: `secrets`, each credential in the environment, signed request parts.

    Example:
        ```python
        os.environ["OPENAI_API_KEY"] = "sk-live-123456"
        assert redact("refused sk-live-123456") == "refused ***"
        ```
    """
    for secret in sorted(_known_secrets(secrets), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return _SIGNATURES.sub(lambda match: match.group(1) + MASK, text)


def _known_secrets(given: Iterable[str | None]) -> set[str]:
    values = {value for value in given if value}
    values.update(value for name, value in os.environ.items() if _SECRET_NAME.search(name))
    return {value for value in values if len(value) >= _SHORTEST_SECRET}


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
