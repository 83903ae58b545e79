"""Settling: the one place where a record's future gets its outcome and the statistics learn of it.

Every way a record can end (a result or an error from the process function, a batcher failure, a
cancellation, a passed deadline) goes through `Settler.settle`, which resolves each future at most
once and counts each record exactly once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from flyteplugins_batcher._errors import RecordExpiredError, add_note, short_repr
from flyteplugins_batcher._pending import Envelope
from flyteplugins_batcher._stats import Settled, StatsRecorder

logger = logging.getLogger("flyteplugins_batcher")


class Settler:
    """Resolves records' futures and counts them. Runs on the batcher's event loop.

    Args:
        owner: The batcher's name, for the notes that tie an error to its records.
        stats: The batcher's statistics.
        split_hint: Whether a whole-batch error should suggest `on_error="split"`.
    """

    def __init__(self, owner: str, stats: StatsRecorder, *, split_hint: bool) -> None:
        self._owner = owner
        self._stats = stats
        self._split_hint = split_hint

    def settle(self, envelopes: Sequence[Envelope], how: Settled, outcome: Any = None) -> None:
        """Give each record its outcome, once, and count it.

        Args:
            envelopes: The records.
            how: `RAN` (they went through the process function), `FAILED` (the batcher failed
                before they ran), `CANCELLED` or `EXPIRED`.
            outcome: For `RAN`, the process function's results in order (a slot may hold an
                `Exception`), or one exception for all of them; for `FAILED`, the exception.
        """
        if how is Settled.RAN and not isinstance(outcome, BaseException):
            self._settle_results(envelopes, outcome)
            return
        fresh = [envelope for envelope in envelopes if not envelope.settled]
        if not fresh:
            return
        error = outcome if isinstance(outcome, BaseException) else None
        if error is not None and how is Settled.RAN:
            self._note_batch_error(error, fresh)
            logger.error("%s: %d records failed: %r", self._owner, len(fresh), error)
        late_cancels = []
        for envelope in fresh:
            envelope.settled = True
            future = envelope.future
            if future.done():  # cancelled by its caller meanwhile
                late_cancels.append(envelope)
                continue
            if how is Settled.CANCELLED:
                future.cancel()
            elif how is Settled.EXPIRED:
                future.set_exception(
                    RecordExpiredError(f"{self._owner}: {envelope.describe()} passed its deadline before it ran")
                )
            else:
                future.set_exception(error)  # type: ignore[arg-type]
        counted = [envelope for envelope in fresh if envelope not in late_cancels] if late_cancels else fresh
        now = time.monotonic()
        if counted:
            failed = len(counted) if how is Settled.RAN else 0
            self._stats.record_settled(now, [now - envelope.submitted_at for envelope in counted], how, failed=failed)
        if late_cancels:
            cancelled_how = Settled.RAN if how is Settled.RAN else Settled.CANCELLED
            self._stats.record_settled(now, [now - envelope.submitted_at for envelope in late_cancels], cancelled_how)

    def _settle_results(self, envelopes: Sequence[Envelope], results: Sequence[Any]) -> None:
        now = time.monotonic()
        failed = 0
        earlier: list[Envelope] = []  # settled before their results came (the batcher failed or aborted)
        for envelope, result in zip(envelopes, results, strict=True):
            future = envelope.future
            if future.done():  # settled earlier, or cancelled by its caller while it ran (still counts as run)
                if envelope.settled:
                    earlier.append(envelope)
                envelope.settled = True
                continue
            envelope.settled = True
            if isinstance(result, Exception):
                add_note(result, f"{self._owner}: failed {envelope.describe()}")
                future.set_exception(result)
                failed += 1
            else:
                future.set_result(result)
        counted = [envelope for envelope in envelopes if envelope not in earlier] if earlier else envelopes
        if counted:
            self._stats.record_settled(
                now, [now - envelope.submitted_at for envelope in counted], Settled.RAN, failed=failed
            )

    def _note_batch_error(self, error: BaseException, envelopes: Sequence[Envelope]) -> None:
        if len(envelopes) == 1:
            add_note(error, f"{self._owner}: failed {envelopes[0].describe()}")
            return
        hint = "; on_error='split' isolates the failing records" if self._split_hint else ""
        add_note(
            error,
            f"{self._owner}: failed {len(envelopes)} records (#{envelopes[0].seq}..#{envelopes[-1].seq}, first "
            f"{short_repr(envelopes[0].record)}){hint}",
        )
