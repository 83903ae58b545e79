"""Record-side contracts: the cost and cancellation protocols, the `Prompt` record and the callable type aliases."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

RecordT = TypeVar("RecordT")
ResultT = TypeVar("ResultT")


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


ProcessFn = Callable[[list[RecordT]], Awaitable[Sequence[ResultT]] | Sequence[ResultT]]
"""`f(batch) -> results`, results in input order. An `async def` is awaited on the event loop;
a plain `def` runs in a worker thread so that it never blocks the loop. A result slot may hold
an `Exception` instance to fail only that record."""

InferenceFn = ProcessFn
"""Alias of `ProcessFn` for LLM inference."""

CostEstimatorFn = Callable[[RecordT], int]
"""`f(record) -> cost` used when `submit` gets no explicit cost."""

TokenEstimatorFn = CostEstimatorFn
"""Alias of `CostEstimatorFn` for token estimates."""
