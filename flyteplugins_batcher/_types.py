"""The types the batcher's parts share: a record's contracts (cost, cancellation, `Prompt`), the callable
type aliases, and the names of states, dispatch reasons and outcomes."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar, runtime_checkable

RecordT = TypeVar("RecordT")
ResultT = TypeVar("ResultT")


class RecordState(enum.Enum):
    """Where a record is in the batcher."""

    QUEUED = "queued"  # in the queue
    STAGED = "staged"  # in a batch formed ahead, waiting for a runner
    RUNNING = "running"  # in a batch a runner took
    DROPPED = "dropped"  # left the queue without running (cancelled or past its deadline); the Settler ends it
    COMPLETED = "completed"  # went through the process function: its future has the result or the error
    FAILED = "failed"  # the batcher failed before the record completed
    CANCELLED = "cancelled"  # by its caller, by `stop(cancel_pending=True)`, or by an abort
    EXPIRED = "expired"  # its deadline passed before it was dispatched


DispatchReason = Literal["full", "budget", "timeout", "idle", "drain"]
"""Why a batch went out:

- `full`: it reached `max_batch_size`.
- `budget`: the next record would have pushed it over `target_batch_cost`.
- `timeout`: its oldest record had waited `batch_timeout_s`.
- `idle`: the engine had nothing in flight and at least `min_batch_size` records were waiting.
- `drain`: the batcher was stopping or flushed (for example at the end of `run`/`map`).
"""

SettledOutcome = Literal["completed", "failed", "cancelled", "expired"]
"""How records ended: went through the process function (`completed`, some of them perhaps with their own
error), failed with the batcher, were cancelled by their caller (before they ran, or while they ran if they could
be told to stop: `Cancellable`), or passed their deadline before dispatch."""


@runtime_checkable
class CostEstimator(Protocol):
    """Records that estimate their own processing cost.

    The batcher calls `estimate_cost()` when `submit` gets no explicit `estimated_cost` and
    the batcher has no `cost_estimator` function.

    Example:
        ```python
        @dataclass
        class ApiRequest:
            payload: str

            def estimate_cost(self) -> int:
                return len(self.payload)
        ```
    """

    def estimate_cost(self) -> int: ...


@runtime_checkable
class TokenEstimator(Protocol):
    """Records that estimate their own token count.

    `TokenBatcher` calls `estimate_tokens()` (before `estimate_cost()`) when `submit` gets no
    explicit estimate and the batcher has no `token_estimator` function.

    Example:
        ```python
        @dataclass
        class Prompt:
            text: str

            def estimate_tokens(self) -> int:
                return len(self.text) // 4 + 1
        ```
    """

    def estimate_tokens(self) -> int: ...


@runtime_checkable
class Cancellable(Protocol):
    """Records that can be told to stop while they run.

    When a record's future is cancelled (its caller left) after a runner took its batch, the
    batcher calls its `cancel()` on the event loop, so that the process function, which already
    has the record, can stop working on it; the record then ends `cancelled`, whatever its result.
    A record cancelled before it runs never reaches the process function, so `cancel()` is not
    needed there. `cancel()` must be quick, must not raise, and may be called more than once.
    A record may also have a `cancellable` attribute: false says it has nothing to stop (its
    future is then not watched, and it counts as completed if it was cancelled while it ran).
    The engines' `Request` is one (it sets its `CancellationToken`, when it has one).

    Example:
        ```python
        @dataclass
        class Job:
            payload: str
            stop: threading.Event = field(default_factory=threading.Event)

            def cancel(self) -> None:
                self.stop.set()  # the process function checks it between steps
        ```
    """

    def cancel(self) -> None: ...


@dataclass
class Prompt:
    """A prompt record with a built-in token estimate (about 4 characters per token).

    Engines accept it wherever they accept a string. For an estimate from the model's real
    tokenizer, pass `engine.estimate_tokens` as the batcher's `token_estimator`.

    Attributes:
        text: The prompt text.

    Example:
        ```python
        future = await batcher.submit(Prompt(text="What is 2 + 2?"))
        ```
    """

    text: str

    def estimate_tokens(self) -> int:
        """Rough token estimate (~4 characters per token)."""
        return len(self.text) // 4 + 1

    def prefix_key(self) -> str:
        """Its text: with `grouping="by_prefix"`, prompts that begin alike go to the model together."""
        return self.text


ProcessFn = Callable[[list[RecordT]], Awaitable[Sequence[ResultT]] | Sequence[ResultT]]
"""`f(batch) -> results`, results in input order. An `async def` is awaited on the event loop;
a plain `def` runs in a worker thread so that it never blocks the loop. A result may be
an `Exception` instance to fail only that record."""

InferenceFn = ProcessFn
"""Alias of `ProcessFn` for LLM inference."""

CostEstimatorFn = Callable[[RecordT], int]
"""`f(record) -> cost` used when `submit` gets no explicit cost."""

TokenEstimatorFn = CostEstimatorFn
"""Alias of `CostEstimatorFn` for token estimates."""
