"""@batched's length-aware default, batch by batch: records of similar length go together."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

import flyteplugins_batcher as ours
from tests.conftest import GatedLog

BATCH = 8
BLOCKER = "blocker"


def done(record: Any) -> tuple[str, Any]:
    return ("done", record)


def decorate(model: GatedLog, **options: Any) -> ours.BatchedFunction[Any, Any]:
    async def embed(batch: list[Any]) -> list[Any]:
        return await model(batch)

    return ours.batched(**{"max_batch_size": BATCH, **options})(embed)


async def run_while_busy(
    embed: ours.BatchedFunction[Any, Any], model: GatedLog, records: Sequence[Any]
) -> tuple[list[list[Any]], ours.BatchStats]:
    """Submit `records` while the device is busy, so that all of them wait together; the batches that follow."""
    model.gate.clear()
    blocker = asyncio.ensure_future(embed(BLOCKER))
    await model.until_held()  # the blocker is in the model: everything below waits together
    calls = asyncio.ensure_future(asyncio.gather(*(embed(record) for record in records)))
    await asyncio.sleep(0.02)
    model.gate.set()
    assert await blocker == ("done", BLOCKER)
    assert await calls == [("done", record) for record in records]  # results stay in place
    stats = embed.stats
    await embed.aclose()
    assert model.batches[0] == [BLOCKER]
    return model.batches[1:], stats


def ideal_blocks(records: Sequence[Any], cost: Callable[[Any], int]) -> list[list[Any]]:
    """The offline ideal: sort by (cost, submission order), cut blocks of `BATCH`."""
    order = sorted(range(len(records)), key=lambda index: (cost(records[index]), index))
    ordered = [records[index] for index in order]
    return [ordered[start : start + BATCH] for start in range(0, len(ordered), BATCH)]


def as_sets(batches: list[list[Any]]) -> list[list[Any]]:
    return sorted(sorted(map(repr, batch)) for batch in batches)


def words(count: int) -> str:
    """A text of `count` words: its cost under `@batched`'s default."""
    return " ".join(["w"] * count)


def texts_of_distinct_lengths(count: int, seed: int) -> list[str]:
    return [words(length) for length in random.Random(seed).sample(range(1, 250), count)]


def text_cost(text: str) -> int:
    return len(text.split())


@dataclass(frozen=True)
class Row:
    """A record without a length."""

    key: int


async def test_the_default_forms_the_length_sorted_blocks_when_everything_waits():
    texts = texts_of_distinct_lengths(60, seed=3)
    model = GatedLog(done)
    embed = decorate(model)
    batches, stats = await run_while_busy(embed, model, texts)
    assert as_sets(batches) == as_sets(ideal_blocks(texts, text_cost))
    assert [len(batch) for batch in batches].count(BATCH) == 7  # 60 = 7 full blocks and one of 4
    assert stats.total_batch_cost == sum(map(text_cost, [BLOCKER, *texts]))
    assert embed.options.settings.grouping == "by_cost"


async def test_records_without_a_length_keep_fifo_order():
    rows = [Row(key) for key in range(30)]
    model = GatedLog(done)
    batches, stats = await run_while_busy(decorate(model), model, rows)
    assert batches == [rows[start : start + BATCH] for start in range(0, len(rows), BATCH)]
    assert stats.total_batch_cost == text_cost(BLOCKER) + len(rows)  # 1 each


async def test_a_mix_keeps_records_without_a_length_in_fifo_order_with_the_shortest():
    rng = random.Random(5)
    texts = texts_of_distinct_lengths(20, seed=7)
    records: list[Any] = texts + [Row(key) for key in range(12)]
    rng.shuffle(records)
    model = GatedLog(done)
    batches, stats = await run_while_busy(decorate(model), model, records)

    def cost(record: Any) -> int:
        return text_cost(record) if isinstance(record, str) else 1

    assert as_sets(batches) == as_sets(ideal_blocks(records, cost))
    assert stats.total_batch_cost == text_cost(BLOCKER) + sum(map(cost, records))
    # The rows cost 1, below every text: they fill the cheapest blocks, in their submission order.
    rows_in_order = [record for record in records if isinstance(record, Row)]
    by_cost = sorted(batches, key=lambda batch: min((cost(record), records.index(record)) for record in batch))
    rows_by_block = [sorted((r for r in batch if isinstance(r, Row)), key=records.index) for batch in by_cost]
    assert [row for rows in rows_by_block for row in rows] == rows_in_order
    assert by_cost[0] == sorted(by_cost[0], key=records.index) and all(isinstance(r, Row) for r in by_cost[0])


async def test_explicit_fifo_keeps_submission_order_as_before():
    texts = texts_of_distinct_lengths(30, seed=9)
    model = GatedLog(done)
    batches, stats = await run_while_busy(decorate(model, grouping="fifo"), model, texts)
    assert batches == [texts[start : start + BATCH] for start in range(0, len(texts), BATCH)]
    assert stats.total_batch_cost == sum(map(text_cost, [BLOCKER, *texts]))  # still costed by length
    # DynamicBatcher, left at its (flyte.extras') defaults, forms the same batches.
    plain = GatedLog(done)
    async with ours.DynamicBatcher(plain, max_batch_size=BATCH) as batcher:
        assert batcher.settings.grouping == "fifo" and batcher.settings.default_cost == 1
        plain.gate.clear()
        blocker = await batcher.submit(BLOCKER)
        await plain.until_held()
        futures = [await batcher.submit(text) for text in texts]
        plain.gate.set()
        await asyncio.gather(blocker, *futures)
    assert plain.batches[1:] == batches


async def test_an_explicit_estimator_decides_the_costs_and_the_default_budget_binds():
    texts = texts_of_distinct_lengths(24, seed=13)

    def reversed_length(text: str) -> int:  # the longest texts are the cheapest: not their length
        return 6_000 - text_cost(text)

    model = GatedLog(done)
    embed = decorate(model, cost_estimator=reversed_length)
    assert embed.options.settings.target_batch_cost == 32_000
    batches, stats = await run_while_busy(embed, model, texts)
    assert all(sum(map(reversed_length, batch)) <= 32_000 for batch in batches)
    assert max(len(batch) for batch in batches) == 5  # 6 texts cost over 32,000
    assert stats.total_batch_cost == sum(map(reversed_length, [BLOCKER, *texts]))


async def test_the_default_sets_no_budget_and_a_given_one_bounds_the_lengths():
    long_texts = [words(1_000)] * 40  # 40,000 words: over flyte.extras' default budget of 32,000
    model = GatedLog(done)
    batches, stats = await run_while_busy(decorate(model, max_batch_size=40), model, long_texts)
    assert [len(batch) for batch in batches] == [40]
    assert stats.batch_cost.max == 40_000

    model = GatedLog(done)
    bounded = decorate(model, target_batch_cost=2_500)  # in words
    batches, _ = await run_while_busy(bounded, model, long_texts[:6])
    assert [len(batch) for batch in batches] == [2, 2, 2]


class Priced:
    """A sized record with its own estimate: the estimate wins over the length."""

    def __len__(self) -> int:
        return 10_000

    def estimate_cost(self) -> int:
        return 2


@pytest.mark.parametrize(
    ("record", "cost"),
    [
        ("Four words, one comma", 5),
        ("Then 48/2=24 dollars.", 8),  # digits and symbols: one each, as a tokenizer splits them
        ("这是一个测试", 6),  # CJK: one per character
        (words(1_000), 1_000),  # counted on its first 512 characters, then scaled
        ("", 0),
        (b"abcdef", 6),
        ([1, 2, 3], 3),
        ({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}, 1),  # a mapping's length counts keys, not work
        (Row(7), 1),
        (Priced(), 2),
    ],
)
async def test_what_a_record_costs_by_default(record: Any, cost: int):
    # With a budget of 3, a record that costs more is refused and its cost named.
    checked = ours.batched(target_batch_cost=3, oversized="reject")(lambda batch: batch)
    if cost > 3:
        with pytest.raises(ours.CostBudgetExceededError, match=f"costs {cost}, more than target_batch_cost=3"):
            await checked(record)
    else:
        assert await checked(record) == record
    await checked.aclose()


async def test_a_token_batched_function_keeps_token_costs():
    @ours.batched(batcher_class=ours.TokenBatcher, target_batch_tokens=3, oversized="reject")
    def echo(texts: list[str]) -> list[str]:
        return texts

    assert await echo("a text of many characters") == "a text of many characters"  # default_token_estimate=1
    assert echo.options.settings.default_cost == 1 and echo.options.settings.grouping == "by_cost"
    await echo.aclose()
