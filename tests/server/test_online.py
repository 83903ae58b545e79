"""The online endpoints of a real server (SmolLM2 and MiniLM on CPU), through the official `openai` client."""

from __future__ import annotations

import base64
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from tests.server.conftest import RunningServer, openai

pytestmark = pytest.mark.slow

QUESTIONS = [f"What is {n} + {n}? Answer with a number." for n in range(8)]


def test_concurrent_chat_requests_are_answered_in_shared_batches(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    before = smollm2_server.metrics()

    def ask(question: str) -> openai.types.chat.ChatCompletion:
        return client.chat.completions.create(
            model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": question}]
        )

    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        answers = list(pool.map(ask, QUESTIONS))

    assert all(answer.choices[0].message.content.strip() for answer in answers)
    assert all(answer.model == "SmolLM2-135M-Instruct" and answer.object == "chat.completion" for answer in answers)
    assert all(0 < answer.usage.completion_tokens <= 16 for answer in answers)  # the server's --max-new-tokens
    assert len({answer.id for answer in answers}) == len(QUESTIONS)
    after = smollm2_server.metrics()
    batches = _delta(after, before, 'batcher_batch_size_count{batcher="llm"}')
    records = _delta(after, before, 'batcher_batch_size_sum{batcher="llm"}')
    assert records == len(QUESTIONS) and batches < len(QUESTIONS)  # concurrent requests shared batches
    assert _delta(after, before, 'batcher_http_requests_total{endpoint="/v1/chat/completions",outcome="ok"}') == 8


def test_per_request_settings_n_and_response_format_behave_as_in_batch_files(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    messages = [{"role": "user", "content": "Describe a cat as JSON with a name and an age."}]
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}

    short = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=3)
    samples = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=messages, n=3, temperature=1.0, seed=5, max_tokens=8
    )
    shaped = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=messages,
        max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "cat", "schema": schema}},
    )

    assert short.usage.completion_tokens == 3 and short.choices[0].finish_reason == "length"
    assert [choice.index for choice in samples.choices] == [0, 1, 2]
    assert 3 <= samples.usage.completion_tokens <= 3 * 8  # every sample counted
    assert len({choice.message.content for choice in samples.choices}) > 1  # sampled, not repeated
    text = shaped.choices[0].message.content
    assert text.lstrip().startswith("{")  # constrained from its first token
    if shaped.choices[0].finish_reason == "stop":
        answer = json.loads(text)
        assert set(answer) <= {"name", "age"} and isinstance(answer.get("age", 0), int)


def test_streamed_answers_arrive_as_openai_events(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    messages = [{"role": "user", "content": QUESTIONS[1]}]
    whole = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages)

    events = list(
        client.chat.completions.create(
            model="SmolLM2-135M-Instruct", messages=messages, stream=True, stream_options={"include_usage": True}
        )
    )

    streamed = "".join(event.choices[0].delta.content or "" for event in events if event.choices)
    assert streamed == whole.choices[0].message.content  # greedy: the same answer, in events
    assert [event.choices[0].finish_reason for event in events if event.choices][-1] == whole.choices[0].finish_reason
    assert events[-1].usage is not None and events[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_a_completions_prompt_reaches_the_model_as_written(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    prompt = "The capital of France is"

    answer = client.completions.create(model="SmolLM2-135M-Instruct", prompt=prompt, max_tokens=4)
    chat = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": prompt}], max_tokens=4
    )

    assert answer.object == "text_completion" and answer.choices[0].text
    assert answer.usage.prompt_tokens < chat.usage.prompt_tokens  # no chat template, no system prompt


def test_embeddings_equal_the_model_run_alone(smollm2_server: RunningServer) -> None:
    pytest.importorskip("sentence_transformers", reason="needs the embed extra")
    from flyteplugins_batcher.engines import EmbeddingModel

    client = smollm2_server.client()
    texts = ["Tea.", "A reusable container keeps the model in memory between tasks.", "Blue."]

    # The client asks for base64 unless told (and decodes it after validation, which strict validation refuses).
    floats = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts, encoding_format="float")
    packed = httpx.post(
        f"{smollm2_server.url}/v1/embeddings",
        json={"model": "all-MiniLM-L6-v2", "input": texts, "encoding_format": "base64"},
    ).json()

    served = np.asarray([item.embedding for item in floats.data])
    alone = np.asarray([embedding.vector for embedding in EmbeddingModel().encode(texts)])
    assert served.shape == (3, 384) and np.abs(served - alone).max() <= 1e-5
    decoded = np.asarray([np.frombuffer(base64.b64decode(item["embedding"]), "<f4") for item in packed["data"]])
    assert np.abs(decoded - served).max() <= 1e-6
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > len(texts)


def test_concurrent_embeddings_of_different_lengths_are_all_answered(smollm2_server: RunningServer) -> None:
    # Costing a request (on the event loop) once switched off the padding of a batch being encoded
    # (in a worker thread): a 400 "Unable to create tensor" now and then (tests/server/test_embedding_race.py).
    pytest.importorskip("sentence_transformers", reason="needs the embed extra")
    from flyteplugins_batcher.engines import EmbeddingModel

    client = smollm2_server.client()
    texts = [" ".join(["word"] * (1 + 9 * (n % 7))) + f" {n}" for n in range(42)]
    requests = [texts[start : start + 3] for start in range(0, len(texts), 3)] * 2

    def embed(inputs: list[str]) -> list[list[float]]:
        answer = client.embeddings.create(model="all-MiniLM-L6-v2", input=inputs, encoding_format="float")
        return [item.embedding for item in answer.data]

    with ThreadPoolExecutor(len(requests)) as pool:
        served = [vector for vectors in pool.map(embed, requests) for vector in vectors]

    alone = np.asarray([embedding.vector for embedding in EmbeddingModel().encode(texts)] * 2)
    assert np.abs(np.asarray(served) - alone).max() <= 1e-5


def test_bad_requests_get_openai_error_bodies(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    model = "SmolLM2-135M-Instruct"
    hello = [{"role": "user", "content": "hi"}]

    with pytest.raises(openai.BadRequestError) as hot:
        client.chat.completions.create(model=model, messages=hello, temperature=7)
    with pytest.raises(openai.NotFoundError) as other:
        client.chat.completions.create(model="gpt-4o", messages=hello)
    with pytest.raises(openai.BadRequestError) as empty:
        client.chat.completions.create(model=model, messages=[])
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "word " * 9000}])
    with pytest.raises(openai.BadRequestError) as blank:
        client.embeddings.create(model="all-MiniLM-L6-v2", input=["fine", ""], encoding_format="float")
    not_json = httpx.post(
        f"{smollm2_server.url}/v1/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"}
    )

    assert (hot.value.code, hot.value.param) == ("invalid_request", "temperature")
    assert "temperature must be from 0 to 2, got 7" in hot.value.message
    assert other.value.code == "model_not_found" and "'gpt-4o' does not exist" in other.value.message
    assert empty.value.code == "invalid_body" and too_long.value.code == "context_length_exceeded"
    assert blank.value.code == "invalid_body" and "input[1] is empty" in blank.value.message
    assert not_json.status_code == 400 and not_json.json()["error"]["type"] == "invalid_request_error"


def test_models_health_and_metrics_as_their_users_expect(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    client.embeddings.create(model="all-MiniLM-L6-v2", input="warm", encoding_format="float")
    client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "Hi"}])

    models = [model.id for model in client.models.list()]
    retrieved = client.models.retrieve("all-MiniLM-L6-v2")
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4o")
    health = httpx.get(f"{smollm2_server.url}/health")
    metrics = smollm2_server.metrics()

    assert models == ["SmolLM2-135M-Instruct", "all-MiniLM-L6-v2"]
    assert retrieved.id == "all-MiniLM-L6-v2" and retrieved.object == "model"
    assert missing.value.code == "model_not_found" and "'gpt-4o' does not exist" in missing.value.message
    assert health.status_code == 200 and health.json()["status"] == "ok"
    for name in (
        'batcher_queue_length{batcher="llm"}',
        'batcher_queue_length{batcher="embeddings"}',
        'batcher_batch_cost_count{batcher="llm"}',
        'batcher_batch_wait_seconds_count{batcher="llm"}',
        'batcher_request_latency_seconds_count{batcher="embeddings"}',
        'batcher_batches_total{batcher="llm",reason="idle"}',
        'batcher_device_busy_seconds_total{batcher="llm"}',
        'batcher_records_total{batcher="llm",outcome="processed"}',
        "batcher_engine_generation_tokens_total{}",
    ):
        assert name in metrics, name
    assert metrics['batcher_device_busy_seconds_total{batcher="llm"}'] > 0
    assert "batcher_engine_occupancy_ratio{}" not in metrics  # Transformers has no continuous batching


def _delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)
