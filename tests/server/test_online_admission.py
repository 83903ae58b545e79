"""The online target's controller (`OnlineAdmission`) on a virtual engine: the batch's quota against online requests'
times.

The engine here is a loop of steps on a virtual clock: each step gives every running online request a
piece of text and every running batch line a token, and takes `step_s(sequences) + prefill_s x sequences
that start in it`, the way a self-scheduling engine reads new prompts in the step that starts them. The
batch lines are real `BatchQuota` holders (tasks that wait for a place and hold it until their last token),
so what is tested is the controller and its quota, not a model of them.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from flyteplugins_batcher.server._admission import (
    TICK_S,
    OnlineAdmission,
    OnlineOverloadedError,
    OnlineTarget,
    OnlineTimer,
)


class Clock:
    """Seconds that move only when the engine steps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Seen:
    """What a run saw: online requests' times, refusals, and the quota after every judgment."""

    tpots: list[tuple[float, float]] = field(default_factory=list)  # (ended at, time per output token)
    ttfts: list[float] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)  # the Retry-After of each refusal
    quotas: list[tuple[float, int | None]] = field(default_factory=list)  # (at, quota) after each judgment
    lines_done: int = 0
    most_in_flight: int = 0  # the most batch lines let in at once

    def quotas_between(self, since: float, until: float = math.inf) -> list[int | None]:
        return [quota for at, quota in self.quotas if since <= at < until]


@dataclass(eq=False)
class Sequence:
    """A batch line or an online request in the engine: tokens left, and whether it has had its prompt read."""

    tokens_left: int
    done: asyncio.Event | None = None  # a batch line's
    timer: OnlineTimer | None = None  # an online request's
    started: bool = False


@dataclass
class VirtualEngine:
    """Online requests and batch lines sharing the steps of one engine (module notes).

    At most `max_sequences` run in a step, and a running one runs to its end; a free slot goes to a waiting
    online request first (the server's batcher puts them first), then to the lines in the order they came.
    """

    admission: OnlineAdmission
    clock: Clock
    step_s: Callable[[int], float]
    prefill_s: float = 0.0
    online_tokens: int = 64
    line_tokens: int = 100
    max_sequences: int = 32
    seen: Seen = field(default_factory=Seen)
    _queue: list[Sequence] = field(default_factory=list)

    async def run(self, seconds: float, arrivals: list[float], *, batch_lines: int, batch_at: float = 5.0) -> Seen:
        """Step until `seconds`, online requests arriving at `arrivals`, `batch_lines` lines coming at `batch_at`."""
        holders: list[asyncio.Task[None]] = []
        pending, next_tick = sorted(arrivals), TICK_S
        while self.clock.now < seconds:
            if not holders and self.clock.now >= batch_at:
                holders = [asyncio.create_task(self._line()) for _ in range(batch_lines)]
            await self._settle()
            while pending and pending[0] <= self.clock.now:
                pending.pop(0)
                self._arrive()
            self._step()
            while next_tick <= self.clock.now:
                self.admission.tick()
                self.seen.quotas.append((self.clock.now, self.admission.quota.limit))
                self.seen.most_in_flight = max(self.seen.most_in_flight, self.admission.quota.in_flight)
                next_tick += TICK_S
        for holder in holders:
            holder.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
        return self.seen

    async def _line(self) -> None:
        async with self.admission.quota.admit_line():
            line = Sequence(self.line_tokens, done=asyncio.Event())
            self._queue.append(line)
            assert line.done is not None
            await line.done.wait()

    async def _settle(self) -> None:
        for _ in range(3):  # let lines given a place enter, and finished ones leave
            await asyncio.sleep(0)

    def _arrive(self) -> None:
        try:
            self._queue.append(Sequence(self.online_tokens, timer=self.admission.admit_online()))
        except OnlineOverloadedError as refusal:
            self.seen.refused.append(refusal.retry_after_s)

    def _step(self) -> None:
        running = self._running()
        prompts = sum(1 for sequence in running if not sequence.started)
        self.clock.now += (self.step_s(len(running)) if running else 0.01) + self.prefill_s * prompts
        for sequence in running:
            sequence.started, sequence.tokens_left = True, sequence.tokens_left - 1
            if sequence.timer is not None:
                sequence.timer(0, "x")
            if sequence.tokens_left == 0:
                self._finish(sequence)
        self._queue = [sequence for sequence in self._queue if sequence.tokens_left > 0]

    def _running(self) -> list[Sequence]:
        """Those that run this step: the ones started, then free slots to online requests first, then lines in order."""
        started = [sequence for sequence in self._queue if sequence.started]
        waiting = [sequence for sequence in self._queue if not sequence.started]
        waiting.sort(key=lambda sequence: sequence.timer is None)  # stable: first come first within each kind
        return (started + waiting)[: self.max_sequences]

    def _finish(self, sequence: Sequence) -> None:
        if sequence.done is not None:
            sequence.done.set()
            self.seen.lines_done += 1
            return
        assert sequence.timer is not None
        times = self.admission.finished(sequence.timer, tokens=self.online_tokens)
        assert times is not None
        self.seen.ttfts.append(times.ttft_s)
        if times.tpot_s is not None:
            self.seen.tpots.append((self.clock.now, times.tpot_s))


def poisson(rate: float, since: float, until: float, seed: int = 5) -> list[float]:
    """Arrival times of a Poisson process at `rate` per second between `since` and `until`."""
    spawn, times, now = random.Random(seed), [], since
    while (now := now + spawn.expovariate(rate)) < until:
        times.append(now)
    return times


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(0.99 * len(ordered)) - 1]


def cpu_like(sequences: int) -> float:
    """A CPU-bound engine: every sequence in a step costs (60 ms + 5 ms a sequence)."""
    return 0.06 + 0.005 * sequences


def drive(
    target: OnlineTarget,
    seconds: float,
    arrivals: list[float],
    *,
    batch_lines: int,
    batch_at: float = 5.0,
    slots_known: bool = True,
    bounded: bool = True,
    **engine: Any,
) -> Seen:
    """A run on a fresh controller and engine; the controller knows the engine's slots and what it holds (its slots
    and a quarter more), as a server tells it, unless `slots_known` or `bounded` is false."""
    clock = Clock()
    admission = OnlineAdmission(target, clock=clock)
    virtual = VirtualEngine(admission, clock, **engine)
    slots = virtual.max_sequences if slots_known else None
    admission.set_engine(slots, math.ceil(1.25 * virtual.max_sequences) if bounded else None)
    return asyncio.run(virtual.run(seconds, arrivals, batch_lines=batch_lines, batch_at=batch_at))


def quota_cuts(seen: Seen) -> int:
    quotas = [quota for quota in seen.quotas_between(0.0) if quota is not None]
    return sum(1 for before, after in itertools.pairwise(quotas) if after < before)


def test_the_prompts_read_after_the_quota_grows_do_not_cut_it() -> None:
    # Each line let in costs its first step 60 ms of prompt: a quota that grows by 16 lines makes one step of
    # about 1.2 s where the others take about 0.2 s. The target is on each request's time per output token
    # over its whole answer, which one such step moves little; judged over a few steps it would look missed.
    target = OnlineTarget(ttft_s=5.0, tpot_s=0.3)
    engine = {"step_s": cpu_like, "prefill_s": 0.06, "max_sequences": 256}
    seen = drive(target, 120.0, poisson(0.5, 0.0, 120.0), batch_lines=400, **engine)
    assert quota_cuts(seen) <= 1, f"the quota was cut {quota_cuts(seen)} times with the target held"
    assert p99([tpot for _, tpot in seen.tpots]) <= target.tpot_s
    assert max(q for q in seen.quotas_between(0.0) if q is not None) >= 20  # it grew to what the target allows


def test_the_quota_leaves_the_engine_slots_for_online_requests() -> None:
    target = OnlineTarget(ttft_s=5.0, tpot_s=0.3)
    engine = {"step_s": cpu_like, "prefill_s": 0.03, "max_sequences": 32}
    known = drive(target, 120.0, poisson(0.5, 0.0, 120.0), batch_lines=400, **engine)
    quotas = [quota for quota in known.quotas_between(0.0) if quota is not None]
    assert max(quotas) <= 32 - 4  # at least the online requests in flight and a burst beyond them stay free
    unknown = drive(target, 120.0, poisson(0.5, 0.0, 120.0), batch_lines=400, slots_known=False, **engine)
    assert max(quota for quota in unknown.quotas_between(0.0) if quota is not None) > 32 - 4  # the slots held it


def test_no_more_lines_go_in_than_the_engine_holds_so_a_cut_takes_hold_soon() -> None:
    # A 2,000-line batch fills the engine alone for 30 s; then online requests come and the quota is cut. Lines
    # let in cannot be taken back: the cut takes hold once those in flight are down to it.
    target = OnlineTarget(ttft_s=3.0, tpot_s=0.3)
    arrivals = poisson(0.5, 30.0, 150.0)
    engine = {"step_s": cpu_like, "prefill_s": 0.01, "line_tokens": 60}
    held = drive(target, 150.0, arrivals, batch_lines=2000, batch_at=0.0, **engine)
    assert held.most_in_flight <= 40  # the engine's 32 slots and a quarter more
    assert len(set(held.quotas_between(60.0))) > 1  # judged and moved again once the engine's lines were down to it
    unbounded = drive(target, 150.0, arrivals, batch_lines=2000, batch_at=0.0, bounded=False, **engine)
    assert unbounded.most_in_flight > 1000  # every line let in while no online request came
    assert len(set(unbounded.quotas_between(60.0))) == 1  # still waiting for them to drain below its cut


def test_the_quota_shrinks_when_online_load_rises_and_the_target_holds_again() -> None:
    target = OnlineTarget(ttft_s=3.0, tpot_s=0.15)
    arrivals = poisson(0.3, 0.0, 60.0) + poisson(0.6, 60.0, 150.0, seed=8)
    seen = drive(target, 150.0, arrivals, batch_lines=400, step_s=cpu_like, prefill_s=0.01, line_tokens=300)
    before = max(quota for quota in seen.quotas_between(40.0, 75.0) if quota is not None)
    after = [quota for quota in seen.quotas_between(110.0) if quota is not None]
    assert after and max(after) < before  # more online requests: a smaller quota for the batch
    late = [tpot for ended, tpot in seen.tpots if ended > 90.0]
    assert late and p99(late) <= target.tpot_s
    assert seen.lines_done > 0  # slowed, never stopped


def test_the_quota_is_given_back_once_online_requests_stop() -> None:
    target = OnlineTarget(ttft_s=3.0, tpot_s=0.15)
    seen = drive(target, 80.0, poisson(0.5, 0.0, 30.0), batch_lines=400, step_s=cpu_like)
    assert any(quota is not None for quota in seen.quotas_between(10.0, 30.0))  # bounded while they came
    assert seen.quotas_between(70.0) and all(quota is None for quota in seen.quotas_between(70.0))


def test_online_requests_alone_over_the_target_are_refused_with_a_retry_after_and_then_served_again() -> None:
    # Online requests alone are too many: 2 a second of 64 tokens at 0.06 + 0.005 x sequences a step keep
    # about 13 in flight at 0.125 s a token; the 0.1-s target holds with 8, so about 40% must be refused.
    target = OnlineTarget(ttft_s=3.0, tpot_s=0.1)
    arrivals = poisson(2.0, 0.0, 60.0) + poisson(0.2, 70.0, 120.0, seed=9)
    seen = drive(target, 120.0, arrivals, batch_lines=0, step_s=cpu_like)
    assert all(1 <= retry_after <= 60 for retry_after in seen.refused)
    assert 0.3 < len(seen.refused) / len(arrivals) < 0.6  # about those it must, not everyone
    refusing = [tpot for ended, tpot in seen.tpots if 20.0 <= ended < 60.0]
    assert refusing and p99(refusing) <= 1.2 * target.tpot_s  # near the target for those it serves meanwhile
    served_late = [tpot for ended, tpot in seen.tpots if ended > 90.0]
    assert served_late and p99(served_late) <= target.tpot_s  # the load fell: served within the target again


@pytest.mark.parametrize("seconds", [0.0, -1.0])
def test_a_target_is_seconds_at_least_zero(seconds: float) -> None:
    if seconds < 0:
        with pytest.raises(ValueError, match="online_ttft_slo_s and online_tpot_slo_s must be >= 0"):
            OnlineTarget(ttft_s=seconds)
    else:
        assert not OnlineTarget(ttft_s=seconds).is_set
