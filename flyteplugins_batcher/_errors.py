"""The package's errors, drawn as one tree, and the notes that tie an error to the record it hit.

Every error the package raises is a `BatcherError`: `except BatcherError` catches any of them. Each
part's errors hang under it, defined beside the code that raises them, and each keeps the built-in
class it has always had (`except ValueError` still catches an `InvalidPromptError`). `from ...`
says where a public one is imported from; one not exported stays inside its part (the server answers
its own in OpenAI's error shape). The warnings (`BlockingProcessFnWarning`,
`ReplicaStarvationWarning`) are not errors. `tests/package/test_error_tree.py` checks that this
drawing is the tree in the code:

```text
BatcherError                                from flyteplugins_batcher
├── BatcherNotRunningError                  from flyteplugins_batcher  (also RuntimeError)
├── BatcherClosedError                      from flyteplugins_batcher  (also RuntimeError)
├── QueueFullError                          from flyteplugins_batcher  (also RuntimeError)
├── BatcherFailedError                      from flyteplugins_batcher  (also RuntimeError)
├── UnrecoverableError                      from flyteplugins_batcher  (also RuntimeError)
│   └── EngineDeadError                     from flyteplugins_batcher.engines
├── RecordExpiredError                      from flyteplugins_batcher  (also TimeoutError)
├── CostBudgetExceededError                 from flyteplugins_batcher  (also ValueError)
├── ResultCountError                        from flyteplugins_batcher  (also ValueError)
├── ProcessFnCancelledError                 from flyteplugins_batcher  (also RuntimeError)
├── EmptyDocumentError                      from flyteplugins_batcher.engines  (also ValueError)
├── InvalidPromptError                      from flyteplugins_batcher.engines  (also ValueError)
│   ├── ContextLengthExceededError          from flyteplugins_batcher.engines
│   ├── InvalidResponseFormatError          from flyteplugins_batcher.engines
│   ├── UnsupportedSettingError             engines, not exported
│   └── UnknownAdapterError                 engines, not exported
├── EngineConfigError                       from flyteplugins_batcher.engines
│   ├── ModelNotFoundError                  from flyteplugins_batcher.engines  (also FileNotFoundError)
│   └── InvalidModelReferenceError          from flyteplugins_batcher.engines  (also ValueError)
├── EngineNotLoadedError                    from flyteplugins_batcher.engines  (also RuntimeError)
├── RequestCancelledError                   from flyteplugins_batcher.engines
├── GarbledAnswerError                      engines, not exported  (also ValueError)
├── JSONBoundsError                         from flyteplugins_batcher.batch_api  (also ValueError)
├── RequestLineError                        from flyteplugins_batcher.batch_api
├── UnrecoverableRunError                   from flyteplugins_batcher.jobs  (also RuntimeError)
├── OutputDirError                          jobs, not exported  (also ValueError)
├── PublishError                            jobs, not exported  (also RuntimeError)
├── RowError                                jobs, not exported  (also ValueError)
├── OnlineOverloadedError                   server, not exported
├── RunFailedError                          server, not exported  (also RuntimeError)
├── APIError                                server, not exported
├── StateError                              server, not exported
│   ├── Refused                             server, not exported
│   ├── NotFound                            server, not exported
│   └── TooLarge                            server, not exported
└── LeaseLost                               server, not exported
```
"""

from __future__ import annotations

import contextlib


class BatcherError(Exception):
    """The root of every error the package raises (the tree above): `except BatcherError` catches them all.

    Each error under it also keeps its built-in class: the batcher's own refusals are
    `RuntimeError`s, a bad record or setting a `ValueError`, an expired record a `TimeoutError`.

    Example:
        ```python
        try:
            results = await batcher.run(prompts)
        except BatcherError as error:  # the batcher, an engine, a request line, a job: any of the package's
            print(f"{type(error).__name__}: {error}")
        ```
    """


class BatcherNotRunningError(BatcherError, RuntimeError):
    """`submit` was called before `start()` (or outside `async with`)."""


class BatcherClosedError(BatcherError, RuntimeError):
    """The batcher is stopping or stopped, so it takes no new records."""


class QueueFullError(BatcherError, RuntimeError):
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


class BatcherFailedError(BatcherError, RuntimeError):
    """The batcher died (a `BaseException` escaped the process function or its own loop).

    Every record that was not yet resolved, and every later `submit`, gets this error; the
    original exception is its `__cause__`.
    """


class UnrecoverableError(BatcherError, RuntimeError):
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


class RecordExpiredError(BatcherError, TimeoutError):
    """A record's `deadline_s` passed before it was dispatched; it never reached the process function."""


class CostBudgetExceededError(BatcherError, ValueError):
    """A record costs more than `target_batch_cost` and the batcher was built with `oversized="reject"`."""


class ResultCountError(BatcherError, ValueError):
    """The process function returned a different number of results than records it was given."""


class ProcessFnCancelledError(BatcherError, RuntimeError):
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
