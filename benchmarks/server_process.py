"""A server in a process group of its own on 127.0.0.1, ready once its `/health` says so; for benchmarks and tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks._harness import REPO_ROOT

START_TIMEOUT_S = 300.0


def free_port() -> int:
    """A port nothing listens on now, and one a Flyte app may use (Flyte reserves a few)."""
    from flyte.app._app_environment import INVALID_APP_PORTS

    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port not in INVALID_APP_PORTS:
            return port


@dataclass
class ServerProcess:
    """A started server: its process, port and log."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path
    arguments: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        """`kill -9` the server and anything it started."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def metrics(self) -> dict[str, float]:
        """`/metrics` as `{'name{label="value",...}': value}`, labels sorted (`name{}` without labels)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f'{key}="{value}"' for key, value in sorted(sample.labels.items()))
                samples[f"{sample.name}{{{labels}}}"] = sample.value
        return samples

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def start(command: list[str], *, port: int, log: Path, environment: dict[str, str] | None = None) -> ServerProcess:
    """Run `command` (a server listening on `port`) from the repository root, and wait until it is ready.

    Raises:
        AssertionError: It exited, or was not ready within `START_TIMEOUT_S` (its log's tail says why).
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(environment or {})}
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = ServerProcess(process, port, log, command)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited ({process.returncode}):\n{server.log_tail()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    server.stop()
    raise AssertionError(f"the server was not ready within {START_TIMEOUT_S} s:\n{server.log_tail()}")


def our_server(data_dir: Path, *arguments: str, port: int | None = None) -> ServerProcess:
    """`make serve`'s server (`python -m flyteplugins_batcher serve`) on `data_dir`, with more flags."""
    port = port or free_port()
    command = [
        sys.executable,
        "-m",
        "flyteplugins_batcher",
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
    ]
    log = data_dir.parent / f"server-{port}-{time.time_ns()}.log"
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    return start([*command, *arguments], port=port, log=log)


def vllm_server(folder: Path, model: str, *arguments: str, port: int | None = None) -> ServerProcess:
    """vLLM's own OpenAI server (`python -m vllm.entrypoints.openai.api_server`) on 127.0.0.1, with more flags.

    Its `vllm` console script does not start with the CPU build here; the module does.
    """
    port = port or free_port()
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"vllm-server-{port}-{time.time_ns()}.log"
    return start([*command, *arguments], port=port, log=log)
