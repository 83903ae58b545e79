"""Reruns: reuse what an earlier run answered, and send what it failed to the engine again.

Flyte caches a finished chunk (`cache="auto"`) with every line's outcome, failures included. A
rerun of the same job gets those outcomes back from the cache in seconds, so without more a user
who fixed the cause of a failure (installed `xgrammar`, say) would get the same errors back. So a
chunk whose outcome came from an earlier run and holds failed lines is not taken as it is: its
failed lines go out again as a chunk of their own, and their new outcomes replace the old ones.
Not those whose failure is permanent (`retryable_positions`): a prompt too long for the model, an
empty one, one its chat template refuses fail again with the same model and settings (which the
chunk's cache key holds), and retrying them alone would load a model for nothing.

The retry chunk is cached too, under a salt one level deeper (`<salt>retry-<level>`), so a third
run reuses what the second one answered and retries only what still failed; each rerun adds at
most one level, walked through cache hits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from typing_extensions import Self


class RetryableChunk(Protocol):
    """A chunk that can be cut down to some of its items."""

    index: int

    def only(self, positions: Sequence[int]) -> Self:
        """The same chunk holding only the items at `positions` (in that order)."""
        ...


class RetryableOutcome(Protocol):
    """A chunk's outcome that says which items failed, and takes the outcomes of their retry."""

    finished_at: float
    fresh: list[int] | None

    def retryable_positions(self) -> list[int]:
        """Positions of the items that failed for a reason another attempt may not meet."""
        ...

    def with_retried(self, positions: Sequence[int], retried: Self, started: float) -> Self:
        """This outcome with the items at `positions` replaced by `retried`'s (see `ItemOutcomes`)."""
        ...


ChunkT = TypeVar("ChunkT", bound=RetryableChunk)
OutcomeT = TypeVar("OutcomeT", bound=RetryableOutcome)
SaltedInfer = Callable[[ChunkT, str], Awaitable[OutcomeT]]
"""Runs a chunk with a cache salt: `infer(chunk, salt)` (a fresh salt makes it run again instead of reusing it)."""


def retrying_reused_failures(
    infer: SaltedInfer[ChunkT, OutcomeT], *, salt: str, started: float
) -> Callable[[ChunkT], Awaitable[OutcomeT]]:
    """`infer` for `fan_out`: a chunk reused from an earlier run has its failed items run again.

    Args:
        infer: Runs a chunk with a cache salt.
        salt: The run's cache salt (empty when resuming).
        started: When this run started (epoch seconds): an outcome that finished before came from the cache.

    Example:
        ```python
        infer = retrying_reused_failures(lambda chunk, salt: infer_chunk(chunk, settings, salt), salt="", started=t0)
        await fan_out(chunks, infer, on_chunk, max_in_flight=16)
        ```
    """

    async def run(chunk: ChunkT, level: int = 0) -> OutcomeT:
        outcome = await infer(chunk, f"{salt}retry-{level}" if level else salt)
        failed = outcome.retryable_positions() if outcome.finished_at < started else []
        if not failed:
            return outcome
        retried = await run(chunk.only(failed), level + 1)
        return outcome.with_retried(failed, retried, started)

    return run
