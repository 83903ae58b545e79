"""How `by_cost` and `by_prefix` choose a batch's records among those waiting in one priority level.

Both start from the level's oldest record (the anchor), which always goes, and add records within
`max_batch_size`, the cost budget and, with a latency target, the predicted batch time
(`BatchBuilder`). A record cancelled or past its deadline that they meet is dropped, never batched.

`by_cost` (`take_similar_cost`): the level's records sorted by cost are cut into blocks of
`max_batch_size` from the cheapest up, and the anchor goes with its own block, those closest to it
in cost first (see `_pipeline/pending.py`).

`by_prefix` (`PrefixGroups.take_near`): records with a prefix key wait in groups of one key, each
in arrival order, and the keys in sorted order. The anchor goes with its group (oldest first),
then with the groups whose keys share the longest beginning with its key: in sorted order those
are its neighbours, and the beginning shared never grows as one walks away from it, so the batch
grows outwards one neighbour at a time, on the side that shares more. When no neighbour shares
anything, the oldest record left in the level is the next anchor ("the usual order"), and so on.
The work per batch is O(records taken + groups taken, each times log(keys)) plus what comparing
two keys' beginnings costs; nothing scans the whole queue. A record that does not fit (the budget,
the latency limit) ends the batch, as in `fifo`: the next batch starts from what is then oldest.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from flyteplugins_batcher._pipeline.envelope import QUEUED, Envelope
from flyteplugins_batcher._types import RecordState

if TYPE_CHECKING:
    from flyteplugins_batcher._pipeline.latency_model import BatchLimit


class BatchBuilder:
    """A batch being formed: its records, its cost, and what left the queue on the way.

    Args:
        budget: The most its records may cost together (the first record always goes).
        max_size: The most records it may hold.
        limit: With a latency target, the most it may take as predicted; else `None`.
        now: The time its records' deadlines are checked against.
        skipped: Where records found cancelled or past their deadline go (dropped).
        to: The state its records move to (`STAGED` or `RUNNING`).
    """

    __slots__ = (
        "budget",
        "closed",
        "cost",
        "dropped",
        "dropped_cost",
        "limit",
        "max_size",
        "now",
        "records",
        "skipped",
        "to",
        "top",
    )

    def __init__(
        self,
        budget: int,
        max_size: int,
        limit: BatchLimit | None,
        now: float,
        skipped: list[Envelope],
        to: RecordState,
    ) -> None:
        self.budget = budget
        self.max_size = max_size
        self.limit = limit
        self.now = now
        self.skipped = skipped
        self.to = to
        self.records: list[Envelope] = []
        self.cost = 0
        self.top = 0  # the costliest record's cost, for the latency limit
        self.dropped = 0  # records dropped on the way, and their summed cost
        self.dropped_cost = 0
        self.closed = False  # a record did not fit: nothing more goes

    @property
    def full(self) -> bool:
        """Whether it holds `max_size` records, or a record did not fit."""
        return self.closed or len(self.records) >= self.max_size

    def fits(self, envelope: Envelope) -> bool:
        """Whether `envelope` may join (size, budget, latency limit); the first record always may."""
        size = len(self.records)
        if not size:
            return True
        grown = self.cost + envelope.cost
        if size >= self.max_size or grown > self.budget:
            return False
        limit = self.limit
        return limit is None or limit.fits(size + 1, grown, max(self.top, envelope.cost))

    def add(self, envelope: Envelope) -> None:
        """Take `envelope` into the batch (the caller checked `fits`)."""
        envelope.state = self.to
        self.records.append(envelope)
        self.cost += envelope.cost
        if envelope.cost > self.top:
            self.top = envelope.cost

    def drop(self, envelope: Envelope) -> None:
        """`envelope` was cancelled or is past its deadline: it leaves the queue without running."""
        envelope.drop()
        self.skipped.append(envelope)
        self.dropped += 1
        self.dropped_cost += envelope.cost


def take_similar_cost(entries: list[tuple[int, int, Envelope]], anchor: Envelope, batch: BatchBuilder) -> None:
    """Add `anchor` and the records of its block closest to it in cost to `batch`, and take them out of `entries`.

    `entries` are a level's `(cost, seq, envelope)` in ascending order; the batch is a run of
    neighbours in that order, within the anchor's block of `max_size` (see the module notes).
    """
    position = bisect.bisect_left(entries, (anchor.cost, anchor.seq))
    if not batch.fits(anchor):
        batch.closed = True
        return
    batch.add(anchor)
    low, high = position, position + 1
    block_low = position - position % batch.max_size
    block_high = min(block_low + batch.max_size, len(entries))
    can_grow_up = True
    while not batch.full:
        below = entries[low - 1][2] if low > block_low else None
        above = entries[high][2] if can_grow_up and high < block_high else None
        if below is None and above is None:
            break
        take_above = below is None or (above is not None and above.cost - anchor.cost < anchor.cost - below.cost)
        candidate = above if take_above else below
        assert candidate is not None
        if not candidate.is_live(batch.now):
            batch.drop(candidate)
        elif batch.fits(candidate):
            batch.add(candidate)
        elif take_above:
            can_grow_up = False  # a cheaper record below may still fit; costlier ones never will
            continue
        else:
            break  # the cheapest record left does not fit
        if take_above:
            high += 1
        else:
            low -= 1
    del entries[low:high]


class PrefixGroups:
    """The records of one priority level that have a prefix key: groups of one key, and the keys in order."""

    __slots__ = ("groups", "keys")

    def __init__(self) -> None:
        # Each in arrival order, a list (a queue holds many groups of one record: a deque weighs ten times
        # more); records dropped meanwhile leave lazily, when a batch reaches them.
        self.groups: dict[str, list[Envelope]] = {}
        self.keys: list[str] = []  # the keys of `groups`, sorted

    def push(self, envelope: Envelope, key: str) -> None:
        """Queue a record under its key; once per record (a new key costs a sorted insertion)."""
        group = self.groups.get(key)
        if group is None:
            self.groups[key] = [envelope]
            bisect.insort(self.keys, key)
        else:
            group.append(envelope)

    def discard(self, envelope: Envelope) -> None:
        """Take one record out of its group at once (a rare event: its deadline passed)."""
        key = envelope.prefix
        assert key is not None
        group = self.groups[key]
        group.remove(envelope)
        if not group:
            self._forget(key)

    def purge(self) -> None:
        """Drop the records that left from every group, and the groups left empty."""
        for key in list(self.groups):
            kept = [envelope for envelope in self.groups[key] if envelope.state is QUEUED]
            if kept:
                self.groups[key] = kept
            else:
                self._forget(key)

    def clear(self) -> None:
        """Forget every record."""
        self.groups.clear()
        self.keys.clear()

    def take_near(self, anchor: Envelope, batch: BatchBuilder) -> None:
        """Add `anchor`'s group, then the groups whose keys share most with its key, to `batch` (see the module notes).

        `anchor` is its group's oldest record still queued. Groups taken whole are forgotten; a
        group taken in part (the batch filled) keeps its newer records.
        """
        key = anchor.prefix
        assert key is not None
        keys, groups = self.keys, self.groups
        index = bisect.bisect_left(keys, key)
        if not self._take_group(groups[key], batch):
            return  # the batch filled inside the anchor's own group
        low, high = index, index + 1  # the keys whose groups were taken whole
        # What the next key on each side shares with the anchor's: computed once per key reached.
        below = common_prefix_length(keys[low - 1], key) if low > 0 else 0
        above = common_prefix_length(keys[high], key) if high < len(keys) else 0
        while not batch.full and (below or above):
            take_above = above >= below
            if not self._take_group(groups[keys[high] if take_above else keys[low - 1]], batch):
                break
            # Walking away from the anchor's key, the beginning shared never grows: the last one bounds the next.
            if take_above:
                high += 1
                above = common_prefix_length(keys[high], key, above) if high < len(keys) else 0
            else:
                low -= 1
                below = common_prefix_length(keys[low - 1], key, below) if low > 0 else 0
        for taken in keys[low:high]:
            del groups[taken]
        del keys[low:high]

    def _take_group(self, group: list[Envelope], batch: BatchBuilder) -> bool:
        """Add `group`'s records in arrival order while they fit; whether it was taken whole (else the rest stays)."""
        for passed, envelope in enumerate(group):  # those before `passed` left: taken now, or dropped now or before
            if envelope.state is not QUEUED:
                continue
            if not envelope.is_live(batch.now):
                batch.drop(envelope)
            elif batch.full or not batch.fits(envelope):
                batch.closed = True
                del group[:passed]
                return False
            else:
                batch.add(envelope)
        return True

    def _forget(self, key: str) -> None:
        del self.groups[key]
        keys = self.keys
        del keys[bisect.bisect_left(keys, key)]


def common_prefix_length(first: str, second: str, at_most: int | None = None) -> int:
    """How many characters `first` and `second` share from their beginning (`at_most`: known to be no more).

    Compares slices of doubling length, then halves the one that differs: each comparison runs in
    C, so a long key (a prompt's text) costs a few dozen comparisons, not a Python loop over its
    characters, and copies about twice the part shared. With `at_most`, one comparison settles the
    common case of a neighbour that shares as much as the last one did.
    """
    end = min(len(first), len(second))
    if at_most is not None and at_most <= end:
        end = at_most
        if first.startswith(second[:end]):
            return end
    low, step = 0, 64  # `low` characters are shared
    while True:
        high = min(low + step, end)
        if first[low:high] != second[low:high]:
            break
        if high == end:
            return end
        low, step = high, step * 2
    high -= 1  # the first difference is before `high + 1`: at most `high` are shared
    while low < high:
        middle = (low + high + 1) // 2
        if first[low:middle] == second[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low
