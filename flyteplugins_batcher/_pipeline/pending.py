"""The queue: submitted records that no batch holds yet, by priority and then in FIFO order.

Records leave only when a batch is formed and are never put back, so a bounded queue cannot
deadlock on itself. The queue is not thread-safe on its own: the staging area (`_staging`) guards
it with its lock, because a runner forms batches from it while the loop appends.

Order: the record to go next is the head of the highest priority level, where a waiting record
gains one level per `priority_aging_s` seconds (so low priorities cannot starve). Within a level,
records go in submission order (`grouping="fifo"`), or, with `grouping="by_cost"`, the head goes
with records of that level close to it in cost, or, with `grouping="by_prefix"`, with records of that
level whose prefix keys share the most with its own (`_pipeline/grouping.py` forms both).

How `by_cost` picks them: the level's records sorted by cost are cut into blocks of
`max_batch_size` from the cheapest up, and the head goes with its own block. When everything
waits at once, that is exactly the offline ideal (sort everything, then cut batches), and taking a
whole block leaves the other blocks whole, where growing a batch outward from the head would
leave fragments on both sides that later end up in batches of mixed cost. Within the block,
records closest in cost to the head go first, so a budget that binds still keeps the batch tight.
A batch never leaves its block: the costliest block may be a partial one, as in the offline ideal.

With `by_prefix`, the records without a prefix key are grouped among themselves that way.
"""

from __future__ import annotations

import bisect
import contextlib
from collections import deque
from collections.abc import Iterator
from itertools import repeat, starmap
from typing import TYPE_CHECKING

from flyteplugins_batcher._pipeline.envelope import QUEUED, STAGED, Envelope, move, take_live
from flyteplugins_batcher._pipeline.grouping import BatchBuilder, PrefixGroups, take_similar_cost
from flyteplugins_batcher._settings import Grouping
from flyteplugins_batcher._types import RecordState

if TYPE_CHECKING:
    from flyteplugins_batcher._pipeline.latency_model import BatchLimit


class PendingQueue:
    """Records waiting for a batch.

    Args:
        grouping: `"fifo"`, `"by_cost"` or `"by_prefix"` (see the module notes).
        priority_aging_s: Seconds of waiting worth one priority level; `None`: strict priorities.
    """

    def __init__(self, grouping: Grouping = "fifo", priority_aging_s: float | None = None) -> None:
        self.cost = 0  # summed cost of the records still queued (cancelled ones until they are dropped)
        self.limit: BatchLimit | None = None  # with a latency target: the most a batch may take, as predicted
        self.size = 0  # records still queued (read on every submit, hence an attribute)
        self._by_cost = grouping == "by_cost"
        self._aging_s = priority_aging_s
        self._queues: dict[int, deque[Envelope]] = {0: deque()}
        self._levels: list[int] = [0]  # priority levels with a queue, highest first
        # by_cost (and by_prefix's records without a key): per level, (cost, seq, envelope) in
        # ascending order; taken entries leave it at once, while the FIFO deques drop them lazily
        # from their heads.
        self._sorted: dict[int, list[tuple[int, int, Envelope]]] = {0: []}
        # by_prefix only: per level, the records with a key, by key.
        self._prefixes: dict[int, PrefixGroups] | None = {0: PrefixGroups()} if grouping == "by_prefix" else None
        self._grouped = grouping != "fifo"

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return self.size > 0

    def push(self, envelope: Envelope) -> None:
        """Queue a record (the caller checked for space); once per record."""
        try:
            queue = self._queues[envelope.priority]
        except KeyError:  # the first record of its priority
            queue = self._add_level(envelope.priority)
        queue.append(envelope)
        if self._grouped:
            if self._prefixes is None or envelope.prefix is None:  # by cost
                bisect.insort(self._sorted[envelope.priority], (envelope.cost, envelope.seq, envelope))
            else:
                self._prefixes[envelope.priority].push(envelope, envelope.prefix)
        self.size += 1
        self.cost += envelope.cost

    def oldest(self, now: float, skipped: list[Envelope]) -> Envelope | None:
        """The longest-waiting live record (its age drives `batch_timeout_s` and `flush`).

        Records found cancelled or expired at the heads are dropped into `skipped`.
        """
        oldest: Envelope | None = None
        for level in self._levels:
            head = self._live_head(level, now, skipped)
            if head is not None and (oldest is None or head.seq < oldest.seq):
                oldest = head
        return oldest

    def peek(self, now: float, skipped: list[Envelope]) -> Envelope | None:
        """The record that goes first in the next batch (dead heads are dropped into `skipped`)."""
        level = self._next_level(now, skipped)
        return None if level is None else self._queues[level][0]

    def take_batch(
        self, budget: int, max_size: int, now: float, skipped: list[Envelope], to: RecordState
    ) -> tuple[list[Envelope], int]:
        """Remove and return the next batch, moved to `to`, and its cost: at most `max_size` records within `budget`.

        The first record always goes, so one costlier than the budget runs alone; otherwise a
        record that would cross the budget (or, with a latency target, make the batch's predicted
        time cross `limit`) stays for the next batch. Cancelled records, and
        records whose deadline has passed, are dropped into `skipped` and never batched; a batch
        to stage is checked when a runner takes it instead (until then, its records may still be
        cancelled).
        """
        level = self._next_level(now, skipped)
        if level is None:
            return [], 0
        if self._by_cost:
            batch = BatchBuilder(budget, max_size, self.limit, now, skipped, to)
            take_similar_cost(self._sorted[level], self._queues[level][0], batch)
            return self._taken(batch)
        if self._prefixes is not None:
            batch = BatchBuilder(budget, max_size, self.limit, now, skipped, to)
            return self._take_by_prefix(level, self._prefixes[level], batch)
        return self._take_in_order(level, budget, max_size, now, skipped, to)

    def remove(self, envelope: Envelope) -> None:
        """Drop one queued record (its deadline passed); a scan in FIFO mode, for rare events such as this."""
        self._drop(envelope)
        if self._prefixes is not None and envelope.prefix is not None:
            self._prefixes[envelope.priority].discard(envelope)
        elif not self._by_cost and self._prefixes is None:
            self._queues[envelope.priority].remove(envelope)

    def remove_dead(self, now: float) -> list[Envelope]:
        """Drop every record that is cancelled or past its deadline; returns them."""
        removed: list[Envelope] = []
        for level, queue in self._queues.items():
            kept: deque[Envelope] = deque()
            for envelope in queue:
                if envelope.state is not QUEUED:
                    continue  # left already (by_cost drops its FIFO entries lazily)
                (kept if envelope.is_live(now) else removed).append(envelope)
            self._queues[level] = kept
        for envelope in removed:
            self._drop(envelope)
        for groups in (self._prefixes or {}).values():
            groups.purge()
        return removed

    def remove_all(self) -> list[Envelope]:
        """Empty the queue; returns the records that were still in it (the caller ends them)."""
        removed = [envelope for envelope in self._iter_queued() if envelope.state is QUEUED]
        for queue in self._queues.values():
            queue.clear()
        for entries in self._sorted.values():
            entries.clear()
        for groups in (self._prefixes or {}).values():
            groups.clear()
        self.size = 0
        self.cost = 0
        return removed

    # -- internals ---------------------------------------------------------------------------------

    def _add_level(self, priority: int) -> deque[Envelope]:
        queue: deque[Envelope] = deque()
        self._queues[priority] = queue
        self._sorted[priority] = []
        if self._prefixes is not None:
            self._prefixes[priority] = PrefixGroups()
        bisect.insort(self._levels, priority, key=lambda level: -level)
        return queue

    def _iter_queued(self) -> Iterator[Envelope]:
        for queue in self._queues.values():
            yield from queue

    def _live_head(self, level: int, now: float, skipped: list[Envelope]) -> Envelope | None:
        """The head of a level once records that left, were cancelled or expired are dropped."""
        queue = self._queues[level]
        while queue:
            head = queue[0]
            if head.state is not QUEUED:
                queue.popleft()  # taken by a `by_cost` or `by_prefix` batch, or removed: already discounted
            elif not head.is_live(now):
                queue.popleft()
                self._drop(head)
                skipped.append(head)
            else:
                return head
        return None

    def _next_level(self, now: float, skipped: list[Envelope]) -> int | None:
        """The level whose head goes next: highest priority, counting the age of each head."""
        if len(self._levels) == 1:
            level = self._levels[0]
            return level if self._live_head(level, now, skipped) is not None else None
        best_level, best_rank = None, None
        for level in self._levels:
            head = self._live_head(level, now, skipped)
            if head is None:
                continue
            effective = level if self._aging_s is None else level + (now - head.submitted_at) / self._aging_s
            rank = (effective, -head.seq)
            if best_rank is None or rank > best_rank:
                best_level, best_rank = level, rank
        return best_level

    def _take_in_order(
        self, level: int, budget: int, max_size: int, now: float, skipped: list[Envelope], to: RecordState
    ) -> tuple[list[Envelope], int]:
        queue = self._queues[level]
        # Count what fits first, then take it in one go: this runs for every record, so it is
        # written for speed. The head is live (`_next_level` dropped dead heads).
        count = 0
        cost = 0
        if self.limit is not None:
            count, cost = self.limit.count_in_order(queue, budget, max_size)
        else:
            for envelope in queue:
                grown = cost + envelope.cost
                if count == max_size or (count and grown > budget):
                    break
                cost = grown
                count += 1
        taken = list(starmap(queue.popleft, repeat((), count)))  # a third faster than a comprehension calling it
        self.size -= count
        self.cost -= cost
        if to is STAGED:
            return move(taken, STAGED), cost  # checked when a runner takes their batch: they may still be cancelled
        live = take_live(taken, now, to, skipped)
        return live, cost if len(live) == count else sum(envelope.cost for envelope in live)

    def _take_by_prefix(self, level: int, groups: PrefixGroups, batch: BatchBuilder) -> tuple[list[Envelope], int]:
        """The head with the records nearest it by prefix key; then, with budget left, the next oldest's, and so on."""
        costs = self._sorted[level]  # the records without a key
        # The level's records in arrival order, from its head: the anchors, oldest first.
        later = iter(self._queues[level])
        anchor: Envelope | None = next(later)  # the live head, as `_next_level` left it
        while anchor is not None:
            if anchor.prefix is None:
                take_similar_cost(costs, anchor, batch)
            else:
                groups.take_near(anchor, batch)
            if batch.full:
                break
            anchor = self._next_anchor(later, batch.now, batch.skipped)
        return self._taken(batch)

    def _next_anchor(self, later: Iterator[Envelope], now: float, skipped: list[Envelope]) -> Envelope | None:
        """The oldest record still queued after those `later` went past (dropping the dead on the way).

        Everything it goes past has left the queue, so the next `_live_head` pops it all: the walk
        costs each record once.
        """
        for envelope in later:
            if envelope.state is not QUEUED:
                continue
            if envelope.is_live(now):
                return envelope
            self._drop(envelope)
            skipped.append(envelope)
        return None

    def _taken(self, batch: BatchBuilder) -> tuple[list[Envelope], int]:
        """Count out what left the queue for `batch` (its records, and those dropped on the way)."""
        self.size -= len(batch.records) + batch.dropped
        self.cost -= batch.cost + batch.dropped_cost
        return batch.records, batch.cost

    def _drop(self, envelope: Envelope) -> None:
        """Take a record that must not run (cancelled, or past its deadline) out of the counts and the cost order.

        Its FIFO entry goes lazily, when it reaches the head of its level.
        """
        envelope.drop()
        self.size -= 1
        self.cost -= envelope.cost
        if self._by_cost or (self._prefixes is not None and envelope.prefix is None):
            entries = self._sorted[envelope.priority]
            index = bisect.bisect_left(entries, (envelope.cost, envelope.seq))
            with contextlib.suppress(IndexError):
                if entries[index][2] is envelope:
                    del entries[index]
