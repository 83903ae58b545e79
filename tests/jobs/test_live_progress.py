"""Progress per record: a replica counts each record as it finishes, and a driver in its process shows it before the
chunk comes back; the counts a chunk brings are not counted twice."""

from __future__ import annotations

import asyncio
import io
import json

from flyteplugins_batcher.jobs._progress import ProgressLine
from flyteplugins_batcher.jobs._report import Progress
from flyteplugins_batcher.jobs._summary import Counts
from flyteplugins_batcher.replica import ChatMessage, EngineSettings, LLMReplica, RequestChunk, RequestItem
from flyteplugins_batcher.replica._live import LiveRecords, _LiveCounter

LINES = 12
STAGGERED = EngineSettings(
    engine="simulated",
    engine_args=json.dumps({"time_scale": 4, "gpu": {"max_num_seqs": 4}, "output_lengths": {"mean": 200}}),
    max_new_tokens=400,
    max_batch_size=4,
)
"""Twelve lines, four at a time, of different lengths: they finish one after another over about two seconds."""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_busy_time_counts_only_while_records_are_in_flight() -> None:
    clock = Clock()
    counter = _LiveCounter(clock)
    counter.submitted(2)
    clock.now += 3
    counter.finished(RuntimeError("too long"))
    clock.now += 1
    assert counter.read() == LiveRecords(finished=1, failed=1, completion_tokens=0, busy_s=4.0)
    counter.finished(asyncio.CancelledError())
    clock.now += 50  # the next model loads: nothing in flight
    counter.submitted(1)
    clock.now += 2
    now = counter.read()
    assert (now.finished, now.busy_s) == (2, 6.0)
    assert now.since(LiveRecords(1, 1, 0, 4.0)) == LiveRecords(1, 1, 0, 2.0)  # a dropped record has no answer


def test_rates_are_per_busy_second() -> None:
    records = LiveRecords(finished=16, failed=0, completion_tokens=1600, busy_s=32.0)
    assert (records.records_per_s(), records.tokens_per_s()) == (0.5, 50.0)
    assert LiveRecords().records_per_s() == 0.0 and LiveRecords().tokens_per_s() == 0.0


async def test_a_driver_in_the_replicas_process_sees_records_before_their_chunk_ends() -> None:
    replica = LLMReplica()
    items = [RequestItem(f"r{n}", messages=[ChatMessage("user", f"Tell story {n}.")]) for n in range(LINES)]
    progress = Progress("test", total=LINES)
    progress.line = _quiet(progress)
    try:
        running = asyncio.create_task(replica.run_chunk(RequestChunk(0, items), STAGGERED))
        seen: set[int] = set()
        while not running.done():
            seen.add(progress.state().done)
            await asyncio.sleep(0.02)
        outcome = await running
        assert any(0 < done < LINES for done in seen), f"only {sorted(seen)} shown while the chunk ran"
        state = progress.state()
        assert state.done == LINES and state.rate > 0 and state.tokens_per_s > 0
        tokens = sum(result.completion_tokens for result in outcome.results)
        counts = Counts()
        for result in outcome.results:
            counts.count(failed=bool(result.error_code), completion_tokens=result.completion_tokens)
        await progress.update(counts)  # the chunk comes back: its records are not counted again
        assert progress.state().done == LINES
        assert LLMReplica.live_records().since(progress._live_from).completion_tokens == tokens
    finally:
        progress.close()
        await replica.aclose()


async def test_on_a_cluster_the_line_moves_per_chunk() -> None:
    """No replica runs in the driver's process: its own counts stay at zero and the chunks' counts say it all."""
    progress = Progress("test", total=16)
    progress.line = _quiet(progress)
    try:
        counts = Counts()
        for _ in range(8):
            counts.count(failed=False, completion_tokens=10)
        await progress.update(counts)
        state = progress.state()
        assert (state.done, state.failed, state.total) == (8, 0, 16)
    finally:
        progress.close()


async def test_the_ticker_stops_with_the_task_that_made_it() -> None:
    async def run() -> Progress:
        return Progress("test", total=1)

    progress = await asyncio.create_task(run())
    await asyncio.sleep(1.5)  # one tick: it sees its task done and ends
    assert progress._ticker is not None and progress._ticker.done()


def _quiet(progress: Progress) -> ProgressLine:
    """A line that writes nowhere (the test reads the state, not the terminal)."""
    return ProgressLine(progress.line.noun, stream=io.StringIO(), interval_s=0)


async def test_logs_get_a_heartbeat_at_the_interval_and_no_stream_without_one() -> None:
    """In logs the line comes at the configured interval even while no chunk finishes (a slow first chunk); with no
    interval (a line per update), the ticker adds nothing while nothing finishes."""
    logs = {interval: io.StringIO() for interval in (1.0, 0.0)}
    runs = [Progress("test", total=8) for _ in logs]
    for progress, (interval, log) in zip(runs, logs.items(), strict=True):
        progress.line = ProgressLine("requests", stream=log, interval_s=interval)
    try:
        await asyncio.sleep(3.5)
    finally:
        for progress in runs:
            progress.close()
    heartbeat = logs[1.0].getvalue().splitlines()
    assert len(heartbeat) >= 2 and all(line.startswith("progress: 0/8 requests") for line in heartbeat)
    assert logs[0.0].getvalue() == ""
