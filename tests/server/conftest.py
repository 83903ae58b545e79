"""A real server in a process of its own (started as `make serve` starts it), driven over HTTP on 127.0.0.1.

The clients are the official `openai` package with `_strict_response_validation=True`, so every
response must match OpenAI's own types. Servers are started with `python -m workflows.serve_cli`,
through flyte's local serving, and stopped (or killed) as a process group.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

openai = pytest.importorskip("openai", reason="needs the test extra")

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 300.0


def simulated(**options: Any) -> list[str]:
    """Flags for a server on the simulated engine (no model to load), with its options as engine arguments."""
    return ["--engine", "simulated", "--engine-args", json.dumps(options), "--no-embeddings"]


@dataclass
class RunningServer:
    """A server process: its address, data folder and log."""

    process: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    log: Path
    arguments: list[str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **options: Any) -> openai.OpenAI:
        """The official client, as a user builds it, with strict response validation and no retries."""
        settings: dict[str, Any] = {"api_key": "unused", "max_retries": 0, "timeout": 120.0, **options}
        return openai.OpenAI(base_url=f"{self.url}/v1", _strict_response_validation=True, **settings)

    def metrics(self) -> dict[str, float]:
        """`/metrics` as `{sample name{labels}: value}`."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f'{key}="{value}"' for key, value in sorted(sample.labels.items()))
                samples[f"{sample.name}{{{labels}}}"] = sample.value
        return samples

    def kill(self) -> None:
        """`kill -9` the server (and anything it started)."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(data_dir: Path, *arguments: str, port: int | None = None) -> RunningServer:
    """Start a server on `data_dir` and wait until `/health` says it is ready."""
    port = port or free_port()
    log = data_dir.parent / f"server-{port}-{time.time_ns()}.log"
    command = [sys.executable, "-m", "workflows.serve_cli", "--port", str(port), "--data-dir", str(data_dir)]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, *arguments],
            cwd=REPO_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,
        )
    server = RunningServer(process, port, data_dir, log, list(arguments))
    _wait_until_ready(server)
    return server


def _wait_until_ready(server: RunningServer) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise AssertionError(f"the server exited ({server.process.returncode}):\n{_tail(server.log)}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    server.stop()
    raise AssertionError(f"the server was not ready within {START_TIMEOUT_S} s:\n{_tail(server.log)}")


def _tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


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
