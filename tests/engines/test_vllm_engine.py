"""The vLLM engines against real vLLM (its CPU build here), with the bundled SmolLM2 checkpoint.

Each mode's engine starts once per module (about 40 s on CPU) and is shared by its tests; only one
runs at a time. Token counts are checked against vLLM's own Prometheus counters, and engine death
against a real `SIGKILL` of vLLM's engine-core process.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import re
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")

from benchmarks.structured_cases import Validity, held_out_cases, held_out_requests, invalid_reason
from flyteplugins_batcher import SharedBatcher
from flyteplugins_batcher.engines import (
    Completion,
    EngineConfigError,
    EngineDeadError,
    GenerationConfig,
    InvalidPromptError,
    InvalidResponseFormatError,
    Request,
    ResponseFormat,
    create_engine,
)
from flyteplugins_batcher.engines.vllm import ENGINE_EXIT_GRACE_S

pytestmark = pytest.mark.slow

SMALL = {"max_model_len": 1024, "kv_cache_memory_bytes": 1 << 30}
"""Small enough to start quickly beside other tests, big enough for every prompt here."""

QUESTIONS = [
    "What is 2 + 2?",
    "Name three primary colors.",
    "Write one sentence about the ocean.",
    "A train travels 60 miles in 1.5 hours. What is its average speed in miles per hour?",
]

COUNT = "Count from 1 to 100, separated by commas."
"""Greedy SmolLM2 counts on past 16 tokens, a comma every two tokens."""

MAX_NUM_SEQS = 16


@pytest.fixture(scope="module", params=["batch", "stream"])
def engine(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A loaded vLLM engine for the mode, with vLLM's default statistics settings.

    Both engines turn vLLM's statistics on by default (they read steps and occupancy from them),
    so vLLM's own Prometheus counters (its token counts) are on too.
    """
    loaded = create_engine(
        "vllm", mode=request.param, generation=GenerationConfig(max_new_tokens=16), max_num_seqs=MAX_NUM_SEQS, **SMALL
    )
    loaded.load()
    yield loaded
    loaded.close()


async def generate(engine: Any, records: list[Any]) -> list[Completion | Exception]:
    result = engine.generate(records)
    return await result if inspect.isawaitable(result) else result


def vllm_counter(name: str) -> float:
    """The value of one of vLLM's Prometheus counters in this process."""
    from vllm.v1.metrics.reader import Counter, get_metrics_snapshot

    return sum(metric.value for metric in get_metrics_snapshot() if metric.name == name and isinstance(metric, Counter))


def completions(results: list[Completion | Exception]) -> list[Completion]:
    assert all(isinstance(result, Completion) for result in results), results
    return [result for result in results if isinstance(result, Completion)]


async def test_answers_come_back_in_order_with_vllms_own_token_counts(engine: Any) -> None:
    prompts_before = vllm_counter("vllm:prompt_tokens")
    generated_before = vllm_counter("vllm:generation_tokens")

    results = completions(await generate(engine, QUESTIONS))
    reversed_results = completions(await generate(engine, QUESTIONS[::-1]))

    assert [result.text for result in reversed_results] == [result.text for result in results][::-1]  # greedy
    assert all(result.text.strip() for result in results)
    tokens = sum(result.prompt_tokens for result in results + reversed_results)
    generated = sum(result.completion_tokens for result in results + reversed_results)
    assert vllm_counter("vllm:prompt_tokens") - prompts_before == tokens
    assert vllm_counter("vllm:generation_tokens") - generated_before == generated
    assert [result.prompt_tokens for result in results] == [engine.prompt_tokens(question) for question in QUESTIONS]


def assert_ended_by_its_own_settings(completion: Completion, *, max_new_tokens: int) -> None:
    """A completion ran to its own `max_new_tokens` ("length") or ended on its own before it ("stop")."""
    assert 0 < completion.completion_tokens <= max_new_tokens, completion
    assert completion.finish_reason == ("length" if completion.completion_tokens == max_new_tokens else "stop")


async def test_generation_settings_apply_per_record(engine: Any) -> None:
    # Each record is checked against its own settings, not against the same prompt in another batch:
    # vLLM does not promise batch-invariant numerics (on CPU in float32, greedy answers change with the
    # batch's composition).
    short = Request(QUESTIONS[3], GenerationConfig(max_new_tokens=3), id="short")
    stopped = Request(COUNT, GenerationConfig(max_new_tokens=16, stop=(",",)), id="stopped")
    sampled = [
        Request(QUESTIONS[1], GenerationConfig(max_new_tokens=12, temperature=1.0, seed=seed)) for seed in (7, 7, 8)
    ]

    results = completions(await generate(engine, [short, QUESTIONS[3], stopped, *sampled]))

    assert results[0].completion_tokens == 3 and results[0].finish_reason == "length"
    assert_ended_by_its_own_settings(results[1], max_new_tokens=16)  # the engine's own settings
    assert results[1].completion_tokens > 3
    assert results[2].finish_reason == "stop" and "," not in results[2].text  # counting: "1, 2, ..." within 16
    assert results[3].text == results[4].text != results[5].text  # same seed, same sample
    assert [result.prompt_tokens for result in results[:3]] == [
        engine.prompt_tokens(record) for record in (QUESTIONS[3], QUESTIONS[3], COUNT)
    ]


async def test_invalid_records_fail_alone(engine: Any) -> None:
    too_long = "word " * 1100  # over max_model_len=1024
    results = await generate(engine, [QUESTIONS[0], "", Request(too_long, id="long"), 7, QUESTIONS[1]])

    assert isinstance(results[0], Completion) and isinstance(results[4], Completion)
    for index, fragment in [(1, "empty prompt"), (2, "prompt is too long"), (3, "got int: 7")]:
        assert isinstance(results[index], InvalidPromptError) and fragment in str(results[index])
    assert "id='long'" in str(results[2]) and "> context length 1024" in str(results[2])


async def test_steps_and_occupancy_come_from_vllms_own_scheduler(engine: Any) -> None:
    before = engine.stats
    results = completions(await generate(engine, [COUNT] * 8))

    window = engine.stats.since(before)
    generated = sum(result.completion_tokens for result in results)
    assert [result.finish_reason for result in results] == ["length"] * 8 and generated == 8 * 16
    assert window.max_num_seqs == MAX_NUM_SEQS
    # Each sequence runs one step per token it generates (its prompt fits one step), so the sequences
    # running, summed over the steps, are exactly the tokens generated.
    assert window.running_seqs == generated
    # 16 steps when the 8 requests reach vLLM's scheduler in the same step; vLLM's engine process takes
    # requests between steps, so some may join a step or two later (each such step adds 1 step).
    assert 16 <= window.steps <= 18
    assert window.occupancy == generated / (window.steps * MAX_NUM_SEQS)  # 8/16 = 0.5 at 16 steps, 0.44 at 18


async def test_a_schema_a_json_object_and_a_plain_record_share_one_batch(engine: Any) -> None:
    case = held_out_cases()[0]
    schema_format = ResponseFormat.json_schema(case["schema"], name=case["name"])
    broken = ResponseFormat.json_schema({"type": "object", "properties": {"a": {"type": "strin"}}}, name="broken")
    chat = [{"role": "user", "content": case["prompt"]}]
    records = [
        Request(chat, GenerationConfig(max_new_tokens=128, response_format=schema_format), id="schema"),
        Request(chat, GenerationConfig(max_new_tokens=128, response_format=ResponseFormat.json_object()), id="object"),
        Request(chat, GenerationConfig(max_new_tokens=128, response_format=broken), id="broken"),
        # Its own question, whose unconstrained answer is prose: a JSON grammar would force a "{" first.
        Request([{"role": "user", "content": QUESTIONS[2]}], GenerationConfig(max_new_tokens=16), id="plain"),
    ]

    schema_answer, object_answer, error, plain = await generate(engine, records)

    assert isinstance(schema_answer, Completion) and schema_answer.finish_reason == "stop"
    assert invalid_reason(schema_answer.text, schema_format) is None, schema_answer.text
    assert isinstance(object_answer, Completion)
    if object_answer.finish_reason == "stop":
        assert invalid_reason(object_answer.text, ResponseFormat.json_object()) is None, object_answer.text
    assert isinstance(error, InvalidResponseFormatError)
    assert "id='broken'" in str(error) and 'cannot be enforced: Unsupported type "strin"' in str(error)
    # vLLM does not promise the same numerics in another batch composition, so the plain record is not
    # compared with itself alone: it is checked for what is promised, no grammar and its own settings.
    assert isinstance(plain, Completion) and plain.text.strip(), plain
    assert not plain.text.lstrip().startswith(("{", "[")), plain.text
    assert invalid_reason(plain.text, ResponseFormat.json_object()) is not None, plain.text
    assert_ended_by_its_own_settings(plain, max_new_tokens=16)


async def test_a_schema_vllm_itself_refuses_fails_alone_not_the_batch(engine: Any) -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(70):  # xgrammar compiles it; vLLM refuses schemas nested over 64 levels
        deep = {"type": "array", "items": deep, "maxItems": 1}
    refused = Request("x", GenerationConfig(max_new_tokens=8, response_format=ResponseFormat.json_schema(deep)))

    first, error, last = await generate(engine, [QUESTIONS[0], refused, QUESTIONS[1]])

    assert isinstance(first, Completion) and isinstance(last, Completion)
    assert isinstance(error, InvalidResponseFormatError)
    assert "is refused by vLLM: The JSON schema is nested too deeply" in str(error)


async def test_n_samples_are_all_returned_and_counted(engine: Any) -> None:
    generated_before = vllm_counter("vllm:generation_tokens")
    sampled = Request(QUESTIONS[1], GenerationConfig(max_new_tokens=12, temperature=1.0, n=3, seed=7))
    greedy = Request(QUESTIONS[1], GenerationConfig(max_new_tokens=12, n=3))
    single = Request(QUESTIONS[1], GenerationConfig(max_new_tokens=12))

    several, identical, one = completions(await generate(engine, [sampled, greedy, single]))

    assert len(several.samples) == 3 and len({sample.text for sample in several.samples}) > 1
    assert several.completion_tokens == sum(sample.completion_tokens for sample in several.samples)
    assert several.prompt_tokens == one.prompt_tokens
    assert [sample.text for sample in identical.samples] == [one.text] * 3  # greedy: decoded once, repeated
    assert identical.completion_tokens == 3 * one.completion_tokens
    decoded = several.completion_tokens + 2 * one.completion_tokens
    assert vllm_counter("vllm:generation_tokens") - generated_before == decoded


@pytest.mark.timeout(600)  # 10 answers of up to 256 tokens on 2 shared CPU cores
async def test_every_answered_held_out_schema_validates(engine: Any) -> None:
    # Greedy here; the sampled answers too (30 in all) in `benchmarks/bench_structured.py`, which gives the table.
    validity = Validity()
    requests = held_out_requests()
    validity.add(requests, await generate(engine, requests))
    print(validity.summary(f"vllm {engine.mode}"))
    assert not validity.failures, validity.failures
    assert validity.answered >= len(held_out_cases()) - 2


def test_each_event_loop_can_use_the_engine(engine: Any) -> None:
    async def ask() -> list[Completion]:
        async with engine.batcher() as batcher:
            return completions(await batcher.run(QUESTIONS[:2], return_exceptions=True))

    first = asyncio.run(ask())
    second = asyncio.run(ask())  # a new event loop, as Flyte's local runner brings for each task

    assert [result.text for result in first] == [result.text for result in second]


# -- failing fast and engine death ---------------------------------------------------------------------------


def test_an_unknown_engine_argument_fails_at_once_with_a_suggestion() -> None:
    engine = create_engine("vllm", max_model_length=1024)
    started = time.monotonic()
    with pytest.raises(
        EngineConfigError, match="unknown engine argument 'max_model_length'; did you mean 'max_model_len'"
    ):
        engine.load()
    assert time.monotonic() - started < 10  # not after vLLM's minute-long start-up


def test_a_kv_cache_that_cannot_fit_fails_at_once() -> None:
    engine = create_engine("vllm", kv_cache_memory_bytes=1 << 50)
    with pytest.raises(EngineConfigError, match=r"does not fit in the .* GiB of host memory"):
        engine.load()


def engine_core_pids() -> list[int]:
    """vLLM's engine-core processes below this one (they name themselves `VLLM::EngineCore`)."""
    import psutil

    return [
        child.pid
        for child in psutil.Process().children(recursive=True)
        if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline())
    ]


class Records(logging.Handler):
    """Keeps every log record it is given."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def log_records() -> Iterator[list[logging.LogRecord]]:
    """Every record logged in this process by this library and by vLLM (whose logger does not propagate)."""
    handler = Records()
    loggers = [logging.getLogger("flyteplugins_batcher"), logging.getLogger("vllm")]
    previous = loggers[0].level
    loggers[0].setLevel(logging.DEBUG)
    for logger in loggers:
        logger.addHandler(handler)
    yield handler.records
    for logger in loggers:
        logger.removeHandler(handler)
    loggers[0].setLevel(previous)


async def kill_engine_core_after_steps(engine: Any, steps: int, running: asyncio.Task[Any]) -> tuple[list[int], float]:
    """SIGKILL vLLM's engine-core processes once `engine` has run `steps` steps of `running` (mid-run, whatever the
    machine's speed: the test's timeout bounds the wait).

    Returns the processes killed and when (`time.monotonic()`).
    """
    while engine.stats.steps < steps and not running.done():
        await asyncio.sleep(0.01)
    pids = engine_core_pids()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return pids, time.monotonic()


async def the_replica_loads_a_fresh_engine_that_answers_and_closes_promptly(shared: Any, dead_batcher: Any) -> None:
    """After a death: the next `get()` closes the dead engine and loads a new one, which answers and closes in time."""
    replacement = await shared.get()  # the next task on the replica gets a fresh engine
    engine = shared.loaded_model
    assert replacement is not dead_batcher and shared.loads == 2
    [answer] = await replacement.run([QUESTIONS[0]])
    assert isinstance(answer, Completion) and answer.text
    assert engine.is_healthy and engine.stats.load_time_s > 1
    processes = engine_core_processes()
    started = time.monotonic()
    ending = asyncio.get_running_loop().run_in_executor(None, when_ended, processes)  # watched from now on
    await shared.aclose()
    assert not engine.is_loaded and not engine.is_healthy
    # Its process ended within our grace, not vLLM's 5 s, which it outlived. Timed to the process's end: what the
    # close does after it (freeing memory) takes as long as the machine is busy.
    assert await ending - started < ENGINE_EXIT_GRACE_S + 3


def engine_core_processes() -> list[Any]:
    """vLLM's engine-core processes below this one, as `psutil` processes (there is one at least)."""
    import psutil

    processes = [psutil.Process(pid) for pid in engine_core_pids()]
    assert processes, "found no EngineCore process"
    return processes


def when_ended(processes: list[Any]) -> float:
    """When the processes had all ended (`time.monotonic()`), watched for a minute at most.

    Watched, not waited for: `psutil`'s wait would reap them, under the feet of vLLM's own join.
    """
    import psutil

    def running(process: Any) -> bool:
        try:
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 60
    while any(running(process) for process in processes) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(running(process) for process in processes), "the engine process outlived the close"
    return time.monotonic()


LONG_ANSWER = GenerationConfig(max_new_tokens=512)
"""Far more steps than the kill waits for (2), and within `max_model_len` with the prompt."""


@pytest.mark.engine_starts(2)  # the engine, and the one that replaces it
@pytest.mark.parametrize("mode", ["batch", "stream"])
def test_a_dead_engine_fails_everything_promptly_and_the_replica_loads_a_new_one(
    mode: str, log_records: list[logging.LogRecord]
) -> None:
    def load(_key: object) -> Any:
        loaded = create_engine("vllm", mode=mode, generation=GenerationConfig(max_new_tokens=64), **SMALL)
        loaded.load()
        return loaded

    shared = SharedBatcher(load, lambda loaded, _key: loaded.batcher())

    async def scenario() -> None:
        batcher = await shared.get()
        first_engine = shared.loaded_model
        assert first_engine is not None and first_engine.is_healthy
        assert first_engine.stats.max_num_seqs == 256  # vllm.LLM's default on CPU, in both modes (not AsyncLLM's 128)

        # Each answer needs hundreds of steps (greedy SmolLM2 counts on to its limit), so the kill after
        # step 2 lands mid-run on any machine: on a GPU, 500 steps are seconds, not milliseconds.
        long_counts = [Request(f"Count from {n} to 1000, separated by commas.", LONG_ANSWER) for n in range(40)]
        running = asyncio.create_task(batcher.run(long_counts, return_exceptions=True))
        killed, killed_at = await kill_engine_core_after_steps(first_engine, 2, running)
        assert killed, "found no EngineCore process to kill"
        outcomes = await asyncio.wait_for(running, timeout=60)
        # Counted from the kill, not from the first steps, which take as long as the machine is busy.
        assert time.monotonic() - killed_at < 30  # failed promptly, not after a minute or forever
        failed = [outcome for outcome in outcomes if isinstance(outcome, EngineDeadError)]
        assert failed and all(isinstance(outcome, (Completion, EngineDeadError)) for outcome in outcomes)
        assert all("engine process died" in str(outcome) for outcome in failed)
        assert any(re.search(r"died \(EngineCore exit code -9\)", str(outcome)) for outcome in failed)
        # One warning line reports the death, and no traceback: the death is recovered below.
        warnings = [
            record for record in log_records if record.levelno >= logging.WARNING and "died" in record.getMessage()
        ]
        assert [record.name for record in warnings] == ["flyteplugins_batcher"]
        assert [record.getMessage() for record in log_records if record.exc_info] == []
        assert not first_engine.is_healthy and batcher.is_failed
        assert first_engine.stats.steps >= 2 and first_engine.stats.max_num_seqs == 256

        await the_replica_loads_a_fresh_engine_that_answers_and_closes_promptly(shared, batcher)

    asyncio.run(scenario())
