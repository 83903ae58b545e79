"""`--batch-executor flyte`: each batch is a real run of the JSONL job (flyte's local runner), and the batch follows it.

The server is real, on the simulated engine, driven over HTTP with the official client: the
batch's status and counts move with the run's journal, cancel and expiry abort the run keeping
what it finished, a killed server's batch is run again with its finished chunks reused, and the
answers are those the in-process executor gives.
"""

from __future__ import annotations

import io
import json
import uuid
from typing import Any

import pytest

from tests.server.conftest import RunningServer, chat_line, jsonl, simulated, wait_for_batch

pytestmark = pytest.mark.slow

ENGINE = [
    *simulated(time_scale=0.2, output_lengths={"mean": 30}),
    "--batch-chunk-size",
    "4",
    "--batch-chunks-in-flight",
    "2",
]
"""Slow enough that 60 lines take several seconds: their counts can be seen moving, and a kill lands mid-run."""

FLYTE = ["--batch-executor", "flyte"]


def create_batch(server: RunningServer, lines: list[Any], window: str = "24h") -> str:
    client = server.client()
    input_id = client.files.create(file=("requests.jsonl", io.BytesIO(jsonl(lines))), purpose="batch").id
    return client.batches.create(input_file_id=input_id, endpoint="/v1/chat/completions", completion_window=window).id


def lines_of(server: RunningServer, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(line) for line in server.client().files.content(file_id).text.splitlines()]


def questions(count: int) -> list[dict[str, Any]]:
    """Lines no earlier run has answered: flyte's local cache, which outlives a test, must not answer them."""
    salt = uuid.uuid4().hex[:8]
    return [chat_line(f"r{n}", f"question {n} ({salt})") for n in range(count)]


def flyte_run(batch: Any) -> dict[str, Any]:
    return (batch.model_extra or {})["flyte_run"]


@pytest.mark.parametrize("local_runs", ["server", "process"])
def test_a_batch_is_a_flyte_run_its_counts_move_with_it_and_its_answers_are_the_in_process_ones(
    start, local_runs: str
) -> None:
    lines = [*questions(40), chat_line("bad", "x", max_tokens=0)]
    server = start(*ENGINE, *FLYTE, "--local-runs", local_runs)
    client = server.client()
    batch_id = create_batch(server, lines)

    seen = wait_for_batch(client, batch_id, until=lambda b: 0 < b.request_counts.completed < 41, timeout_s=180)
    batch = wait_for_batch(client, batch_id, timeout_s=180)

    assert seen.status == "in_progress" and flyte_run(seen)["name"] == f"{batch_id.replace('_', '-')}-1"
    assert flyte_run(seen)["url"] == ""  # a local run has no address, and its folder is not for clients
    assert batch.status == "completed" and flyte_run(batch)["phase"] == "succeeded"
    assert not (server.data_dir / "runs" / batch_id).exists()  # the run's journal and files, once in the batch's
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (41, 40, 1)
    answers = {
        line["custom_id"]: line["response"]["body"]["choices"][0]["message"]["content"]
        for line in lines_of(server, batch.output_file_id)
    }
    assert sorted(answers) == sorted(f"r{n}" for n in range(40))
    [error] = lines_of(server, batch.error_file_id)
    assert error["custom_id"] == "bad" and error["error"]["code"] == "invalid_request"
    assert (
        batch.usage.output_tokens > 0
        and batch.usage.total_tokens == batch.usage.input_tokens + batch.usage.output_tokens
    )

    in_process = start(*ENGINE)
    reference = wait_for_batch(in_process.client(), create_batch(in_process, lines), timeout_s=180)
    expected = {
        line["custom_id"]: line["response"]["body"]["choices"][0]["message"]["content"]
        for line in lines_of(in_process, reference.output_file_id)
    }
    assert answers == expected  # the same job code, the same engine: the same answers


@pytest.mark.parametrize("local_runs", ["server", "process"])
def test_cancel_aborts_the_run_keeps_what_it_finished_and_fails_the_rest(start, local_runs: str) -> None:
    server = start(*ENGINE, *FLYTE, "--local-runs", local_runs)
    client = server.client()
    batch_id = create_batch(server, questions(60))
    wait_for_batch(client, batch_id, until=lambda b: b.request_counts.completed >= 4, timeout_s=180)

    client.batches.cancel(batch_id)
    batch = wait_for_batch(client, batch_id, timeout_s=180)

    assert batch.status == "cancelled" and flyte_run(batch)["phase"] == "aborted"
    answered = [line["custom_id"] for line in lines_of(server, batch.output_file_id)]
    failed = lines_of(server, batch.error_file_id)
    assert 4 <= len(answered) < 60
    assert sorted(answered + [line["custom_id"] for line in failed]) == sorted(f"r{n}" for n in range(60))
    assert {line["error"]["code"] for line in failed} == {"batch_cancelled"}
    assert (batch.request_counts.completed, batch.request_counts.failed) == (len(answered), len(failed))


def test_an_expired_batch_aborts_its_run(start) -> None:
    server = start(*ENGINE, *FLYTE, "--short-windows")
    batch = wait_for_batch(server.client(), create_batch(server, questions(60), window="4s"), timeout_s=120)

    assert batch.status == "expired" and flyte_run(batch)["phase"] == "aborted"
    counts = batch.request_counts
    assert counts.completed + counts.failed == counts.total == 60 and counts.failed > 0
    assert {line["error"]["code"] for line in lines_of(server, batch.error_file_id)} == {"batch_expired"}


@pytest.mark.parametrize("local_runs", ["server", "process"])
def test_a_killed_server_runs_the_batch_again_and_answers_each_line_once(start, local_runs: str) -> None:
    server = start(*ENGINE, *FLYTE, "--local-runs", local_runs)
    batch_id = create_batch(server, questions(60))
    partial = wait_for_batch(server.client(), batch_id, until=lambda b: b.request_counts.completed >= 8, timeout_s=180)

    server.kill()
    restarted = start(*ENGINE, *FLYTE, "--local-runs", local_runs, data_dir=server.data_dir)
    batch = wait_for_batch(restarted.client(), batch_id, timeout_s=240)

    assert partial.request_counts.completed < 60 and flyte_run(partial)["attempt"] == 1
    assert batch.status == "completed" and flyte_run(batch)["attempt"] == 2
    assert (batch.request_counts.completed, batch.request_counts.failed) == (60, 0)
    answered = [line["custom_id"] for line in lines_of(restarted, batch.output_file_id)]
    assert sorted(answered) == sorted(f"r{n}" for n in range(60))  # every line once: none lost, none twice
