"""Exceptions raised by the batchers, and the notes that tie an error to the record it hit."""

from __future__ import annotations

import contextlib


class BatcherError(RuntimeError):
    """Base class of the errors the batcher itself raises."""


class BatcherNotRunningError(BatcherError):
    """`submit` was called before `start()` (or outside `async with`)."""


class BatcherClosedError(BatcherError):
    """The batcher is stopping or stopped, so it takes no new records."""


class QueueFullError(BatcherError):
    """`submit(..., wait_for_room=False)` found the queue full (backpressure, without the wait).

    A server turns it into `429 Too Many Requests`; `retry_after_s` estimates when there will be room.

    Attributes:
        queue_depth: Records waiting when the record was refused.
        retry_after_s: Seconds until the queue has likely drained enough (at least 1), from the
            batcher's recent throughput.
    """

    def __init__(self, message: str, *, queue_depth: int, retry_after_s: float) -> None:
        super().__init__(message)
        self.queue_depth = queue_depth
        self.retry_after_s = retry_after_s


class BatcherFailedError(BatcherError):
    """The batcher died (a `BaseException` escaped the process function or its own loop).

    Every record that was not yet resolved, and every later `submit`, gets this error; the
    original exception is its `__cause__`.
    """


class UnrecoverableError(BatcherError):
    """Raised by a process function when no later batch can succeed either (the model or device is gone).

    The batcher then stops running batches: every queued and in-flight record fails with this
    exception, and every later `submit` raises `BatcherFailedError` caused by it. `SharedBatcher`
    notices the failed batcher and loads a fresh model on its next `get()`.

    Example:
        ```python
        def generate(batch):
            if not engine_process.is_alive():
                raise UnrecoverableError("the engine process died")
            return engine.run(batch)
        ```
    """


class RecordExpiredError(TimeoutError):
    """A record's `deadline_s` passed before it was dispatched; it never reached the process function."""


class CostBudgetExceededError(ValueError):
    """A record costs more than `target_batch_cost` and the batcher was built with `oversized="reject"`."""


class ResultCountError(ValueError):
    """The process function returned a different number of results than records it was given."""


class ProcessFnCancelledError(RuntimeError):
    """The process function raised `asyncio.CancelledError` without the batcher cancelling it."""


def add_note(exc: BaseException, note: str) -> None:
    """Attach a note to an exception (shown in its traceback on Python 3.11+)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10 has no add_note; keep the same attribute so tools that read it still see it.
        notes = getattr(exc, "__notes__", None)
        if isinstance(notes, list):
            notes.append(note)
        else:
            with contextlib.suppress(AttributeError):  # exceptions with __slots__ take no notes
                exc.__notes__ = [note]  # type: ignore[attr-defined]


def short_repr(value: object, limit: int = 80) -> str:
    """`repr(value)` cut to `limit` characters, for error messages that name a record."""
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ must not hide the error being reported
        text = f"<{type(value).__name__} with failing repr: {exc!r}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
