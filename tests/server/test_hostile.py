"""The server under hostile and careless clients, over real HTTP on 127.0.0.1.

Every refusal is a 4xx in OpenAI's error shape that names the problem, and no body carries an
internal: a filesystem path, an exception's name, a traceback. Bodies and heads are bounded as
they arrive (the 413 comes before the body is sent, and the server's memory stays flat), a web
page cannot drive the server (Host, Origin, content types), and the signals are right (a refused
request costs nothing in the metrics, a 429 gives the queue's real numbers).
"""

from __future__ import annotations

import io
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import RunningServer, chat_line, jsonl, simulated, start_server, wait_for_batch

pytestmark = pytest.mark.slow

KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON = {**AUTH, "Content-Type": "application/json"}
CAPS = ["--max-request-mb", "1", "--max-upload-mb", "1"]
"""Limits set low, so that a body a few times over them is sent in well under a second."""

OVER = 64
"""MiB sent at a limit of 1 MiB: the answer must come long before they are all sent."""

LEAKS = ("Traceback", "Error:", "Exception", 'File "', "/tmp", "/work", "/home", "/usr", "site-packages")
"""What no body may hold: a path, an exception's name, a traceback."""

HELLO = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the refusals that change nothing: the simulated engine, an API key, limits of 1 MiB."""
    running = start_server(tmp_path_factory.mktemp("hostile") / "data", *simulated(), *CAPS, "--api-key", KEY)
    yield running
    running.stop()


def clean(text: str, server: RunningServer) -> None:
    """No path, exception name or traceback in a body."""
    found = [leak for leak in (*LEAKS, str(server.data_dir)) if leak in text]
    assert found == [], text


def refused(response: httpx.Response, status: int, server: RunningServer, *, says: str = "") -> dict[str, Any]:
    """The error of a refusal: `status`, in OpenAI's shape, saying `says`, with nothing internal."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    assert error["type"] == ("authentication_error" if status == 401 else "invalid_request_error")
    assert says in error["message"], error
    clean(response.text, server)
    return error


def chat(**fields: Any) -> dict[str, Any]:
    return {"json": {"model": "simulated", "messages": HELLO, **fields}, "headers": AUTH}


def raw(body: bytes, content_type: str = "application/json") -> dict[str, Any]:
    return {"content": body, "headers": {**AUTH, "Content-Type": content_type}}


CASES: list[tuple[str, str, str, dict[str, Any], int, str | None, str]] = [
    # (name, method, path, request, status, param, what the message says)
    ("put chat", "PUT", "/v1/chat/completions", {"headers": AUTH}, 405, None, "Method Not Allowed"),
    ("get chat", "GET", "/v1/chat/completions", {"headers": AUTH}, 405, None, "Method Not Allowed"),
    ("delete models", "DELETE", "/v1/models", {"headers": AUTH}, 405, None, "Method Not Allowed"),
    ("patch batches", "PATCH", "/v1/batches", {"headers": AUTH}, 405, None, "Method Not Allowed"),
    ("text/plain", "POST", "/v1/chat/completions", raw(b"{}", "text/plain"), 415, None, "application/json"),
    ("form", "POST", "/v1/batches", raw(b"a=b", "application/x-www-form-urlencoded"), 415, None, "application/json"),
    ("no type", "POST", "/v1/completions", {"content": b"{}", "headers": AUTH}, 415, None, "got none"),
    ("latin-1", "POST", "/v1/chat/completions", raw(b"{}", "application/json; charset=latin-1"), 415, None, "UTF-8"),
    ("json upload", "POST", "/v1/files", raw(b"{}"), 415, None, "multipart/form-data"),
    ("empty", "POST", "/v1/chat/completions", raw(b""), 400, None, "Expecting value"),
    ("not json", "POST", "/v1/chat/completions", raw(b"{not json"), 400, None, "not valid JSON"),
    ("array", "POST", "/v1/completions", raw(b"[1, 2]"), 400, None, "must be a JSON object"),
    ("null", "POST", "/v1/batches", raw(b"null"), 400, None, "must be a JSON object"),
    ("deep", "POST", "/v1/chat/completions", raw(b"[" * 100_000 + b"]" * 100_000), 400, None, "deeper than 64"),
    ("deep 65", "POST", "/v1/batches", raw(b'{"a": ' + b"[" * 65 + b"]" * 65 + b"}"), 400, None, "deeper than 64"),
    ("NaN", "POST", "/v1/chat/completions", raw(b'{"temperature": NaN}'), 400, None, "NaN is not a JSON value"),
    ("Infinity", "POST", "/v1/completions", raw(b'{"top_p": -Infinity}'), 400, None, "-Infinity is not"),
    ("1e999", "POST", "/v1/chat/completions", raw(b'{"temperature": 1e999}'), 400, None, "out of range"),
    ("digits", "POST", "/v1/chat/completions", raw(b'{"seed": ' + b"9" * 5000 + b"}"), 400, None, "5000 digits"),
    ("utf-8", "POST", "/v1/chat/completions", raw(b'{"model": "\xff\xfe"}'), 400, None, "not valid UTF-8"),
    ("surrogate", "POST", "/v1/completions", raw(b'{"prompt": "\\ud800"}'), 400, None, "lone UTF-16 surrogate"),
    ("model type", "POST", "/v1/chat/completions", chat(model=5), 400, "model", "must be a string"),
    ("other model", "POST", "/v1/chat/completions", chat(model="gpt-4o"), 404, "model", "does not exist"),
    ("messages type", "POST", "/v1/chat/completions", chat(messages="hi"), 400, "messages", "non-empty list"),
    ("no messages", "POST", "/v1/chat/completions", chat(messages=[]), 400, "messages", "non-empty list"),
    ("no content", "POST", "/v1/chat/completions", chat(messages=[{"role": "user"}]), 400, "messages[0]", "text"),
    ("role type", "POST", "/v1/chat/completions", chat(messages=[{"role": 5, "content": "x"}]), 400, None, "role"),
    ("role", "POST", "/v1/chat/completions", chat(messages=[{"role": "hacker", "content": "x"}]), 400, None, "hacker"),
    (
        "content type",
        "POST",
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": 5}]),
        400,
        None,
        "text",
    ),
    ("max_tokens text", "POST", "/v1/chat/completions", chat(max_tokens="5"), 400, "max_tokens", "integer"),
    ("max_tokens -1", "POST", "/v1/chat/completions", chat(max_tokens=-1), 400, "max_tokens", ">= 1"),
    ("max_tokens 2^63", "POST", "/v1/chat/completions", chat(max_tokens=2**63), 400, "max_tokens", ">= 1"),
    ("max_tokens huge", "POST", "/v1/chat/completions", chat(max_tokens=2**63 - 1), 400, "max_tokens", "context"),
    ("max_completion", "POST", "/v1/chat/completions", chat(max_completion_tokens=True), 400, None, "integer"),
    ("temperature", "POST", "/v1/chat/completions", chat(temperature="hot"), 400, "temperature", "number"),
    ("temperature 3", "POST", "/v1/chat/completions", chat(temperature=3), 400, "temperature", "0 to 2"),
    ("top_p", "POST", "/v1/chat/completions", chat(top_p=-0.5), 400, "top_p", "0 to 1"),
    ("n", "POST", "/v1/chat/completions", chat(n=10**6), 400, "n", "from 1 to"),
    ("seed", "POST", "/v1/chat/completions", chat(seed=2**70), 400, "seed", "64-bit"),
    ("stop", "POST", "/v1/chat/completions", chat(stop=["a"] * 5), 400, "stop", "at most 4"),
    ("stop type", "POST", "/v1/chat/completions", chat(stop=5), 400, "stop", "string"),
    ("format", "POST", "/v1/chat/completions", chat(response_format="json"), 400, "response_format", "object"),
    ("format type", "POST", "/v1/chat/completions", chat(response_format={"type": "xml"}), 400, None, "one of"),
    ("stream yes", "POST", "/v1/chat/completions", chat(stream="yes"), 400, "stream", "true or false"),
    ("stream 1", "POST", "/v1/chat/completions", chat(stream=1), 400, "stream", "true or false"),
    ("options", "POST", "/v1/chat/completions", chat(stream_options="x"), 400, "stream_options", "object"),
    ("usage", "POST", "/v1/chat/completions", chat(stream_options={"include_usage": "yes"}), 400, None, "true or"),
    ("logprobs", "POST", "/v1/chat/completions", chat(logprobs="yes"), 400, "logprobs", "true or false"),
    ("prompt list", "POST", "/v1/completions", {"json": {"prompt": ["a", "b"]}, "headers": AUTH}, 400, None, "string"),
    ("no prompt", "POST", "/v1/completions", {"json": {"max_tokens": 3}, "headers": AUTH}, 400, None, "prompt"),
    ("embeddings", "POST", "/v1/embeddings", {"json": {"input": 5}, "headers": AUTH}, 404, "model", "embeddings"),
    ("empty batch", "POST", "/v1/batches", {"json": {}, "headers": AUTH}, 400, "input_file_id", "is required"),
    ("unknown field", "POST", "/v1/batches", {"json": {"x": 1}, "headers": AUTH}, 400, "x", "Unrecognized"),
    ("file id type", "POST", "/v1/batches", {"json": {"input_file_id": 5}, "headers": AUTH}, 400, "input_file_id", ""),
    ("models path", "GET", "/v1/models/..%2F..%2Fsecret", {"headers": AUTH}, 404, "model", "does not exist"),
    ("file path", "GET", "/v1/files/..%2F..%2Fetc%2Fpasswd/content", {"headers": AUTH}, 404, None, "Not Found"),
    ("file id", "GET", "/v1/files/file-nope", {"headers": AUTH}, 404, "file_id", "No such File object: file-nope"),
    ("file dots", "GET", "/v1/files/...", {"headers": AUTH}, 404, "file_id", "No such File object"),
    ("delete file", "DELETE", "/v1/files/file-nope", {"headers": AUTH}, 404, "file_id", "No such File object"),
    ("batch id", "GET", "/v1/batches/batch_nope", {"headers": AUTH}, 404, "batch_id", "No such batch"),
    ("batch path", "GET", "/v1/batches/..%2Fserver.db", {"headers": AUTH}, 404, None, "Not Found"),
    ("cancel", "POST", "/v1/batches/batch_nope/cancel", {"headers": AUTH}, 404, "batch_id", "No such batch"),
    ("limit -1", "GET", "/v1/files?limit=-1", {"headers": AUTH}, 400, None, "limit"),
    ("limit text", "GET", "/v1/batches?limit=abc", {"headers": AUTH}, 400, None, "limit"),
    ("limit huge", "GET", "/v1/files?limit=" + "9" * 5000, {"headers": AUTH}, 400, None, "limit"),
    ("order", "GET", "/v1/files?order=sideways", {"headers": AUTH}, 400, None, "order"),
    ("no key", "GET", "/v1/models", {}, 401, None, "Bearer"),
    ("no bearer", "GET", "/v1/models", {"headers": {"Authorization": KEY}}, 401, None, "Bearer"),
    ("basic", "GET", "/v1/files", {"headers": {"Authorization": f"Basic {KEY}"}}, 401, None, "Bearer"),
    ("wrong key", "GET", "/v1/batches", {"headers": {"Authorization": "Bearer nope"}}, 401, None, "Incorrect"),
]


@pytest.mark.parametrize(
    ("name", "method", "path", "request_", "status", "param", "says"), CASES, ids=[c[0] for c in CASES]
)
def test_every_endpoint_refuses_a_bad_request_in_openais_shape_with_nothing_internal(
    server: RunningServer,
    name: str,
    method: str,
    path: str,
    request_: dict[str, Any],
    status: int,
    param: str | None,
    says: str,
) -> None:
    response = httpx.request(method, f"{server.url}{path}", timeout=30, **request_)

    error = refused(response, status, server, says=says)
    if param is not None:
        assert error["param"] == param, error


@pytest.mark.parametrize(
    "window", ["24h\n", "\u0662\u0664h", "99999999999999999999h", "9" * 5000 + "h", "0h", "169h", "90m", 24, None]
)
def test_a_completion_window_is_openais_form_within_a_week(server: RunningServer, window: object) -> None:
    input_id = upload(server, jsonl([chat_line("a", "hi")]))
    body = {"input_file_id": input_id, "endpoint": "/v1/chat/completions", "completion_window": window}

    response = httpx.post(f"{server.url}/v1/batches", json=body, headers=AUTH, timeout=30)

    error = refused(response, 400, server, says="completion_window")
    assert error["param"] == "completion_window" and len(error["message"]) < 200


@pytest.mark.parametrize(
    ("metadata", "says"),
    [("x", "at most 16 pairs"), ({"k": 5}, "string values"), ({"k" * 65: "v"}, "keys up to 64"), ({"k": []}, "")],
)
def test_batch_metadata_is_checked(server: RunningServer, metadata: object, says: str) -> None:
    input_id = upload(server, jsonl([chat_line("a", "hi")]))
    body = {"input_file_id": input_id, "endpoint": "/v1/completions", "completion_window": "24h", "metadata": metadata}

    error = refused(httpx.post(f"{server.url}/v1/batches", json=body, headers=AUTH, timeout=30), 400, server, says=says)

    assert error["param"] == "metadata"


def upload(server: RunningServer, content: bytes, purpose: str = "batch") -> str:
    response = httpx.post(
        f"{server.url}/v1/files",
        files={"file": ("in.jsonl", content)},
        data={"purpose": purpose},
        headers=AUTH,
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.json()["id"]


def test_bad_uploads_are_refused_and_a_deep_line_is_no_500(server: RunningServer) -> None:
    url, good = f"{server.url}/v1/files", jsonl([chat_line("a", "hi")])

    wrong_purpose = httpx.post(url, files={"file": ("a.jsonl", good)}, data={"purpose": "fine-tune"}, headers=AUTH)
    no_purpose = httpx.post(url, files={"file": ("a.jsonl", good)}, headers=AUTH)
    no_file = httpx.post(url, data={"purpose": "batch"}, files={"other": ("a", b"x")}, headers=AUTH)
    deep = httpx.post(url, files={"file": ("a.jsonl", b"[" * 100_000 + b"\n")}, data={"purpose": "batch"}, headers=AUTH)
    digits = httpx.post(
        url, files={"file": ("a.jsonl", b'{"n": ' + b"9" * 5000 + b"}\n")}, data={"purpose": "batch"}, headers=AUTH
    )

    assert refused(wrong_purpose, 400, server, says="purpose must be one of ['batch']")["param"] == "purpose"
    refused(no_purpose, 400, server, says="purpose")
    refused(no_file, 400, server, says="file")
    assert refused(deep, 400, server, says="no line is a JSON object")["code"] == "invalid_file_format"
    assert refused(digits, 400, server, says="no line is a JSON object")["code"] == "invalid_file_format"


def test_a_file_gone_from_disk_or_deleted_is_a_404_that_names_no_path(server: RunningServer) -> None:
    gone, deleted = upload(server, jsonl([chat_line("a", "hi")])), upload(server, jsonl([chat_line("b", "hi")]))
    (server.data_dir / "files" / gone).unlink()
    assert httpx.delete(f"{server.url}/v1/files/{deleted}", headers=AUTH).status_code == 200
    batch = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}

    content = httpx.get(f"{server.url}/v1/files/{gone}/content", headers=AUTH)
    over_gone = httpx.post(f"{server.url}/v1/batches", json={**batch, "input_file_id": gone}, headers=AUTH)
    over_deleted = httpx.post(f"{server.url}/v1/batches", json={**batch, "input_file_id": deleted}, headers=AUTH)
    over_path = httpx.post(f"{server.url}/v1/batches", json={**batch, "input_file_id": "../server.db"}, headers=AUTH)

    assert refused(content, 404, server, says=f"The content of file {gone} is missing")["code"] == "file_not_found"
    assert refused(over_gone, 404, server, says="is missing on the server")["param"] == "input_file_id"
    assert refused(over_deleted, 404, server, says=f"No such File object: {deleted}")["param"] == "input_file_id"
    assert refused(over_path, 404, server)["message"] == "No such File object"  # an id like a path is not echoed


def test_batch_lines_fail_alone_with_the_online_messages_and_a_refused_request_costs_nothing(
    server: RunningServer,
) -> None:
    lines = [
        chat_line("good", "hi", max_tokens=4),
        chat_line("role", "hi") | {"body": {"messages": [{"role": "hacker", "content": "x"}]}},
        chat_line("huge", "hi", max_tokens=2**63 - 1),
        chat_line("stream", "hi", stream="yes"),
        '{"custom_id": "deep", "body": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"custom_id": "digits", "n": ' + "9" * 5000 + "}",
        '{"custom_id": "nan", "temperature": NaN}',
    ]
    online = httpx.post(f"{server.url}/v1/chat/completions", **chat(messages=[{"role": "hacker", "content": "x"}]))
    costly = httpx.post(f"{server.url}/v1/chat/completions", **chat(max_tokens=2**63 - 1))
    body = {
        "input_file_id": upload(server, jsonl(lines)),
        "endpoint": "/v1/chat/completions",
        "completion_window": "1h",
    }
    created = httpx.post(f"{server.url}/v1/batches", json=body, headers=AUTH).json()
    batch = wait_for_batch(server.client(api_key=KEY), created["id"])

    errors = {line["error"]["line"]: line["error"] for line in lines_of(server, batch.error_file_id)}
    assert batch.status == "completed" and (batch.request_counts.completed, batch.request_counts.failed) == (1, 6)
    assert errors[2]["message"] == "body." + online.json()["error"]["message"]  # the same parser, the same words
    assert (errors[3]["code"], costly.json()["error"]["code"]) == ("context_length_exceeded",) * 2
    assert errors[4]["code"] == "invalid_request" and "body.stream must be true or false" in errors[4]["message"]
    assert [errors[line]["code"] for line in (5, 6, 7)] == ["invalid_json"] * 3
    assert "deeper than 64" in errors[5]["message"] and "5000 digits" in errors[6]["message"]
    clean(json.dumps(errors), server)
    cost = server.metrics()['batcher_batch_cost_sum{batcher="llm"}']
    assert 0 < cost < 10_000  # only the good line was costed: no 9.2e18 from a request refused later


def test_unknown_fields_of_a_chat_request_are_ignored_as_documented(server: RunningServer) -> None:
    # OpenAI's own optional fields (and engines' extras, as vLLM clients send them) must not break a client.
    # (A known field the engine cannot honour, such as frequency_penalty on the simulated engine, is refused
    # by name instead: tests/server/test_request_fields.py.)
    extra = {"user": "u-1", "top_k": 5, "store": False, "service_tier": "auto", "tools": [], "x": {"y": [1, [2]]}}

    response = httpx.post(f"{server.url}/v1/chat/completions", **chat(max_tokens=2, **extra))

    assert response.status_code == 200 and response.json()["object"] == "chat.completion", response.text


def test_a_known_field_the_engine_cannot_honour_is_refused_by_name_not_ignored(server: RunningServer) -> None:
    response = httpx.post(f"{server.url}/v1/chat/completions", **chat(max_tokens=2, frequency_penalty=0.5))

    error = refused(response, 400, server, says="frequency_penalty cannot be honoured by the simulated engine")
    assert error["type"] == "invalid_request_error"


def lines_of(server: RunningServer, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    text = httpx.get(f"{server.url}/v1/files/{file_id}/content", headers=AUTH).text
    return [json.loads(line) for line in text.splitlines()]


# -- a web page driving the server ------------------------------------------------------------------


def test_a_foreign_host_or_origin_is_refused_and_changes_nothing(server: RunningServer) -> None:
    before = httpx.get(f"{server.url}/v1/batches", headers=AUTH).json()["data"]
    evil = {"Origin": "http://evil.example"}
    body = json.dumps({"model": "simulated", "messages": HELLO}).encode()

    simple_post = httpx.post(
        f"{server.url}/v1/chat/completions", content=body, headers={**AUTH, **evil, "Content-Type": "text/plain"}
    )
    json_post = httpx.post(f"{server.url}/v1/chat/completions", content=body, headers={**JSON, **evil})
    rebound = [
        httpx.get(f"{server.url}{path}", headers={**AUTH, "Host": host})
        for path in ("/v1/models", "/health", "/metrics")
        for host in ("evil.example", f"evil.example:{server.port}", "127.0.0.1:1")
    ]
    own = [
        httpx.get(f"{server.url}/health", headers={"Host": host})
        for host in ("localhost", f"localhost:{server.port}", f"[::1]:{server.port}", "127.0.0.1")
    ]
    same_origin = httpx.get(f"{server.url}/v1/models", headers={**AUTH, "Origin": server.url})

    refused(simple_post, 403, server, says="'http://evil.example' are not allowed")
    assert refused(json_post, 403, server)["code"] == "origin_not_allowed"
    assert all(
        refused(response, 400, server, says="does not answer the host")["code"] == "invalid_host"
        for response in rebound
    )
    assert [response.status_code for response in own] == [200] * 4 and same_origin.status_code == 200
    assert httpx.get(f"{server.url}/v1/batches", headers=AUTH).json()["data"] == before


def test_allowed_hosts_and_cors_origins_open_the_server_to_those_only(start) -> None:
    server = start(
        *simulated(), "--allowed-hosts", "gpu-box.lan, 10.1.2.3:443", "--cors-origins", "https://app.example.com"
    )
    app, evil = {"Origin": "https://app.example.com"}, {"Origin": "https://evil.example"}
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type,authorization"}

    hosts = [
        httpx.get(f"{server.url}/v1/models", headers={"Host": host}).status_code
        for host in ("gpu-box.lan:8080", "10.1.2.3:443", "10.1.2.3:80")
    ]
    preflight = httpx.options(f"{server.url}/v1/chat/completions", headers={**app, **ask})
    answer = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2}, headers=app)
    foreign = httpx.options(f"{server.url}/v1/chat/completions", headers={**evil, **ask})

    assert hosts == [200, 200, 400]
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == app["Origin"]
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == app["Origin"]
    refused(foreign, 403, server, says="--cors-origins")


# -- bodies and heads bounded as they arrive --------------------------------------------------------


def vm_rss_mib(pid: int) -> float:
    """The process's resident memory, as `/proc/<pid>/status` says (VmRSS, in kB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def peak_rss_during(pid: int, action: Callable[[], Any]) -> tuple[float, Any]:
    """The process's peak resident memory (MiB, sampled every 10 ms) while `action` runs, and what it returned."""
    peak, done = [vm_rss_mib(pid)], threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak[0] = max(peak[0], vm_rss_mib(pid))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = action()
    finally:
        done.set()
        sampler.join()
    return peak[0], result


def send_streaming(port: int, head: bytes, pieces: Iterator[bytes], *, limit_s: float = 30.0) -> tuple[int, bytes]:
    """Send a request's head, then its body piece by piece, reading between pieces.

    Returns:
        The body bytes the kernel took before the answer came (or the server closed), and the answer.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=limit_s) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)  # what is "sent" is near what was read
        sock.sendall(head)
        sent, deadline = 0, time.monotonic() + limit_s
        for piece in pieces:
            view = memoryview(piece)
            while view:
                readable, writable, _ = select.select([sock], [sock], [], max(0.0, deadline - time.monotonic()))
                if readable or not writable:
                    return sent, read_answer(sock, deadline)
                try:
                    taken = sock.send(view)
                except OSError:  # closed after its answer
                    return sent, read_answer(sock, deadline)
                view, sent = view[taken:], sent + taken
        return sent, read_answer(sock, deadline)


def read_answer(sock: socket.socket, deadline: float) -> bytes:
    """What the server answered, until it closes the connection (a refusal closes it) or the deadline."""
    sock.settimeout(max(0.1, deadline - time.monotonic()))
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except OSError:
        pass
    return answer


def chunked(pieces: Iterator[bytes]) -> Iterator[bytes]:
    for piece in pieces:
        yield b"%x\r\n%s\r\n" % (len(piece), piece)
    yield b"0\r\n\r\n"


def megabytes(count: int, first: bytes = b"") -> Iterator[bytes]:
    yield first
    for _ in range(count):
        yield b"x" * 2**20


def head(port: int, path: str, content_type: str, length: int | None) -> bytes:
    framing = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Authorization: Bearer {KEY}"]
    return "\r\n".join([*lines, f"Content-Type: {content_type}", framing, "", ""]).encode()


MULTIPART = "multipart/form-data; boundary=b0undary"
PART = b'--b0undary\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--b0undary\r\n'
PART += b'Content-Disposition: form-data; name="file"; filename="big.jsonl"\r\n\r\n'


@pytest.mark.parametrize(
    ("path", "content_type", "first", "code"),
    [
        ("/v1/chat/completions", "application/json", b'{"messages": "', "request_too_large"),
        ("/v1/batches", "application/json", b'{"metadata": "', "request_too_large"),
        ("/v1/files", MULTIPART, PART, "file_too_large"),
    ],
    ids=["chat", "batches", "upload"],
)
@pytest.mark.parametrize("declared", [False, True], ids=["chunked", "content-length"])
def test_a_body_over_its_limit_is_refused_as_it_arrives_and_memory_stays_flat(
    server: RunningServer, path: str, content_type: str, first: bytes, code: str, declared: bool
) -> None:
    size = len(first) + OVER * 2**20
    # With its length declared, nothing of the body is sent: the answer must come for the head alone.
    pieces = iter(()) if declared else chunked(megabytes(OVER, first))
    request_head = head(server.port, path, content_type, size if declared else None)
    before = vm_rss_mib(server.process.pid)

    peak, (sent, answer) = peak_rss_during(
        server.process.pid, lambda: send_streaming(server.port, request_head, pieces)
    )

    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 413") and b"connection: close" in status.lower(), answer[:300]
    assert json.loads(body)["error"]["code"] == code
    assert sent < OVER * 2**20 / 4  # answered long before the body was sent
    assert peak - before < OVER / 4, (before, peak)  # the server never held the body
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert not [path for path in (server.data_dir / "files").iterdir() if path.name.startswith(".upload-")]


def test_a_chunked_upload_under_the_limit_is_kept(server: RunningServer) -> None:
    content = jsonl([chat_line(f"r{n}", "x" * 1000) for n in range(900)])  # about 0.95 MiB, under the 1 MiB limit
    body = PART + content + b"\r\n--b0undary--\r\n"

    response = httpx.post(
        f"{server.url}/v1/files",
        content=(body[start : start + 65536] for start in range(0, len(body), 65536)),  # sent chunked
        headers={**AUTH, "Content-Type": MULTIPART},
        timeout=60,
    )

    assert response.status_code == 200, response.text
    assert response.json()["bytes"] == len(content)


def test_a_huge_head_is_refused_with_431_and_memory_stays_flat(server: RunningServer) -> None:
    request_head = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nX-Big: ".encode()
    before = vm_rss_mib(server.process.pid)

    peak, (sent, answer) = peak_rss_during(
        server.process.pid, lambda: send_streaming(server.port, request_head, megabytes(OVER))
    )

    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "headers_too_large"
    assert sent < OVER * 2**20 / 4 and peak - before < OVER / 4
    assert httpx.get(f"{server.url}/health").status_code == 200


# -- what a client is told ------------------------------------------------------------------------


def test_a_batch_whose_input_vanished_fails_saying_so_without_a_path(start) -> None:
    engine = [*simulated(time_scale=0.2, output_lengths={"mean": 40}), "--batch-chunk-size", "1"]
    server = start(*engine, "--batch-chunks-in-flight", "1")
    client = server.client()
    input_id = client.files.create(
        file=("in.jsonl", io.BytesIO(jsonl([chat_line(f"r{n}", "hi") for n in range(12)]))), purpose="batch"
    ).id
    batch_id = client.batches.create(input_file_id=input_id, endpoint="/v1/chat/completions", completion_window="1h").id
    wait_for_batch(client, batch_id, until=lambda batch: batch.request_counts.completed >= 1)

    server.stop()
    (server.data_dir / "files" / input_id).unlink()
    restarted = start(*engine, data_dir=server.data_dir)
    batch = wait_for_batch(restarted.client(), batch_id)

    assert batch.status == "failed"
    [error] = batch.errors.data
    assert (
        error.code == "file_not_found" and error.message == f"The content of file {input_id} is missing on the server."
    )
    clean(restarted.client().batches.retrieve(batch_id).model_dump_json(), restarted)
