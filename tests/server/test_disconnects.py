"""No work for clients who left: a client that disconnects, and a batch that is cancelled, stop their records,
with or without an online target, whichever executor runs the batch.

The simulated GPU steps like vLLM; the engine's own counters (`/metrics`) say what it made. An
abandoned record stops at the engine's next step, so what the engine made for it is compared with
what its whole answer would have cost, never with a time.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.server.conftest import RunningServer, chat_line, jsonl, openai, simulated, start_server, wait_for_batch

pytestmark = pytest.mark.slow

CANCELLED = 'batcher_records_total{batcher="llm",outcome="cancelled"}'
PROCESSED = 'batcher_records_total{batcher="llm",outcome="processed"}'
DISPATCHED = 'batcher_batch_size_sum{batcher="llm"}'
GENERATED = "batcher_engine_generation_tokens_total{}"
STEPS = "batcher_engine_steps_total{}"

MAX_TOKENS, SAMPLES, CLIENTS = 200, 4, 4
FULL_COST = CLIENTS * SAMPLES * MAX_TOKENS
"""Tokens the abandoned requests would have cost had they run to their end (3,200; about 7 s of engine time)."""

ENGINE = simulated(time_scale=0.25, output_lengths={"mean": 1000, "spread": 0.0})
"""A simulated GPU 4 times slower than real time, whose answers run to `max_tokens`."""

ONLINE_TARGET = ["--online-ttft-slo-s", "60"]

CONTROL = [{"role": "user", "content": "Another client's question."}]


@pytest.fixture(scope="module", params=[[], ONLINE_TARGET], ids=["no-target", "online-target"])
def server(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """The server the clients leave, without and with an online target (its online records carry a timer)."""
    running = start_server(tmp_path_factory.mktemp("disconnects") / "data", *ENGINE, *request.param)
    yield running
    running.stop()


def long_request(n: int) -> dict:
    messages = [{"role": "user", "content": f"Write story number {n}."}]
    return {"model": "simulated", "messages": messages, "max_tokens": MAX_TOKENS, "n": SAMPLES, "temperature": 1.0}


def wait_until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        time.sleep(0.05)


def when_idle(server: RunningServer) -> dict[str, float]:
    """The metrics once the engine has stopped stepping (two reads 0.3 s apart agree)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        first = server.metrics()
        time.sleep(0.3)
        second = server.metrics()
        if second[STEPS] == first[STEPS]:
            return second
    raise AssertionError("the engine kept stepping for a minute")


def made_for_the_abandoned(server: RunningServer, abandon: Callable[[int], None]) -> tuple[float, dict[str, float]]:
    """Tokens the engine made for `CLIENTS` clients who abandon long requests, and the metrics once it is idle.

    Another client asks meanwhile: its answer is the one it gets alone, and its tokens are not counted.
    """
    client = server.client()
    alone = client.chat.completions.create(model="simulated", messages=CONTROL, temperature=0, max_tokens=32)
    before = when_idle(server)
    with ThreadPoolExecutor(CLIENTS + 1) as pool:
        leaving = [pool.submit(abandon, n) for n in range(CLIENTS)]
        meanwhile = client.chat.completions.create(model="simulated", messages=CONTROL, temperature=0, max_tokens=32)
        for left in leaving:
            left.result()
    wait_until(lambda: server.metrics()[CANCELLED] - before[CANCELLED] == CLIENTS)
    after = when_idle(server)
    assert meanwhile.choices[0].message.content == alone.choices[0].message.content  # unaffected
    assert meanwhile.usage == alone.usage
    assert after[PROCESSED] - before[PROCESSED] == 1  # the other client's; the abandoned ones were cancelled
    return after[GENERATED] - before[GENERATED] - meanwhile.usage.completion_tokens, after


def test_clients_who_stop_reading_a_stream_cost_no_more_tokens(server: RunningServer) -> None:
    client = server.client()

    def abandon(n: int) -> None:
        stream = client.chat.completions.create(**long_request(n), stream=True)
        for read, _ in enumerate(stream):
            if read == SAMPLES + 2:  # the roles, then text
                break
        stream.close()

    made, after = made_for_the_abandoned(server, abandon)
    time.sleep(0.5)

    assert 0 < made < FULL_COST / 2
    assert server.metrics()[GENERATED] == after[GENERATED]  # nothing more, though their answers were not done


def test_clients_who_leave_before_the_answer_cost_no_more_tokens(server: RunningServer) -> None:
    impatient = server.client(timeout=1.0)

    def abandon(n: int) -> None:
        with pytest.raises(openai.APITimeoutError):
            impatient.chat.completions.create(**long_request(n))

    made, after = made_for_the_abandoned(server, abandon)
    time.sleep(0.5)

    assert 0 < made < FULL_COST / 2
    assert server.metrics()[GENERATED] == after[GENERATED]


def test_a_cancelled_batch_stops_its_lines_in_flight_and_keeps_what_was_answered(start) -> None:
    tokens, slots, lines = 60, 2, 16
    engine = simulated(time_scale=0.25, output_lengths={"mean": tokens, "spread": 0.0}, gpu={"max_num_seqs": slots})
    server = start(*engine, "--batch-chunk-size", "4", "--batch-chunks-in-flight", "2")
    client = server.client()
    requests = [chat_line(f"r{n}", f"question {n}") for n in range(lines)]
    input_id = client.files.create(file=("requests.jsonl", jsonl(requests)), purpose="batch").id
    batch_id = client.batches.create(input_file_id=input_id, endpoint="/v1/chat/completions", completion_window="1h").id
    answered_then = wait_for_batch(client, batch_id, until=lambda b: b.request_counts.completed > 0).request_counts

    client.batches.cancel(batch_id)
    batch = wait_for_batch(client, batch_id)
    metrics = when_idle(server)

    counts = batch.request_counts
    assert batch.status == "cancelled" and counts.completed + counts.failed == counts.total == lines
    assert answered_then.completed <= counts.completed < lines
    answered = [line["custom_id"] for line in _lines(client, batch.output_file_id)]
    failed = _lines(client, batch.error_file_id)
    assert sorted(answered + [line["custom_id"] for line in failed]) == sorted(line["custom_id"] for line in requests)
    assert {line["error"]["code"] for line in failed} == {"batch_cancelled"}
    # Beyond the answered lines, the engine made only part of what its slots ran when the batch was
    # cancelled (and at most one line more, finished as the cancel came): the lines waiting in it,
    # handed out and not started, never ran (had they run, they would add 60 tokens each).
    assert metrics[PROCESSED] == counts.completed and batch.usage.output_tokens == counts.completed * tokens
    assert metrics[GENERATED] - batch.usage.output_tokens < (slots + 1) * tokens
    # Every line handed to the engine and not finished was cancelled, and so were lines still waiting in
    # the batcher (the engine holds its slots and a quarter more; the rest waits where it can be dropped).
    assert metrics[CANCELLED] >= metrics[DISPATCHED] - metrics[PROCESSED] and metrics[CANCELLED] > slots


def _lines(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    assert file_id is not None
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_batch_cancelled_as_soon_as_it_is_created_accounts_for_every_line(server: RunningServer) -> None:
    client = server.client()
    requests = [chat_line(f"r{n}", f"question {n}") for n in range(5000)]  # enough for validation to take a while
    input_id = client.files.create(file=("requests.jsonl", jsonl(requests)), purpose="batch").id

    batch_id = client.batches.create(input_file_id=input_id, endpoint="/v1/chat/completions", completion_window="1h").id
    client.batches.cancel(batch_id)  # while it still validates: it never counted its lines
    batch = wait_for_batch(client, batch_id)

    counts = batch.request_counts
    assert batch.status == "cancelled" and counts.completed + counts.failed == counts.total == len(requests)
    assert {line["error"]["code"] for line in _lines(client, batch.error_file_id)} == {"batch_cancelled"}


LONG_LINES, LONG_TOKENS = 8, 1500
FLYTE_RUNS = ["--batch-executor", "flyte"]


@pytest.mark.parametrize(
    "flags",
    [ONLINE_TARGET, [*ONLINE_TARGET, *FLYTE_RUNS], FLYTE_RUNS],
    ids=["online-target", "online-target-flyte-run", "flyte-run"],
)
def test_a_cancelled_batch_of_long_answers_stops_in_the_engine(start, flags: list[str]) -> None:
    """A batch of long answers cancelled while they run stops in the engine: with an online target (its lines wait
    for room before they go in), and as a local Flyte run on the server's engine (the run's task is cancelled)."""
    engine = simulated(time_scale=1, output_lengths={"mean": LONG_TOKENS, "spread": 0.0})
    server = start(*engine, "--max-new-tokens", str(LONG_TOKENS), *flags)
    client = server.client()
    salt = uuid.uuid4().hex[:8]  # flyte's local cache outlives a test: no earlier run may answer these
    requests = [chat_line(f"r{n}", f"Write story number {n} ({salt}).") for n in range(LONG_LINES)]
    input_id = client.files.create(file=("requests.jsonl", jsonl(requests)), purpose="batch").id
    batch_id = client.batches.create(input_file_id=input_id, endpoint="/v1/chat/completions", completion_window="1h").id
    wait_until(lambda: server.metrics().get(STEPS, 0) >= 50, timeout_s=120)  # every line runs, none is near its end

    client.batches.cancel(batch_id)
    batch = wait_for_batch(client, batch_id)
    metrics = when_idle(server)

    assert batch.status == "cancelled" and batch.request_counts.completed == 0
    # Had they run to their end, the lines would have made 12,000 tokens in 1,500 steps.
    assert metrics[STEPS] < LONG_TOKENS / 5, f"{metrics[STEPS]:.0f} steps: the cancelled lines ran on"
    assert metrics[GENERATED] < LONG_LINES * LONG_TOKENS / 5
    assert metrics[CANCELLED] == LONG_LINES
