"""Two real servers sharing one PostgreSQL and one files folder: one set of batches, served by either.

Each server is its own process on its own port of 127.0.0.1 (`--database-url`, the same
`--data-dir`, a short `--lease-s`), driven over HTTP with the official client. A batch made on one
is the same object on the other; a cancel sent to the one that does not run it stops it; and a
server killed with `kill -9` mid-batch has its batch finished by the other, every line once.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import RunningServer, chat_line, jsonl, simulated, wait_for_batch

pytestmark = pytest.mark.slow

LEASE_S = 2.0
SECRET = "s3cret-pw"
"""A password in the database URL (trust authentication ignores it): no log may show it."""
ENGINE = [
    *simulated(time_scale=0.2, output_lengths={"mean": 30}),
    "--batch-chunk-size",
    "8",
    "--batch-chunks-in-flight",
    "4",
]
"""Slow enough that a batch of a few hundred lines takes many seconds: a kill or a cancel lands mid-batch."""
STABLE = ("id", "object", "endpoint", "model", "input_file_id", "completion_window", "created_at", "expires_at")
"""Fields of a batch that do not change as it runs."""


def replicas(start: Any, tmp_path: Path, database_url: str, count: int = 2) -> list[RunningServer]:
    """`count` servers on one database and one data folder."""
    url = database_url.replace("postgres@", f"postgres:{SECRET}@")
    shared = ["--database-url", url, "--lease-s", str(LEASE_S)]
    return [start(*ENGINE, *shared, data_dir=tmp_path / "shared") for _ in range(count)]


def create_batch(server: RunningServer, count: int) -> str:
    client = server.client()
    lines = [chat_line(f"r{n}", f"question {n}") for n in range(count)]
    input_id = client.files.create(file=("requests.jsonl", io.BytesIO(jsonl(lines))), purpose="batch").id
    return client.batches.create(
        input_file_id=input_id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"k": "v"}
    ).id


def custom_ids(server: RunningServer, file_id: str | None) -> list[str]:
    assert file_id is not None
    return [json.loads(line)["custom_id"] for line in server.client().files.content(file_id).text.splitlines()]


def test_a_batch_made_on_one_server_is_the_same_batch_on_the_other(start, tmp_path: Path, postgres_url: str) -> None:
    first, second = replicas(start, tmp_path, postgres_url)
    batch_id = create_batch(first, 40)

    made, seen = first.client().batches.retrieve(batch_id), second.client().batches.retrieve(batch_id)
    listed = second.client().batches.list().data
    ended = wait_for_batch(second.client(), batch_id)

    assert {key: getattr(seen, key) for key in STABLE} == {key: getattr(made, key) for key in STABLE}
    assert seen.metadata == {"k": "v"} and [batch.id for batch in listed] == [batch_id]
    assert second.client().files.retrieve(made.input_file_id).bytes > 0
    assert ended.status == "completed" and ended.request_counts.completed == 40
    assert custom_ids(second, ended.output_file_id) == [f"r{n}" for n in range(40)]
    assert first.client().batches.retrieve(batch_id).model_dump() == ended.model_dump()
    assert all(SECRET not in server.log.read_text() for server in (first, second))


def test_a_cancel_sent_to_the_other_server_stops_the_batch(start, tmp_path: Path, postgres_url: str) -> None:
    runs, other = replicas(start, tmp_path, postgres_url)
    batch_id = create_batch(runs, 300)
    wait_for_batch(runs.client(), batch_id, until=lambda batch: batch.request_counts.completed >= 16)

    cancelling = other.client().batches.cancel(batch_id)
    batch = wait_for_batch(other.client(), batch_id, timeout_s=60)

    assert cancelling.status == "cancelling" and batch.status == "cancelled"
    counts = batch.request_counts
    assert counts.completed + counts.failed == counts.total == 300 and counts.failed > 0
    answered = custom_ids(other, batch.output_file_id) + custom_ids(other, batch.error_file_id)
    assert sorted(answered) == sorted(f"r{n}" for n in range(300))  # every line once, answered or cancelled
    assert "another server has taken it over" not in runs.log.read_text()  # the owner ended it itself


def test_a_server_killed_mid_batch_has_its_batch_finished_by_the_other(
    start, tmp_path: Path, postgres_url: str
) -> None:
    doomed, survivor = replicas(start, tmp_path, postgres_url)
    batch_id = create_batch(doomed, 300)
    partial = wait_for_batch(doomed.client(), batch_id, until=lambda batch: batch.request_counts.completed >= 48)

    doomed.kill()
    batch = wait_for_batch(survivor.client(), batch_id, timeout_s=180)

    assert partial.status == "in_progress" and partial.request_counts.completed < 300  # killed mid-batch
    assert batch.status == "completed"
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (300, 300, 0)
    answered = custom_ids(survivor, batch.output_file_id) + custom_ids(survivor, batch.error_file_id)
    assert Counter(answered) == Counter(f"r{n}" for n in range(300))  # every custom_id exactly once
    assert custom_ids(survivor, batch.output_file_id) == [f"r{n}" for n in range(300)]  # in input order
    assert "lease had lapsed" in survivor.log.read_text()
