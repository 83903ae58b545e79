"""grouping="by_prefix": records that share a prompt prefix go to the engine together, without starving anyone."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

import pytest

import flyteplugins_batcher as ours
from flyteplugins_batcher._pipeline.envelope import RUNNING, Envelope, new_envelope
from flyteplugins_batcher._pipeline.grouping import common_prefix_length
from flyteplugins_batcher._pipeline.pending import PendingQueue
from flyteplugins_batcher._pipeline.prefix import PrefixResolver
from tests.conftest import GatedLog

BLOCKER = ("blocker", -1)


def key_of(record: tuple[Any, ...]) -> str | None:
    return record[0]


async def run_waiting(records: list[Any], **settings: Any) -> list[list[Any]]:
    """Every record waits behind a busy device, then the batcher forms its batches from all of them."""
    model = GatedLog()
    async with ours.DynamicBatcher(model, **settings) as batcher:
        model.gate.clear()
        blocker = await batcher.submit(BLOCKER)
        await model.until_held()  # the device is busy: everything below waits together
        futures = await batcher.submit_batch(records)
        model.gate.set()
        assert await asyncio.gather(*futures) == records  # each result in its own place
        await blocker
    return model.batches[1:]


def one_document_per_batch(batches: list[list[tuple[str, int]]]) -> bool:
    return all(len({key for key, _ in batch}) == 1 for batch in batches)


def oldest_in_every_batch(records: list[Any], batches: list[list[Any]]) -> bool:
    """Whether each batch holds the oldest record still waiting when it was formed (nothing starves)."""
    waiting = list(records)
    for batch in batches:
        if waiting[0] not in batch:
            return False
        for record in batch:
            waiting.remove(record)
    return waiting == []


# Four documents, four questions each, listed question by question (as a batch file often is).
QUESTIONS = [(f"document {document}", question) for question in range(4) for document in range(4)]


async def test_records_of_one_key_submitted_interleaved_come_out_in_one_batch():
    batches = await run_waiting(QUESTIONS, max_batch_size=4, grouping="by_prefix", prefix_key=key_of)
    assert one_document_per_batch(batches) and len(batches) == 4
    assert [batch[0] for batch in batches] == QUESTIONS[:4]  # each led by its document's first question
    for grouping in ("fifo", "by_cost"):  # the same records, grouped otherwise, mix the documents
        assert not one_document_per_batch(await run_waiting(QUESTIONS, max_batch_size=4, grouping=grouping))


async def test_the_room_left_goes_to_the_keys_that_share_most_with_the_first_records():
    records = [
        ("sys A/doc 1", 0),
        ("sys B/doc 9", 1),
        ("sys B/doc 8", 2),
        ("sys A/doc 2", 3),
        ("sys A/doc 1", 4),
        ("sys A/doc 3", 5),
        ("other", 6),
    ]
    batches = await run_waiting(records, max_batch_size=4, grouping="by_prefix", prefix_key=key_of)
    # The head, its key's other record, then "sys A/doc 2" and "3" (sharing "sys A/doc "), before
    # the older "sys B" records (sharing "sys " only).
    assert [[index for _, index in batch] for batch in batches] == [[0, 4, 3, 5], [1, 2, 6]]


async def test_the_oldest_waiting_record_is_in_every_batch():
    rng = random.Random(7)
    keys = ["sys A/doc 1", "sys A/doc 2", "sys B/doc 1", "zzz", None]
    records = [(rng.choice(keys), index, rng.randint(1, 6)) for index in range(80)]
    for budget in (None, 12):
        batches = await run_waiting(
            records,
            max_batch_size=5,
            target_batch_cost=budget,
            grouping="by_prefix",
            prefix_key=key_of,
            cost_estimator=lambda record: record[2] if len(record) == 3 else 1,
        )
        assert oldest_in_every_batch(records, batches)
        assert max(map(len, batches)) == 5


async def test_the_cost_budget_is_never_broken_and_an_oversized_record_runs_alone():
    rng = random.Random(9)
    records = [(f"doc {rng.randint(0, 5)}", index, rng.randint(1, 8)) for index in range(150)]
    records[40] = ("doc 1", 40, 30)  # costlier than the budget
    batches = await run_waiting(
        records,
        max_batch_size=16,
        target_batch_cost=12,
        grouping="by_prefix",
        prefix_key=key_of,
        cost_estimator=lambda record: record[2] if len(record) == 3 else 1,
    )
    assert max(sum(record[2] for record in batch) for batch in batches if records[40] not in batch) <= 12
    assert [records[40]] in batches


async def test_priorities_still_win():
    model = GatedLog()
    async with ours.DynamicBatcher(model, max_batch_size=8, grouping="by_prefix", prefix_key=key_of) as batcher:
        model.gate.clear()
        blocker = await batcher.submit(BLOCKER)
        await model.until_held()
        low = await batcher.submit_batch([("A", 0), ("A", 1), ("A", 2)])
        high = await batcher.submit_batch([("B", 3), ("B", 4), ("A", 5)], priority=1)
        model.gate.set()
        await asyncio.gather(blocker, *low, *high)
    # The higher level goes first, alone, though the lower one's "A" records share a key with it.
    assert model.batches[1:] == [[("B", 3), ("B", 4), ("A", 5)], [("A", 0), ("A", 1), ("A", 2)]]


async def test_records_without_a_key_are_grouped_as_by_cost_groups_them():
    lengths = [random.Random(4).choice([4, 5, 6, 60, 64, 70, 200, 210]) for _ in range(64)]
    lengths = [length + index % 3 for index, length in enumerate(lengths)]
    settings = {"max_batch_size": 8, "cost_estimator": lambda length: 1 if length == BLOCKER else length}
    by_prefix = await run_waiting(lengths, grouping="by_prefix", **settings)  # an int has no key
    assert by_prefix == await run_waiting(lengths, grouping="by_cost", **settings)
    assert by_prefix != await run_waiting(lengths, grouping="fifo", **settings)


async def test_records_with_and_without_keys_side_by_side():
    # ints have no key (cost: themselves); a str's key is its own text (cost 1).
    records: list[Any] = [5, "doc A q1", 6, "doc B q1", 50, "doc A q2", 7, "doc B q2"]
    batches = await run_waiting(
        records,
        max_batch_size=3,
        grouping="by_prefix",
        cost_estimator=lambda record: record if isinstance(record, int) else 1,
    )
    # The oldest (5) with its neighbours in cost; "doc A q1" with the keys nearest its own; then
    # 50 (the oldest left, no key) alone in its cost block, and, room left, the next oldest.
    assert batches == [[5, 6, 7], ["doc A q1", "doc A q2", "doc B q1"], [50, "doc B q2"]]


async def test_cancelled_and_expired_records_never_reach_the_device():
    model = GatedLog()
    async with ours.DynamicBatcher(model, max_batch_size=8, grouping="by_prefix", prefix_key=key_of) as batcher:
        model.gate.clear()
        blocker = await batcher.submit(BLOCKER)
        await model.until_held()
        kept = await batcher.submit_batch([("A", 0), ("B", 1), ("A", 2)])
        cancelled = await batcher.submit(("A", 3))
        expiring = await batcher.submit(("B", 4), deadline_s=0.02)
        cancelled.cancel()
        await asyncio.sleep(0.1)  # the deadline passes while the device is still busy
        model.gate.set()
        assert await asyncio.gather(*kept) == [("A", 0), ("B", 1), ("A", 2)]
        with pytest.raises(ours.RecordExpiredError):
            await expiring
        await blocker
    assert model.batches[1:] == [[("A", 0), ("A", 2), ("B", 1)]]
    assert batcher.stats.total_expired == 1


async def test_a_records_key_comes_from_the_function_then_its_method_then_its_text():
    @dataclass(frozen=True)
    class Row:
        document: str
        question: int

        def prefix_key(self) -> str:
            return self.document

    rows = [Row("d1", 0), Row("d2", 1), Row("d1", 2), Row("d2", 3)]
    assert await run_waiting(rows, max_batch_size=2, grouping="by_prefix") == [[rows[0], rows[2]], [rows[1], rows[3]]]
    by_parity = await run_waiting(rows, max_batch_size=2, grouping="by_prefix", prefix_key=lambda row: "same")
    assert by_parity == [rows[:2], rows[2:]]  # the function wins over the method
    resolver = PrefixResolver("b", None)
    assert (resolver.resolve("text"), resolver.resolve(b"\xffab"), resolver.resolve(ours.Prompt("p"))) == (
        "text",
        "\xffab",
        "p",
    )
    assert resolver.resolve(3) is None and resolver.resolve({"a": 1}) is None


async def test_a_bad_key_fails_the_submit_naming_the_record():
    async with ours.DynamicBatcher(GatedLog(), grouping="by_prefix", prefix_key=lambda record: record) as batcher:
        with pytest.raises(ValueError, match=r"prefix_key gave 42 for 42; a prefix key must be a str, bytes or None"):
            await batcher.submit(42)
    failing = ours.DynamicBatcher(GatedLog(), grouping="by_prefix", prefix_key=lambda record: record["document"])
    async with failing:
        with pytest.raises(KeyError) as raised:
            await failing.submit({"question": 1})
    assert "DynamicBatcher: prefix_key failed for {'question': 1}" in raised.value.__notes__
    with pytest.raises(ValueError, match="prefix_key must be a function of a record"):
        ours.DynamicBatcher(GatedLog(), prefix_key="document")  # type: ignore[arg-type]


async def test_every_batcher_and_batched_take_the_grouping_and_the_key():
    with pytest.raises(ValueError, match="grouping must be one of 'fifo', 'by_cost', 'by_prefix', got 'prefix'"):
        ours.BatcherSettings(grouping="prefix")  # type: ignore[arg-type]
    tokens = ours.TokenBatcher(GatedLog(), grouping="by_prefix", prefix_key=key_of, max_batch_size=2)
    async with tokens:
        assert await tokens.run([("x", 0), ("y", 1), ("x", 2)]) == [("x", 0), ("y", 1), ("x", 2)]
    assert tokens.settings.grouping == "by_prefix"
    model = GatedLog()
    batched = ours.batched(grouping="by_prefix", prefix_key=key_of, max_batch_size=2)(model)
    assert batched.options.prefix_key is key_of and batched.options.settings.grouping == "by_prefix"
    with pytest.raises(ValueError, match="prefix_key must be a function"):
        ours.batched(prefix_key=3)(model)


async def test_with_a_latency_target_it_forms_batches_and_learns():
    def padded(batch: list[str]) -> list[int]:
        time.sleep(0.001 + 1e-6 * len(batch) * max(map(len, batch)))
        return [len(text) for text in batch]

    texts = [f"document {index % 7} " * 4 + f"question {index}" for index in range(300)]
    async with ours.DynamicBatcher(padded, latency_slo_s=0.5, grouping="by_prefix") as batcher:
        futures = []
        for text in texts:
            futures.append(await batcher.submit(text, estimated_cost=len(text)))
            await asyncio.sleep(0.0005)
        assert await asyncio.gather(*futures) == [len(text) for text in texts]
    slo = batcher.stats.slo
    assert slo is not None and slo.completed == len(texts) and slo.choice is not None


class NotCancelled:
    """A stand-in for a record's future: never done."""

    def done(self) -> bool:
        return False


class PaddedLimit:
    """A latency limit for a padded model: a batch's records times its costliest one, at most `most`."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.in_flight = 0

    def fits(self, size: int, cost: int, max_cost: int) -> bool:
        return size * max_cost <= self.most


def queued(keys_and_costs: list[tuple[str | None, int]]) -> tuple[PendingQueue, list[Envelope]]:
    queue = PendingQueue("by_prefix")
    envelopes = []
    for seq, (key, cost) in enumerate(keys_and_costs):
        envelope = new_envelope(seq, cost, NotCancelled(), 0.0, seq)  # type: ignore[arg-type]
        envelope.prefix = key
        queue.push(envelope)
        envelopes.append(envelope)
    return queue, envelopes


def take_all(queue: PendingQueue, max_size: int, budget: int = 10**9) -> list[list[int]]:
    batches = []
    while queue.size:
        records, cost = queue.take_batch(budget, max_size, 0.0, [], RUNNING)
        assert cost == sum(envelope.cost for envelope in records)
        batches.append([envelope.seq for envelope in records])
    return batches


def test_the_latency_limit_bounds_a_batch_as_the_budget_does():
    rng = random.Random(3)
    queue, envelopes = queued([(rng.choice(["a/1", "a/2", "b", None]), rng.randint(1, 10)) for _ in range(200)])
    queue.limit = PaddedLimit(40)  # type: ignore[assignment]
    batches = take_all(queue, max_size=32)
    costs = {envelope.seq: envelope.cost for envelope in envelopes}
    assert all(len(batch) * max(costs[seq] for seq in batch) <= 40 for batch in batches if len(batch) > 1)
    assert sorted(seq for batch in batches for seq in batch) == list(range(200))


def forming_seconds_per_record(waiting: int) -> float:
    """Push `waiting` keyed records (a question each on one of 1,000 long documents), then time taking them all."""
    document = "You are given a document to answer questions about. "
    rng = random.Random(waiting)
    keys = [f"{document}{rng.randrange(1000):04d} question {index}" for index in range(waiting)]
    best = float("inf")
    for _ in range(3):
        queue, _ = queued([(key, 1) for key in keys])
        started = time.process_time()  # this process's own time: others on the machine count less
        take_all(queue, max_size=64)
        best = min(best, time.process_time() - started)
    return best / waiting


def test_forming_a_batch_costs_the_same_per_record_whatever_the_queues_length():
    # Work per batch that grows with the queue's length, done in Python, would cost ten times more per record
    # at ten times the length. What does grow (taking the batch's keys out of the sorted keys, a move of memory
    # in C; the caches' misses) costs about 1.8 times more per record here.
    assert forming_seconds_per_record(40_000) < 4 * forming_seconds_per_record(4_000)


def test_common_prefix_length_is_what_the_two_texts_share():
    rng = random.Random(5)
    for _ in range(2000):
        first = "".join(rng.choice("ab") for _ in range(rng.randint(0, 400)))
        second = first[: rng.randint(0, len(first))] + "".join(rng.choice("ab") for _ in range(rng.randint(0, 400)))
        shared = 0
        while shared < min(len(first), len(second)) and first[shared] == second[shared]:
            shared += 1
        assert common_prefix_length(first, second) == common_prefix_length(second, first) == shared
        assert common_prefix_length(first, second, shared + rng.randint(0, 3)) == shared  # a bound it may be given
