"""A server killed with `kill -9` and started again: every batch resumes, no line is lost or answered twice."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from tests.server.conftest import RunningServer, chat_line, jsonl, simulated, wait_for_batch

pytestmark = pytest.mark.slow

LINES = 60
ENGINE = [
    *simulated(time_scale=0.2, output_lengths={"mean": 30}),
    "--batch-chunk-size",
    "4",
    "--batch-chunks-in-flight",
    "2",
]
"""Slow enough that a batch of LINES takes several seconds: the kill lands mid-batch."""


def create_batch(server: RunningServer, count: int, prefix: str = "r") -> str:
    client = server.client()
    lines = [chat_line(f"{prefix}{n}", f"question {n}") for n in range(count)]
    input_id = client.files.create(file=("requests.jsonl", io.BytesIO(jsonl(lines))), purpose="batch").id
    return client.batches.create(input_file_id=input_id, endpoint="/v1/chat/completions", completion_window="24h").id


def output_ids(server: RunningServer, file_id: str | None) -> list[str]:
    assert file_id is not None
    return [json.loads(line)["custom_id"] for line in server.client().files.content(file_id).text.splitlines()]


def test_a_killed_server_resumes_its_batch_losing_no_line_and_answering_none_twice(start) -> None:
    server = start(*ENGINE)
    batch_id = create_batch(server, LINES)
    partial = wait_for_batch(server.client(), batch_id, until=lambda batch: batch.request_counts.completed >= 20)

    server.kill()
    restarted = start(*ENGINE, data_dir=server.data_dir)
    batch = wait_for_batch(restarted.client(), batch_id, timeout_s=180)

    assert partial.status == "in_progress" and partial.request_counts.completed < LINES  # killed mid-batch
    assert batch.status == "completed"
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (
        LINES,
        LINES,
        0,
    )
    answered = output_ids(restarted, batch.output_file_id)
    assert sorted(answered, key=lambda custom_id: int(custom_id[1:])) == answered  # input order
    assert answered == [f"r{n}" for n in range(LINES)]  # every line once: none lost, none twice
    assert output_ids(restarted, batch.error_file_id) == []


def test_a_batch_cancelling_when_the_server_died_is_cancelled_when_it_restarts(start) -> None:
    slow = [*simulated(time_scale=0.01, output_lengths={"mean": 100}), "--batch-chunk-size", "2"]  # lines take ~1 min
    server = start(*slow, "--batch-chunks-in-flight", "1")
    batch_id = create_batch(server, 6)
    wait_for_batch(server.client(), batch_id, until=lambda batch: batch.status == "in_progress")
    cancelling = server.client().batches.cancel(batch_id)  # its running chunk holds it in `cancelling`

    server.kill()
    restarted = start(*slow, data_dir=server.data_dir)
    batch = wait_for_batch(restarted.client(), batch_id, timeout_s=60)

    assert cancelling.status == "cancelling" and batch.status == "cancelled"
    assert batch.request_counts.completed + batch.request_counts.failed == 6
    assert set(output_ids(restarted, batch.error_file_id)) <= {f"r{n}" for n in range(6)}


def test_a_file_half_written_when_the_server_died_is_removed_and_the_rest_is_kept(start, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = start(*simulated(), data_dir=data_dir)
    kept = server.client().files.create(file=("a.jsonl", io.BytesIO(jsonl([chat_line("a", "hi")]))), purpose="batch")
    server.kill()
    (data_dir / "files" / ".upload-crashed").write_bytes(b'{"custom_id": "half')  # as a kill mid-upload leaves it
    (data_dir / "files" / "file-without-a-row").write_bytes(b"{}")

    restarted = start(*simulated(), data_dir=data_dir)

    assert sorted(path.name for path in (data_dir / "files").iterdir()) == [kept.id]
    assert [item.id for item in restarted.client().files.list().data] == [kept.id]
    assert json.loads(restarted.client().files.content(kept.id).text)["custom_id"] == "a"
