"""How full the engines were: through the replica's snapshot, across a run's chunks, and the one warning."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace

from flyte.io import File

from flyteplugins_batcher.jobs import RunOptions, RunSummary, fan_out
from flyteplugins_batcher.jobs._driver import FanOutStats
from flyteplugins_batcher.jobs._environments import ReplicaPool
from flyteplugins_batcher.jobs._finish import occupancy_warning
from flyteplugins_batcher.jobs._report import final_html
from flyteplugins_batcher.jobs._summary import summary_line
from flyteplugins_batcher.replica import (
    ChatMessage,
    ChunkOutcome,
    EngineSettings,
    LLMReplica,
    ReplicaSnapshot,
    RequestChunk,
    RequestItem,
)

SIMULATED = EngineSettings(
    engine="simulated",
    engine_args=json.dumps({"time_scale": 200, "gpu": {"max_num_seqs": 16}, "output_lengths": {"mean": 20}}),
    max_new_tokens=64,
)
POOL = ReplicaPool(replicas=1, concurrency=8, gpu=None, prefix="BATCH_LLM")


def chunk(index: int, size: int) -> RequestChunk:
    items = [RequestItem(f"{index}-{n}", messages=[ChatMessage("user", f"Question {index}.{n}?")]) for n in range(size)]
    return RequestChunk(index, items)


async def chunks(count: int, size: int) -> AsyncIterator[RequestChunk]:
    for index in range(count):
        yield chunk(index, size)


async def run_simulated(chunk: RequestChunk) -> ChunkOutcome:
    return await LLMReplica.of_process().run_chunk(chunk, SIMULATED)


async def test_the_replica_snapshot_carries_the_engines_steps_and_occupancy(fresh_replica: LLMReplica) -> None:
    outcome = await LLMReplica.of_process().run_chunk(chunk(0, 40), SIMULATED)

    engine = fresh_replica.shared.loaded_model
    stats, snapshot = engine.stats, outcome.replica
    completion_tokens = sum(result.completion_tokens for result in outcome.results)
    assert (snapshot.engine_steps, snapshot.running_seqs, snapshot.max_num_seqs) == (
        stats.steps,
        stats.running_seqs,
        16,
    )
    # Each sequence holds its slot one step per token it generates: the occupancy's numerator is the tokens.
    assert snapshot.running_seqs == completion_tokens > 0
    assert snapshot.occupancy == completion_tokens / (stats.steps * 16) == stats.occupancy
    assert 0 < snapshot.engine_busy_s == stats.generate_time_s
    assert snapshot.engine_counts().since(snapshot.engine_counts()).occupancy == 0.0


def state(name: str, records: int, steps: int, running: int, capacity: int = 256) -> ReplicaSnapshot:
    return ReplicaSnapshot(
        replica=name, records=records, engine_steps=steps, running_seqs=running, max_num_seqs=capacity
    )


def test_a_runs_occupancy_counts_each_replica_from_its_first_chunk_and_while_chunks_waited() -> None:
    fanned = FanOutStats()
    for replica in ("a", "b"):
        fanned.record(ChunkOutcome(0, [], state(replica, 8, 100, 25_600), finished_at=2e9), started=1e9)
    fanned.record(ChunkOutcome(1, [], state("a", 16, 300, 25_600 + 200 * 128), finished_at=2e9), started=1e9)
    fanned.reading = False  # from here on no chunk waited in the driver
    fanned.record(ChunkOutcome(2, [], state("b", 16, 200, 25_600 + 100 * 64), finished_at=2e9), started=1e9)

    # a: 200 steps at 128 of 256 while chunks waited; b ran nothing new meanwhile, then 100 steps at 64.
    assert fanned.occupancy(while_waiting=True) == 0.5
    assert fanned.occupancy() == (200 * 128 + 100 * 64) / (300 * 256)
    assert [replica.records for replica in fanned.replicas] == [16, 16]


async def test_a_driver_cap_below_the_replicas_slots_starves_the_engine_and_says_so() -> None:
    fanned = await fan_out(chunks(12, 2), run_simulated, _ignore, max_in_flight=1)

    assert fanned.held_back and 0 < fanned.occupancy(while_waiting=True) <= 2 / 16
    warning = occupancy_warning(fanned, RunOptions(chunk_size=2, max_chunks_in_flight=1), POOL)
    assert "engines were" in warning and "max_num_seqs=16" in warning
    assert "raise --max_chunks_in_flight (now 1; 0 fills every replica's slots: 1 replicas x 8 = 8)" in warning


async def test_a_full_cap_on_too_few_slots_names_the_replicas_concurrency() -> None:
    pool = ReplicaPool(replicas=1, concurrency=2, gpu=None, prefix="BATCH_LLM")
    run = RunOptions(chunk_size=2)  # the cap: every slot of the pool, 2 calls of 2 requests
    fanned = await fan_out(chunks(12, 2), run_simulated, _ignore, max_in_flight=2)

    warning = occupancy_warning(fanned, run, pool)

    # size_in_flight(16, chunk_size=2): 4 x 16 requests in calls of 2.
    assert "raise BATCH_LLM_CONCURRENCY (now 2 calls of 2 requests per replica; size_in_flight gives 32" in warning


def test_an_engine_kept_full_gets_no_warning_and_one_that_never_waited_neither() -> None:
    full = FanOutStats(held_back=True)
    full.record(ChunkOutcome(0, [], state("a", 8, 10, 2_000), finished_at=2e9), started=1e9)
    full.record(ChunkOutcome(1, [], state("a", 16, 110, 2_000 + 100 * 250), finished_at=2e9), started=1e9)
    never_waited = FanOutStats(held_back=False, latest={}, first={}, while_waiting={})
    never_waited.record(ChunkOutcome(0, [], state("a", 8, 100, 100), finished_at=2e9), started=1e9)

    assert occupancy_warning(full, RunOptions(), POOL) == ""
    assert occupancy_warning(never_waited, RunOptions(), POOL) == ""


def test_an_engine_that_counted_no_steps_gets_no_warning() -> None:
    # vLLM with its statistics off knows its capacity but counts no steps: an occupancy of 0 is not a reading.
    no_steps = FanOutStats(held_back=True)
    no_steps.record(ChunkOutcome(0, [], state("a", 8, 0, 0), finished_at=2e9), started=1e9)
    no_steps.record(ChunkOutcome(1, [], state("a", 16, 0, 0), finished_at=2e9), started=1e9)

    assert no_steps.occupancy(while_waiting=True) is None and no_steps.occupancy() is None
    assert occupancy_warning(no_steps, RunOptions(), POOL) == ""


def test_the_driver_cap_defaults_to_every_replicas_slots() -> None:
    pool = ReplicaPool(replicas=4, concurrency=128, gpu="H100:1")

    assert RunOptions().chunks_in_flight(pool) == 512
    assert RunOptions(max_chunks_in_flight=16).chunks_in_flight(pool) == 16


def test_the_summary_line_says_how_full_the_engines_were(tmp_path) -> None:
    empty = File(path=str(tmp_path / "x.jsonl"))
    summary = RunSummary(
        "f",
        10,
        10,
        0,
        load_time_s=1.0,
        inference_s=2.0,
        requests_per_s=5.0,
        output_tokens_per_s=100.0,
        results=empty,
        errors=empty,
        occupancy=0.874,
    )

    assert "100 output tokens/s, engines 87% full (inference 2.0 s" in summary_line(summary, "requests")


def test_an_engine_without_continuous_batching_has_no_occupancy_in_the_outputs_or_the_summary(tmp_path) -> None:
    transformers = FanOutStats()
    transformers.record(ChunkOutcome(0, [], state("a", 8, 0, 0, capacity=0), finished_at=2e9), started=1e9)
    empty = File(path=str(tmp_path / "x.jsonl"))
    summary = RunSummary(
        "f",
        10,
        10,
        0,
        load_time_s=1.0,
        inference_s=2.0,
        requests_per_s=5.0,
        output_tokens_per_s=100.0,
        results=empty,
        errors=empty,
        occupancy=transformers.occupancy(),
    )

    assert summary.occupancy is None and transformers.replicas[0].occupancy is None
    assert "full" not in summary_line(summary, "requests")
    assert '<div class="k">engine occupancy</div>' not in final_html(summary, [])


def test_the_report_gives_each_replicas_occupancy_and_none_for_an_engine_without_steps(tmp_path) -> None:
    empty = File(path=str(tmp_path / "x.jsonl"))
    summary = RunSummary(
        "f",
        10,
        10,
        0,
        load_time_s=1.0,
        inference_s=2.0,
        requests_per_s=5.0,
        output_tokens_per_s=100.0,
        results=empty,
        errors=empty,
        occupancy=0.5,
    )
    stepped = replace(state("a", 8, 100, 12_800), occupancy=0.5)
    no_steps = state("b", 8, 0, 0)

    page = final_html(summary, [stepped, no_steps])

    assert "<td>50% of 256 seqs over 100 steps</td>" in page
    assert page.count("<td>n/a</td>") == 1


async def _ignore(chunk: RequestChunk, outcome: ChunkOutcome | None, reason: str) -> None:
    assert outcome is not None, reason
