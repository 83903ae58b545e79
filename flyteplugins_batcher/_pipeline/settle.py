"""Settling: the one place where a record's future gets its outcome and the statistics learn of it.

Every way a record can end (a result or an error from the process function, a batcher failure, a
cancellation, a passed deadline) goes through `Settler.settle`, which moves the record into its
end state (`_envelope.RecordState`), resolves its future at most once and counts it exactly once.
The futures that `map` hands out for records `submit` refused, and those it cancels when its
consumer stops early, are made and cancelled here too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from flyteplugins_batcher._errors import RecordExpiredError, UnrecoverableError, add_note, short_repr
from flyteplugins_batcher._measure.stats import StatsRecorder
from flyteplugins_batcher._pipeline.envelope import (
    CANCELLED,
    COMPLETED,
    ENDS,
    EXPIRED,
    RUNNING,
    TRANSITIONS,
    Envelope,
    RecordState,
    is_cancellable,
)

logger = logging.getLogger("flyteplugins_batcher")

_monotonic = time.monotonic


class Settler:
    """Ends records: resolves their futures and counts them. Runs on the batcher's event loop.

    Args:
        batcher_name: For the notes that tie an error to its records.
        stats: The batcher's statistics.
        split_hint: Whether a whole-batch error should suggest `on_error="split"`.
    """

    def __init__(self, batcher_name: str, stats: StatsRecorder, *, split_hint: bool) -> None:
        self._batcher_name = batcher_name
        self._stats = stats
        self._split_hint = split_hint

    def settle(self, envelopes: Sequence[Envelope], end: RecordState, outcome: Any = None) -> None:
        """End every record that has not ended yet in `end`, resolve its future, and count it.

        A record whose future its caller cancelled ends `CANCELLED` instead (or `COMPLETED`, if it ran
        and could not be told to stop: see `_records.Cancellable`).

        Args:
            envelopes: The records.
            end: `COMPLETED` (they went through the process function), `FAILED` (the batcher failed
                before they completed), `CANCELLED` or `EXPIRED`.
            outcome: For `COMPLETED`, the process function's results in order (a result may be an
                `Exception`), or one exception for all of them; for `FAILED`, the exception.
        """
        if end is COMPLETED and not isinstance(outcome, BaseException):
            self._complete(envelopes, outcome)
            return
        fresh = [envelope for envelope in envelopes if envelope.state not in ENDS]
        if not fresh:
            return
        error = outcome if isinstance(outcome, BaseException) else None
        if error is not None and end is COMPLETED:
            self._note_batch_error(error, fresh)
            if not isinstance(error, UnrecoverableError):  # the batcher's failure was reported once already
                logger.error("%s: %d records failed: %r", self._batcher_name, len(fresh), error)
        ran_anyway: list[Envelope] = []  # cancelled by their caller while they ran, and not told to stop
        cancelled_by_caller: list[Envelope] = []
        resolved: list[Envelope] = []
        for envelope in fresh:
            future = envelope.future
            if future.done():  # its caller cancelled it
                if end is COMPLETED and not is_cancellable(envelope.record):
                    envelope.state = COMPLETED
                    ran_anyway.append(envelope)
                else:
                    envelope.state = CANCELLED
                    cancelled_by_caller.append(envelope)
                continue
            assert end in TRANSITIONS[envelope.state], f"a {envelope.state.value} record cannot end {end.value}"
            envelope.state = end
            resolved.append(envelope)
            if end is CANCELLED:
                future.cancel()
            elif end is EXPIRED:
                future.set_exception(
                    RecordExpiredError(f"{self._batcher_name}: {envelope.describe()} passed its deadline before it ran")
                )
            else:
                future.set_exception(error)  # type: ignore[arg-type]
        now = _monotonic()
        self._count(now, ran_anyway, COMPLETED)
        self._count(now, cancelled_by_caller, CANCELLED)
        self._count(now, resolved, end, failed=len(resolved) if end is COMPLETED else 0)

    def settle_dropped(self, envelopes: Sequence[Envelope]) -> None:
        """End records that left the queue without running: cancelled by their caller, or past their deadline."""
        self.settle(envelopes, EXPIRED)  # those whose caller cancelled them end CANCELLED

    @staticmethod
    def refused(error: Exception) -> asyncio.Future[Any]:
        """A future already failed with `error`, for a record that `submit` refused (`map` yields it in place).

        The record never entered the batcher, so it is not counted.
        """
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_exception(error)
        return future

    @staticmethod
    def abandon(futures: Iterable[asyncio.Future[Any]]) -> None:
        """Cancel the futures of records whose consumer went away, as their caller would.

        They are counted when their records end: cancelled if they were still waiting (the
        batcher drops them) or could be told to stop (`_records.Cancellable`), completed if they
        were already running and could not.
        """
        for future in futures:
            future.cancel()

    def _complete(self, envelopes: Sequence[Envelope], results: Sequence[Any]) -> None:
        # Once per record that completes: the hot path of settling, so the rare cases wait for after the loop.
        failed = 0
        unusual: list[Envelope] = []  # ended before their results came, or cancelled by their caller while they ran
        running, completed, exception = RUNNING, COMPLETED, Exception
        for envelope, result in zip(envelopes, results, strict=True):
            if envelope.state is not running:
                unusual.append(envelope)
            elif isinstance(result, exception):
                if envelope.future.done():
                    unusual.append(envelope)
                    continue
                envelope.state = completed
                add_note(result, f"{self._batcher_name}: failed {envelope.describe()}")
                envelope.future.set_exception(result)
                failed += 1
            else:
                try:
                    envelope.future.set_result(result)
                except asyncio.InvalidStateError:  # its caller cancelled it (rare: no need to ask each future first)
                    unusual.append(envelope)
                    continue
                envelope.state = completed
        now = _monotonic()
        if unusual:
            self._count(now, self._end_unusual(unusual), CANCELLED)
            envelopes = [envelope for envelope in envelopes if envelope.state is COMPLETED]
        self._count(now, envelopes, COMPLETED, failed=failed)

    @staticmethod
    def _end_unusual(envelopes: list[Envelope]) -> list[Envelope]:
        """End the running records among `envelopes`, whose caller cancelled them; returns those told to stop.

        The others ended before their results came (the batcher failed or aborted). A record that
        could be told to stop (`_records.Cancellable`) ends `CANCELLED`; one that could not ran to
        its end, and counts as completed.
        """
        stopped: list[Envelope] = []
        for envelope in envelopes:
            if envelope.state is not RUNNING:
                continue
            if is_cancellable(envelope.record):
                envelope.state = CANCELLED
                stopped.append(envelope)
            else:
                envelope.state = COMPLETED
        return stopped

    def _count(self, now: float, envelopes: Sequence[Envelope], end: RecordState, *, failed: int = 0) -> None:
        if envelopes:
            starts = [envelope.submitted_at for envelope in envelopes]
            self._stats.record_settled(now, starts, end, failed=failed)
            slo = self._stats.slo
            if slo is not None and end is COMPLETED:  # a latency target counts the records that got their answer
                latencies = [now - start for start in starts]
                targets = [envelope.slo_s for envelope in envelopes]
                slo.settled(now, [envelope.priority for envelope in envelopes], latencies, targets)

    def _note_batch_error(self, error: BaseException, envelopes: Sequence[Envelope]) -> None:
        if len(envelopes) == 1:
            add_note(error, f"{self._batcher_name}: failed {envelopes[0].describe()}")
            return
        hint = "; on_error='split' isolates the failing records" if self._split_hint else ""
        add_note(
            error,
            f"{self._batcher_name}: failed {len(envelopes)} records (#{envelopes[0].seq}..#{envelopes[-1].seq}, "
            f"first {short_repr(envelopes[0].record)}){hint}",
        )
