"""Real vLLM (stream mode) behind the server: tokens go out as vLLM makes them; a client who leaves aborts its request.

vLLM's own scheduler statistics (steps) and the tokens vLLM reports for the aborted request
(`batcher_engine_generation_tokens_total`) say how much work was done; they are compared with the
same greedy request's whole answer, never with a time.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.server.conftest import RunningServer

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
COUNT = [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}]
"""Greedy SmolLM2 counts for over a hundred tokens."""
MAX_TOKENS = 192

GENERATED = "batcher_engine_generation_tokens_total{}"
CANCELLED = 'batcher_records_total{batcher="llm",outcome="cancelled"}'
STEPS = "batcher_engine_steps_total{}"


def content_arrivals(server: RunningServer, body: dict) -> tuple[list[float], float, str]:
    """When each content event of a streamed answer arrived, the whole time, and the text."""
    started, arrivals, text = time.perf_counter(), [], ""
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content": "' in line and '"content": ""' not in line:
                arrivals.append(time.perf_counter() - started)
                text += json.loads(line.removeprefix("data: "))["choices"][0]["delta"]["content"]
    return arrivals, time.perf_counter() - started, text


def test_vllm_streams_as_it_generates_and_stops_a_request_whose_client_left(start) -> None:
    pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")
    server = start(*("--engine", "vllm", "--no-embeddings"), *("--max-model-len", "1024", "--kv-cache-gb", "1"))
    client = server.client()
    body = {"model": MODEL, "messages": COUNT, "temperature": 0, "max_tokens": MAX_TOKENS}
    whole = client.chat.completions.create(**body)

    arrivals, total, streamed = content_arrivals(server, {**body, "stream": True})
    before = server.metrics()
    with client.chat.completions.create(**body, stream=True) as stream:
        for read, _ in enumerate(stream):
            if read == 5:
                break
    deadline = time.monotonic() + 60
    while server.metrics()[CANCELLED] == before[CANCELLED]:
        assert time.monotonic() < deadline, "the abandoned request was not cancelled"
        time.sleep(0.05)
    settled = server.metrics()
    time.sleep(1.0)
    after = server.metrics()

    whole_tokens = whole.usage.completion_tokens
    assert whole_tokens > 100 and streamed == whole.choices[0].message.content
    assert len(arrivals) > whole_tokens // 4 and arrivals[0] < 0.25 * total  # the first text long before the last
    made = after[GENERATED] - before[GENERATED]
    assert 0 < made < whole_tokens / 2  # vLLM stopped it: far fewer tokens than its whole answer
    assert after[STEPS] == settled[STEPS] and after[GENERATED] == settled[GENERATED]  # and nothing ran since
