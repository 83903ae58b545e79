"""A full queue answers 429 with `Retry-After` at once, never an unbounded wait; an API key, when set, is checked."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.server.conftest import openai, simulated

pytestmark = pytest.mark.slow

# Room for two requests of max_tokens=200 in the engine (its in-flight bound is twice a 300-token cache) and
# two in the queue; each answer is about 10 tokens, 0.35 s on this slowed GPU.
TIGHT = [
    *simulated(
        time_scale=0.2,
        gpu={"max_num_seqs": 1, "kv_cache_tokens": 300, "max_model_len": 288},  # 18 blocks of 16
        output_lengths={"mean": 10},
    ),
    "--max-queue-size",
    "2",
]


QUEUE_TOLD = re.compile(r"(?P<queued>\d+) requests wait in its queue of 2, behind \d+ in the batch being assembled")
"""What a 429 says of the queue: how many wait in it, of the --max-queue-size it holds."""


def test_a_full_queue_answers_429_with_retry_after_and_the_rest_are_answered(start) -> None:
    server = start(*TIGHT)
    body = {"model": "simulated", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200}

    def ask(_: int) -> tuple[httpx.Response, float]:
        started = time.monotonic()
        response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
        return response, time.monotonic() - started

    with ThreadPoolExecutor(16) as pool:
        outcomes = list(pool.map(ask, range(16)))

    refused = [(response, seconds) for response, seconds in outcomes if response.status_code == 429]
    answered = [response for response, _ in outcomes if response.status_code == 200]
    assert refused and answered and len(refused) + len(answered) == 16
    assert all(int(response.headers["Retry-After"]) >= 1 for response, _ in refused)
    assert all(response.json()["error"]["code"] == "rate_limit_exceeded" for response, _ in refused)
    assert all(1 <= int(response.headers["Retry-After"]) <= 60 for response, _ in refused)
    waiting = [QUEUE_TOLD.search(response.json()["error"]["message"]) for response, _ in refused]
    assert all(told is not None and int(told["queued"]) <= 2 for told in waiting)  # the queue's real numbers
    assert max(seconds for _, seconds in refused) < 2  # refused at once, not after waiting for room
    metrics = server.metrics()
    rate_limited = 'batcher_http_requests_total{endpoint="/v1/chat/completions",outcome="rate_limited"}'
    assert metrics[rate_limited] == len(refused)


def test_the_official_client_gets_a_rate_limit_error_and_its_retries_honour_retry_after(start) -> None:
    server = start(*TIGHT)
    messages = [{"role": "user", "content": "hi"}]
    impatient, patient = server.client(), server.client(max_retries=8)

    def ask(client: openai.OpenAI) -> str:
        try:
            return client.chat.completions.create(model="simulated", messages=messages, max_tokens=200).object
        except openai.RateLimitError:
            return "429"

    with ThreadPoolExecutor(12) as pool:
        without_retries = list(pool.map(ask, [impatient] * 12))
    with ThreadPoolExecutor(12) as pool:
        with_retries = list(pool.map(ask, [patient] * 12))

    assert "429" in without_retries
    assert with_retries == ["chat.completion"] * 12  # each came back after Retry-After, and was answered


def test_an_api_key_when_set_is_required_on_the_api_but_not_on_health_or_metrics(start) -> None:
    server = start(*simulated(), "--api-key", "s3cret")

    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="wrong").models.list()
    without_bearer = httpx.get(f"{server.url}/v1/models", headers={"Authorization": "s3cret"})
    models = server.client(api_key="s3cret").models.list()

    assert [model.id for model in models] == ["simulated"]
    assert without_bearer.status_code == 401 and "Bearer" in without_bearer.json()["error"]["message"]
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.get(f"{server.url}/metrics").status_code == 200
