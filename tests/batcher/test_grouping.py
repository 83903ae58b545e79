"""grouping="by_cost": batches of similar cost, for padded models, without starving anyone."""

from __future__ import annotations

import asyncio
import random

import flyteplugins_batcher as ours
from tests.conftest import GatedLog


class Padded(GatedLog):
    """A padded model: a batch costs its size times its longest row. Records are their own lengths."""

    def __init__(self) -> None:
        super().__init__(lambda length: length * 10)

    def padding_efficiency(self) -> float:
        real = sum(sum(batch) for batch in self.batches)
        padded = sum(len(batch) * max(batch) for batch in self.batches)
        return real / padded


async def run_mixed(grouping: str, lengths: list[int]) -> tuple[Padded, list[int]]:
    model = Padded()
    async with ours.DynamicBatcher(
        model, max_batch_size=8, grouping=grouping, cost_estimator=lambda length: length
    ) as batcher:
        model.gate.clear()
        blocker = await batcher.submit(1)
        await model.until_held()  # the device is busy: everything below waits together
        futures = await batcher.submit_batch(lengths)
        model.gate.set()
        results = await asyncio.gather(blocker, *futures)
    return model, results[1:]


async def test_by_cost_groups_similar_lengths_and_keeps_results_in_place():
    rng = random.Random(4)
    lengths = [rng.choice([4, 5, 6, 60, 64, 70, 200, 210]) for _ in range(64)]
    fifo, fifo_results = await run_mixed("fifo", lengths)
    grouped, grouped_results = await run_mixed("by_cost", lengths)
    assert fifo_results == grouped_results == [length * 10 for length in lengths]
    ordered = sorted(lengths)  # the offline ideal: sort everything, then cut batches of 8
    ideal_batches = [ordered[start : start + 8] for start in range(0, len(ordered), 8)]
    ideal = sum(map(sum, ideal_batches)) / sum(len(batch) * max(batch) for batch in ideal_batches)
    assert grouped.padding_efficiency() >= 0.95 * ideal
    assert fifo.padding_efficiency() < 0.6 * ideal


async def test_when_everything_waits_by_cost_batches_are_the_offline_ideal():
    lengths = random.Random(11).sample(range(1, 1000), 60)  # distinct, so the ideal's blocks are unique
    model, results = await run_mixed("by_cost", lengths)
    assert results == [length * 10 for length in lengths]
    ordered = sorted(lengths)
    ideal = sorted(tuple(ordered[start : start + 8]) for start in range(0, len(ordered), 8))
    assert sorted(tuple(sorted(batch)) for batch in model.batches[1:]) == ideal


async def test_each_by_cost_batch_holds_the_oldest_waiting_record():
    lengths = [100, 5, 6, 101, 7, 99, 5, 102, 8, 6]
    model, _ = await run_mixed("by_cost", lengths)
    waiting = list(lengths)
    for batch in model.batches[1:]:  # the first batch is the blocker
        assert waiting[0] in batch  # the oldest still waiting goes in every batch: nothing starves
        for length in batch:
            waiting.remove(length)
    assert waiting == []


async def test_by_cost_never_breaks_the_budget():
    model = Padded()
    rng = random.Random(9)
    lengths = [rng.randint(1, 40) for _ in range(200)]
    async with ours.DynamicBatcher(
        model, target_batch_cost=64, max_batch_size=16, grouping="by_cost", cost_estimator=lambda length: length
    ) as batcher:
        assert await batcher.run(lengths) == [length * 10 for length in lengths]
    assert max(sum(batch) for batch in model.batches) <= 64


async def test_cancelled_records_are_skipped_by_cost_grouping_too():
    model = Padded()
    async with ours.DynamicBatcher(model, max_batch_size=4, grouping="by_cost", cost_estimator=lambda x: x) as batcher:
        model.gate.clear()
        blocker = await batcher.submit(1)
        await model.until_held()
        futures = await batcher.submit_batch([10, 11, 12, 50, 51])
        futures[1].cancel()
        model.gate.set()
        outcomes = await asyncio.gather(blocker, *futures, return_exceptions=True)
    assert [outcome for outcome in outcomes[1:] if not isinstance(outcome, BaseException)] == [100, 120, 500, 510]
    assert all(11 not in batch for batch in model.batches)
