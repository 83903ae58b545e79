"""Admission: what goes into the server's LLM batcher, and when. Every gate an online request or a batch line
meets on its way to the engine is here, in the order it meets them:

1. **Priority.** An online request's record has `ONLINE_PRIORITY`, a batch line's 0: in the batcher's queue a
   user waiting on an answer goes first (a batch line gains a level per `priority_aging_s`, so batches are
   slowed, not starved).
2. **The engine's hold.** An engine that schedules sequences itself (vLLM stream mode, the simulated GPU) is
   let hold its slots and a quarter more (`engine_hold_keywords`); the rest waits in the batcher, where
   priority orders it.
3. **Room.** An online request never waits for room in the batcher's queue (`Inference.start` submits it
   with `wait_for_room=False`): a full queue is a `QueueFullError`, answered 429.
4. **The online target** (`online_ttft_slo_s`, `online_tpot_slo_s`; none set: nothing below runs).
   `OnlineAdmission.admit_online` gives an online request the timer its record carries, or refuses it
   (`OnlineOverloadedError`, 429) when online requests alone are more than the engine serves within the
   target; a batch line waits for a place in the batch's quota (`BatchQuota.admit_line`, which the server
   hands its replica as `LLMReplica(admit=...)`, and `replica.run_admitted` holds per line) before its
   record goes to the batcher.
5. **The batcher's own target.** `latency_slo_s`, on a server, is the online records' alone
   (`server_batcher_keywords`): batch lines have none.

**The online target.** The server measures each online request's time to first token (from its arrival to
the first text the engine makes: `OnlineTimer`, the listener its record carries) and time per output token
after it, and `OnlineAdmission` keeps them within the target two ways, judged every `TICK_S` on the requests
that ran wholly under the current choice:

- **The batch's quota.** Batch lines have no target; each waits for a place in the batch's quota
  (`BatchQuota`) before its record goes to the batcher, and holds it until its answer. While the target
  holds with margin to spare, every bound has been measured under the current quota, and lines wait, the
  quota grows (by the share of the target left, by `GROW_STEP` lines at most: lines that go in together
  have their prompts read in the same steps), never past the engine's slots less those online requests
  need (the ones in flight and a burst beyond them); when the target is missed, it shrinks to a share of
  the lines running, and is judged again once they are down to it. Time per output token is judged over
  `LEAST_PIECES` steps at least, so that the one long step that reads new lines' prompts weighs on it
  about as much as on a whole answer. On an engine that schedules sequences itself (vLLM stream mode, the
  simulated GPU) that is the batch's share of each step, whose time is every running sequence's time per
  token. When no online request has come for `QUIET_S` (or ten targets), the quota is given back whole:
  the batch fills the engine again, but no more lines go in than the engine holds (`set_engine`). A line
  let in cannot be taken back, so the first online requests after a quiet spell share the engine with as
  many lines as it holds (or, when fewer run, with the quota the target last held under).
- **Honest refusals.** When the target is missed `PERSIST` judgments in a row with the batch at its
  floor (a line), online requests alone are more than the engine can serve within it: new ones
  beyond a bound on those in flight (cut to a share of the requests then running, and grown back
  while the target holds) are answered 429, with a `Retry-After` of the time the requests ahead
  of it take to leave at the rate online requests were answered lately, instead of every request
  missing it. The bound goes once the target holds and nobody was refused.

Without a target, online requests and batch lines share the engine under gates 1 to 3 alone.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flyteplugins_batcher import BatcherError

if TYPE_CHECKING:
    from flyteplugins_batcher.engines import Completion, DeltaListener, Engine, TokenLogprob
    from flyteplugins_batcher.replica import EngineSettings

ONLINE_PRIORITY = 30
"""Online requests' priority in the shared batchers; batch lines have 0.

A waiting record gains a level per `priority_aging_s` (10 s), so a batch line overtakes new online
requests only after waiting 5 minutes: batches are slowed, not starved. At 1, a batch of a few
thousand lines (each waiting over 10 s in the queue) caught up with online requests at once, and
they waited behind it: the online p99 beside a batch was 16x its idle value."""

ENGINE_QUEUE_SHARE = 0.25
"""Records a self-scheduling engine may hold waiting, beyond those it runs, as a share of its slots."""


def server_batcher_keywords(engine: Engine, settings: EngineSettings) -> dict[str, object]:
    """The keywords of a server's LLM batcher: the settings', with the engine's hold, and `latency_slo_s` (when
    set) the online records' alone, `{ONLINE_PRIORITY: seconds}`: batch lines have no latency target."""
    keywords: dict[str, object] = settings.batcher_keywords()
    if "latency_slo_s" in keywords:
        keywords["latency_slo_s"] = {ONLINE_PRIORITY: keywords["latency_slo_s"]}
    return keywords | engine_hold_keywords(engine)


def engine_hold_keywords(engine: Engine) -> dict[str, object]:
    """Batcher keywords that keep a server's queue in its batcher, where online requests go first.

    An engine that schedules requests itself (vLLM stream mode, the simulated engine) gets records
    the moment they arrive, and a batch job keeps up to 4x its capacity inside it
    (`stream_batcher_settings` in `engines/_base.py`), in the engine's own first-come queue. An online request would
    wait behind all of them: on the GPU-timed engine, a batch running beside online traffic made
    the online p99 24x its idle value. A server lets the engine hold its slots and a quarter more
    (enough to refill the slots freed at each step), and keeps the rest in the batcher, where
    `ONLINE_PRIORITY` puts a user's request ahead of batch lines.
    """
    slots = engine_slots(engine)
    return {} if slots is None else {"max_concurrent_batches": engine_holds(slots)}


def engine_slots(engine: Engine) -> int | None:
    """The sequences an engine that schedules requests itself runs at once (`None`: one that takes whole batches)."""
    capacity = engine.stats.max_num_seqs
    if not capacity or engine.batcher_defaults().max_batch_size != 1:
        return None
    return capacity


def engine_holds(slots: int) -> int:
    """The records a server lets a self-scheduling engine hold: its slots and `ENGINE_QUEUE_SHARE` more."""
    return math.ceil(slots * (1 + ENGINE_QUEUE_SHARE))


TICK_S = 0.1
"""Seconds between judgments of the target (each is a few comparisons)."""
LEAST = 4
"""Figures a judgment needs (times to first token, and times per output token of requests with `LEAST_PIECES`
pieces under the current quota), unless two requests already wait past the time to first token."""
LEAST_PIECES = 16
"""Pieces of text (engine steps) after the current quota came that make a request's time per output token: enough
that the one long step in which the lines let in have their prompts read weighs on it as little as on a whole answer
(the target's figure), so that letting lines in does not by itself look like a miss."""
GROW = 0.8
"""Below this share of the target, a quota that lines wait for grows (by the share left, at most twofold)."""
GROW_STEP = 32
"""Most lines a quota grows by at one judgment: the lines that go in at once have their prompts read in the same
steps, and every running sequence (online ones too) waits for such a step."""
SHRINK = 0.85
"""A missed target cuts the quota to this over the share missed by (between a half and nine tenths of it)."""
PERSIST = 3
"""Judgments in a row that miss the target with the batch at its floor before online requests are refused."""
QUIET_S = 5.0
"""Seconds without online requests (at least ten times the time to first token) before the quota is given back."""
MIN_QUOTA = 1
"""Batch lines that may always run: a batch is slowed by online traffic, never stopped."""
BURST_Z = 2.33
"""Deviations of a Poisson count of online requests in flight the engine's slots keep free for (its p99)."""
RECENT = 512
"""Latest online requests whose times are kept."""
JUDGED = 64
"""Latest finished online requests a judgment weighs (with those in flight)."""
RATE_WINDOW_S = 10.0
"""How far back arrival and completion rates look."""
MAX_RETRY_AFTER_S = 60
"""The longest `Retry-After`: the official clients honour one up to a minute."""


@dataclass(frozen=True)
class OnlineTarget:
    """The online requests' target: time to first token and per output token, at a quantile (0: no bound).

    Example:
        ```python
        target = OnlineTarget(ttft_s=0.5, tpot_s=0.05)
        assert target.describe() == "time to first token p99 <= 0.5 s, time per output token p99 <= 0.05 s"
        ```
    """

    ttft_s: float = 0.0
    tpot_s: float = 0.0
    quantile: float = 0.99

    def __post_init__(self) -> None:
        if self.ttft_s < 0 or self.tpot_s < 0:
            raise ValueError(
                f"online_ttft_slo_s and online_tpot_slo_s must be >= 0 seconds, got {self.ttft_s} and {self.tpot_s}"
            )
        if not 0 < self.quantile < 1:
            raise ValueError(f"online_slo_quantile must be between 0 and 1, got {self.quantile}")

    @property
    def is_set(self) -> bool:
        """Whether any bound is set."""
        return self.ttft_s > 0 or self.tpot_s > 0

    def describe(self) -> str:
        """The bounds for a person: `time to first token p99 <= 0.5 s, ...`."""
        quantile = f"p{100 * self.quantile:g}"
        bounds = [("time to first token", self.ttft_s), ("time per output token", self.tpot_s)]
        return ", ".join(f"{name} {quantile} <= {seconds:g} s" for name, seconds in bounds if seconds > 0)


class OnlineOverloadedError(BatcherError):
    """Online requests alone are more than the engine serves within their target: refuse this one (429).

    Attributes:
        retry_after_s: Whole seconds until the requests ahead have likely left (1 to 60).
    """

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class OnlineTimer:
    """One online request's times, and the listener its record carries: it notes when each piece of text came.

    Args:
        submitted: When the request arrived (the clock's seconds).
        listener: The stream's own listener, told every piece after the timer notes it (`None`: not streamed).
        clock: Seconds, monotonic; read on the engine's thread.
    """

    __slots__ = ("_clock", "ended", "listener", "pieces", "submitted")

    def __init__(self, submitted: float, listener: DeltaListener | None, clock: Callable[[], float]) -> None:
        self.submitted = submitted
        self.listener = listener
        self.pieces: list[float] = []  # when each piece of the first choice came: a step of the engine each
        self.ended: float | None = None
        self._clock = clock

    @property
    def first(self) -> float | None:
        """When its first text came (`None`: not yet, or it came whole with the answer)."""
        return self.pieces[0] if self.pieces else None

    def __call__(self, index: int, text: str, logprobs: tuple[TokenLogprob, ...] = ()) -> None:
        if index == 0:
            self.pieces.append(self._clock())
        if self.listener is not None:
            self.listener(index, text, logprobs)

    @property
    def ttft_s(self) -> float | None:
        """Its time to first token (`None`: none yet); with no text before its answer, its first came with it."""
        first = self.first if self.pieces else self.ended
        return None if first is None else first - self.submitted

    def tpot_since(self, since: float) -> float | None:
        """Its time per output token over the pieces since `since` (`None`: fewer than `LEAST_PIECES` of them)."""
        pieces = self.pieces[:]  # a copy: the engine's thread may add more
        start = bisect.bisect_left(pieces, since, 1)
        if len(pieces) - start < LEAST_PIECES:
            return None
        return (pieces[-1] - pieces[start]) / (len(pieces) - start - 1)


@dataclass(frozen=True)
class OnlineTimes:
    """A finished online request's times: to its first token, and per output token after it (`None`: one token)."""

    submitted: float
    ttft_s: float
    tpot_s: float | None


class BatchQuota:
    """How many batch lines may be in flight at once (`None`: any), and the lines waiting for a place, in order.

    Example:
        ```python
        quota = BatchQuota()
        quota.set_limit(4)
        async with quota.admit_line():  # waits while 4 lines are in flight
            answer = await (await batcher.submit(line))
        ```
    """

    def __init__(self) -> None:
        self.limit: int | None = None
        self.ceiling: int | None = None  # the most in flight whatever the limit: what the engine holds
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        """Lines waiting for a place."""
        return len(self._waiters)

    @property
    def binding(self) -> bool:
        """Whether lines wait because the quota is full (not merely because they just came)."""
        return bool(self._waiters) and self.limit is not None and self.in_flight >= self.limit

    def set_limit(self, limit: int | None) -> None:
        """Let `limit` lines be in flight (`None`: any); waiting lines go in at once if the quota has places now."""
        self.limit = limit
        self._wake()

    @contextlib.asynccontextmanager
    async def admit_line(self) -> AsyncIterator[None]:
        """Hold a place for one line while the block runs; wait for it first, behind the lines that came before."""
        if self._waiters or not self._has_place():
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():  # a place was given just as it was cancelled: pass it on
                    self._release()
                else:
                    self._waiters.remove(waiter)
                raise
        else:
            self.in_flight += 1
        try:
            yield
        finally:
            self._release()

    def _has_place(self) -> bool:
        limit, ceiling = self.limit, self.ceiling
        return (limit is None or self.in_flight < limit) and (ceiling is None or self.in_flight < ceiling)

    def _release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._has_place():
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.in_flight += 1
                waiter.set_result(None)


@dataclass(frozen=True)
class OnlineAdmissionStats:
    """What the online target's controller sees and chose (the server's `/metrics` export it).

    Attributes:
        target: The target.
        quota: Batch lines allowed in flight (`None`: any).
        batch_in_flight: Batch lines in flight (queued in the batcher or running).
        batch_waiting: Batch lines waiting for a place.
        online_in_flight: Online requests in flight.
        online_limit: While overloaded, the online requests allowed in flight (`None`: any).
        overloaded: Online requests alone miss the target: new ones beyond `online_limit` get 429.
        arrivals_per_s: Online requests that arrived per second lately, refused ones included.
        sustainable_per_s: Online requests per second that met the target lately.
        refused: Online requests answered 429 for the target, since the server started.
        ttft_s: The quantile of the latest requests' time to first token (0 before any).
        tpot_s: The quantile of the latest requests' time per output token (0 before any).
    """

    target: OnlineTarget
    quota: int | None
    batch_in_flight: int
    batch_waiting: int
    online_in_flight: int
    online_limit: int | None
    overloaded: bool
    arrivals_per_s: float
    sustainable_per_s: float
    refused: int
    ttft_s: float
    tpot_s: float


class OnlineAdmission:
    """Keeps online requests within their target beside batch lines: the batch's quota, and 429s past it (module notes).

    Everything runs on the server's event loop, but `OnlineTimer.__call__` (the engine's thread).

    Args:
        target: The target (at least one bound set).
        clock: Seconds, monotonic (a test's virtual clock).

    Example:
        ```python
        admission = OnlineAdmission(OnlineTarget(ttft_s=0.5))
        timer = admission.admit_online(on_delta)  # raises OnlineOverloadedError when the server must refuse
        ...  # the record runs, `timer` is its listener
        admission.finished(timer, tokens=completion.completion_tokens)
        ```
    """

    def __init__(self, target: OnlineTarget, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.target = target
        self.quota = BatchQuota()
        self._clock = clock
        self._quiet_s = max(QUIET_S, 10 * target.ttft_s)
        self._times: deque[OnlineTimes] = deque(maxlen=RECENT)
        self._finished: deque[OnlineTimer] = deque(maxlen=RECENT)
        self._pending: set[OnlineTimer] = set()
        self._arrivals: deque[float] = deque()
        self._met: deque[float] = deque()  # when each request that met the target ended
        self._ended: deque[float] = deque()  # when each answered request ended
        self._last_arrival = -math.inf
        self._judged_from = clock()  # the judgments weigh requests that arrived since (the quota was as it is)
        self._settling = False  # a cut waits for the lines in flight to come down to the quota
        self._held_quota: int | None = None  # the last quota the target held under (where online requests resume)
        self._misses = 0
        self._online_limit: int | None = None
        self._refused_since_judged = False
        self.refused = 0
        self.slots: int | None = None  # sequences the engine runs at once, once known (`None`: unknown)

    def set_engine(self, slots: int | None, holds: int | None) -> None:
        """The engine's `slots` (sequences it runs at once) and the lines it `holds` (its slots and its queue).

        The quota never takes the slots online requests need, and no more lines are let in than the
        engine holds even while the quota is given back whole: a line let in cannot be taken back, so
        lines beyond would all run before a cut takes hold once online requests come.
        """
        self.slots = slots
        self.quota.ceiling = holds
        self.quota.set_limit(self.quota.limit)  # let in those the new ceiling allows

    # -- online requests --------------------------------------------------------------------------

    def admit_online(self, listener: DeltaListener | None = None) -> OnlineTimer:
        """An online request arrives: its timer (the listener its record carries), or a refusal.

        Raises:
            OnlineOverloadedError: Online requests alone are more than the target allows, and the
                bound on those in flight is reached.
        """
        now = self._clock()
        if now - self._last_arrival >= self._quiet_s and not self._pending:
            self._wake_up(now)
        self._last_arrival = now
        self._arrivals.append(now)
        limit = self._online_limit
        if limit is not None and len(self._pending) >= limit:
            self.refused += 1
            self._refused_since_judged = True
            raise self._refusal(len(self._pending) - limit + 1)
        timer = OnlineTimer(now, listener, self._clock)
        self._pending.add(timer)
        return timer

    def finished(self, timer: OnlineTimer, tokens: int | None) -> OnlineTimes | None:
        """An online request ended: with `tokens` output tokens (per choice), or `None` when it failed or left.

        Returns:
            Its times, for a request that was answered.
        """
        self._pending.discard(timer)
        if tokens is None:
            return None
        timer.ended = self._clock()
        times = times_of(timer, tokens, timer.ended)
        self._times.append(times)
        self._finished.append(timer)
        self._ended.append(timer.ended)
        if self._meets(times):
            self._met.append(timer.ended)
        return times

    # -- judging ----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Judge every `TICK_S` until cancelled."""
        while True:
            await asyncio.sleep(TICK_S)
            self.tick()

    def tick(self) -> None:
        """Judge the target on the latest requests, and move the quota or the bound on online requests."""
        now = self._clock()
        if not self._pending and now - self._last_arrival >= self._quiet_s:
            if self.quota.limit is not None or self._online_limit is not None:
                self._give_back(now)
            return
        if self._settling:
            if self.quota.in_flight > max(self.quota.limit or 0, MIN_QUOTA):
                return
            self._settling, self._judged_from = False, now
        pressure = self._pressure(now)
        if pressure is None:
            return
        if pressure <= 1 and self.quota.limit is not None:
            self._held_quota = self.quota.limit
        if pressure > 1:
            self._missed(pressure, now)
        elif pressure < GROW:
            self._held(pressure, now)
        else:
            self._misses = 0

    def _pressure(self, now: float) -> float | None:
        """The worst share of its bound a quantile of the figures under the current quota takes (`None`: too few).

        Times to first token count for the requests that arrived since `_judged_from` (one still
        waiting with its wait so far, once past the bound); times per output token for the requests
        with `LEAST_PIECES` pieces since then, over those pieces.
        """
        since, target = self._judged_from, self.target
        finished = itertools.islice(reversed(self._finished), JUDGED)
        timers = [*(timer for timer in finished if timer.ended is not None and timer.ended >= since), *self._pending]
        ttfts = [ttft for timer in timers if timer.submitted >= since and (ttft := timer.ttft_s) is not None]
        waits = [now - timer.submitted for timer in self._pending if timer.submitted >= since and not timer.pieces]
        late = [wait for wait in waits if wait > target.ttft_s > 0]
        tpots = [tpot for timer in timers if (tpot := timer.tpot_since(since)) is not None]
        if len(ttfts) + len(tpots) < LEAST and len(late) < 2:
            return None
        pressure = 0.0
        if target.ttft_s > 0 and (ttfts or late):
            pressure = self._quantile(ttfts + late) / target.ttft_s
        if target.tpot_s > 0 and tpots:
            pressure = max(pressure, self._quantile(tpots) / target.tpot_s)
        unmeasured = (target.ttft_s > 0 and not (ttfts or late)) or (target.tpot_s > 0 and not tpots)
        if unmeasured and pressure <= 1:
            return None  # a bound not measured under this quota yet: no reason to grow it (a miss is one)
        return pressure

    def _missed(self, pressure: float, now: float) -> None:
        """The target was missed: cut the batch's quota, or with the batch at its floor, bound online requests."""
        cut = min(max(SHRINK / pressure, 0.5), 0.9)
        quota = self.quota
        self._judged_from = now
        if quota.in_flight > MIN_QUOTA:
            base = min(quota.in_flight, quota.limit or quota.in_flight, self.slots or quota.in_flight)
            quota.set_limit(max(MIN_QUOTA, math.floor(base * cut)))
            self._settling, self._misses = True, 0
            return
        if quota.limit is None or quota.limit > MIN_QUOTA:
            quota.set_limit(MIN_QUOTA)
        self._misses += 1
        if self._misses >= PERSIST or self._online_limit is not None:
            running = len(self._pending)
            base = running if self._online_limit is None else min(self._online_limit, running)
            self._online_limit = max(1, math.floor(base * cut))
            self._refused_since_judged = False

    def _held(self, pressure: float, now: float) -> None:
        """The target holds with margin to spare: bound online requests less, or grow a quota lines wait for."""
        self._misses = 0
        grow = min(GROW / pressure, 2.0)
        if self._online_limit is not None:
            if not self._refused_since_judged:
                self._online_limit = None  # nobody was refused since: the demand fits
            else:
                self._online_limit = max(self._online_limit + 1, math.floor(self._online_limit * grow))
            self._refused_since_judged = False
            self._judged_from = now
            return
        quota = self.quota
        if quota.binding and quota.limit is not None:
            grown = self._at_most_slots(
                min(max(quota.limit + 1, math.floor(quota.limit * grow)), quota.limit + GROW_STEP)
            )
            if grown > quota.limit:
                quota.set_limit(grown)
                self._judged_from = now

    def _wake_up(self, now: float) -> None:
        """Online requests come again after a quiet spell: no more lines go in until the target is judged (beyond
        the quota it last held under, when fewer run)."""
        self.quota.set_limit(self._at_most_slots(max(MIN_QUOTA, self.quota.in_flight, self._held_quota or 0)))
        self._judged_from, self._settling, self._misses = now, False, 0

    def _at_most_slots(self, quota: int) -> int:
        """`quota`, but no more than the engine's slots less those online requests may need: the ones in flight and
        a burst beyond them (`BURST_Z` deviations of a Poisson count, and one), so that the next online request
        finds a slot instead of waiting for a line to end (`quota` as it is while the slots are unknown)."""
        if self.slots is None:
            return quota
        online = len(self._pending)
        kept_free = online + math.ceil(BURST_Z * math.sqrt(max(online, 1))) + 1
        return max(MIN_QUOTA, min(quota, self.slots - kept_free))

    def _give_back(self, now: float) -> None:
        """No online request for a while: the batch may fill the engine, and nobody is refused."""
        self.quota.set_limit(None)
        self._online_limit, self._settling, self._misses = None, False, 0
        self._judged_from = now

    # -- figures ----------------------------------------------------------------------------------

    def stats(self) -> OnlineAdmissionStats:
        """The figures as of now."""
        now = self._clock()
        times = list(self._times)[-64:]
        tpots = [item.tpot_s for item in times if item.tpot_s is not None]
        return OnlineAdmissionStats(
            target=self.target,
            quota=self.quota.limit,
            batch_in_flight=self.quota.in_flight,
            batch_waiting=self.quota.waiting,
            online_in_flight=len(self._pending),
            online_limit=self._online_limit,
            overloaded=self._online_limit is not None,
            arrivals_per_s=self._rate(self._arrivals, now),
            sustainable_per_s=self._rate(self._met, now),
            refused=self.refused,
            ttft_s=self._quantile([item.ttft_s for item in times]) if times else 0.0,
            tpot_s=self._quantile(tpots) if tpots else 0.0,
        )

    def _refusal(self, ahead: int) -> OnlineOverloadedError:
        now = self._clock()
        arrivals, sustainable = self._rate(self._arrivals, now), self._rate(self._met, now)
        leaving = self._rate(self._ended, now)
        seconds = ahead / leaving if leaving > 0 else MAX_RETRY_AFTER_S
        retry_after = min(MAX_RETRY_AFTER_S, max(1, math.ceil(seconds)))
        message = (
            f"The server is at capacity for its latency target ({self.target.describe()}): online requests "
            f"arrive at {arrivals:.1f}/s and about {sustainable:.1f}/s meet it; retry after {retry_after} s."
        )
        return OnlineOverloadedError(message, retry_after_s=retry_after)

    def _meets(self, times: OnlineTimes) -> bool:
        target = self.target
        if target.ttft_s > 0 and times.ttft_s > target.ttft_s:
            return False
        return not (target.tpot_s > 0 and times.tpot_s is not None and times.tpot_s > target.tpot_s)

    def _quantile(self, values: list[float]) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(self.target.quantile * len(ordered)) - 1))]

    def _rate(self, events: deque[float], now: float) -> float:
        """Events per second over the last `RATE_WINDOW_S` (or since the first, when sooner)."""
        while events and events[0] < now - RATE_WINDOW_S:
            events.popleft()
        if not events:
            return 0.0
        return len(events) / max(min(RATE_WINDOW_S, now - events[0]), 1.0)


def times_of(timer: OnlineTimer, tokens: int, ended: float) -> OnlineTimes:
    """A request's times, answered at `ended` with `tokens` output tokens (per choice).

    A request whose engine made no text before the answer (Transformers, vLLM batch mode) had its
    first token with it.
    """
    first = ended if timer.first is None else min(timer.first, ended)
    tpot = (ended - first) / (tokens - 1) if tokens > 1 and ended > first else None
    return OnlineTimes(timer.submitted, first - timer.submitted, tpot)


def tokens_per_choice(completion: Completion) -> int:
    """Output tokens of a completion's first choice: its time per output token is over these."""
    return completion.samples[0].completion_tokens
