"""A real server in a process of its own (started as `make serve` starts it), driven over HTTP on 127.0.0.1.

The clients are the official `openai` package with `_strict_response_validation=True`, so every
response must match OpenAI's own types. Servers are started with `python -m flyteplugins_batcher serve`,
through flyte's local serving, and stopped (or killed) as a process group. Servers that share one
database get it from `postgres_url`: a new database on a throwaway PostgreSQL (`_postgres.py`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.server_process import ServerProcess, our_server
from tests.server._postgres import PostgresServer, postgres_bin, start_postgres

openai = pytest.importorskip("openai", reason="needs the test extra")


def simulated(**options: Any) -> list[str]:
    """Flags for a server on the simulated engine (no model to load), with its options as engine arguments."""
    return ["--engine", "simulated", "--engine-args", json.dumps(options), "--no-embeddings"]


class RunningServer(ServerProcess):
    """A server process, with the official client and its metrics at hand."""

    @property
    def data_dir(self) -> Path:
        return Path(self.arguments[self.arguments.index("--data-dir") + 1])

    def client(self, **options: Any) -> openai.OpenAI:
        """The official client, as a user builds it, with strict response validation and no retries."""
        settings: dict[str, Any] = {"api_key": "unused", "max_retries": 0, "timeout": 120.0, **options}
        return openai.OpenAI(base_url=f"{self.url}/v1", _strict_response_validation=True, **settings)


def start_server(data_dir: Path, *arguments: str) -> RunningServer:
    """Start a server on `data_dir` and wait until `/health` says it is ready."""
    started = our_server(data_dir, *arguments)
    return RunningServer(started.process, started.port, started.log, started.arguments)


@pytest.fixture(scope="session")
def smollm2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The default server (`make serve`): the bundled SmolLM2 and MiniLM on CPU, short answers for speed."""
    pytest.importorskip("transformers", reason="needs the cpu extra")
    server = start_server(tmp_path_factory.mktemp("serve") / "data", "--max-new-tokens", "16")
    yield server
    server.stop()


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    """Start servers for one test (`start(*flags)`); all are stopped when it ends."""
    started: list[RunningServer] = []

    def start_one(*arguments: str, data_dir: Path | None = None) -> RunningServer:
        server = start_server(data_dir or tmp_path / f"data-{len(started)}", *arguments)
        started.append(server)
        return server

    yield start_one
    for server in started:
        server.stop()


def wait_for_batch(client: openai.OpenAI, batch_id: str, *, until: Any = None, timeout_s: float = 120.0) -> Any:
    """Poll a batch until it has ended (or `until(batch)` holds); fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    ended = ("completed", "failed", "expired", "cancelled")
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if (until or (lambda b: b.status in ended))(batch):
            return batch
        time.sleep(0.1)
    raise AssertionError(f"batch {batch_id} is still {batch.status} after {timeout_s} s: {batch.request_counts}")


def jsonl(lines: list[Any]) -> bytes:
    return "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines).encode() + b"\n"


def chat_line(custom_id: str, text: str, **body: Any) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": text}], **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server on 127.0.0.1 for the session; skipped only where PostgreSQL is not installed."""
    folder = postgres_bin()
    if folder is None:
        pytest.skip("PostgreSQL is not installed (`make test` installs Debian's postgresql package)")
    server = start_postgres(folder)
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres: PostgresServer) -> str:
    """The URL of a new, empty database on the session's PostgreSQL server (`postgresql://...`)."""
    return postgres.new_database()
