"""What the server's state refuses, in its own terms: the HTTP side answers each in OpenAI's error shape.

Each error carries a message for a person (naming no path and no exception), a code for a program,
and the request field at fault; its class says which kind of refusal it is, and the HTTP side maps
the class to a status (`flyteplugins_batcher/server/_http/errors.py`).
"""

from __future__ import annotations

from flyteplugins_batcher import BatcherError


class StateError(BatcherError):
    """A request the batches' and files' state refuses.

    Args:
        message: What is wrong, for a person.
        code: What is wrong, for a program (`file_not_found`, `batch_not_cancellable`, ...).
        param: The request field at fault, if one is.

    Example:
        ```python
        raise NotFound(f"No such batch: {batch_id}", code="batch_not_found", param="batch_id")
        ```
    """

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param


class Refused(StateError):
    """A request the state cannot take as it is: a field out of range, a batch that cannot move so."""


class NotFound(StateError):
    """No such batch or file (or its bytes are gone)."""


class TooLarge(StateError):
    """A file over the server's size limit."""
