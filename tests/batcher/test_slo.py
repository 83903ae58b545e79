"""A latency target instead of knobs (`latency_slo_s`): the controller's model, choices, overload signal and stats.

The batcher runs here on a virtual clock (`benchmarks/_virtual_clock.py`): the simulated GPU and the
Poisson arrivals take exactly their simulated time, so the latencies, choices and batch counts are
the same on every machine, however busy. Nothing asserts how long anything took in real time.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

import flyteplugins_batcher as ours
from benchmarks._padded_gpu import Doc, PaddedGpu, poisson_arrivals
from benchmarks._virtual_clock import VirtualClock
from flyteplugins_batcher._pipeline.latency_model import BatchLimit, ClearingCurve, LatencyModel, pools_of
from flyteplugins_batcher._pipeline.slo_control import SloController
from flyteplugins_batcher._pipeline.staging import Batch

REAL_MONOTONIC = time.monotonic
GPU = PaddedGpu(fixed_s=0.010, per_padded_token_s=10e-6)
PACKING_GPU = PaddedGpu(fixed_s=0.030, per_padded_token_s=0.0, per_token_s=10e-6)
"""A device whose batches cost their tokens as they are: the larger the batch, the cheaper each record."""
SLO_S = 0.25


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
    """A virtual clock for the batcher: `time.monotonic` (and what the batcher's modules keep of it) reads it."""
    clock = VirtualClock()
    monkeypatch.setattr(time, "monotonic", clock.monotonic)
    monkeypatch.setattr(time, "perf_counter", clock.monotonic)  # the controller's own cost, too: none
    for name, module in list(sys.modules.items()):
        if name.startswith("flyteplugins_batcher") and getattr(module, "_monotonic", None) is REAL_MONOTONIC:
            monkeypatch.setattr(module, "_monotonic", clock.monotonic)
    return clock


@dataclass
class Traffic:
    """What a run of Poisson phases saw: each record's latency and priority, and the controller's choices."""

    latencies: list[float] = field(default_factory=list)
    priorities: list[int] = field(default_factory=list)
    arrived_at: list[float] = field(default_factory=list)
    choices: list[tuple[int, float, bool]] = field(default_factory=list)  # (batches so far, batch time, overloaded)
    phase_starts: list[int] = field(default_factory=list)  # batches so far when each phase began

    def p99(self, since: float = 0.0, until: float = math.inf, priority: int | None = None) -> float:
        """The p99 latency of the records (of `priority`) that arrived between `since` and `until`."""
        picked = sorted(
            latency
            for latency, arrived, level in zip(self.latencies, self.arrived_at, self.priorities, strict=True)
            if since <= arrived < until and (priority is None or level == priority)
        )
        return picked[math.ceil(0.99 * len(picked)) - 1]


async def drive(
    batcher: ours.DynamicBatcher[Doc, int],
    phases: list[tuple[float, float]],
    *,
    priority: int = 0,
    seed: int = 1,
    **options: Any,
) -> Traffic:
    """Offer `(records per second, seconds)` phases of Poisson arrivals to a running batcher; wait for every answer.

    `options` go to every `submit` (a record's own `latency_slo_s`).
    """
    loop = asyncio.get_running_loop()
    traffic = Traffic()
    watcher = asyncio.create_task(_watch(batcher, traffic))
    futures = []
    start = loop.time()
    for index, (rate, seconds) in enumerate(phases):
        traffic.phase_starts.append(batcher.stats.total_batches)
        began = loop.time()
        for offset, doc in poisson_arrivals(rate, seconds, seed=seed + index):
            await asyncio.sleep(max(began + offset - loop.time(), 0.0))
            future = await batcher.submit(doc, estimated_cost=doc.tokens, priority=priority, **options)
            futures.append(_timed(future, traffic))
            traffic.arrived_at.append(loop.time() - start)
            traffic.priorities.append(priority)
        await asyncio.sleep(max(began + seconds - loop.time(), 0.0))
    await asyncio.gather(*futures)
    watcher.cancel()
    return traffic


def _timed(future: asyncio.Future[Any], traffic: Traffic) -> asyncio.Future[Any]:
    submitted = asyncio.get_running_loop().time()
    index = len(traffic.latencies)
    traffic.latencies.append(math.nan)

    def done(_: asyncio.Future[Any]) -> None:
        traffic.latencies[index] = asyncio.get_running_loop().time() - submitted

    future.add_done_callback(done)
    return future


async def _watch(batcher: ours.DynamicBatcher[Doc, int], traffic: Traffic) -> None:
    while True:
        slo = batcher.stats.slo
        assert slo is not None
        if slo.choice is not None:
            traffic.choices.append((batcher.stats.total_batches, slo.choice.batch_time_s, slo.overloaded))
        await asyncio.sleep(0.05)


def settled_after(choices: list[tuple[int, float, bool]], start: int, end: int) -> int:
    """Batches after `start` until the batch time limit stays within 1.5x of where it ends up, until `end`."""
    phase = [(batches, limit) for batches, limit, _ in choices if start <= batches < end]
    final = sorted(limit for _, limit in phase[len(phase) // 2 :])[len(phase[len(phase) // 2 :]) // 2]
    unsettled = [batches for batches, limit in phase if not final / 1.5 <= limit <= final * 1.5]
    return (max(unsettled) - start) if unsettled else 0


def slo_batcher(device: PaddedGpu = GPU, **settings: Any) -> ours.DynamicBatcher[Doc, int]:
    return ours.DynamicBatcher(device, latency_slo_s=SLO_S, grouping="by_cost", **settings)


# -- settings ------------------------------------------------------------------------------------------------------


def test_the_target_is_a_setting_of_every_batcher() -> None:
    assert ours.BatcherSettings().latency_slo_s is None
    assert ours.BatcherSettings().slo_quantile == 0.99
    assert ours.DynamicBatcher(GPU, latency_slo_s=0.5).settings.latency_slo_s == 0.5
    assert ours.TokenBatcher(inference_fn=GPU, latency_slo_s=0.5, slo_quantile=0.95).settings.slo_quantile == 0.95
    assert ours.BatcherOptions.for_batched({"latency_slo_s": {1: 0.2}}).settings.slo_of(1) == 0.2
    per_priority = ours.BatcherSettings(latency_slo_s={10: 0.25, 0: 30.0})
    assert (per_priority.slo_of(10), per_priority.slo_of(0), per_priority.slo_of(5)) == (0.25, 30.0, None)


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, {}, {1: 0}, {True: 1.0}, {"online": 1.0}, "1s"])
def test_a_target_that_is_not_seconds_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="latency_slo_s"):
        ours.BatcherSettings(latency_slo_s=bad)


@pytest.mark.parametrize("quantile", [0.0, 1.0, 1.5])
def test_the_quantile_is_a_share(quantile: float) -> None:
    with pytest.raises(ValueError, match="slo_quantile"):
        ours.BatcherSettings(latency_slo_s=1.0, slo_quantile=quantile)


def test_a_mapping_of_targets_is_copied() -> None:
    targets = {1: 0.5}
    settings = ours.BatcherSettings(latency_slo_s=targets)
    targets[1] = 99.0
    assert settings.slo_of(1) == 0.5


async def test_without_a_target_there_is_no_slo_in_the_stats() -> None:
    async with ours.DynamicBatcher(GPU) as batcher:
        await asyncio.gather(*await batcher.submit_batch([Doc(8)] * 5))
    assert batcher.stats.slo is None
    assert "slo" not in batcher.stats.summary()


# -- the model -----------------------------------------------------------------------------------------------------


def timed_batches(device: PaddedGpu, sizes: list[int], seed: int = 3) -> LatencyModel:
    """A model that saw `device` run batches of `sizes` records of mixed length."""
    model = LatencyModel()
    records = [doc for _, doc in poisson_arrivals(1000.0, 10.0, seed=seed)]
    start = 0
    for size in sizes:
        batch = records[start : start + size]
        start += size
        tokens = [doc.tokens for doc in batch]
        model.observe(len(tokens), sum(tokens), max(tokens), 0, device.batch_time(batch))
    model.fit()
    return model


@pytest.mark.parametrize("device", [GPU, PACKING_GPU], ids=["padding", "packing"])
def test_the_model_learns_which_costs_the_device_has(device: PaddedGpu) -> None:
    model = timed_batches(device, [1, 2, 4, 8, 3, 16, 5, 32, 7, 12] * 3)
    learned = model.as_dict()
    assert learned["overhead_s"] == pytest.approx(device.fixed_s, rel=1e-3)
    assert learned["per_padded_cost_s"] == pytest.approx(device.per_padded_token_s, abs=1e-9)
    assert learned["per_cost_s"] == pytest.approx(device.per_token_s, abs=1e-9)
    assert learned["per_record_s"] == pytest.approx(0.0, abs=1e-9)
    assert model.predict(10, 1000, 300) == pytest.approx(
        device.fixed_s + 10 * 300 * device.per_padded_token_s + 1000 * device.per_token_s
    )


def test_the_model_never_learns_a_negative_cost() -> None:
    model = LatencyModel()
    for size, seconds in [(1, 0.05), (2, 0.04), (4, 0.03), (8, 0.02)]:  # bigger batches faster: noise, not a device
        model.observe(size, 10 * size, 10, 0, seconds)
    model.fit()
    assert min(model.coefficients) >= 0
    assert model.predict(4, 40, 10) == pytest.approx(0.035, rel=0.2)  # the mean, as the best non-negative fit


def test_the_cycle_is_the_fixed_point_and_infinite_past_what_the_device_clears() -> None:
    model = timed_batches(GPU, [1, 2, 4, 8, 16, 32] * 2)
    costs = sorted(doc.tokens for _, doc in poisson_arrivals(1000.0, 0.3, seed=5))
    curve = ClearingCurve.of(model, pools_of(costs), 0.04)
    cycle = curve.cycle_time(300.0, horizon_s=10.0)
    assert cycle == pytest.approx(curve.time(300.0 * cycle), rel=1e-9)  # the records of one cycle fill the next
    iterated = curve.time(1)
    for _ in range(200):
        iterated = curve.time(max(300.0 * iterated, 1.0))
    assert cycle == pytest.approx(iterated, rel=1e-6)
    assert curve.cycle_time(1.01 / curve.per_record_s, horizon_s=1e9) == math.inf
    assert curve.cycle_time(300.0, horizon_s=cycle / 2) == math.inf


def test_a_batch_grows_in_order_only_while_its_predicted_time_fits() -> None:
    model = timed_batches(GPU, [1, 2, 4, 8, 16, 32] * 2)
    limit = BatchLimit(model, 0.010 + 10e-6 * 4 * 100 + 1e-6)  # four records of 100 tokens, padded
    envelopes = [type("E", (), {"cost": cost})() for cost in (100, 90, 100, 80, 100, 500)]
    assert limit.count_in_order(envelopes, budget=10_000, max_size=256) == (4, 370)
    assert limit.count_in_order(envelopes[5:], budget=10_000, max_size=256) == (1, 500)  # the first always goes
    assert limit.count_in_order(envelopes, budget=250, max_size=256) == (2, 190)  # the knobs stay bounds
    assert limit.count_in_order(envelopes, budget=10_000, max_size=3) == (3, 290)


# -- the controller on the simulated GPU ---------------------------------------------------------------------------


def run_phases(
    clock: VirtualClock, make: Callable[[], ours.DynamicBatcher[Doc, int]], phases: list[tuple[float, float]]
):
    async def main() -> tuple[Traffic, ours.BatchStats]:
        async with make() as batcher:
            traffic = await drive(batcher, phases)
        return traffic, batcher.stats

    return clock.run(main())


def test_the_first_batches_are_small_while_the_model_learns(clock: VirtualClock) -> None:
    async def main() -> list[int]:
        async with slo_batcher(prefetch_batches=0) as batcher:
            await asyncio.gather(*await batcher.submit_batch([Doc(64)] * 50, estimated_cost=[64] * 50))
            assert batcher.stats.slo is not None and batcher.stats.slo.choice is not None
        return batcher.stats.timeline.records[:3]

    assert clock.run(main()) == [1, 2, 4]


@pytest.mark.parametrize(("low", "high"), [(50.0, 450.0)])
def test_the_choice_settles_within_a_bounded_number_of_batches_after_a_load_step(
    clock: VirtualClock, low: float, high: float
) -> None:
    # On a device whose larger batches are cheaper per record, the right batch time grows with the load.
    traffic, stats = run_phases(clock, lambda: slo_batcher(PACKING_GPU), [(low, 10.0), (high, 10.0), (low, 10.0)])
    ends = [*traffic.phase_starts[1:], stats.total_batches + 1]
    phases = list(zip(traffic.phase_starts, ends, strict=True))
    assert max(settled_after(traffic.choices, start, end) for start, end in phases) <= 40
    last = [[limit for batches, limit, _ in traffic.choices if start <= batches < end][-1] for start, end in phases]
    assert last[1] > 1.5 * last[0]  # it chose longer batches for the higher load
    for phase in range(3):
        assert traffic.p99(since=10.0 * phase + 5.0, until=10.0 * phase + 10.0) <= SLO_S  # settled: within the target
    assert not any(overloaded for _, _, overloaded in traffic.choices)


def test_a_load_beyond_the_device_raises_the_signal_once_and_never_hangs(
    clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="flyteplugins_batcher")
    traffic, stats = run_phases(
        clock, lambda: slo_batcher(max_queue_size=0), [(100.0, 5.0), (1500.0, 2.0), (50.0, 20.0)]
    )
    flagged = [batches for batches, _, overloaded in traffic.choices if overloaded]
    assert flagged, "a load three times what the device clears was not flagged"
    assert min(flagged) - traffic.phase_starts[1] <= 50  # within 50 batches of the step: a second of evidence
    assert max(flagged) < traffic.phase_starts[2] + 400  # and it ends once the backlog is served
    warnings = [record for record in caplog.records if "more than the batcher can serve" in record.getMessage()]
    assert len(warnings) == 1
    assert stats.slo is not None and not stats.slo.overloaded
    assert stats.total_completed == len(traffic.latencies)  # every record answered: nothing hung or was lost
    assert 200 < stats.slo.sustainable_per_s < 700  # the device clears about 450 records/s within the target


def test_the_share_met_in_the_stats_is_the_share_of_latencies_within_the_target(clock: VirtualClock) -> None:
    traffic, stats = run_phases(clock, slo_batcher, [(450.0, 10.0)])  # at the edge: some records miss
    within = sum(latency <= SLO_S for latency in traffic.latencies)
    assert stats.slo is not None
    assert (stats.slo.completed, stats.slo.met) == (len(traffic.latencies), within)
    assert len(traffic.latencies) - within > 0  # the comparison can fail: not everything met it
    assert stats.slo.by_priority[0].met == within
    assert stats.slo.met_fraction == pytest.approx(within / len(traffic.latencies))
    assert f"slo {within / len(traffic.latencies):.1%} met" in stats.summary()
    assert stats.as_dict()["slo"]["met"] == within


async def online_beside_a_flood(batcher: ours.DynamicBatcher[Doc, int], **online_options: Any) -> Traffic:
    """2000 batch records (priority 0) at once, and online records (priority 10) at 20/s for 10 s beside them."""
    flood = [doc for _, doc in poisson_arrivals(1000.0, 2.0, seed=7)]
    batch = await batcher.submit_batch(flood, estimated_cost=[doc.tokens for doc in flood])
    online = await drive(batcher, [(20.0, 10.0)], priority=10, seed=11, **online_options)
    await asyncio.gather(*batch)
    return online


def test_online_records_keep_their_target_beside_batch_work(clock: VirtualClock) -> None:
    async def main(**settings: Any) -> tuple[Traffic, ours.BatchStats]:
        async with ours.DynamicBatcher(GPU, grouping="by_cost", **settings) as batcher:
            online = await online_beside_a_flood(batcher)
        return online, batcher.stats

    online, stats = clock.run(main(latency_slo_s={10: 0.1}))
    assert online.p99() <= 0.1
    assert stats.slo is not None and list(stats.slo.by_priority) == [10]  # batch records have no target
    assert stats.slo.by_priority[10].met_fraction >= 0.99 and not stats.slo.overloaded
    assert stats.slo.choice is not None and stats.slo.choice.batch_time_s <= 0.05 + 1e-9  # a running batch fits it
    without_target, _ = clock.run(main())
    assert without_target.p99() > 0.1  # the same flood, batches of up to 256: online records wait behind them


async def test_a_records_own_target_needs_a_batcher_with_a_target() -> None:
    async with ours.DynamicBatcher(GPU) as batcher:
        with pytest.raises(ValueError, match="needs a batcher with a latency target"):
            await batcher.submit(Doc(8), latency_slo_s=1.0)
        assert batcher.stats.total_submitted == 0  # refused before it was queued


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, "1s"])
async def test_a_records_own_target_that_is_not_seconds_is_refused(bad: Any) -> None:
    async with slo_batcher() as batcher:
        with pytest.raises(ValueError, match="latency_slo_s must be a positive number"):
            await batcher.submit(Doc(8), latency_slo_s=bad)


def test_records_own_targets_steer_the_controller_and_count_against_their_own_target(clock: VirtualClock) -> None:
    async def main(**online_options: Any) -> tuple[Traffic, ours.BatchStats]:
        async with ours.DynamicBatcher(GPU, grouping="by_cost", latency_slo_s=60.0) as batcher:
            online = await online_beside_a_flood(batcher, **online_options)
        return online, batcher.stats

    online, stats = clock.run(main(latency_slo_s=0.1))  # only the online records carry the tight target
    assert online.p99() <= 0.1
    assert stats.slo is not None and not stats.slo.overloaded
    assert stats.slo.by_priority[10].latency_slo_s == 0.1 and stats.slo.by_priority[0].latency_slo_s == 60.0
    assert stats.slo.by_priority[10].met == sum(latency <= 0.1 for latency in online.latencies)
    assert stats.slo.by_priority[10].completed == len(online.latencies)
    assert stats.slo.choice is not None and stats.slo.choice.batch_time_s <= 0.05 + 1e-9  # a running batch fits it
    loose, loose_stats = clock.run(main())  # the same flood with every record at the batcher's 60 s
    assert loose.p99() > 0.1  # the tight target is what kept the online records' latency down
    assert loose_stats.slo is not None and loose_stats.slo.by_priority[10].latency_slo_s == 60.0


def test_what_was_learned_survives_a_restart(clock: VirtualClock) -> None:
    batcher = slo_batcher(prefetch_batches=0)

    async def burst() -> None:
        async with batcher:
            await asyncio.gather(*await batcher.submit_batch([Doc(64)] * 60, estimated_cost=[64] * 60))

    clock.run(burst())
    assert batcher.stats.slo is not None
    learned = batcher.stats.slo.choice
    before = len(batcher.stats.timeline.records)
    clock.run(burst())
    assert learned is not None and batcher.stats.slo.choice is not None
    assert batcher.stats.timeline.records[before] > 4  # no learning again from batches of 1, 2 and 4


async def test_a_plain_def_in_a_worker_thread_is_timed_and_batched_within_the_limit() -> None:
    # Real time, and no assertion about it: the wiring of a thread runner (its timings reach the model on
    # the loop, the limits reach the staging area under its lock), with counts that hold on any machine.
    def padded(batch: list[Doc]) -> list[int]:
        time.sleep(0.002 + 2e-6 * len(batch) * max(doc.tokens for doc in batch))
        return [doc.tokens for doc in batch]

    async with ours.DynamicBatcher(padded, latency_slo_s=0.5, grouping="by_cost") as batcher:
        docs = [doc for _, doc in poisson_arrivals(1000.0, 0.3, seed=13)]
        futures = []
        for doc in docs:
            futures.append(await batcher.submit(doc, estimated_cost=doc.tokens))
            await asyncio.sleep(0.001)
        assert await asyncio.gather(*futures) == [doc.tokens for doc in docs]
    slo = batcher.stats.slo
    assert slo is not None and slo.completed == len(docs) and 0 <= slo.met <= slo.completed
    assert slo.model["overhead_s"] > 0 and slo.choice is not None


# -- overload: the most records per second, and back ---------------------------------------------------------------

OVERLOAD = [(100.0, 5.0), (1500.0, 4.0), (100.0, 30.0)]
"""A calm start, about twice what the device clears at all (thrice what it clears within the target), calm again."""


def served_by(traffic: Traffic, until: float) -> int:
    """Records answered by `until` (seconds from the first phase's start)."""
    return sum(
        arrived + latency <= until for arrived, latency in zip(traffic.arrived_at, traffic.latencies, strict=True)
    )


def test_under_overload_it_serves_the_most_records_and_comes_back_when_the_load_falls(
    clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="flyteplugins_batcher")
    traffic, stats = run_phases(clock, lambda: slo_batcher(max_queue_size=0), OVERLOAD)
    overloaded = [limit for _, limit, flagged in traffic.choices if flagged]
    calm = [limit for _, limit, flagged in traffic.choices if not flagged]
    assert overloaded and max(overloaded) > SLO_S / 2  # past the limits weighed for latency: the fastest batches
    assert max(calm) <= SLO_S / 2 + 1e-9
    assert not traffic.choices[-1][2] and traffic.choices[-1][1] <= SLO_S / 2 + 1e-9  # back to a latency choice
    messages = [record.getMessage() for record in caplog.records]
    switched = [number for number, text in enumerate(messages) if "overloaded: batches of about" in text]
    back = [number for number, text in enumerate(messages) if "back to batches sized for the latency target" in text]
    assert len(switched) == 1 and len(back) == 1 and switched[0] < back[0]  # said once each way, in that order
    assert traffic.p99(since=30.0) <= SLO_S  # the backlog served, the target is met again
    assert stats.total_completed == len(traffic.latencies)


def test_under_overload_it_serves_at_least_as_many_records_as_static_batches(clock: VirtualClock) -> None:
    end_of_overload = OVERLOAD[0][1] + OVERLOAD[1][1]
    served = {}
    for name, make in {
        "ours": lambda: slo_batcher(max_queue_size=0),
        "static 32": lambda: ours.DynamicBatcher(GPU, grouping="by_cost", max_batch_size=32, max_queue_size=0),
        "static 8": lambda: ours.DynamicBatcher(GPU, grouping="by_cost", max_batch_size=8, max_queue_size=0),
    }.items():
        traffic, _ = run_phases(clock, make, OVERLOAD[:2])
        served[name] = served_by(traffic, end_of_overload) - served_by(traffic, OVERLOAD[0][1])
    assert served["ours"] >= 0.98 * max(served["static 32"], served["static 8"]), served


def test_the_model_counts_the_batchers_own_time_between_batches() -> None:
    def learned(gap_s: float | None) -> float:
        controller = SloController.of(ours.BatcherSettings(latency_slo_s=SLO_S, grouping="by_cost"), "test")
        assert controller is not None
        records = [doc for _, doc in poisson_arrivals(1000.0, 1.0, seed=3)]
        loop = type("Loop", (), {"call_soon": lambda self, *args: None})()
        clock = 0.0
        for number, size in enumerate([1, 2, 4, 8, 3, 16, 5, 32, 7, 12] * 3):
            docs = records[number * 32 : number * 32 + size]
            batch = Batch([type("E", (), {"cost": doc.tokens})() for doc in docs], 0, "full")  # type: ignore[misc]
            batch.calls, batch.device_s = 1, GPU.batch_time(docs)
            batch.after_s = None if gap_s is None or number % 4 == 0 else clock  # every fourth after an idle device
            clock += gap_s or 0.0
            batch.started_at, clock = clock, clock + batch.device_s
            controller.batch_done(batch, loop)  # type: ignore[arg-type]
        controller.model.fit()
        return controller.model.as_dict()["overhead_s"]

    assert learned(None) == pytest.approx(GPU.fixed_s, rel=1e-3)  # a virtual clock: no time between batches
    assert learned(0.002) == pytest.approx(GPU.fixed_s + 0.002, rel=0.05)  # the batcher's 2 ms count as the device's


def test_under_overload_in_submission_order_it_keeps_deciding(
    clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # In fifo order the clearing curves come from runs of consecutive records: noisy, yet a choice each time.
    caplog.set_level(logging.INFO)
    traffic, stats = run_phases(clock, lambda: ours.DynamicBatcher(GPU, latency_slo_s=SLO_S), OVERLOAD)
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]  # no decision failed
    assert any(flagged for _, _, flagged in traffic.choices) and not traffic.choices[-1][2]
    assert stats.total_completed == len(traffic.latencies)


def test_a_timer_that_fires_late_shortens_the_wait_by_its_lateness() -> None:
    controller = SloController.of(ours.BatcherSettings(latency_slo_s=SLO_S, grouping="by_cost"), "test")
    assert controller is not None
    controller.model = timed_batches(GPU, [1, 2, 4, 8, 16, 32] * 2)
    costs = sorted(doc.tokens for _, doc in poisson_arrivals(1000.0, 0.3, seed=5))
    curve = ClearingCurve.of(controller.model, pools_of(costs), 0.11)  # waits up to 250 - 2 x 110 = 30 ms
    on_time = controller._choice(curve).wait_s
    for _ in range(100):
        controller.own_time.timer_fired(0.004)
    late = controller.own_time.timer_late_s
    assert late == pytest.approx(0.004, rel=0.01)
    assert on_time == pytest.approx(SLO_S - 2 * 0.11) and controller._choice(curve).wait_s == pytest.approx(
        on_time - late
    )
