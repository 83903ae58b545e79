"""A record inside the batcher: its envelope, and the one state it is in.

A record only moves forward, along these transitions (`TRANSITIONS`):

```
QUEUED  -> STAGED (in a full batch formed ahead) | RUNNING (in a batch a runner formed) | DROPPED | FAILED | CANCELLED
STAGED  -> RUNNING (a runner took its batch) | DROPPED | FAILED | CANCELLED
RUNNING -> COMPLETED (a result, or an error from the process function) | FAILED | CANCELLED
DROPPED -> CANCELLED (its caller cancelled it) | EXPIRED (its deadline passed)
```

`FAILED` is the batcher failing; `CANCELLED` without `DROPPED` is `stop` cancelling what is left.
Who moves a record: the queue (`_pending`) and the staging area (`_staging`), under the
staging area's lock, move it out of the queue (`take_live`, `move`, `Envelope.drop`); the Settler
(`_settle`), on the event loop, gives it its end and resolves its future. A record whose future is
done but that has not ended was therefore cancelled by its caller: `is_live` is the one place that
reads a future so. A record cancelled after a runner took it is told so through its own `cancel()`,
when it has one (`_records.Cancellable`; `tell_when_cancelled`), and then ends `CANCELLED`.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from flyteplugins_batcher._errors import short_repr
from flyteplugins_batcher._types import RecordState

QUEUED = RecordState.QUEUED
STAGED = RecordState.STAGED
RUNNING = RecordState.RUNNING
DROPPED = RecordState.DROPPED
COMPLETED = RecordState.COMPLETED
FAILED = RecordState.FAILED
CANCELLED = RecordState.CANCELLED
EXPIRED = RecordState.EXPIRED

WAITING = (QUEUED, STAGED)
"""States in which no runner has taken the record yet, so its deadline still matters."""

ENDS: frozenset[RecordState] = frozenset({COMPLETED, FAILED, CANCELLED, EXPIRED})
"""States a record never leaves; only the Settler moves a record into one."""

TRANSITIONS: dict[RecordState, frozenset[RecordState]] = {
    QUEUED: frozenset({STAGED, RUNNING, DROPPED, FAILED, CANCELLED}),
    STAGED: frozenset({RUNNING, DROPPED, FAILED, CANCELLED}),
    RUNNING: frozenset({COMPLETED, FAILED, CANCELLED}),
    DROPPED: frozenset({CANCELLED, EXPIRED}),
    **dict.fromkeys(ENDS, frozenset()),
}
"""Every move a record can make (the diagram above); the moves off the hot paths check it."""


class Envelope:
    """A submitted record with its future and accounting; lives only until its record has ended.

    `new_envelope` makes one, once per record: CPython 3.11 calls a class's Python `__init__` through C,
    which took half as many instructions again as a plain function setting the slots (4,700 against 3,200).

    Example:
        ```python
        envelope = new_envelope(record, cost=1, future=loop.create_future(), submitted_at=time.monotonic(), seq=1)
        ```
    """

    __slots__ = ("cost", "deadline", "future", "prefix", "priority", "record", "seq", "slo_s", "state", "submitted_at")

    record: Any
    cost: int
    future: asyncio.Future[Any]
    submitted_at: float  # time.monotonic() of its submit
    seq: int  # its submission number, from 1
    priority: int
    deadline: float | None  # time.monotonic() after which it must not be dispatched
    slo_s: float | None  # its own latency target (`submit(latency_slo_s=...)`), if it has one
    prefix: str | bytes | None  # its prefix key; only `grouping="by_prefix"` reads it
    state: RecordState

    def describe(self) -> str:
        """Names the record in error messages: its submission number and a short repr."""
        return f"record #{self.seq} {short_repr(self.record)}"

    def is_live(self, now: float) -> bool:
        """Whether it may still be dispatched: its caller has not cancelled it, and its deadline has not passed.

        Only the Settler resolves futures, and only as records end, so the future of a record that
        is still queued or staged is done only when its caller cancelled it.
        """
        return not self.future.done() and (self.deadline is None or now < self.deadline)

    def drop(self) -> None:
        """It leaves the queue (or its staged batch) without running; the Settler ends it."""
        assert DROPPED in TRANSITIONS[self.state], f"a {self.state.value} record cannot be dropped"
        self.state = DROPPED


_new = object.__new__


def new_envelope(
    record: Any,
    cost: int,
    future: asyncio.Future[Any],
    submitted_at: float,
    seq: int,
    priority: int = 0,
    slo_s: float | None = None,
    prefix: str | bytes | None = None,
    deadline: float | None = None,
) -> Envelope:
    """A record's envelope, in state `QUEUED` (`submit` makes one per record, with every argument by position)."""
    envelope = _new(Envelope)
    envelope.record = record
    envelope.cost = cost
    envelope.future = future
    envelope.submitted_at = submitted_at
    envelope.seq = seq
    envelope.priority = priority
    envelope.slo_s = slo_s
    envelope.prefix = prefix
    envelope.deadline = deadline
    envelope.state = QUEUED
    return envelope


def take_live(envelopes: list[Envelope], now: float, to: RecordState, dropped: list[Envelope]) -> list[Envelope]:
    """Move the live records among `envelopes` (all queued, or all staged) to `to` and return them.

    The others (cancelled by their caller, or past their deadline) are dropped into `dropped`.
    Called under the staging area's lock for every record on its way to a runner: as a runner forms
    its batch from the queue, or takes a staged batch.
    """
    # `Envelope.is_live`, inline: this runs for every record.
    live = [
        envelope
        for envelope in envelopes
        if not envelope.future.done() and (envelope.deadline is None or now < envelope.deadline)
    ]
    for envelope in live:
        envelope.state = to
    if len(live) < len(envelopes):
        for envelope in envelopes:
            if envelope.state is not to:
                envelope.drop()
                dropped.append(envelope)
    return live


def move(envelopes: list[Envelope], to: RecordState) -> list[Envelope]:
    """Move `envelopes` to `to` unchecked: they were checked just now, or will be as they leave a staged batch."""
    for envelope in envelopes:
        envelope.state = to
    return envelopes


_CANCELLABLE: dict[type, bool] = {}
"""Whether records of a type have a `cancel()` method (`_records.Cancellable`), by type: asked once per type."""


def _has_cancel(kind: type) -> bool:
    known = _CANCELLABLE.get(kind)
    if known is None:
        known = _CANCELLABLE[kind] = callable(getattr(kind, "cancel", None))
    return known


def is_cancellable(record: Any) -> bool:
    """Whether `record` can be told to stop while it runs: its class has `cancel()`, and it has something to stop.

    A record says it has nothing to stop with a false `cancellable` (a `Request` without a
    cancellation token): the batcher then neither watches its future nor counts it cancelled once
    it runs, since it runs to its end anyway.
    """
    return _has_cancel(type(record)) and getattr(record, "cancellable", True)


def tell_when_cancelled(envelopes: list[Envelope]) -> None:
    """Call each cancellable record's `cancel()` if its future is cancelled from now on (it is running).

    Called on the event loop as a runner takes a batch; a future cancelled a moment before (while
    a worker thread took the batch) is told at once. A batch's records are mostly of one type, and
    mostly of types without `cancel()`: those are told apart once per type, not once per record.
    """
    if not any(_has_cancel(kind) for kind in {type(envelope.record) for envelope in envelopes}):
        return
    for envelope in envelopes:
        if is_cancellable(envelope.record):
            envelope.future.add_done_callback(functools.partial(_tell_cancelled, envelope.record))


def _tell_cancelled(record: Any, future: asyncio.Future[Any]) -> None:
    if future.cancelled():
        record.cancel()
