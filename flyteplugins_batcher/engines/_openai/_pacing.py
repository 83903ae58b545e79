"""How many requests an endpoint gets at once, and how fast: concurrency that adapts, limits per minute.

`AdaptiveConcurrency` finds the concurrency an endpoint serves without being told it, as TCP finds a window. It
starts at 16 (an endpoint worth calling serves that many; a provider's limits are far above) and, in its slow start,
grows by one request for each answer that came back in time while the limit was in use: it doubles each round
trip. The first answer that came back late (much longer per output token than the best seen: the calls wait in the
endpoint's queue, and more of them would only wait longer) or the first halving ends the slow start: from then it
grows by one per round trip. A late answer never shrinks it: a CPU server's latency moves with what else the
machine runs, and says nothing the next answers would not. An overloaded endpoint's answer (429 or 503, or a request
that timed out) halves it, once per window: only for a request sent while the limit was in use (else the limit
was not what the endpoint refused) and after the last halving (what was sent before cannot have seen it, so one
burst of 429s halves once), and never below what the endpoint holds: the requests in flight, or its answers per
second times the round trip (Little's law). A share of 429s that says nothing about load, as a provider's per-key
limit or a proxy's, then leaves a full endpoint full; an endpoint that refuses what it cannot hold is brought down
to what it holds. A `Retry-After` pauses every new request until then. `RatePacer` keeps
optional limits in requests and tokens per minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from dataclasses import dataclass, field

SLOWDOWN = 3.0
"""An answer whose time per output token is more than this many times the best seen came back late."""

FORGET = 1.001
"""The best time per output token drifts up by this factor per answer, so that one lucky answer is forgotten."""

INITIAL_CONCURRENCY = 16
"""Requests in flight to start from, unless told."""

MIN_WINDOW_S = 1.0
"""The least time over which answers per second are counted (a fast endpoint's round trip holds too few)."""

ANSWERS_KEPT = 4096
"""The answer times kept for that count: enough for 4,096 answers a second."""


@dataclass
class AdaptiveConcurrency:
    """The number of requests allowed in flight, grown while answers come back in time and halved on overload.

    Attributes:
        initial: The limit to start from.
        most: The highest it may grow to.
        slow_s: An answer that took longer than this does not grow the limit (not "in time").

    Example:
        ```python
        limit = AdaptiveConcurrency(initial=16, most=256, slow_s=30.0)
        await limit.acquire()
        sent = time.monotonic()
        try:
            answer = await send()
        finally:
            await limit.release()
        await limit.answered(elapsed_s, tokens, was_full=True)  # or: await limit.overloaded(sent_at=sent)
        ```
    """

    initial: int = INITIAL_CONCURRENCY
    most: int = 256
    slow_s: float = 30.0
    limit: float = field(init=False)
    in_flight: int = field(init=False, default=0)
    paused_until: float = field(init=False, default=0.0)
    halvings: int = field(init=False, default=0)
    peak: float = field(init=False, default=0.0)
    slow_start: bool = field(init=False, default=True)
    """Growing by one per answer in time (doubling each round trip) until the first late answer or overload."""
    _round_trip_s: float = field(init=False, default=1.0)
    _best_per_token: float = field(init=False, default=float("inf"))
    _last_halving: float = field(init=False, default=float("-inf"))
    _answer_times: deque[float] = field(init=False)
    _changed: asyncio.Condition | None = field(init=False, default=None)
    _loop: object = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.initial < 1 or self.most < self.initial:
            raise ValueError(f"concurrency must start at >= 1 and at most {self.most}, got {self.initial}")
        self.limit = float(self.initial)
        self.peak = self.limit
        self._answer_times = deque(maxlen=ANSWERS_KEPT)

    async def acquire(self) -> None:
        """Wait for a place within the limit (and past any `Retry-After` pause), then take it."""
        changed = self._condition()
        async with changed:
            while True:
                wait_s = self.paused_until - time.monotonic()
                if wait_s <= 0 and self.in_flight < int(self.limit):
                    self.in_flight += 1
                    return
                with contextlib.suppress(TimeoutError):  # a pause ended: look again
                    await asyncio.wait_for(changed.wait(), timeout=wait_s if wait_s > 0 else None)

    async def release(self) -> None:
        """Give the place back."""
        changed = self._condition()
        async with changed:
            self.in_flight -= 1
            changed.notify_all()

    async def answered(self, elapsed_s: float, tokens: int, *, was_full: bool) -> None:
        """An answer of `tokens` output tokens in `elapsed_s`; `was_full`: the limit was in use when it was sent
        (else growing proves nothing). One that came back in time (within `slow_s`, and at most `SLOWDOWN` times
        the best time per output token seen) grows the limit: by one in the slow start, else by one per round trip;
        a late one ends the slow start and changes nothing else."""
        self._answer_times.append(time.monotonic())
        self._round_trip_s = 0.8 * self._round_trip_s + 0.2 * elapsed_s
        per_token = elapsed_s / max(tokens, 1)
        self._best_per_token = min(self._best_per_token * FORGET, per_token)
        in_time = elapsed_s <= self.slow_s and per_token <= SLOWDOWN * self._best_per_token
        if not in_time:
            self.slow_start = False
        elif was_full and self.limit < self.most:
            step = 1.0 if self.slow_start else 1.0 / self.limit
            self.limit = min(float(self.most), self.limit + step)
            self.peak = max(self.peak, self.limit)
            await self._wake()

    async def overloaded(
        self, retry_after_s: float | None = None, *, sent_at: float | None = None, was_full: bool = True
    ) -> None:
        """A 429, a 503 or a timeout for a request sent at `sent_at` (`time.monotonic()`; `None`: now), `was_full`:
        the limit was in use when it was sent. Pause for `retry_after_s`; if the limit was in use and the request
        was sent after the last halving, halve the limit, but not below what the endpoint holds: the requests in
        flight (this one's place included), or what it `served` at once of late. A halving ends the slow start."""
        now = time.monotonic()
        if retry_after_s:
            self.paused_until = max(self.paused_until, now + retry_after_s)
        held = max(self.in_flight + 1, self.served())
        halved = max(1.0, self.limit / 2, float(held))
        if was_full and (now if sent_at is None else sent_at) > self._last_halving and halved < self.limit:
            self.limit = halved
            self._last_halving = now
            self.halvings += 1
            self.slow_start = False
        await self._wake()

    def served(self) -> float:
        """How many requests the endpoint serves at once, by Little's law: its answers per second over the last round
        trip (at least `MIN_WINDOW_S`) times the round trip."""
        window_s = max(self._round_trip_s, MIN_WINDOW_S)
        since = time.monotonic() - window_s
        answers = sum(1 for _ in itertools.takewhile(lambda at: at >= since, reversed(self._answer_times)))
        return answers * self._round_trip_s / window_s

    def _condition(self) -> asyncio.Condition:
        """The condition of the running loop (an engine may be used from one loop, then another)."""
        loop = asyncio.get_running_loop()
        if self._changed is None or self._loop is not loop:
            self._changed, self._loop = asyncio.Condition(), loop
        return self._changed

    async def _wake(self) -> None:
        changed = self._condition()
        async with changed:
            changed.notify_all()


@dataclass
class RatePacer:
    """Optional limits in requests and (estimated) tokens per minute, as a provider sets them; 0 is none.

    Each limit is a bucket that holds a minute's worth and refills continuously: a request waits until both
    buckets hold what it takes.
    """

    requests_per_minute: float = 0.0
    tokens_per_minute: float = 0.0
    _requests: float = field(init=False, default=0.0)
    _tokens: float = field(init=False, default=0.0)
    _refilled: float = field(init=False, default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.requests_per_minute < 0 or self.tokens_per_minute < 0:
            raise ValueError("requests_per_minute and tokens_per_minute must be >= 0")
        self._requests, self._tokens = self.requests_per_minute, self.tokens_per_minute

    async def take(self, tokens: int) -> None:
        """Wait until one request of `tokens` tokens fits both limits, then count it."""
        if not (self.requests_per_minute or self.tokens_per_minute):
            return
        tokens = min(tokens, int(self.tokens_per_minute)) if self.tokens_per_minute else tokens
        while True:
            self._refill()
            short_s = max(
                _seconds_short(self._requests, 1, self.requests_per_minute),
                _seconds_short(self._tokens, tokens, self.tokens_per_minute),
            )
            if short_s <= 0:
                self._requests -= 1
                self._tokens -= tokens
                return
            await asyncio.sleep(short_s)

    def _refill(self) -> None:
        now = time.monotonic()
        minutes = (now - self._refilled) / 60.0
        self._refilled = now
        self._requests = min(self.requests_per_minute, self._requests + minutes * self.requests_per_minute)
        self._tokens = min(self.tokens_per_minute, self._tokens + minutes * self.tokens_per_minute)


def _seconds_short(held: float, needed: float, per_minute: float) -> float:
    """Seconds until a bucket refilling `per_minute` holds `needed` (0: it does, or there is no limit)."""
    if not per_minute or held >= needed:
        return 0.0
    return (needed - held) * 60.0 / per_minute
