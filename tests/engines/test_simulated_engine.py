"""SimulatedEngine through the real `TokenBatcher`: the engine pipeline, honest counts, the clock against the model."""

from __future__ import annotations

import asyncio
import time

import pytest

from flyteplugins_batcher.engines import (
    Completion,
    EngineNotLoadedError,
    GenerationConfig,
    InvalidPromptError,
    Request,
    create_engine,
)
from flyteplugins_batcher.engines.simulated import OutputLengths, SimulatedEngine, SimulatedGpu

PROMPTS = [f"Question {index}: what is {index} times {index + 3}? Show the steps." for index in range(300)]
"""More prompts than the default 256 slots, so slots are refilled as sequences leave."""


@pytest.fixture
def engine() -> SimulatedEngine:
    loaded = SimulatedEngine(time_scale=10, generation=GenerationConfig(max_new_tokens=512))
    loaded.load()
    yield loaded
    loaded.close()


def test_create_engine_builds_it_by_name_only() -> None:
    engine = create_engine("simulated", "sim-8b", time_scale=5, gpu=SimulatedGpu(max_num_seqs=64))

    assert isinstance(engine, SimulatedEngine) and engine.name == "simulated"
    assert (engine.model_name, engine.time_scale, engine.gpu.max_num_seqs) == ("sim-8b", 5, 64)
    assert create_engine("simulated").model_name == "simulated"


def test_the_capacity_is_reported_from_load_before_any_step() -> None:
    engine = SimulatedEngine(gpu=SimulatedGpu(max_num_seqs=96))
    assert engine.stats.max_num_seqs == 0  # nothing loaded, no capacity
    engine.load()
    try:
        assert (engine.stats.steps, engine.stats.max_num_seqs, engine.stats.occupancy) == (0, 96, 0.0)
        engine.reset_stats()
        assert engine.stats.max_num_seqs == 96  # a capacity is not a counter: reset keeps it
    finally:
        engine.close()


def test_the_tokenizer_counts_four_characters_per_token(engine: SimulatedEngine) -> None:
    assert len(engine.tokenize("x" * 400)) == 100  # the chat template renders prompts, so no BOS is added
    assert engine.render("hi") == "USR:hi\nAST:"
    assert engine.prompt_tokens("a" * 38) == 12  # "USR:" + 38 + "\nAST:" = 47 characters


async def test_completions_carry_honest_counts_and_per_record_settings(engine: SimulatedEngine) -> None:
    capped = Request(PROMPTS[0], GenerationConfig(max_new_tokens=3), id="capped")
    lengths = engine.output_lengths

    results = await engine.generate([capped, PROMPTS[1]])

    assert all(isinstance(result, Completion) for result in results)
    assert (results[0].completion_tokens, results[0].finish_reason) == (3, "length")
    drawn = lengths.draw(engine.tokenize(engine.render(PROMPTS[1])))
    assert (results[1].completion_tokens, results[1].finish_reason) == (drawn, "stop") and 100 <= drawn <= 300
    assert len(engine.tokenize(results[1].text)) == drawn  # the text is as long as the count says
    assert [result.prompt_tokens for result in results] == [engine.prompt_tokens(prompt) for prompt in PROMPTS[:2]]
    assert engine.stats.completion_tokens == 3 + drawn


async def test_a_bad_record_fails_alone(engine: SimulatedEngine) -> None:
    too_long = Request("word " * 7000, id="long")  # 8,750 tokens > the 8,192 context

    results = await engine.generate([PROMPTS[0], "", too_long, 7, PROMPTS[1]])

    assert isinstance(results[0], Completion) and isinstance(results[4], Completion)
    for index, fragment in [(1, "empty prompt"), (2, "prompt is too long"), (3, "got int: 7")]:
        assert isinstance(results[index], InvalidPromptError) and fragment in str(results[index])
    assert "id='long'" in str(results[2]) and "> context length 8192" in str(results[2])


def test_its_batcher_defaults_are_stream_modes() -> None:
    settings = SimulatedEngine(gpu=SimulatedGpu(max_num_seqs=512)).batcher_defaults()

    assert (settings.max_batch_size, settings.batch_timeout_s, settings.max_concurrent_batches) == (1, 0.0, 2048)
    # Twice the cache, or twice a full engine of requests as costly as the context allows: whichever is more.
    assert settings.max_in_flight_cost == 2 * max(SimulatedGpu().kv_cache_tokens, 512 * SimulatedGpu().max_model_len)


def test_large_max_tokens_never_hold_the_engine_below_its_capacity() -> None:
    # vLLM 0.32's defaults on an H100: 1,024 slots, a 442k-token cache; requests asking for 2,048 tokens.
    gpu = SimulatedGpu(max_num_seqs=1024, max_num_batched_tokens=16384)
    settings = SimulatedEngine(gpu=gpu).batcher_defaults()
    estimate = 200 + 2048  # prompt + max_new_tokens, as the batcher estimates a request

    assert 2 * gpu.kv_cache_tokens // estimate < gpu.max_num_seqs  # a bound on the cache alone would starve it
    assert settings.in_flight_cost_limit // estimate >= 2 * gpu.max_num_seqs
    assert settings.in_flight_cost_limit // gpu.max_model_len >= 2 * gpu.max_num_seqs  # even at the longest


async def test_in_real_time_through_the_batcher_it_matches_the_offline_model(
    engine: SimulatedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    ideal = engine.ideal_run(PROMPTS)
    steps_at_arrival: list[int] = []
    generate = engine.generate

    async def arrive(records: list) -> list:  # what the device had done when each record reached the engine
        steps_at_arrival.append(engine.stats.steps)
        return await generate(records)

    monkeypatch.setattr(engine, "generate", arrive)
    started = time.perf_counter()
    async with engine.batcher() as batcher:
        results = await batcher.run(PROMPTS)

    wall_s = time.perf_counter() - started
    stats = engine.stats
    generated = sum(result.completion_tokens for result in results)
    # Every sequence holds its slot one step per token it generates (each prompt fits one step's budget).
    assert stats.running_seqs == ideal.running_seqs == generated
    # The offline run has every record before step 1; through the batcher they arrive over a few steps (a
    # few ms of our own overhead are tens of virtual ms at 10x), and each step of lateness costs one step.
    assert len(steps_at_arrival) == len(PROMPTS)
    assert ideal.steps <= stats.steps <= ideal.steps + max(steps_at_arrival) + 1
    # The same decode and prefill work, plus t0 for each extra step.
    assert stats.step_time_s == pytest.approx(ideal.makespan_s + engine.gpu.step_base_s * (stats.steps - ideal.steps))
    assert stats.occupancy == pytest.approx(ideal.occupancy * ideal.steps / stats.steps)
    assert wall_s >= stats.step_time_s / engine.time_scale  # each step slept its scaled duration
    assert stats.max_num_seqs == 256 and engine.lag_s < 0.5


async def test_closing_fails_the_requests_in_flight_without_hanging() -> None:
    engine = SimulatedEngine(time_scale=1, output_lengths=OutputLengths(mean=1000, spread=0.0))  # ~10 s of work
    engine.load()
    task = asyncio.create_task(engine.generate(PROMPTS[:4]))
    while engine.stats.steps < 2:
        await asyncio.sleep(0.005)

    engine.close()
    with pytest.raises(EngineNotLoadedError, match="closed while the request was running"):
        await asyncio.wait_for(task, timeout=5)

    assert not engine.is_healthy
    engine.load()  # and it can be loaded again
    [answer] = await SimulatedEngine.generate(engine, [Request(PROMPTS[0], GenerationConfig(max_new_tokens=2))])
    assert isinstance(answer, Completion) and answer.completion_tokens == 2
    engine.close()
