"""Records in progress: text streamed as an engine makes it, and records stopped when their caller cancels them.

The simulated engine and its scheduler run here with no model; the Transformers engine with the
bundled SmolLM2 (`slow`). vLLM's stream mode is tested through a server (`tests/server/test_vllm_streaming.py`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from flyteplugins_batcher.engines import (
    CancellationToken,
    Completion,
    GenerationConfig,
    Request,
    RequestCancelledError,
    TokenLogprob,
)
from flyteplugins_batcher.engines.simulated import OutputLengths, SimulatedEngine, SimulatedGpu
from flyteplugins_batcher.engines.simulated._continuous_batching import ContinuousBatchScheduler, SequenceJob


class Pieces:
    """A text listener that keeps what it hears, by choice (called from the engine's thread)."""

    def __init__(self) -> None:
        self.heard: list[tuple[int, str]] = []
        self.logprobs: list[tuple[int, tuple[TokenLogprob, ...]]] = []
        self._lock = threading.Lock()

    def __call__(self, index: int, text: str, logprobs: tuple[TokenLogprob, ...]) -> None:
        with self._lock:
            self.heard.append((index, text))
            self.logprobs.append((index, logprobs))

    def text(self, index: int) -> str:
        return "".join(text for choice, text in self.heard if choice == index)


@pytest.fixture
def engine() -> Iterator[SimulatedEngine]:
    loaded = SimulatedEngine(time_scale=2, output_lengths=OutputLengths(mean=40, spread=0.0))
    loaded.load()
    yield loaded
    loaded.close()


def test_the_token_is_set_once_and_tells_its_callbacks_once_from_any_thread() -> None:
    token, told = CancellationToken(), []
    token.add_callback(lambda: told.append("early"))

    threads = [threading.Thread(target=token.cancel) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    token.add_callback(lambda: told.append("late"))

    assert token.cancelled and told == ["early", "late"]
    assert Request("hi", cancellation=token) == Request("hi")  # not part of what the request is


async def test_the_simulated_engine_streams_each_steps_text_and_the_answer_is_their_sum(engine: SimulatedEngine):
    greedy, sampled = Pieces(), Pieces()
    records = [
        Request("Tell me a story.", GenerationConfig(n=2), on_delta=greedy),
        Request("Tell me another.", GenerationConfig(n=2, temperature=1.0, seed=1), on_delta=sampled),
    ]

    async with engine.batcher() as batcher:
        first, second = await batcher.run(records)

    for pieces, completion in ((greedy, first), (sampled, second)):
        assert isinstance(completion, Completion) and len(completion.samples) == 2
        assert [pieces.text(index) for index in (0, 1)] == [sample.text for sample in completion.samples]
        assert sum(1 for index, _ in pieces.heard if index == 0) == 40  # a piece per token: one per step
    assert first.completion_tokens == second.completion_tokens == 80
    assert engine.stats.running_seqs == 40 * 3  # greedy decodes one sequence for both choices, sampling two


async def test_a_running_record_cancelled_stops_at_the_next_step(engine: SimulatedEngine) -> None:
    pieces, token = Pieces(), CancellationToken()
    long = Request("A long one.", GenerationConfig(max_new_tokens=2000), cancellation=token, on_delta=pieces)
    engine.output_lengths = OutputLengths(mean=2000, spread=0.0)

    async with engine.batcher() as batcher:
        future = await batcher.submit(long)
        while len(pieces.heard) < 5:
            await asyncio.sleep(0.005)
        future.cancel()
        while batcher.stats.total_cancelled < 1:
            await asyncio.sleep(0.005)
        steps = engine.stats.steps
        await asyncio.sleep(0.1)

    stats = engine.stats
    assert token.cancelled and stats.steps == steps  # the engine is idle again
    assert stats.cancelled_records == 1 and 5 <= stats.completion_tokens < 2000 / 4
    assert stats.completion_tokens == len(pieces.heard)  # what it made for the record, and no more


async def test_a_record_cancelled_before_it_runs_never_reaches_the_model(engine: SimulatedEngine) -> None:
    token = CancellationToken()
    token.cancel()

    [outcome] = await engine.generate([Request("Too late.", cancellation=token)])

    assert isinstance(outcome, RequestCancelledError) and outcome.completion_tokens == 0
    assert (engine.stats.steps, engine.stats.cancelled_records, engine.stats.failed_records) == (0, 1, 0)


def test_the_scheduler_drops_a_cancelled_job_wherever_it_is_and_frees_its_slot() -> None:
    scheduler = ContinuousBatchScheduler(SimulatedGpu(max_num_seqs=2, max_num_batched_tokens=64))
    decoding, prefilling, waiting = SequenceJob(10, 50), SequenceJob(500, 50), SequenceJob(10, 50)
    for job in (decoding, prefilling, waiting):
        scheduler.submit(job)
    for _ in range(3):
        scheduler.step()  # `decoding` has 3 tokens; `prefilling` is part-way through its prompt

    assert scheduler.cancel(decoding) == 3 and scheduler.cancel(prefilling) == 0
    assert scheduler.running == 0 and scheduler.waiting == 1
    assert scheduler.cancel(waiting) == 0 and scheduler.idle
    assert scheduler.cancel(waiting) is None  # not there any more


@pytest.mark.slow
def test_transformers_stops_a_cancelled_row_and_runs_the_others_to_their_end(smollm2_engine) -> None:
    token = CancellationToken()
    generation = GenerationConfig(max_new_tokens=64)
    story = [{"role": "user", "content": "Write a long story about a dragon."}]
    alone = smollm2_engine.generate([Request(story, generation)])[0]
    records = [Request(story, generation, cancellation=token), Request(story, generation)]
    threading.Timer(0.2, token.cancel).start()  # a row of 64 tokens takes seconds on a CPU

    stopped, other = smollm2_engine.generate(records)

    assert isinstance(stopped, RequestCancelledError) and stopped.completion_tokens < generation.max_new_tokens
    assert other == alone  # the row beside it is unaffected
