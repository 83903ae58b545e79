"""The remote engine (`create_engine("openai", base_url=...)`) against real OpenAI-compatible endpoints on this machine.

Our own server (`flyteplugins-batcher serve`, on the simulated engine: it starts in seconds) and vLLM's
(`python -m vllm.entrypoints.openai.api_server`, slow), with `FaultyProxy` between them and the engine answering a
share of calls 429 or dropping the connection: every record is answered exactly once. Each bad input fails its
records, or the load, with an error that names it, and no output shows the key.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks._faulty_proxy import FaultyProxy
from benchmarks.server_process import ServerProcess, our_server
from flyteplugins_batcher.engines import Completion, EngineConfigError, GenerationConfig, Request, create_engine
from flyteplugins_batcher.engines._openai._pacing import AdaptiveConcurrency, RatePacer

KEY = "sk-test-remote-0123456789abcdef"
"""The key our server demands: a test asserts that no output shows it."""

SHORT = GenerationConfig(max_new_tokens=8)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Our server on the simulated engine (fast steps), demanding `KEY`."""
    started = our_server(
        tmp_path_factory.mktemp("remote") / "data",
        *("--engine", "simulated", "--engine-args", json.dumps({"time_scale": 20}), "--no-embeddings"),
        *("--api-key", KEY),
    )
    yield started
    started.stop()


@pytest.fixture
def keyed(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    return KEY


def run(engine: Any, records: list[Any]) -> list[Any]:
    async def go() -> list[Any]:
        async with engine.batcher() as batcher:
            return await batcher.run(records, return_exceptions=True)

    return asyncio.run(go())


def test_every_record_is_answered_once_through_429s_and_dropped_connections(
    server: ServerProcess, keyed: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    records = [Request(f"Question {number}", SHORT, id=f"q{number}") for number in range(120)]
    with FaultyProxy(server.url, rate_limited=0.3, dropped=0.05, seed=7).running() as proxy:
        engine = create_engine("openai", base_url=f"{proxy.url}/v1", generation=SHORT, timeout_s=20)
        with engine:
            outcomes = run(engine, records)
            assert engine.model_name == "simulated"  # the first model /v1/models lists
    assert [type(outcome) for outcome in outcomes] == [Completion] * len(records), [
        str(outcome) for outcome in outcomes if isinstance(outcome, Exception)
    ][:3]
    assert all(outcome.completion_tokens > 0 and outcome.prompt_tokens > 0 for outcome in outcomes)  # usage per line
    assert proxy.seen["forwarded"] == len(records)  # each answered by exactly one call that got through
    assert proxy.seen["429"] > 10 and proxy.seen["dropped"] > 0
    assert engine.retries == proxy.seen["429"] + proxy.seen["dropped"]  # those, and only those, were sent again
    assert engine.concurrency.halvings >= 1
    printed = capsys.readouterr()
    assert KEY not in caplog.text + printed.out + printed.err


def test_the_concurrency_doubles_in_its_slow_start_then_grows_one_per_round_trip_and_never_shrinks_when_late() -> None:
    async def scenario() -> None:
        limit = AdaptiveConcurrency(initial=4, most=64, slow_s=10.0)
        assert limit.slow_start
        for _ in range(20):
            await limit.answered(0.1, 10, was_full=True)
        assert limit.limit == 24  # one per answer in time: 4 answers double 4
        await limit.answered(0.1, 10, was_full=False)  # the limit was not in use: nothing learnt
        assert limit.limit == 24 and limit.slow_start
        await limit.answered(1.0, 10, was_full=True)  # ten times slower per token: calls wait in a queue
        await limit.answered(20.0, 1000, was_full=True)  # past slow_s
        assert limit.limit == 24 and not limit.slow_start  # late: the slow start ends, nothing shrinks
        for _ in range(24):
            await limit.answered(0.1, 10, was_full=True)
        assert 24.9 < limit.limit < 25.1  # a round trip's answers (24) grow it by one
        assert (limit.peak, limit.halvings) == (limit.limit, 0)

    asyncio.run(scenario())


def test_one_burst_of_429s_halves_once_and_a_later_call_sent_at_the_limit_halves_again() -> None:
    async def scenario() -> None:
        limit = AdaptiveConcurrency(initial=32, most=64)
        await limit.overloaded(was_full=False)  # sent while the limit was not in use: the limit was not refused
        assert (limit.limit, limit.halvings, limit.slow_start) == (32, 0, True)
        sent = time.monotonic()
        await asyncio.sleep(0.001)
        await limit.overloaded(sent_at=sent)
        await limit.overloaded(sent_at=sent)  # sent before the halving: it cannot have seen it
        assert (limit.limit, limit.halvings, limit.slow_start) == (16, 1, False)
        await asyncio.sleep(0.001)
        await limit.overloaded(sent_at=time.monotonic())  # sent after it: the endpoint is still overloaded
        assert (limit.limit, limit.halvings) == (8, 2)

    asyncio.run(scenario())


def test_a_halving_never_goes_below_the_calls_the_endpoint_holds_or_answered_in_the_last_round_trip() -> None:
    async def scenario() -> None:
        held = AdaptiveConcurrency(initial=16, most=64)
        for _ in range(12):
            await held.acquire()
        await held.overloaded()  # twelve in flight and this one's place: 13, not 8
        assert (held.limit, held.halvings) == (13, 1)
        full = AdaptiveConcurrency(initial=16, most=64)
        for _ in range(15):
            await full.acquire()
        await full.overloaded()  # the endpoint holds all it was sent: a 429 that says nothing about load
        assert (full.limit, full.halvings, full.slow_start) == (16, 0, True)
        served = AdaptiveConcurrency(initial=32, most=64)
        for _ in range(20):
            await served.answered(2.0, 10, was_full=False)  # twenty answers within the last round trip (2 s)
        await served.overloaded()
        assert served.limit == pytest.approx(20)  # twenty at once, by Little's law
        fast = AdaptiveConcurrency(initial=32, most=64)
        for _ in range(40):
            await fast.answered(0.1, 10, was_full=False)  # forty in the last second, each in 0.1 s: four at once
        await fast.overloaded()
        assert fast.limit == 16

    asyncio.run(scenario())


def test_a_retry_after_pauses_every_new_call_until_then() -> None:
    async def scenario() -> float:
        limit = AdaptiveConcurrency(initial=4, most=8)
        await limit.overloaded(retry_after_s=0.5)
        started = time.monotonic()
        await limit.acquire()
        return time.monotonic() - started

    assert 0.45 <= asyncio.run(scenario()) < 3.0


def test_limits_per_minute_hold_calls_once_a_minutes_worth_is_spent() -> None:
    async def scenario() -> tuple[float, float]:
        pacer = RatePacer(requests_per_minute=600)  # a bucket of 600, refilled at 10 a second
        started = time.monotonic()
        for _ in range(600):
            await pacer.take(1)
        burst = time.monotonic() - started
        for _ in range(3):
            await pacer.take(1)
        return burst, time.monotonic() - started - burst

    burst, paced = asyncio.run(scenario())
    assert burst < 0.5 and paced >= 0.25


def test_a_wrong_url_fails_the_load_naming_it() -> None:
    engine = create_engine("openai", base_url="http://127.0.0.1:9/v1", timeout_s=2)
    with pytest.raises(EngineConfigError, match=r"cannot reach http://127.0.0.1:9/v1/models"):
        engine.load()
    with pytest.raises(EngineConfigError, match="base_url must be an http"):
        create_engine("openai", base_url="localhost:8000")


def test_a_refused_key_fails_the_load_without_showing_it(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "sk-wrong-key-9876543210"
    monkeypatch.setenv("OPENAI_API_KEY", wrong)
    with pytest.raises(EngineConfigError, match=r"refused the key \(HTTP 401\): set OPENAI_API_KEY") as raised:
        create_engine("openai", base_url=f"{server.url}/v1").load()
    assert wrong not in str(raised.value) and KEY not in str(raised.value)


def test_a_model_the_endpoint_does_not_serve_fails_the_load_naming_what_it_serves(
    server: ServerProcess, keyed: str
) -> None:
    with pytest.raises(EngineConfigError, match="does not serve model 'gpt-9'; it serves: simulated"):
        create_engine("openai", "gpt-9", base_url=f"{server.url}/v1").load()


def test_an_endpoint_that_answers_garbage_fails_each_record_at_once(server: ServerProcess, keyed: str) -> None:
    with FaultyProxy(server.url, garbage=1.0).running() as proxy:
        engine = create_engine("openai", base_url=f"{proxy.url}/v1", generation=SHORT)
        with engine:
            outcomes = run(engine, ["one", "two"])
    assert all(isinstance(outcome, ValueError) for outcome in outcomes)
    assert "is not an OpenAI response (not JSON: '<html>upstream exploded</html>')" in str(outcomes[0])
    assert proxy.seen["garbage"] == 2 and engine.retries == 0  # not worth a second call


def test_an_endpoint_that_hangs_fails_each_record_after_its_timeouts(server: ServerProcess, keyed: str) -> None:
    with FaultyProxy(server.url, hang_s=30).running() as proxy:
        engine = create_engine("openai", base_url=f"{proxy.url}/v1", generation=SHORT, timeout_s=0.5, max_retries=1)
        with engine:
            started = time.monotonic()
            outcomes = run(engine, ["one", "two", "three"])
            took = time.monotonic() - started
    assert all(isinstance(outcome, TimeoutError) for outcome in outcomes)
    assert "no answer within 0.5 s (after 2 attempts)" in str(outcomes[0])
    assert took < 10


def test_run_batch_runs_a_file_against_an_endpoint(server: ServerProcess, keyed: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    lines = [
        {
            "custom_id": f"q{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": f"Question {n}"}], "max_tokens": 8},
        }
        for n in range(20)
    ]
    requests = tmp_path / "requests.jsonl"
    requests.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with FaultyProxy(server.url, rate_limited=0.3, seed=3).running() as proxy:
        command = [sys.executable, "-m", "flyteplugins_batcher", "run-batch", "-i", str(requests)]
        command += ["-o", str(tmp_path / "out"), "--engine", "openai", "--base-url", f"{proxy.url}/v1", "--no-resume"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    answered = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert sorted(line["custom_id"] for line in answered) == sorted(line["custom_id"] for line in lines)
    assert all(line["response"]["body"]["usage"]["completion_tokens"] > 0 for line in answered)
    assert KEY not in result.stdout + result.stderr
    assert not any(KEY in path.read_text(errors="ignore") for path in (tmp_path / "out").rglob("*") if path.is_file())


@pytest.mark.slow
def test_vllms_own_server_answers_through_the_proxy_as_it_answers_directly(tmp_path: Path) -> None:
    pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")
    from benchmarks.server_process import vllm_server
    from flyteplugins_batcher.engines import bundled_smollm2_path

    flags = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "512", "--max-num-seqs", "8"]
    vllm = vllm_server(tmp_path, str(bundled_smollm2_path()), *flags, "--kv-cache-memory-bytes", str(1 << 28))
    try:
        questions = [f"What is {number} + {number}?" for number in range(24)]
        direct = create_engine("openai", base_url=f"{vllm.url}/v1", generation=SHORT)
        with direct:
            expected = [outcome.text for outcome in run(direct, questions)]
        with FaultyProxy(vllm.url, rate_limited=0.3, dropped=0.05, seed=5).running() as proxy:
            faulty = create_engine("openai", base_url=f"{proxy.url}/v1", generation=SHORT)
            with faulty:
                outcomes = run(faulty, questions)
        assert [getattr(outcome, "text", outcome) for outcome in outcomes] == expected
        assert proxy.seen["forwarded"] == len(questions) and proxy.seen["429"] > 0
    finally:
        vllm.stop()
