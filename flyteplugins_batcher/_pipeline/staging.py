"""The staging area: where batches are formed and wait for a runner, shared by the event loop and the runners.

The event loop adds records, and stages up to `prefetch_batches` full batches ahead. A runner (the
thread or task that calls the process function) takes its next batch here the moment its previous
one returns: a staged batch if there is one, else it forms one itself from the waiting records.
Either way the device never waits for the event loop to come round, which matters when producers
keep the loop busy. Everything here runs under one lock, because runners may be threads (when none is,
`plan`, once per record, skips it: then everything runs on the event loop's thread).

When may a batch go (its dispatch reason)?

- `full` / `budget`: it reached `max_batch_size`, or the waiting records reach `target_batch_cost` (if set).
- `idle`: nothing is in flight and at least `min_batch_size` records wait (the device must not
  idle while work waits).
- `timeout`: the oldest waiting record was submitted `batch_timeout_s` ago.
- `drain`: the batcher is stopping, or the records were flushed.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flyteplugins_batcher._pipeline.envelope import QUEUED, RUNNING, STAGED, Envelope, take_live
from flyteplugins_batcher._pipeline.pending import PendingQueue
from flyteplugins_batcher._settings import BatcherSettings
from flyteplugins_batcher._types import DispatchReason

if TYPE_CHECKING:
    from flyteplugins_batcher._pipeline.latency_model import BatchLimit


@dataclass(eq=False)
class Batch:
    """Records that go to the process function together."""

    envelopes: list[Envelope]
    cost: int
    reason: DispatchReason
    staged: bool = False  # assembled ahead: its records may have been cancelled or expired since
    in_flight_before: int = 0  # cost already in flight when a runner took it
    device_s: float = 0.0  # seconds inside the process function, measured by its runner
    calls: int = 0  # calls of the process function it took (more than one when split to isolate a failure)
    started_at: float = 0.0  # when its first call began (`time.monotonic`), and when its last one ended
    ended_at: float = 0.0
    after_s: float | None = None  # when its runner's batch before it ended, if the runner went straight on to it


@dataclass
class Plan:
    """What the event loop must do after a change: start runners, settle skipped records, wake up later."""

    runners_to_start: int = 0
    skipped: list[Envelope] = field(default_factory=list)
    wake_at: float | None = None


class StagingArea:
    """Waiting records, staged batches and the in-flight accounting, under one lock.

    Args:
        settings: The batcher's settings.
        threads: Whether runners are worker threads (a plain `def` process function); without them,
            everything here happens on the event loop's thread, and `plan` skips the lock.
    """

    def __init__(self, settings: BatcherSettings, *, threads: bool = True) -> None:
        self.settings = settings
        self.lock = threading.Lock()
        self._plan_lock = self.lock if threads else None  # `plan` runs once per record: no lock when it needs none
        self.pending = PendingQueue(settings.grouping, settings.priority_aging_s)
        self.staged: deque[Batch] = deque()
        self.runners = 0  # runners started and not yet retired
        self.running: set[Batch] = set()  # inside the process function
        self.in_flight_cost = 0
        self.draining = False
        self.flush_upto = -1  # records up to this submission number go without waiting for the timeout
        # The limits batches are formed within: the settings', or what a latency target's controller
        # chose within them (`apply_limits`).
        self._in_flight_limit = settings.in_flight_cost_limit
        self._prefetch = settings.prefetch_batches
        self._max_size = settings.max_batch_size
        self._budget = settings.batch_budget
        self._full_cost = self._budget  # waiting cost that makes a full batch
        self._wait = settings.batch_timeout_s
        self._max_runners = settings.max_concurrent_batches
        # Grouping by cost or by prefix chooses among everything waiting, so it stages batches when
        # the device takes one (from the largest pool) rather than as soon as a batch's worth has arrived.
        self._stage_late = settings.chooses_from_waiting

    # -- the event loop's side -----------------------------------------------------------------

    def plan(self, now: float, envelope: Envelope | None = None) -> Plan | None:
        """Add `envelope` (if given), stage full batches ahead, and claim runners for what can go now.

        Returns `None` when the event loop has nothing to do: the common case while the device is
        busy. This runs once per submitted record, hence the settings read into attributes, and the
        lock taken by hand (a `with` costs twice as much), or not at all when no runner is a thread.
        """
        lock = self._plan_lock
        if lock is not None:
            lock.acquire()
        try:
            pending = self.pending
            if envelope is not None:
                pending.push(envelope)
            skipped: list[Envelope] | None = None
            if (
                len(self.staged) < self._prefetch
                and (pending.size >= self._max_size or pending.cost >= self._full_cost)
                and (envelope is None or not self._stage_late)
            ):
                skipped = []
                self._stage_full_batches(now, skipped)
            if self.runners >= self._max_runners:
                return Plan(skipped=skipped) if skipped else None
            return self._claim_runners(now, skipped or [])
        finally:
            if lock is not None:
                lock.release()

    def _claim_runners(self, now: float, skipped: list[Envelope]) -> Plan:
        plan = Plan(skipped=skipped)
        pending = self.pending
        reason = self._pending_reason(now, skipped)
        ready = self._takeable(now, reason, skipped)
        claimed = self.runners - self.in_flight_batches  # started, about to take a batch
        while self.runners < self._max_runners and claimed < ready:
            self.runners += 1
            claimed += 1
            plan.runners_to_start += 1
        if reason is None and pending and self.runners < self._max_runners:
            # The waiting records may go once the oldest times out; busy runners look again by
            # themselves when their batch returns.
            oldest = pending.oldest(now, skipped)
            if oldest is not None:
                plan.wake_at = oldest.submitted_at + self._wait
        return plan

    def _stage_full_batches(self, now: float, skipped: list[Envelope]) -> None:
        pending = self.pending
        while len(self.staged) < self._prefetch and (pending.size >= self._max_size or pending.cost >= self._full_cost):
            why: DispatchReason = "full" if pending.size >= self._max_size else "budget"
            records, cost = pending.take_batch(self._budget, self._max_size, now, skipped, STAGED)
            if not records:
                break
            self.staged.append(Batch(records, cost, why, staged=True))

    def apply_limits(
        self,
        *,
        max_size: int,
        limit: BatchLimit | None = None,
        full_cost: int | None = None,
        wait_s: float | None = None,
        in_flight_cost: int | None = None,
        prefetch: int | None = None,
    ) -> None:
        """Form batches within these limits from now on, as a latency target chose them (`None`: the setting)."""
        settings = self.settings
        with self.lock:
            self._max_size = max_size
            self.pending.limit = limit
            self._full_cost = settings.batch_budget if full_cost is None else full_cost
            self._wait = settings.batch_timeout_s if wait_s is None else wait_s
            self._in_flight_limit = settings.in_flight_cost_limit if in_flight_cost is None else in_flight_cost
            self._prefetch = settings.prefetch_batches if prefetch is None else prefetch

    def flush(self, upto_seq: int) -> None:
        """Let every record up to `upto_seq` go without waiting for the timeout."""
        with self.lock:
            self.flush_upto = max(self.flush_upto, upto_seq)

    def start_draining(self) -> None:
        """Stopping: every waiting record may go at once."""
        with self.lock:
            self.draining = True

    def remove_waiting(self, *, with_running: bool = False) -> list[Envelope]:
        """Take every queued and staged record out and return them (and, if asked, those running).

        Running batches stay accounted for until their runner returns: when the batcher aborts or
        fails, their records are settled at once, and whatever the process function still returns
        for them is dropped.
        """
        with self.lock:
            removed = [envelope for batch in self.staged for envelope in batch.envelopes]
            self.staged.clear()
            removed.extend(self.pending.remove_all())
            if with_running:
                removed.extend(envelope for batch in self.running for envelope in batch.envelopes)
            return removed

    def finish(self, batch: Batch) -> None:
        """`batch` left the process function and its runner stopped (the batcher failed)."""
        with self.lock:
            self._release(batch)

    @property
    def in_flight_batches(self) -> int:
        """Batches inside the process function."""
        return len(self.running)

    def remove_dead(self, now: float) -> list[Envelope]:
        """Drop every waiting or staged record that was cancelled or is past its deadline; returns them."""
        with self.lock:
            removed = self.pending.remove_dead(now)
            for batch in self.staged:
                dead = [envelope for envelope in batch.envelopes if not envelope.is_live(now)]
                if dead:
                    for envelope in dead:
                        envelope.drop()
                    batch.envelopes = [envelope for envelope in batch.envelopes if envelope.state is STAGED]
                    batch.cost = sum(envelope.cost for envelope in batch.envelopes)
                    removed.extend(dead)
            return removed

    def drop_expired(self, envelope: Envelope) -> bool:
        """Drop a record whose deadline just passed, if no runner took it yet; whether it was dropped.

        Under the lock, so that a runner cannot take it meanwhile.
        """
        with self.lock:
            if envelope.state is QUEUED:
                self.pending.remove(envelope)
                return True
            if envelope.state is STAGED:
                batch = next(batch for batch in self.staged if envelope in batch.envelopes)
                batch.envelopes.remove(envelope)
                batch.cost -= envelope.cost
                envelope.drop()
                return True
            return False

    @property
    def waiting(self) -> int:
        """Records waiting: queued, or in a staged batch."""
        return self.pending.size + sum(len(batch.envelopes) for batch in self.staged)

    # -- the runners' side ---------------------------------------------------------------------

    def next_batch(self, finished: Batch | None, now: float) -> tuple[Batch | None, list[Envelope]]:
        """Account for `finished` and hand out the next batch; `None` retires the calling runner.

        Also returns the records left out on the way (cancelled, or past their deadline), for the
        event loop to settle; they never reach the process function.
        """
        skipped: list[Envelope] = []
        with self.lock:
            if finished is not None:
                self._release(finished)
            while True:
                batch = self._take(now, skipped)
                if batch is None:
                    self.runners -= 1
                    return None, skipped
                if not batch.staged:
                    break  # formed just now: its records were checked as they were taken
                # A staged batch's records are checked now, as they go: they were not when it was staged.
                envelopes = batch.envelopes
                live = take_live(envelopes, now, RUNNING, skipped)
                if len(live) < len(envelopes):
                    batch.envelopes = live
                    batch.cost = sum(envelope.cost for envelope in live)
                if live:
                    break
            self.running.add(batch)
            batch.in_flight_before = self.in_flight_cost
            self.in_flight_cost += batch.cost
            return batch, skipped

    def _release(self, batch: Batch) -> None:
        if batch in self.running:
            self.running.discard(batch)
            self.in_flight_cost -= batch.cost

    def has_waiting(self) -> bool:
        """Whether records wait that no runner will take until something changes (a timeout, a submit)."""
        with self.lock:
            return bool(self.pending) or bool(self.staged)

    def _takeable(self, now: float, reason: DispatchReason | None, skipped: list[Envelope]) -> int:
        """How many batches a runner could take right now (`_take` would not refuse the first)."""
        spare = self._in_flight_limit - self.in_flight_cost
        if self.staged:
            fits = not self.in_flight_batches or self.staged[0].cost <= spare
            return len(self.staged) + (reason is not None) if fits else 0
        if reason is None:
            return 0
        if self.in_flight_batches:
            head = self.pending.peek(now, skipped)
            if head is None or head.cost > spare:
                return 0
        return 1

    def _take(self, now: float, skipped: list[Envelope]) -> Batch | None:
        spare = self._in_flight_limit - self.in_flight_cost
        if self.staged:
            head = self.staged[0]
            if self.in_flight_batches and head.cost > spare:
                return None  # the in-flight bound is reached; a completion will call again
            return self.staged.popleft()
        reason = self._pending_reason(now, skipped)
        if reason is None:
            return None
        budget = self._budget
        if self.in_flight_batches:
            head = self.pending.peek(now, skipped)
            if head is None or head.cost > spare:
                return None  # it goes once a batch in flight returns (an oversized record: on an idle device)
            budget = min(budget, spare)
        limit = self.pending.limit
        if limit is not None:
            limit.in_flight = self.in_flight_cost
        records, cost = self.pending.take_batch(budget, self._max_size, now, skipped, RUNNING)
        if not records:
            return None
        return Batch(records, cost, reason)

    def _pending_reason(self, now: float, skipped: list[Envelope]) -> DispatchReason | None:
        pending = self.pending
        if not pending:
            return None
        if pending.size >= self._max_size:
            return "full"
        if pending.cost >= self._full_cost:
            return "budget"
        oldest = pending.oldest(now, skipped)
        if oldest is None:
            return None
        if self.draining or oldest.seq <= self.flush_upto:
            return "drain"
        if now - oldest.submitted_at >= self._wait:
            return "timeout"
        if not self.in_flight_batches and pending.size >= self.settings.min_batch_size:
            return "idle"
        return None
