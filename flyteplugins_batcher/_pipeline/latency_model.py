"""The latency model the SLO controller learns as the batcher runs, and the latency it implies at a load.

**A batch's time.** Each batch the runners time gives one observation: its records `n`, summed cost
`S`, costliest record `M`, the cost already in flight when it started `F`, and its device time.
`LatencyModel` fits `time = a + b*n + c*S + d*n*M + e*F` to them by non-negative least squares,
older batches weighing less and less (`memory`). The terms are what devices do: a fixed cost per
call (`a`), per record (`b`), per token for a device that packs its inputs (`c`), per *padded*
token for one that pads them to the longest (`d`), and the slowdown from other work in flight
(`e`); the fit finds which of them this device has.

**The batcher's own time.** On a real clock a batch holds the device for longer than its call: the
batcher settles the batch before and plans this one (`OwnTime`: the time between a runner's two
calls, when it went straight on), and a device that sleeps on the event loop wakes when the loop
comes round. The call's time includes the latter; the model learns from the call's time plus the
former, so its fixed and per-record terms, and the capacity the controller derives from them, are
what the device and the batcher take together. `OwnTime` also keeps how late the batch timer fires.

**A batch's limit.** `BatchLimit` holds the controller's choice: the most a batch may take, as the
model predicts it; the staging area grows each batch within it.

**The load.** Records arriving at `rate` per second while a batch runs wait for the next one, so the
batcher runs in cycles: the records that arrived during one cycle are cleared in the next. The
`ClearingCurve` of a batch time limit tells how long clearing `m` waiting records takes, from a
sample of recent record costs cut into batches within the limit (in cost order with
`grouping="by_cost"`, else in the order they came), as the staging area cuts them. The cycle is
the fixed point of `cycle = clearing_time(rate * cycle)`; a record waits at worst about two cycles
(the one it arrived in and its own), plus the time to clear a burst of Poisson arrivals beyond
the mean (`predicted_latency`). No fixed point below the target's horizon means the load is more
than that limit can clear.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flyteplugins_batcher._pipeline.envelope import Envelope

FEATURES = ("overhead_s", "per_record_s", "per_cost_s", "per_padded_cost_s", "per_in_flight_cost_s")
"""The model's terms, in the order of its coefficients (and of `SloStats.model`)."""

GRID = (1, 2, 4, 8, 16, 32, 64, 128)
"""Numbers of waiting records at which a clearing curve is computed; between them it is interpolated."""


class LatencyModel:
    """A batch's device time as a non-negative linear function of its shape, fitted online.

    Args:
        memory: Weight of the past at each new batch (0.985: the last hundred or so batches count).

    Example:
        ```python
        model = LatencyModel()
        model.observe(size=8, cost=800, max_cost=150, in_flight=0, seconds=0.022)
        ...
        model.fit()
        model.predict(16, 1600, 200)
        ```
    """

    def __init__(self, memory: float = 0.985) -> None:
        self._memory = memory
        count = len(FEATURES)
        self._xx = [[0.0] * count for _ in range(count)]
        self._xy = [0.0] * count
        self._yy = 0.0
        self.batches = 0
        self.coefficients: tuple[float, ...] = (0.0,) * count

    def observe(self, size: int, cost: int, max_cost: int, in_flight: int, seconds: float) -> None:
        """One timed batch."""
        x = (1.0, float(size), float(cost), float(size * max_cost), float(in_flight))
        memory = self._memory
        for i, row in enumerate(self._xx):
            xi = x[i]
            for j in range(len(row)):
                row[j] = row[j] * memory + xi * x[j]
            self._xy[i] = self._xy[i] * memory + xi * seconds
        self._yy = self._yy * memory + seconds * seconds
        self.batches += 1

    def fit(self) -> None:
        """Refit the coefficients to the batches observed (non-negative least squares)."""
        self.coefficients = _nnls(self._xx, self._xy, self._yy)

    def predict(self, size: int, cost: int, max_cost: int, in_flight: int = 0) -> float:
        """The predicted device time of a batch of `size` records, summed `cost`, costliest `max_cost`."""
        a, b, c, d, e = self.coefficients
        return a + b * size + c * cost + d * size * max_cost + e * in_flight

    def as_dict(self) -> dict[str, float]:
        """The coefficients by name (`FEATURES`)."""
        return dict(zip(FEATURES, self.coefficients, strict=True))


def _nnls(xx: list[list[float]], xy: list[float], yy: float) -> tuple[float, ...]:
    """Least squares with every coefficient >= 0, from the normal equations: the best feasible subset of terms.

    Five terms make 31 subsets, each a small linear solve: cheap enough once per decision. A subset
    whose matrix is singular (a term that never varied, such as the in-flight cost of a batcher that
    runs one batch at a time) is skipped.
    """
    count = len(xy)
    best: tuple[float, ...] = (0.0,) * count
    best_error = yy
    for mask in range(1, 1 << count):
        terms = [i for i in range(count) if mask >> i & 1]
        # A whisker of ridge keeps near-collinear terms (summed and padded cost) solvable.
        matrix = [[xx[i][j] + (1e-9 * xx[i][i] if i == j else 0.0) for j in terms] for i in terms]
        solution = _solve(matrix, [xy[i] for i in terms])
        if solution is None or min(solution) < 0:
            continue
        beta = [0.0] * count
        for i, value in zip(terms, solution, strict=True):
            beta[i] = value
        fitted = sum(beta[i] * beta[j] * xx[i][j] for i in terms for j in terms)
        error = yy - 2 * sum(beta[i] * xy[i] for i in terms) + fitted
        if error < best_error - 1e-15 * max(yy, 1e-30):
            best, best_error = tuple(beta), error
    return best


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; `None` when the matrix is (nearly) singular."""
    size = len(vector)
    rows = [[*row, value] for row, value in zip(matrix, vector, strict=True)]
    scale = max(abs(rows[i][i]) for i in range(size)) or 1.0
    for column in range(size):
        pivot = max(range(column, size), key=lambda row: abs(rows[row][column]))
        if abs(rows[pivot][column]) <= 1e-12 * scale:
            return None
        rows[column], rows[pivot] = rows[pivot], rows[column]
        for row in range(column + 1, size):
            factor = rows[row][column] / rows[column][column]
            for k in range(column, size + 1):
                rows[row][k] -= factor * rows[column][k]
    solution = [0.0] * size
    for row in range(size - 1, -1, -1):
        done = sum(rows[row][k] * solution[k] for k in range(row + 1, size))
        solution[row] = (rows[row][size] - done) / rows[row][row]
    return solution


OWN_SMOOTHING = 0.1
"""Weight of each new measure of the batcher's own time between batches, and of its timer's lateness."""


class OwnTime:
    """What the batcher itself adds on a real clock: its time between a runner's batches, its timer's lateness.

    Both smoothed (`OWN_SMOOTHING`); on a virtual clock that only jumps, both stay 0.

    Example:
        ```python
        own = OwnTime()
        seconds = batch.device_s + own.before(batch)  # what the latency model learns from
        own.timer_fired(late_s=0.0012)
        ```
    """

    __slots__ = ("between_s", "timer_late_s")

    def __init__(self) -> None:
        self.between_s = 0.0
        self.timer_late_s = 0.0

    def before(self, after_s: float | None, started_at: float) -> float:
        """The batcher's own time before a batch that started at `started_at`.

        `after_s` is when its runner's batch before it ended, if the runner went straight on to it:
        the time between is the batcher's (settling one, planning the next). Otherwise the device
        idled meanwhile, and the smoothed time between stands in.
        """
        if after_s is None or started_at < after_s:
            return self.between_s
        between = started_at - after_s
        self.between_s += OWN_SMOOTHING * (between - self.between_s)
        return between

    def timer_fired(self, late_s: float) -> None:
        """The batch timer fired `late_s` after it was due."""
        self.timer_late_s += OWN_SMOOTHING * (max(late_s, 0.0) - self.timer_late_s)


class BatchLimit:
    """The most a batch may take, as the latency model predicts it; the staging area grows batches within it.

    Args:
        model: The latency model (its coefficients are copied: the limit does not move while in use).
        limit_s: The batch time limit.
    """

    __slots__ = ("_a", "_b", "_c", "_d", "_e", "in_flight", "limit_s")

    def __init__(self, model: LatencyModel, limit_s: float) -> None:
        self._a, self._b, self._c, self._d, self._e = model.coefficients
        self.limit_s = limit_s
        self.in_flight = 0  # cost in flight when the batch starts; set by the staging area before it takes one

    def fits(self, size: int, cost: int, max_cost: int) -> bool:
        """Whether a batch of `size` records, summed `cost` and costliest `max_cost` is predicted within the limit."""
        predicted = self._a + self._b * size + self._c * cost + self._d * size * max_cost + self._e * self.in_flight
        return predicted <= self.limit_s

    def count_in_order(self, envelopes: Iterable[Envelope], budget: int, max_size: int) -> tuple[int, int]:
        """How many of `envelopes`, from the first, make a batch within the limit, `budget` and `max_size`; its cost.

        The first always goes, as in `PendingQueue.take_batch`.
        """
        count = cost = top = 0
        for envelope in envelopes:
            grown = cost + envelope.cost
            grown_top = top if top >= envelope.cost else envelope.cost
            if count == max_size or (count and (grown > budget or not self.fits(count + 1, grown, grown_top))):
                break
            count, cost, top = count + 1, grown, grown_top
        return count, cost


@dataclass(frozen=True)
class ClearingCurve:
    """How long clearing `m` waiting records takes in batches within a time limit (see the module notes).

    Attributes:
        limit_s: The batch time limit.
        times: The clearing time at each `GRID` size.
        batch_size: Records in a typical batch, when many wait.
        batch_cost: Summed cost of a typical batch, when many wait.
    """

    limit_s: float
    times: tuple[float, ...]
    batch_size: float
    batch_cost: float

    @classmethod
    def of(cls, model: LatencyModel, pools: Sequence[Sequence[Sequence[int]]], limit_s: float) -> ClearingCurve:
        """The curve for `limit_s`, from `pools_of(costs)`: waiting records as the staging area would take them.

        Raises:
            ValueError: `pools` is not one list of pools per `GRID` size.
        """
        if len(pools) != len(GRID):
            raise ValueError(f"a clearing curve needs pools for {len(GRID)} sizes, got {len(pools)}")
        times = []
        batches = 1.0
        for alike in pools:  # pools of one size: their mean clearing time
            cuts = [_cut(model, pool, limit_s) for pool in alike]
            times.append(sum(seconds for seconds, _ in cuts) / len(cuts))
            batches = sum(count for _, count in cuts) / len(cuts)
        largest = pools[-1][0]
        return cls(limit_s, tuple(times), len(largest) / batches, sum(largest) / batches)

    @property
    def per_record_s(self) -> float:
        """Clearing time per record when many wait: its inverse is the most records per second this limit serves."""
        return (self.times[-1] - self.times[-2]) / (GRID[-1] - GRID[-2])

    def time(self, waiting: float) -> float:
        """Seconds to clear `waiting` records (interpolated between the grid's sizes, extrapolated past it)."""
        if waiting <= GRID[0]:
            return self.times[0]
        index = bisect.bisect_left(GRID, waiting)
        if index == len(GRID):
            return self.times[-1] + (waiting - GRID[-1]) * self.per_record_s
        low, high = GRID[index - 1], GRID[index]
        return self.times[index - 1] + (waiting - low) / (high - low) * (self.times[index] - self.times[index - 1])

    def cycle_time(self, rate: float, horizon_s: float) -> float:
        """The steady cycle at `rate` records/s: the least `cycle = time(rate * cycle)`; `inf` past `horizon_s`.

        The records that arrive during a cycle are cleared in the next. Written as waiting records
        `m = rate * cycle`, the cycle is the first root of the piecewise linear `time(m) - m / rate`,
        found segment by segment (iterating `cycle = time(rate * cycle)` from one record up ends there).
        """
        if rate <= 0:
            return self.times[0]
        points = [(0.0, self.times[0]), *zip(GRID, self.times, strict=True)]
        points.append((GRID[-1] + 1.0, self.times[-1] + self.per_record_s))  # the line past the grid
        for (low, time_low), (high, time_high) in itertools.pairwise(points):
            slope = (time_high - time_low) / (high - low)
            excess_low = time_low - low / rate  # > 0: the records of a cycle take longer than it
            excess_high = time_low + slope * (high - low) - high / rate
            last = high == points[-1][0]
            if excess_high <= 0 or (last and slope * rate < 1):
                waiting = low + excess_low / (1 / rate - slope)  # where the excess reaches 0
                cycle = waiting / rate
                return cycle if cycle <= horizon_s else math.inf
        return math.inf  # the records come faster than any number of full batches clears them


def pools_of(costs: Sequence[int], *, windows: int = 1) -> list[list[list[int]]]:
    """For each `GRID` size, pools of that many waiting records' costs, from a sample of recent ones.

    With `windows` 1 (costs sorted, for `grouping="by_cost"`), one pool picked evenly from the
    sample: the mix of costs that the staging area sorts. With more (costs in the order they came,
    for `"fifo"`), up to that many runs of consecutive records: which records happen to wait
    together decides how much a batch in order pads, so one pool would say too little.

    Raises:
        ValueError: `costs` is empty.
    """
    if not costs:
        raise ValueError("a clearing curve needs at least one record cost")
    pools = []
    for size in GRID:
        runs = min(windows, len(costs) // size)
        if runs > 1:
            pools.append([list(costs[start * size : (start + 1) * size]) for start in range(runs)])
        else:
            pools.append([[costs[int((index + 0.5) * len(costs) / size)] for index in range(size)]])
    return pools


def _cut(model: LatencyModel, costs: Sequence[int], limit_s: float) -> tuple[float, int]:
    """Device time and number of batches for `costs`, cut in order into batches predicted within `limit_s`."""
    a, b, c, d, _ = model.coefficients
    total = 0.0
    batches = 0
    size = summed = top = 0
    for cost in costs:
        grown_top = top if top >= cost else cost
        if size and a + b * (size + 1) + c * (summed + cost) + d * (size + 1) * grown_top > limit_s:
            total += a + b * size + c * summed + d * size * top
            batches += 1
            size = summed = top = 0
            grown_top = cost
        size += 1
        summed += cost
        top = grown_top
    total += a + b * size + c * summed + d * size * top
    return total, batches + 1


def predicted_latency(
    curve: ClearingCurve, rate: float, burst_z: float, horizon_s: float, *, behind_others: bool = False
) -> float:
    """The latency quantile of records arriving at `rate`: the cycle they arrive in, their own, and a burst.

    The burst is `burst_z` standard deviations of Poisson arrivals beyond a cycle's mean. Records
    that others of a lower priority run beside (`behind_others`) may find one of their batches
    running, as long as the limit, instead of a cycle of their own.
    """
    cycle = curve.cycle_time(rate, horizon_s)
    if math.isinf(cycle):
        return math.inf
    burst = burst_z * math.sqrt(max(rate * cycle, 1.0))
    running = max(cycle, curve.limit_s) if behind_others else cycle
    return running + cycle + curve.time(burst)
