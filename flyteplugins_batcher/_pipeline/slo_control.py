"""The SLO controller: a latency target (`latency_slo_s`) instead of knobs.

With a target, the batcher learns how long its batches take (`latency_model.LatencyModel`, from every
batch the runners time), counts the records that arrive at each priority, and every few batches
chooses a batch time limit for the load it sees (`SloController.decide`). The staging area then
grows each batch while its predicted time stays within the limit (`latency_model.BatchLimit`): cheap
records go many to a batch, costly ones few, so that a padding device wastes little, and no batch
keeps a record waiting long. The settings' knobs stay bounds: no batch exceeds `max_batch_size`
or `target_batch_cost`, no record waits past `batch_timeout_s`, no more than
`max_in_flight_cost` is in flight.

How it chooses: for twelve limits between the time of one typical record and half the tightest
target, the model gives the latency quantile each priority would see (`latency_model.predicted_latency`:
a priority's records wait behind those of its own and higher priorities, and behind a lower
one's batch already running), corrected by how far its predictions were from what the records
then saw. The limit whose worst priority takes the smallest share of its target wins (the current
one stays while it is about as good, so that noise does not move it; and while more records wait
than a steady cycle leaves, no shorter one replaces it: shorter batches would clear them slower).
With records of priorities without a target beside, the limit that clears the most records per
second among those that keep every target with margin wins instead: the others' work gets the
device's best throughput.

When even the best limit misses a target at the load offered, and the latest records miss it too
(or no limit clears the load at all), that priority is overloaded: the batcher logs one warning,
and `BatchStats.slo.overloaded` says so until the load falls. If it then serves well under the
records that arrive (`FALLING_BEHIND`), it weighs longer batches too, up to twice the tightest
target (`FastestBatches`): the limit that clears the backlog and then serves the arrivals soonest,
or, when no limit clears the load, the batches that serve the most records per second; a target
that cannot be met is no reason to serve fewer. It says so once, and once the load falls so that
the best limit is predicted within the target again, it says so and goes back to the limit chosen
for latency.

On a real clock, the batcher's own time between batches (settling one, planning the next) and how
late its timer fires count too (`latency_model.OwnTime`): the model learns each batch's time as
its call's plus the time before it, so that the capacity the controller reckons with is what the
device and the batcher achieve together.

Until it has timed a few batches, batches start small (1, 2, 4 records), so that the first ones
teach the model without keeping anybody waiting.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from flyteplugins_batcher._measure.slo_stats import SloChoice, SloTally, SloVerdict, describe
from flyteplugins_batcher._pipeline.envelope import Envelope
from flyteplugins_batcher._pipeline.latency_model import (
    BatchLimit,
    ClearingCurve,
    LatencyModel,
    OwnTime,
    pools_of,
    predicted_latency,
)
from flyteplugins_batcher._pipeline.staging import Batch, Plan, StagingArea
from flyteplugins_batcher._settings import BatcherSettings

if TYPE_CHECKING:
    import asyncio

logger = logging.getLogger("flyteplugins_batcher")

LEARNING_BATCHES = 3
"""Batches timed before the first choice; until then batches hold 1, 2, 4 records."""
JUDGING_BATCHES = 16
"""Batches timed before the model's predictions may flag an overload: a model of three batches is a guess."""
PERSIST = 4
"""Targets' times for which a priority's target must keep being missed before it is flagged overloaded."""
LADDER = 2 ** (1 / 3)
"""Ratio between neighbouring batch time limits the controller weighs: a ladder down from half the tightest target."""
SMOOTHING = 0.3
"""Weight of a decision's score of a limit against the scores it had before: choices follow the load, not its noise."""
COST_SAMPLE = 256
"""Latest record costs the clearing curves are computed from."""
TIE = 1.03
"""Limits whose score is within this factor of the best count as equally good; the shortest of them wins."""
MARGIN = 0.8
"""With records of priorities without a target beside, the limit that clears most among those predicted within this
share of every target wins: the records with targets keep them, the others get the device's best throughput."""
STAY = 1.05
"""The current limit stays while its score is within this factor of the best: choices do not flicker with noise."""
LEAVE_OVERLOAD = 0.9
"""An overloaded priority is no longer so once its predicted latency is back under this share of its target."""
RATE_MEMORY = 256
"""Arrivals the arrival rates are smoothed over (at least one target's time, at most five)."""
OWN_TARGET_DECISIONS = 32
"""Decisions over which a priority keeps the tightest target its records carried (`submit(latency_slo_s=...)`):
about three targets' time, so that a priority whose records stop carrying one is soon back to its setting."""
WARN_AGAIN_S = 60.0
"""Seconds without overload (at least a hundred targets' times) after which a new overload is warned of again."""
FASTEST_REACH = 2.0
"""Overloaded and falling behind, limits up to this many times the tightest target are weighed (`FastestBatches`)."""
FALLING_BEHIND = 0.75
"""Overloaded and serving less than this share of the arrivals: the limit chosen for latency falls behind the load,
and longer batches are weighed (`FastestBatches`) until the load falls."""
SUSTAINABLE_EVERY = 8
"""Decisions between two estimates of the sustainable load (shown in the stats and the warning), unless overloaded."""


class OverloadWatch:
    """Whether each priority's target can be met at the load offered, and one warning when it cannot.

    Args:
        settings: The batcher's settings (for the warning).
        batcher_name: For the warning.
        tightest_s: The tightest target (a new overload is warned of again after a hundred of them,
            or a minute, without any).
    """

    def __init__(self, settings: BatcherSettings, batcher_name: str, tightest_s: float) -> None:
        self._settings = settings
        self._name = batcher_name
        self._quiet_s = max(WARN_AGAIN_S, 100 * tightest_s)
        self._missing_since: dict[int, float] = {}  # since when each priority's target has been missed, if it is
        self._overloaded_at = -math.inf  # when some priority was last overloaded

    def judge(
        self, priority: int, verdict: SloVerdict, slo_s: float, observed: float | None, now: float, *, timed: int
    ) -> None:
        """Set `verdict.overloaded`: whether the priority's prediction misses its target, and its records see it.

        It takes `PERSIST` targets' times in which every decision found the load more than any
        limit clears, or the prediction over the target while the latest records missed it too:
        near the edge, a noisy estimate of the load, or a few seconds of bad luck, do not raise it.
        It ends once the prediction is back under `LEAVE_OVERLOAD` of the target, or the latest
        records are well within it.
        """
        predicted = verdict.predicted_s
        seen = observed is not None and observed > slo_s
        missing = timed >= JUDGING_BATCHES and (math.isinf(predicted) or (predicted > slo_s and seen))
        if not missing:
            self._missing_since.pop(priority, None)
        since = self._missing_since.setdefault(priority, now) if missing else now
        if verdict.overloaded:
            calm = observed is not None and observed <= (2 * LEAVE_OVERLOAD - 1) * slo_s
            verdict.overloaded = predicted > LEAVE_OVERLOAD * slo_s and not (calm and math.isfinite(predicted))
        else:
            verdict.overloaded = missing and now - since >= PERSIST * slo_s

    def warn(self, now: float, arrivals_per_s: float, sustainable_per_s: Callable[[], float]) -> None:
        """Some priority is overloaded now: warn, unless it was already within the last quiet spell."""
        if now - self._overloaded_at > self._quiet_s:
            logger.warning(
                "%s: %.0f records/s is more than the batcher can serve within latency_slo_s=%s at p%g: "
                "about %.0f records/s would fit; records will miss the target until the load falls",
                self._name,
                arrivals_per_s,
                describe(self._settings.latency_slo_s),
                100 * self._settings.slo_quantile,
                sustainable_per_s(),
            )
        self._overloaded_at = now


class FastestBatches:
    """While overloaded and falling behind: the batch time limit that serves the load and its backlog soonest.

    Longer batches than the target allows are weighed too; when no limit clears the load, the one
    that serves the most records per second wins. It logs its choice once, and once more when the
    load falls (`leave`).

    Args:
        batcher_name: For the log lines.

    Example:
        ```python
        fastest = FastestBatches("embed")
        curve = fastest.choose(model, pools, curves, reach_s=0.5, load=(600.0, 2_000), latency=predict)
        fastest.leave(arrivals_per_s=200.0)  # logs that it is back to the target's limit
        ```
    """

    def __init__(self, batcher_name: str) -> None:
        self._name = batcher_name
        self.active = False

    def choose(
        self,
        model: LatencyModel,
        pools: list[list[list[int]]],
        curves: list[ClearingCurve],
        reach_s: float,
        load: tuple[float, int],
        latency: Callable[[ClearingCurve], float],
    ) -> ClearingCurve:
        """Of `curves` (ascending limits) and longer ones up to `reach_s`, the one that serves `load` soonest.

        `load` is the records arriving per second and those waiting. A limit that clears more than
        arrive is scored by the time to clear the backlog plus `latency(curve)`, a new record's latency
        once it is cleared; when none does, the shortest limit within `TIE` of the most records per second.
        """
        longer = [curves[-1].limit_s * LADDER]
        while longer[-1] * LADDER <= reach_s:
            longer.append(longer[-1] * LADDER)
        every = [*curves, *(ClearingCurve.of(model, pools, limit) for limit in longer)]
        # A curve from records in the order they came (fifo) may show a noisy slope <= 0: not a real one.
        timed = [curve for curve in every if curve.per_record_s > 0] or every[-1:]
        rate, waiting = load
        soonest = math.inf
        chosen = None
        for curve in timed:
            spare = 1 / curve.per_record_s - rate if curve.per_record_s > 0 else math.inf
            took = waiting / spare + latency(curve) if spare > 0 else math.inf
            if took < soonest / TIE:
                soonest, chosen = took, curve
        if chosen is None:  # no limit clears the load: the most records per second
            best = min(curve.per_record_s for curve in timed)
            chosen = next(curve for curve in timed if curve.per_record_s <= best * TIE)
        if not self.active:
            logger.warning(
                "%s: overloaded: batches of about %.0f records (%.0f ms), which serve about %.0f records/s, "
                "until the load falls",
                self._name,
                chosen.batch_size,
                1000 * chosen.limit_s,
                1 / chosen.per_record_s if chosen.per_record_s > 0 else math.inf,
            )
        self.active = True
        return chosen

    def leave(self, arrivals_per_s: float) -> None:
        """The load fell within what a limit chosen for latency serves: say so once, if it was overloaded."""
        if self.active:
            logger.info(
                "%s: the load fell to %.0f records/s: back to batches sized for the latency target",
                self._name,
                arrivals_per_s,
            )
        self.active = False


def sustainable_load(curves: list[ClearingCurve], score: Callable[..., float], total: float) -> float:
    """The highest total load, with today's mix, at which some curve's `score(curve, load=factor)` is at most 1."""
    if total <= 0:
        return 0.0
    fastest = min(curve.per_record_s for curve in curves)
    low, high = 0.0, 1.0 / (total * fastest) if fastest > 0 else 1e6
    for _ in range(10):
        middle = (low + high) / 2
        if any(score(curve, load=middle) <= 1.0 for curve in curves):
            low = middle
        else:
            high = middle
    return low * total


def remember_tightest(own_targets: dict[int, deque[float]], arrived: dict[int, float]) -> None:
    """Keep the tightest own target of each priority over the latest `OWN_TARGET_DECISIONS` decisions."""
    for priority in set(own_targets) | set(arrived):
        targets = own_targets.setdefault(priority, deque(maxlen=OWN_TARGET_DECISIONS))
        targets.append(arrived.get(priority, math.inf))  # none came: the targets before age out
        if math.isinf(min(targets)):
            del own_targets[priority]


class SloStagingArea(StagingArea):
    """The staging area of a batcher with a latency target: it also counts the records that arrive, by priority."""

    def __init__(self, settings: BatcherSettings, controller: SloController, *, threads: bool = True) -> None:
        super().__init__(settings, threads=threads)
        self.controller = controller
        controller.start(self)

    def plan(self, now: float, envelope: Envelope | None = None) -> Plan | None:
        """Count `envelope` (if given), then plan as any staging area (`StagingArea.plan`)."""
        if envelope is not None:
            self.controller.arrived(envelope.priority, envelope.slo_s)
        return super().plan(now, envelope)


class SloController:
    """Learns the batches' time and chooses the batch time limit, the wait and the work in flight (module notes).

    Lives as long as its batcher (what it learned survives a restart); everything but `arrived`
    runs on the batcher's event loop, and `arrived` only counts.

    Args:
        settings: The batcher's settings (`latency_slo_s` is set).
        tally: Where the records' latencies against their targets are counted, and the choice shown.
        batcher_name: For the overload warning.
    """

    def __init__(self, settings: BatcherSettings, tally: SloTally, batcher_name: str) -> None:
        self._settings = settings
        self._tally = self.tally = tally
        self._by_cost = settings.grouping == "by_cost"
        self._burst_z = statistics.NormalDist().inv_cdf(settings.slo_quantile)
        self.model = LatencyModel()
        self._costs: deque[int] = deque(maxlen=COST_SAMPLE)
        self._arrived: dict[int, int] = {}  # records per priority since the last decision
        self._own_arrived: dict[int, float] = {}  # the tightest own target per priority since the last decision
        self._own_targets: dict[int, deque[float]] = {}  # per priority, that tightest at each of the latest decisions
        self._rates: dict[int, float] = {}  # records per second per priority, smoothed
        self._calibration: dict[int, float] = {}  # observed / predicted latency, per priority
        self._predicted: dict[int, float] = {}  # the model's latest prediction per priority, before calibration
        self._overload = OverloadWatch(settings, batcher_name, self.tightest_s)
        self._fastest = FastestBatches(batcher_name)
        self.own_time = OwnTime()  # the batcher's own time between batches, and its timer's lateness
        self._decisions = 0
        self._served, self._served_rate = 0, 0.0  # records out of the process function since the last decision
        self._decided_at = -math.inf
        self._chosen_at = -math.inf  # when the batch time limit last changed
        self._counted_since = time.monotonic()
        self._decide_cost_s = 0.0
        self._scores: dict[float, float] = {}  # each limit's smoothed score
        self._staging: StagingArea | None = None

    @classmethod
    def of(cls, settings: BatcherSettings, batcher_name: str) -> SloController | None:
        """The controller a batcher with these settings needs: `None` without a latency target."""
        if settings.latency_slo_s is None:
            return None
        return cls(settings, SloTally(settings.latency_slo_s, settings.slo_quantile, settings.slo_of), batcher_name)

    @property
    def tightest_s(self) -> float:
        """The tightest target of any priority, records' own targets of late included."""
        slo = self._settings.latency_slo_s
        assert slo is not None
        tightest = min(slo.values()) if isinstance(slo, dict) else float(slo)
        return min([tightest, *(min(targets) for targets in self._own_targets.values())])

    def slo_of(self, priority: int) -> float | None:
        """A priority's target: its setting, or the tightest its records carried lately, if tighter (`None`: none)."""
        setting = self._settings.slo_of(priority)
        own = self._own_targets.get(priority)
        if own is None:
            return setting
        return min(own) if setting is None else min(setting, *own)

    # -- what happens -----------------------------------------------------------------------------

    def start(self, staging: StagingArea) -> None:
        """A run of the batcher begins with `staging`: apply what was learned before, or start learning."""
        self._staging = staging
        if self.model.batches < LEARNING_BATCHES:
            staging.apply_limits(max_size=min(staging.settings.max_batch_size, 1 << self.model.batches))
        elif self._tally.choice is not None:
            self._apply(self._tally.choice, staging)

    def arrived(self, priority: int, own_target: float | None = None) -> None:
        """A record of `priority` was submitted (with its own target, if it has one)."""
        arrived = self._arrived
        arrived[priority] = arrived.get(priority, 0) + 1
        if own_target is not None:
            tightest = self._own_arrived
            tightest[priority] = min(tightest.get(priority, own_target), own_target)

    def batch_done(self, batch: Batch, loop: asyncio.AbstractEventLoop) -> None:
        """`batch` left the process function: learn its time, and decide again soon if it is time to."""
        envelopes = batch.envelopes
        if batch.calls == 1 and envelopes:  # a batch split to isolate a failure is not one device call
            costs = [envelope.cost for envelope in envelopes]
            seconds = batch.device_s + self.own_time.before(batch.after_s, batch.started_at)
            self.model.observe(len(costs), sum(costs), max(costs), batch.in_flight_before, seconds)
            self._costs.extend(costs)
        self._served += len(envelopes)
        now = time.monotonic()
        if self.model.batches < LEARNING_BATCHES:
            if self._staging is not None:
                limit = min(self._settings.max_batch_size, 1 << self.model.batches)
                self._staging.apply_limits(max_size=limit)
            return
        interval = max(self.tightest_s / 10, 50 * self._decide_cost_s)  # deciding takes at most 2% of the loop
        if now - self._decided_at >= interval:
            self._decided_at = now  # one decision per interval, however many batches end before it runs
            loop.call_soon(self.decide)

    # -- deciding ---------------------------------------------------------------------------------

    def decide(self) -> None:
        """Refit the model and choose anew for the load seen since the last decision; tell the staging area."""
        started = time.perf_counter()
        now = time.monotonic()
        self.model.fit()
        self._update_rates(now)
        classes = self._classes()
        costs = sorted(self._costs) if self._by_cost else list(self._costs)
        if not costs:
            return
        pools = pools_of(costs, windows=1 if self._by_cost else 8)
        curves = [ClearingCurve.of(self.model, pools, limit) for limit in self._candidates(costs)]
        curve = self._best(curves, classes)
        before = self._tally.choice.batch_time_s if self._tally.choice is not None else None
        if before is not None and curve.limit_s < before and self._backlogged(curve):  # shorter batches clear less
            curve = next((kept for kept in curves if kept.limit_s == before), curve)
        if before != curve.limit_s:
            self._chosen_at = now
        self._judge(curve, classes, now, steady=not self._backlogged(curve))
        arrivals = self._tally.arrivals_per_s = sum(self._rates.values())
        if self._tally.overloaded and (self._fastest.active or self._served_rate < FALLING_BEHIND * arrivals):
            load, reach = (arrivals, self._staging.waiting if self._staging else 0), FASTEST_REACH * self.tightest_s
            after = partial(predicted_latency, rate=arrivals, burst_z=self._burst_z, horizon_s=100 * self.tightest_s)
            curve = self._fastest.choose(self.model, pools, curves, reach, load, after)
            self._chosen_at = now if before != curve.limit_s else self._chosen_at
        else:
            self._fastest.leave(arrivals)
        choice = self._choice(curve)
        self._tally.choice = choice
        self._tally.model = self.model.as_dict()
        if self._decisions % SUSTAINABLE_EVERY == 0 or self._tally.overloaded:
            self._tally.sustainable_per_s = self._sustainable(curves, classes)
        self._decisions += 1
        if self._staging is not None:
            self._apply(choice, self._staging)
        self._decide_cost_s = time.perf_counter() - started

    def _update_rates(self, now: float) -> None:
        """Smooth each priority's arrival rate over about `RATE_MEMORY` records."""
        elapsed = max(now - self._counted_since, 1e-9)
        total = sum(self._rates.values())
        memory_s = min(max(RATE_MEMORY / total if total > 0 else math.inf, self.tightest_s), 5 * self.tightest_s)
        weight = 1.0 - math.exp(-elapsed / memory_s)
        for priority in set(self._rates) | set(self._arrived):
            measured = self._arrived.get(priority, 0) / elapsed
            previous = self._rates.get(priority)
            self._rates[priority] = measured if previous is None else previous + weight * (measured - previous)
        self._served_rate += weight * (self._served / elapsed - self._served_rate)
        self._arrived, self._served = {}, 0
        self._counted_since = now
        arrived, self._own_arrived = self._own_arrived, {}
        remember_tightest(self._own_targets, arrived)

    def _classes(self) -> list[tuple[int, float, float]]:
        """Each priority with a target that records came in at: (priority, target, records/s at or above it)."""
        slo_of = self.slo_of
        classes = []
        for priority in sorted(self._rates, reverse=True):
            slo_s = slo_of(priority)
            if slo_s is not None:
                ahead = sum(rate for other, rate in self._rates.items() if other >= priority)
                classes.append((priority, slo_s, ahead))
        return classes

    def _untargeted_rate(self) -> float:
        """Records per second of priorities without a target (they fill the device around the others)."""
        slo_of = self.slo_of
        return sum(rate for priority, rate in self._rates.items() if slo_of(priority) is None)

    def _candidates(self, costs: list[int]) -> list[float]:
        """Batch time limits down a fixed ladder from half the tightest target to one typical record's batch.

        The ladder's steps do not move with the model, so each limit's score can be smoothed across
        decisions (`_smoothed`).
        """
        typical = costs[len(costs) // 2] if self._by_cost else sorted(costs)[len(costs) // 2]
        shortest = max(self.model.predict(1, typical, typical), 1e-6)  # a device too fast to time: 1 µs
        limits = [self.tightest_s / 2]
        while limits[-1] / LADDER > shortest and len(limits) < 24:
            limits.append(limits[-1] / LADDER)
        return limits[::-1]

    def _smoothed(self, curves: list[ClearingCurve], scores: list[float]) -> list[float]:
        """Each limit's score, smoothed with the scores it had at the decisions before."""
        smoothed = []
        for curve, score in zip(curves, scores, strict=True):
            before = self._scores.get(curve.limit_s)
            if before is not None and math.isfinite(before) and math.isfinite(score):
                score = before + SMOOTHING * (score - before)
            smoothed.append(score)
        self._scores = dict(zip((curve.limit_s for curve in curves), smoothed, strict=True))
        return smoothed

    def _score(self, curve: ClearingCurve, classes: list[tuple[int, float, float]], load: float = 1.0) -> float:
        """The worst share of its target that any priority's predicted latency takes at `load` times the rates."""
        worst = 0.0
        for priority, slo_s, rate in classes:
            predicted = self._predict(curve, slo_s, rate, load)
            worst = max(worst, self._calibration.get(priority, 1.0) * predicted / slo_s)
        return worst

    def _predict(self, curve: ClearingCurve, slo_s: float, rate: float, load: float = 1.0) -> float:
        """The latency quantile of a priority that sees `rate` records/s at or above it, at `load` times that."""
        behind_others = rate < sum(self._rates.values())  # lower priorities run too: their batch may be running
        predicted = predicted_latency(curve, rate * load, self._burst_z, 4 * slo_s, behind_others=behind_others)
        return predicted + self.own_time.timer_late_s

    def _best(self, curves: list[ClearingCurve], classes: list[tuple[int, float, float]]) -> ClearingCurve:
        """The current limit if it scores about as well as the best, else the shortest of the best scored.

        When no limit has a finite score (the load is more than any clears), the one that clears most.
        """
        scores = self._smoothed(curves, [self._score(curve, classes) for curve in curves])
        best = min(scores)
        if math.isinf(best):
            return min(reversed(curves), key=lambda curve: curve.per_record_s)  # the longest of equals
        if self._untargeted_rate() > 0 or not classes:
            within = [curve for curve, score in zip(curves, scores, strict=True) if score <= MARGIN]
            if within:
                return min(reversed(within), key=lambda curve: curve.per_record_s)
        current = self._tally.choice
        for curve, score in zip(curves, scores, strict=True):
            if current is not None and curve.limit_s == current.batch_time_s and score <= best * STAY:
                return curve
        return next(curve for curve, score in zip(curves, scores, strict=True) if score <= best * TIE)

    def _choice(self, curve: ClearingCurve) -> SloChoice:
        settings = self._settings
        late = self.own_time.timer_late_s  # the timer fires that late: wait that much less
        wait = min(settings.batch_timeout_s, max(self.tightest_s - 2 * curve.limit_s - late, 0.0))
        in_flight = settings.in_flight_cost_limit
        per_in_flight = self.model.coefficients[-1]
        if per_in_flight > 0:
            typical = max(curve.batch_cost / max(curve.batch_size, 1.0), 1.0)
            alone = self.model.predict(round(curve.batch_size), round(curve.batch_cost), round(typical))
            spare = max(curve.limit_s - alone, 0.0) / per_in_flight
            in_flight = min(in_flight, max(round(spare + curve.batch_cost), 1))
        return SloChoice(
            batch_time_s=curve.limit_s,
            batch_size=curve.batch_size,
            batch_cost=min(curve.batch_cost, settings.batch_budget),
            wait_s=wait,
            in_flight_cost=in_flight,
        )

    def _apply(self, choice: SloChoice, staging: StagingArea) -> None:
        staging.apply_limits(
            max_size=self._settings.max_batch_size,
            limit=BatchLimit(self.model, choice.batch_time_s),
            full_cost=max(1, math.ceil(choice.batch_cost)),
            wait_s=choice.wait_s,
            in_flight_cost=choice.in_flight_cost,
            # Grouping by cost (or by prefix) chooses from what waits when a runner takes a batch: a
            # batch staged ahead would be cut from fewer records, and pad more (or share less).
            prefetch=0 if self._settings.chooses_from_waiting else None,
        )

    # -- judging ----------------------------------------------------------------------------------

    def _backlogged(self, curve: ClearingCurve) -> bool:
        """Whether more records wait than a steady cycle leaves (a load that rose, or a limit that was wrong)."""
        if self._staging is None:
            return False
        rate = sum(self._rates.values())
        cycle = curve.cycle_time(rate, 4 * self.tightest_s)
        if math.isinf(cycle):
            return True
        steady = rate * cycle + self._burst_z * math.sqrt(max(rate * cycle, 1.0))
        return self._staging.waiting > 2 * steady

    def _judge(
        self, curve: ClearingCurve, classes: list[tuple[int, float, float]], now: float, *, steady: bool
    ) -> None:
        """Calibrate against the latencies records saw, predict each priority's, and flag and warn of overload.

        The model is calibrated on the records that arrived since the limit last changed, while the
        batcher is `steady` (no backlog beyond what a cycle leaves): records that waited out a rise
        of the load, or a choice made for another, say nothing of how well the model predicts.
        """
        for priority, slo_s, rate in classes:
            verdict = self._tally.verdicts.setdefault(priority, SloVerdict())
            observed = self._tally.recent_quantile(priority, max(now - 16 * slo_s, self._chosen_at), 32)
            before = self._predicted.get(priority, 0.0)
            if steady and observed is not None and 0 < before < math.inf:  # the model against what it predicted
                ratio = min(max(observed / before, 0.5), 1.5)
                previous = self._calibration.get(priority, 1.0)
                self._calibration[priority] = previous + 0.1 * (ratio - previous)
            predicted = self._predicted[priority] = self._predict(curve, slo_s, rate)
            verdict.predicted_s = self._calibration.get(priority, 1.0) * predicted
            verdict.arrivals_per_s = rate
            latest = self._tally.recent_quantile(priority, now - 16 * slo_s, 32)
            self._overload.judge(priority, verdict, slo_s, latest, now, timed=self.model.batches)
        if self._tally.overloaded:
            self._overload.warn(now, sum(self._rates.values()), lambda: self._sustainable([curve], classes))

    def _sustainable(self, curves: list[ClearingCurve], classes: list[tuple[int, float, float]]) -> float:
        """The highest total load, with today's mix, at which some limit is predicted to meet every target."""
        total = sum(self._rates.values())
        return sustainable_load(curves, partial(self._score, classes=classes), total) if classes else 0.0
