"""The Batch API of a real server over HTTP: files, batches, their lines and their ends, through the `openai` client."""

from __future__ import annotations

import io
import json
import time

import httpx
import numpy as np
import pytest

from tests.server.conftest import RunningServer, chat_line, jsonl, openai, simulated, wait_for_batch

pytestmark = pytest.mark.slow

SLOW_ENGINE = simulated(time_scale=0.2, output_lengths={"mean": 40})
"""A simulated GPU 5 times slower than real time: a line takes about 1.4 s, time enough to cancel."""


def upload(client: openai.OpenAI, lines: list) -> str:
    return client.files.create(file=("requests.jsonl", io.BytesIO(jsonl(lines))), purpose="batch").id


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    assert file_id is not None  # a client never has to handle a null file id
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_batch_with_bad_lines_answers_the_rest_and_reports_each_bad_line(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    lines = [
        chat_line("good-1", "What is 2 + 2?"),
        "{not json",
        chat_line("hot", "hi", temperature=9),
        chat_line("good-2", "Name a color.", max_tokens=4),
        chat_line("other-model", "hi", model="gpt-4o"),
        chat_line("good-1", "the same id again"),
        {"custom_id": "plain", "messages": [{"role": "user", "content": "Say hi."}]},
        chat_line("too-long", "word " * 9000),
    ]
    input_id = upload(client, lines)

    created = client.batches.create(
        input_file_id=input_id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"run": "1"}
    )
    batch = wait_for_batch(client, created.id)

    assert created.status == "validating" and created.metadata == {"run": "1"}
    assert batch.status == "completed" and batch.model == "SmolLM2-135M-Instruct"
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (8, 3, 5)
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at and batch.errors is None
    assert (
        batch.usage.output_tokens > 0
        and batch.usage.total_tokens == batch.usage.input_tokens + batch.usage.output_tokens
    )
    results = lines_of(client, batch.output_file_id)
    assert [line["custom_id"] for line in results] == ["good-1", "good-2", "plain"]  # in input order
    assert all(line["response"]["status_code"] == 200 and line["error"] is None for line in results)
    assert results[1]["response"]["body"]["usage"]["completion_tokens"] <= 4
    errors = {line["error"]["line"]: line for line in lines_of(client, batch.error_file_id)}
    codes = {line: error["error"]["code"] for line, error in errors.items()}
    assert codes == {
        2: "invalid_json",
        3: "invalid_request",
        5: "model_mismatch",
        6: "duplicate_custom_id",
        8: "context_length_exceeded",
    }
    assert errors[3]["custom_id"] == "hot" and "temperature must be from 0 to 2" in errors[3]["error"]["message"]


def test_an_embeddings_batch_gives_the_vectors_the_online_endpoint_gives(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    texts = ["Tea.", "A reusable container keeps the model in memory between tasks."]
    lines = [
        {"custom_id": "one", "method": "POST", "url": "/v1/embeddings", "body": {"input": texts[0]}},
        {"custom_id": "empty", "method": "POST", "url": "/v1/embeddings", "body": {"input": ""}},
        {"custom_id": "two", "method": "POST", "url": "/v1/embeddings", "body": {"input": [texts[1], texts[0]]}},
    ]

    input_id = upload(client, lines)
    created = client.batches.create(input_file_id=input_id, endpoint="/v1/embeddings", completion_window="1h")
    batch = wait_for_batch(client, created.id)
    online = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts, encoding_format="float")

    assert batch.status == "completed" and batch.model == "all-MiniLM-L6-v2"
    assert (batch.request_counts.completed, batch.request_counts.failed) == (2, 1)
    results = {line["custom_id"]: line["response"]["body"] for line in lines_of(client, batch.output_file_id)}
    vectors = {name: [item["embedding"] for item in body["data"]] for name, body in results.items()}
    expected = [item.embedding for item in online.data]
    assert np.abs(np.asarray(vectors["one"]) - np.asarray(expected[:1])).max() <= 1e-5
    assert np.abs(np.asarray(vectors["two"]) - np.asarray(expected[::-1])).max() <= 1e-5
    assert results["two"]["object"] == "list" and results["two"]["usage"]["prompt_tokens"] > 2
    [error] = lines_of(client, batch.error_file_id)
    assert error["custom_id"] == "empty" and error["error"]["code"] == "invalid_body"


def test_a_batch_whose_every_line_fails_still_completes_with_files(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    input_id = upload(client, ["{broken", chat_line("bad", "x", max_tokens=0)])

    batch = wait_for_batch(
        client,
        client.batches.create(input_file_id=input_id, endpoint="/v1/chat/completions", completion_window="24h").id,
    )

    assert batch.status == "completed" and batch.request_counts.failed == 2 == batch.request_counts.total
    assert lines_of(client, batch.output_file_id) == []  # an empty file, not a null id
    assert [line["error"]["code"] for line in lines_of(client, batch.error_file_id)] == [
        "invalid_json",
        "invalid_request",
    ]


def test_lines_for_another_endpoint_fail_the_batch_with_a_clear_error(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    embedding_line = {"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"input": "hi"}}
    input_id = upload(client, [chat_line("c", "hi"), embedding_line])

    batch = wait_for_batch(
        client,
        client.batches.create(input_file_id=input_id, endpoint="/v1/chat/completions", completion_window="24h").id,
    )

    assert batch.status == "failed" and batch.failed_at
    [error] = batch.errors.data
    assert (error.code, error.line, error.param) == ("url_mismatch", 2, "url")
    assert "'/v1/embeddings' does not match the batch's endpoint '/v1/chat/completions'" in error.message


def test_files_are_listed_read_and_deleted_and_bad_uploads_refused(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    first, second = upload(client, [chat_line("a", "hi")]), upload(client, [chat_line("b", "hi")])

    listed = client.files.list(purpose="batch", limit=1)
    content = client.files.content(first).text
    deleted = client.files.delete(first)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(first)
    with pytest.raises(openai.BadRequestError) as not_jsonl:
        client.files.create(file=("table.csv", io.BytesIO(b"a,b\n1,2\n")), purpose="batch")
    with pytest.raises(openai.BadRequestError) as wrong_purpose:
        client.files.create(file=("x.jsonl", io.BytesIO(jsonl([chat_line("a", "hi")]))), purpose="fine-tune")

    assert [item.id for item in listed.data] == [second] and listed.has_more
    assert json.loads(content)["custom_id"] == "a" and client.files.retrieve(second).bytes > 0
    assert deleted.deleted and deleted.id == first
    assert not_jsonl.value.code == "invalid_file_format" and wrong_purpose.value.param == "purpose"


def test_batches_are_listed_newest_first_in_pages(start) -> None:
    server = start(*simulated())
    client = server.client()
    input_id = upload(client, [chat_line("a", "hi")])
    ids = [
        client.batches.create(input_file_id=input_id, endpoint="/v1/chat/completions", completion_window="24h").id
        for _ in range(3)
    ]

    first_page = client.batches.list(limit=2)
    second_page = client.batches.list(limit=2, after=first_page.data[-1].id)
    every = [batch.id for batch in client.batches.list(limit=1)]  # the client follows has_more page by page

    assert [batch.id for batch in first_page.data] == ids[::-1][:2] and first_page.has_more
    assert [batch.id for batch in second_page.data] == ids[:1] and not second_page.has_more
    assert every == ids[::-1]


def test_cancel_keeps_the_answered_lines_fails_the_rest_and_is_idempotent(start) -> None:
    server = start(*SLOW_ENGINE, "--batch-chunk-size", "2", "--batch-chunks-in-flight", "1")
    client = server.client()
    input_id = upload(client, [chat_line(f"r{n}", f"question {n}") for n in range(12)])
    batch_id = client.batches.create(
        input_file_id=input_id, endpoint="/v1/chat/completions", completion_window="24h"
    ).id
    wait_for_batch(client, batch_id, until=lambda batch: batch.request_counts.completed >= 2)

    cancelling = client.batches.cancel(batch_id)
    again = client.batches.cancel(batch_id)
    batch = wait_for_batch(client, batch_id)
    after = client.batches.cancel(batch_id)

    assert (
        cancelling.status == "cancelling" and cancelling.cancelling_at and again.status in ("cancelling", "cancelled")
    )
    assert batch.status == after.status == "cancelled" and batch.cancelled_at
    answered = [line["custom_id"] for line in lines_of(client, batch.output_file_id)]
    cancelled = [line["custom_id"] for line in lines_of(client, batch.error_file_id)]
    assert 2 <= len(answered) < 12 and sorted(answered + cancelled, key=lambda c: int(c[1:])) == [
        f"r{n}" for n in range(12)
    ]
    assert {line["error"]["code"] for line in lines_of(client, batch.error_file_id)} == {"batch_cancelled"}
    assert batch.request_counts.completed == len(answered) and batch.request_counts.failed == len(cancelled)
    quick = client.batches.create(
        input_file_id=upload(client, [chat_line("bad", "x", max_tokens=0)]),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    wait_for_batch(client, quick.id)
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a batch with status 'completed'"):
        client.batches.cancel(quick.id)


def test_a_batch_past_its_completion_window_expires_with_what_it_answered(start) -> None:
    server = start(*SLOW_ENGINE, "--batch-chunk-size", "1", "--batch-chunks-in-flight", "1", "--short-windows")
    client = server.client()
    input_id = upload(client, [chat_line(f"r{n}", f"question {n}") for n in range(20)])

    started = time.monotonic()
    batch = wait_for_batch(
        client,
        client.batches.create(input_file_id=input_id, endpoint="/v1/chat/completions", completion_window="3s").id,
    )

    assert batch.status == "expired" and batch.expired_at and time.monotonic() - started < 30
    codes = {line["error"]["code"] for line in lines_of(client, batch.error_file_id)}
    assert codes == {"batch_expired"} and batch.request_counts.completed + batch.request_counts.failed == 20


def test_uploads_over_the_size_limit_are_refused_with_413(start) -> None:
    server = start(*simulated(), "--max-upload-mb", "1")
    big = jsonl([chat_line(f"r{n}", "x" * 1000) for n in range(1500)])  # about 1.6 MiB

    response = httpx.post(
        f"{server.url}/v1/files", files={"file": ("big.jsonl", big)}, data={"purpose": "batch"}, timeout=60
    )

    assert response.status_code == 413 and response.json()["error"]["code"] == "file_too_large"
    assert server.client().files.list().data == []  # nothing half-kept
