"""The online latency target in a real server: 429s with a true `Retry-After` when online requests alone are too
many, the batch's quota taken while online requests come and given back when they stop, and a stream's headers
before its answer on an engine that answers whole records (Transformers), with keep-alive comments meanwhile."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.server.conftest import RunningServer, chat_line, jsonl, openai, simulated, wait_for_batch

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "hi"}]
QUOTA = "batcher_online_slo_batch_quota{}"
IN_FLIGHT = "batcher_online_slo_batch_lines_in_flight{}"


def _ask(client: openai.OpenAI, sent_at: float) -> tuple[float, float, str, int]:
    """One online request: when it was sent and ended (since `sent_at`), its outcome, and its Retry-After."""
    sent = time.monotonic() - sent_at
    try:
        client.chat.completions.create(model="simulated", messages=MESSAGES, max_tokens=32)
    except openai.RateLimitError as error:
        return (
            sent,
            time.monotonic() - sent_at,
            error.response.json()["error"]["message"],
            int(error.response.headers["Retry-After"]),
        )
    return sent, time.monotonic() - sent_at, "answered", 0


def _load(client: openai.OpenAI, per_s: float, seconds: float) -> list[tuple[float, float, str, int]]:
    """Online requests at `per_s` for `seconds`, each awaited; every outcome."""
    started = time.monotonic()
    with ThreadPoolExecutor(64) as pool:
        futures = []
        while time.monotonic() - started < seconds:
            futures.append(pool.submit(_ask, client, started))
            time.sleep(1 / per_s)
        return [future.result(timeout=120) for future in futures]


def test_too_many_online_requests_get_429_with_a_retry_after_that_holds(start) -> None:
    # two sequences of 32 tokens at 7 ms a step: about 9 answers/s; 25/s is far more than a 0.15-s TTFT allows
    engine = simulated(time_scale=1, gpu={"max_num_seqs": 2}, output_lengths={"mean": 32, "spread": 0})
    server = start(*engine, "--online-ttft-slo-s", "0.15")
    client = server.client()

    outcomes = _load(client, 25, 4.0)

    refused = [outcome for outcome in outcomes if outcome[2] != "answered"]
    answered = [outcome for outcome in outcomes if outcome[2] == "answered"]
    assert refused and answered, f"{len(refused)} refused of {len(outcomes)}"
    assert all("latency target (time to first token p99 <= 0.15 s)" in message for _, _, message, _ in refused)
    assert all(1 <= retry <= 60 for *_, retry in refused)
    # the last refusal's Retry-After: the load has stopped, so the requests then in flight must be gone by then
    # (not too short: a request sent then is answered), and it is not far longer than they took to go
    told_at, _, _, retry_after = max(refused)
    drained = max(ended for _, ended, _, _ in answered) - told_at
    assert retry_after <= drained + 2, f"Retry-After {retry_after} s, the requests ahead left in {drained:.1f} s"
    time.sleep(retry_after)
    assert _ask(client, time.monotonic())[2] == "answered"
    metrics = server.metrics()
    assert metrics["batcher_online_slo_refused_total{}"] == len(refused)
    assert metrics["batcher_online_time_to_first_token_seconds_count{}"] >= len(answered)


def _quota(server: RunningServer) -> float | None:
    """The batch's quota of lines in flight (`None`: any)."""
    return server.metrics().get(QUOTA)


def test_the_batch_gives_its_quota_to_online_requests_and_gets_it_back_when_they_stop(start) -> None:
    engine = simulated(time_scale=1, gpu={"max_num_seqs": 64}, output_lengths={"mean": 64, "spread": 0})
    server = start(*engine, "--online-ttft-slo-s", "0.05", "--online-tpot-slo-s", "0.0085", "--max-new-tokens", "64")
    client = server.client()
    lines = [chat_line(f"line-{number}", f"question {number}") for number in range(3000)]
    uploaded = client.files.create(file=("lines.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_for_batch(client, batch.id, until=lambda b: b.request_counts.completed > 0)
    assert _quota(server) is None  # no online request yet: the batch fills the engine
    full = server.metrics()[IN_FLIGHT]

    stop = threading.Event()
    quotas: list[float | None] = []

    def watch() -> None:
        while not stop.is_set():
            quotas.append(_quota(server))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        outcomes = _load(client, 8, 4.0)
    finally:
        stop.set()
        watcher.join()
    taken = [quota for quota in quotas if quota is not None]
    assert taken and min(taken) < full / 2, f"quota while online requests came: {quotas}, {full} lines alone"
    assert all(outcome[2] == "answered" for outcome in outcomes)

    deadline = time.monotonic() + 15
    while _quota(server) is not None and time.monotonic() < deadline:
        time.sleep(0.25)
    assert _quota(server) is None, "the quota was not given back once online requests stopped"
    time.sleep(1.0)
    assert server.metrics()[IN_FLIGHT] > min(taken)  # the lines fill the engine again
    client.batches.cancel(batch.id)


NO_END = {"0": -100, "2": -100}
"""SmolLM2's end-of-text and end-of-turn tokens, banned: an answer then always runs to `max_tokens`."""


def _streamed(server: RunningServer, read_timeout_s: float) -> tuple[float, float, float, str, int]:
    """A streamed chat request through the official client with a short read timeout: when its headers, its first
    text and its end came (seconds after it was sent), its text, and the keep-alive comments it had."""
    client = server.client(timeout=httpx.Timeout(60.0, read=read_timeout_s))
    messages = [{"role": "user", "content": "Count from 1 to 100, one number a line."}]
    model = client.models.list().data[0].id
    sent = time.monotonic()
    first, text, comments = 0.0, "", 0
    with client.chat.completions.with_streaming_response.create(
        model=model,
        messages=messages,
        stream=True,
        max_tokens=160,
        temperature=0,
        logit_bias=NO_END,  # every answer runs to max_tokens: long enough to outlast the read timeout
    ) as response:
        headers = time.monotonic() - sent
        for line in response.iter_lines():
            comments += line.startswith(": keep-alive")
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[len("data: ") :])["choices"]:
                piece = (choice.get("delta") or {}).get("content") or ""
                first = first or (time.monotonic() - sent if piece else 0.0)
                text += piece
    return headers, first, time.monotonic() - sent, text, comments


def test_a_stream_on_transformers_has_its_headers_at_once_and_keep_alives_until_its_answer(start) -> None:
    pytest.importorskip("transformers", reason="needs the cpu extra")
    server = start("--engine", "transformers", "--no-embeddings", "--stream-keepalive-s", "0.2")

    headers, first, _, text, comments = _streamed(server, read_timeout_s=2.0)

    assert text.strip() and first > 2 * 2.0, f"the first text came after {first:.1f} s: the read timeout never ran out"
    assert headers < first / 8, f"headers after {headers:.2f} s, text after {first:.1f} s"  # headers at once
    assert comments >= (first - headers) / 0.2 / 2, f"{comments} keep-alive comments in {first - headers:.1f} s"
    assert server.metrics()["batcher_online_time_to_first_byte_seconds_count{}"] == 1
