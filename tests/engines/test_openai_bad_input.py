"""The remote engine's bad input (issue 43) against a tiny HTTP server in the test: each fails fast, named, no key.

`test_openai_engine.py` covers the same list against our real server (a wrong URL, a refused key, a model it does
not serve, garbage and a hang behind `FaultyProxy`); here are the answers a real server of ours never gives but a
provider or a misconfigured endpoint does: a model list that is garbage or hangs, a base URL without `/v1`, a key
or a model refused per call (with the key echoed back, as OpenAI's "Incorrect API key provided: sk-..." does),
JSON that is not an OpenAI answer. Each fails the load (the run before it starts) or each line at once, never
retried, never hanging, and no message shows the key.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from flyteplugins_batcher.engines import EngineConfigError, GenerationConfig, Request, create_engine
from flyteplugins_batcher.engines._engine_errors import UnknownAdapterError
from flyteplugins_batcher.engines._openai._wire import GarbledAnswerError

KEY = "sk-live-bad-input-0123456789"
"""The key the engine sends: no message may show it, even when the endpoint echoes it back."""

MODELS = {"object": "list", "data": [{"id": "tiny", "object": "model", "max_model_len": 512}]}
SHORT = GenerationConfig(max_new_tokens=4)


@dataclass
class Answer:
    """What the tiny server answers on one path: a status, a body (JSON when not a string), after `delay_s`."""

    status: int = 200
    body: Any = None
    delay_s: float = 0.0


@dataclass
class TinyEndpoint:
    """An HTTP server on a free loopback port that answers each path as told, and counts the calls per path."""

    answers: dict[str, Answer]
    calls: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's spelling
                endpoint._answer(self)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                endpoint._answer(self)

            def log_message(self, *args: Any) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        self.calls[handler.path] += 1
        answer = self.answers.get(handler.path, Answer(404, {"error": {"message": f"no route {handler.path}"}}))
        time.sleep(answer.delay_s)
        body = answer.body if isinstance(answer.body, str) else json.dumps(answer.body)
        payload = body.encode()
        kind = "text/html" if isinstance(answer.body, str) else "application/json"
        try:
            handler.send_response(answer.status)
            handler.send_header("Content-Type", kind)
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting (a hang's test)
            pass


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[TinyEndpoint]:
    """A tiny endpoint that serves `tiny` in its model list; each test sets the other answers. The key is set."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    tiny = TinyEndpoint({"/v1/models": Answer(200, MODELS)})
    thread = threading.Thread(target=tiny.server.serve_forever, daemon=True)
    thread.start()
    yield tiny
    tiny.server.shutdown()
    tiny.server.server_close()


def answer_all(engine: Any, records: list[Any]) -> list[Any]:
    async def go() -> list[Any]:
        async with engine.batcher() as batcher:
            return await batcher.run(records, return_exceptions=True)

    with engine:
        return asyncio.run(go())


def test_a_base_url_without_v1_fails_the_load_asking_for_it(endpoint: TinyEndpoint) -> None:
    with pytest.raises(EngineConfigError, match=r"not an OpenAI-compatible API \(HTTP 404\): does base_url end in /v1"):
        create_engine("openai", base_url=endpoint.url).load()


def test_a_model_list_that_is_garbage_fails_the_load(endpoint: TinyEndpoint) -> None:
    endpoint.answers["/v1/models"] = Answer(200, "<html>welcome to nginx</html>")
    with pytest.raises(EngineConfigError, match=r"answered something that is not an OpenAI model list.*nginx"):
        create_engine("openai", base_url=f"{endpoint.url}/v1").load()


def test_a_model_list_that_hangs_fails_the_load_after_its_timeout(endpoint: TinyEndpoint) -> None:
    endpoint.answers["/v1/models"] = Answer(200, MODELS, delay_s=20)
    started = time.monotonic()
    with pytest.raises(EngineConfigError, match=r"/v1/models did not answer within 0.5 s"):
        create_engine("openai", base_url=f"{endpoint.url}/v1", timeout_s=0.5).load()
    assert time.monotonic() - started < 10


def test_a_refusal_that_echoes_the_key_fails_the_load_without_showing_it(endpoint: TinyEndpoint) -> None:
    endpoint.answers["/v1/models"] = Answer(401, {"error": {"message": f"Incorrect API key provided: {KEY}"}})
    with pytest.raises(EngineConfigError, match=r"refused the key \(HTTP 401\): set OPENAI_API_KEY") as raised:
        create_engine("openai", base_url=f"{endpoint.url}/v1").load()
    assert KEY not in str(raised.value) and "Incorrect API key provided: ***" in str(raised.value)


def test_a_key_refused_per_call_fails_each_line_at_once_without_showing_it(endpoint: TinyEndpoint) -> None:
    # A provider whose model list is public and whose completions want a key it does not accept.
    refused = {"error": {"message": f"Incorrect API key provided: {KEY}", "code": "invalid_api_key"}}
    endpoint.answers["/v1/chat/completions"] = Answer(401, refused)
    engine = create_engine("openai", base_url=f"{endpoint.url}/v1", generation=SHORT)
    outcomes = answer_all(engine, ["one", "two", "three"])
    assert [type(outcome) for outcome in outcomes] == [PermissionError] * 3
    assert "the endpoint refused the key (HTTP 401; OPENAI_API_KEY)" in str(outcomes[0])
    assert all(KEY not in str(outcome) for outcome in outcomes)
    assert endpoint.calls["/v1/chat/completions"] == 3 and engine.retries == 0  # never sent again


def test_a_model_refused_per_call_fails_each_line_naming_it(endpoint: TinyEndpoint) -> None:
    # vLLM's words for an adapter (or model) it does not serve, asked for by a record.
    missing = {"error": {"message": "The model `sql-lora` does not exist.", "type": "NotFoundError", "code": 404}}
    endpoint.answers["/v1/chat/completions"] = Answer(404, missing)
    engine = create_engine("openai", base_url=f"{endpoint.url}/v1", generation=SHORT)
    outcomes = answer_all(
        engine, [Request("one", SHORT, adapter="sql-lora"), Request("two", SHORT, adapter="sql-lora")]
    )
    assert [type(outcome) for outcome in outcomes] == [UnknownAdapterError] * 2
    assert "does not serve the model it asked for" in str(outcomes[0]) and "sql-lora" in str(outcomes[0])
    assert engine.retries == 0


def test_json_that_is_not_an_openai_answer_fails_each_line_at_once(endpoint: TinyEndpoint) -> None:
    endpoint.answers["/v1/chat/completions"] = Answer(200, {"status": "ok", "result": "four"})
    engine = create_engine("openai", base_url=f"{endpoint.url}/v1", generation=SHORT)
    outcomes = answer_all(engine, ["one", "two"])
    assert [type(outcome) for outcome in outcomes] == [GarbledAnswerError] * 2
    assert "is not an OpenAI response (no choices in the answer" in str(outcomes[0])
    assert engine.retries == 0


def test_a_server_error_per_call_is_retried_then_fails_its_line_naming_the_attempts(endpoint: TinyEndpoint) -> None:
    endpoint.answers["/v1/chat/completions"] = Answer(500, {"error": {"message": f"backend down, key {KEY}"}})
    engine = create_engine("openai", base_url=f"{endpoint.url}/v1", generation=SHORT, max_retries=2)
    outcomes = answer_all(engine, ["one"])
    assert isinstance(outcomes[0], ConnectionError)
    assert "HTTP 500" in str(outcomes[0]) and "(after 3 attempts)" in str(outcomes[0])
    assert KEY not in str(outcomes[0]) and endpoint.calls["/v1/chat/completions"] == 3


def test_run_batch_against_a_refusing_endpoint_stops_before_any_line_without_showing_the_key(
    endpoint: TinyEndpoint, tmp_path: Path
) -> None:
    endpoint.answers["/v1/models"] = Answer(401, {"error": {"message": f"Incorrect API key provided: {KEY}"}})
    line = {
        "custom_id": "q0",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "hi"}]},
    }
    requests = tmp_path / "requests.jsonl"
    requests.write_text(json.dumps(line) + "\n")
    command = [
        sys.executable,
        "-m",
        "flyteplugins_batcher",
        "run-batch",
        "-i",
        str(requests),
        "-o",
        str(tmp_path / "o"),
    ]
    command += ["--engine", "openai", "--base-url", f"{endpoint.url}/v1", "--no-resume"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    printed = result.stdout + result.stderr
    assert result.returncode != 0
    assert "refused the key (HTTP 401)" in " ".join(printed.split())
    assert KEY not in printed
    assert endpoint.calls["/v1/chat/completions"] == 0
    written = [path.read_text(errors="ignore") for path in (tmp_path / "o").rglob("*") if path.is_file()]
    assert not any(KEY in text for text in written)
