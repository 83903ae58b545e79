"""`LLMReplica.live_records`: what this process's replicas have finished, record by record, for a progress line.

A chunk's outcome reaches the driver only when its last record is answered; with chunks of 8 and
batches of 16, a run on a busy CPU shows nothing for many minutes. So every record a replica's
`run_chunk` finishes is counted here, in the process that ran it, as its future settles.

Where the driver can read it:

- Under flyte's local runner (`flyte run --local`, `run-batch`, `make run`) the replicas' tasks run in
  the driver's process: the driver reads these counts about once a second and shows each record as
  it finishes, with a rate measured over the time records were in flight (model loading excluded).
- On a cluster the replicas are other processes: the driver's own counts stay at zero, and its
  progress moves per chunk, as each chunk's outcome comes back (the chunk is what Flyte returns).

The counts are cumulative over the process's life: a reader keeps the counts it started from and
takes differences (`LiveRecords.since`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from flyteplugins_batcher.engines import Completion


@dataclass(frozen=True)
class LiveRecords:
    """Records this process's LLM replicas finished, and the seconds during which any was in flight.

    Attributes:
        finished: Records answered or failed (a record dropped unanswered counts too: it is done).
        failed: Of those, the ones that got an error.
        completion_tokens: Tokens the answered records generated.
        busy_s: Seconds with at least one record submitted and not yet finished (model loads and the
            gaps between chunks excluded), up to the moment the counts were read.

    Example:
        ```python
        start = LLMReplica.live_records()
        ...  # chunks run in this process
        now = LLMReplica.live_records().since(start)
        print(f"{now.finished} records, {now.tokens_per_s():.1f} tokens/s")
        ```
    """

    finished: int = 0
    failed: int = 0
    completion_tokens: int = 0
    busy_s: float = 0.0

    def since(self, earlier: LiveRecords) -> LiveRecords:
        """What happened between `earlier` and these counts."""
        return LiveRecords(
            self.finished - earlier.finished,
            self.failed - earlier.failed,
            self.completion_tokens - earlier.completion_tokens,
            self.busy_s - earlier.busy_s,
        )

    def records_per_s(self) -> float:
        """Records finished per busy second (0.0 before any finished)."""
        return self.finished / self.busy_s if self.busy_s > 0 and self.finished else 0.0

    def tokens_per_s(self) -> float:
        """Tokens generated per busy second (0.0 before any)."""
        return self.completion_tokens / self.busy_s if self.busy_s > 0 else 0.0


class _LiveCounter:
    """The process's counts, kept from the event loop of whichever replica runs (several loops may share it)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._finished = self._failed = self._tokens = self._in_flight = 0
        self._busy_s = 0.0
        self._busy_from = 0.0  # when in-flight records went from none to some

    def submitted(self, count: int) -> None:
        with self._lock:
            if count and not self._in_flight:
                self._busy_from = self._clock()
            self._in_flight += count

    def finished(self, outcome: object) -> None:
        with self._lock:
            self._finished += 1
            if isinstance(outcome, Completion):
                self._tokens += outcome.completion_tokens
            else:
                self._failed += 1
            self._in_flight -= 1
            if not self._in_flight:
                self._busy_s += self._clock() - self._busy_from

    def read(self) -> LiveRecords:
        with self._lock:
            busy_s = self._busy_s + (self._clock() - self._busy_from if self._in_flight else 0.0)
            return LiveRecords(self._finished, self._failed, self._tokens, busy_s)


_COUNTER = _LiveCounter()


def live_records() -> LiveRecords:
    """The records this process's LLM replicas have finished so far (cumulative; see `LiveRecords.since`)."""
    return _COUNTER.read()


def count_submitted(count: int) -> None:
    """`count` records went to a replica's batcher (each is later `count_finished`)."""
    _COUNTER.submitted(count)


def count_finished(outcome: object) -> None:
    """A record a replica submitted finished: its `Completion`, or its error."""
    _COUNTER.finished(outcome)
