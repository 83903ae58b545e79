"""`RequestLineError`: a request line that cannot run, and the code its error line carries."""

from __future__ import annotations

from typing import Literal

from flyteplugins_batcher import BatcherError
from flyteplugins_batcher.engines import InvalidPromptError

ErrorCode = Literal[
    "invalid_json",
    "missing_custom_id",
    "invalid_custom_id",
    "duplicate_custom_id",
    "invalid_url",
    "invalid_body",
    "invalid_request",
    "model_mismatch",
    "context_length_exceeded",
    "invalid_prompt",
    "inference_failed",
]
"""Every code an error line can carry (see the `batch_api` module notes for what each means)."""


class RequestLineError(BatcherError):
    """A request line that cannot run; it becomes one line of the errors file.

    Attributes:
        code: A short machine-readable reason (one of `ErrorCode`).
        message: What is wrong, for a person, naming fields as the request wrote them.
        line: The 1-based line number in the input.
        custom_id: The request's id, when it has one.

    Example:
        ```python
        raise RequestLineError("invalid_request", "temperature must be from 0 to 2, got 5.0", line=3, custom_id="q-3")
        ```
    """

    def __init__(self, code: str, message: str, *, line: int, custom_id: str | None = None) -> None:
        super().__init__(f"line {line}: {message}")
        self.code = code
        self.message = message
        self.line = line
        self.custom_id = custom_id


def error_code(error: BaseException) -> ErrorCode:
    """The error-line code for a record the engine could not answer.

    An `InvalidPromptError` carries its own `code`: `context_length_exceeded`
    (`ContextLengthExceededError`), `invalid_request` (`InvalidResponseFormatError`, a schema that
    does not compile) or `invalid_prompt` (an empty prompt, a conversation the chat template
    refuses). Anything else is `inference_failed`. The message text is never read.

    Example:
        ```python
        outcome = (await batcher.run([request], return_exceptions=True))[0]
        if isinstance(outcome, Exception):
            failure = RequestLineError(error_code(outcome), str(outcome), line=line, custom_id=custom_id)
        ```
    """
    return error.code if isinstance(error, InvalidPromptError) else "inference_failed"
