"""The server's guards and limits without a server: hosts, origins, keys, body types, body limits, the drain rate."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.datastructures import Headers

from flyteplugins_batcher import BatcherSettings, QueueFullError
from flyteplugins_batcher.server import ServerSettings
from flyteplugins_batcher.server._http.errors import APIError, install_error_handlers
from flyteplugins_batcher.server._http.guards import HostGuard, HostPolicy, key_refusal, media_refusal, split_host
from flyteplugins_batcher.server._http.limits import MULTIPART_OVERHEAD, limit_for
from flyteplugins_batcher.server._metrics import DrainRate


def test_a_host_header_splits_into_name_and_port() -> None:
    assert [split_host(host) for host in ("127.0.0.1:8000", "LocalHost", "[::1]:9", "[::1]", "a.b:", "x:y")] == [
        ("127.0.0.1", "8000"),
        ("localhost", ""),
        ("[::1]", "9"),
        ("[::1]", ""),
        ("a.b:", ""),
        ("x:y", ""),
    ]


@pytest.mark.parametrize(
    ("settings", "answered", "refused"),
    [
        (
            ServerSettings(port=8000),
            ["127.0.0.1:8000", "localhost", "[::1]:8000", "LOCALHOST:8000"],
            ["evil.example", "evil.example:8000", "127.0.0.1:8001", "", "127.0.0.1.evil.example"],
        ),
        (ServerSettings(host="10.0.0.5", port=80), ["10.0.0.5", "10.0.0.5:80", "localhost:80"], ["10.0.0.6:80"]),
        (ServerSettings(host="::1", port=80), ["[::1]:80"], ["[::2]:80"]),
        (
            ServerSettings(port=8000, allowed_hosts="gpu-box.lan, proxy.example:443"),
            ["gpu-box.lan", "gpu-box.lan:1234", "proxy.example:443", "127.0.0.1:8000"],
            ["proxy.example", "proxy.example:80", "evil.example"],
        ),
        (ServerSettings(host="0.0.0.0"), ["anything.example", "", "10.1.1.1:31337"], []),
        (ServerSettings(allowed_hosts="*"), ["anything.example:1"], []),
    ],
    ids=["loopback", "bound address", "ipv6", "allowed hosts", "every address", "star"],
)
def test_the_server_answers_its_own_host_names_and_those_it_is_told(
    settings: ServerSettings, answered: list[str], refused: list[str]
) -> None:
    policy = HostPolicy.of(settings)

    assert [host for host in answered if not policy.allows(host)] == []
    assert [host for host in refused if policy.allows(host)] == []


def test_a_foreign_origin_is_refused_unless_named_and_the_servers_own_passes() -> None:
    plain = HostGuard(app=None, settings=ServerSettings(port=8000))  # type: ignore[arg-type]
    named = HostGuard(app=None, settings=ServerSettings(port=8000, cors_origins="https://app.example.com/"))  # type: ignore[arg-type]

    def origin(guard: HostGuard, value: str) -> int | None:
        refusal = guard.refusal(Headers({"host": "127.0.0.1:8000", "origin": value}))
        return refusal.status if refusal is not None else None

    assert origin(plain, "http://127.0.0.1:8000") is None and origin(plain, "https://127.0.0.1:8000") is None
    assert [origin(plain, value) for value in ("http://evil.example", "null", "http://127.0.0.1:8001")] == [403] * 3
    assert origin(named, "https://app.example.com") is None and origin(named, "http://app.example.com") == 403


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (None, 401),
        ("s3cret", 401),
        ("Basic s3cret", 401),
        ("Bearer", 401),
        ("Bearer nope", 401),
        ("Bearer s3cret", None),
        ("bearer  s3cret ", None),
    ],
)
def test_the_key_is_taken_as_bearer_only(header: str | None, status: int | None) -> None:
    headers = Headers({"authorization": header} if header is not None else {})

    refusal = key_refusal("/v1/models", headers, "s3cret")

    assert (refusal.status if refusal else None) == status
    assert key_refusal("/health", Headers({}), "s3cret") is None and key_refusal("/v1/models", headers, "") is None


@pytest.mark.parametrize(
    ("method", "path", "content_type", "status"),
    [
        ("POST", "/v1/chat/completions", "application/json", None),
        ("POST", "/v1/chat/completions", "Application/JSON; charset=UTF-8", None),
        ("POST", "/v1/chat/completions", "application/json; charset=utf-16", 415),
        ("POST", "/v1/completions", "text/plain", 415),
        ("POST", "/v1/embeddings", None, 415),
        ("POST", "/v1/batches", "application/x-www-form-urlencoded", 415),
        ("POST", "/v1/batches", "application/jsonl", 415),
        ("POST", "/v1/files", "multipart/form-data; boundary=x", None),
        ("POST", "/v1/files", "application/json", 415),
        ("POST", "/v1/batches/batch_1/cancel", None, None),
        ("GET", "/v1/models", "text/plain", None),
    ],
)
def test_each_endpoint_takes_its_own_body_type(method: str, path: str, content_type: str | None, status: int) -> None:
    headers = Headers({"content-type": content_type} if content_type else {})

    refusal = media_refusal({"method": method, "path": path}, headers)

    assert (refusal.status if refusal else None) == status


def test_uploads_take_the_upload_limit_and_every_other_body_the_request_limit() -> None:
    settings = ServerSettings(max_upload_mb=3, max_request_mb=2)

    upload = limit_for({"method": "POST", "path": "/v1/files"}, settings)
    chat = limit_for({"method": "POST", "path": "/v1/chat/completions"}, settings)

    assert (upload.max_bytes, upload.code) == (3 * 2**20 + MULTIPART_OVERHEAD, "file_too_large")
    assert (chat.max_bytes, chat.code) == (2 * 2**20, "request_too_large")
    assert chat.refusal().headers == {"Connection": "close"} and "2 MiB" in chat.message
    assert ServerSettings().max_request_bytes == 16 * 2**20


def test_the_drain_rate_counts_the_records_that_left_in_the_recent_window() -> None:
    now = [100.0]
    rate = DrainRate(window_s=10, clock=lambda: now[0])

    now[0] = 102.0
    rate.add(4)
    early = rate.per_s()  # 4 records in the 2 s since it started
    now[0] = 105.5
    rate.add(6)
    full = rate.per_s()
    now[0] = 113.5  # the first records are out of the window
    late = rate.per_s()
    now[0] = 200.0

    assert (early, full, late, rate.per_s()) == (2.0, 10 / 5.5, 0.6, 0.0)


def test_a_429_says_who_waits_and_retries_after_the_queue_drains_at_the_recent_rate() -> None:
    full = QueueFullError("full", queue_depth=6, retry_after_s=30.0)
    limits = BatcherSettings(max_queue_size=4, max_batch_size=2)

    measured = APIError.busy(full, drained_per_s=2.0, limits=limits)
    unmeasured = APIError.busy(full)
    slow = APIError.busy(full, drained_per_s=0.01)

    assert measured.headers == {"Retry-After": "3"} and measured.status == 429
    assert "4 requests wait in its queue of 4, behind 2 in the batch being assembled" in measured.message
    assert unmeasured.headers == {"Retry-After": "30"} and "6 requests wait for the model" in unmeasured.message
    assert slow.headers == {"Retry-After": "60"}  # at most a minute, which the official clients honour


def test_an_unexpected_failure_is_a_500_with_an_error_id_and_nothing_internal(caplog: pytest.LogCaptureFixture) -> None:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom() -> None:
        raise FileNotFoundError("/srv/data/files/file-1")

    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/boom")

    error = response.json()["error"]
    assert response.status_code == 500 and error["code"] == "server_error" and error["type"] == "server_error"
    assert "error id" in error["message"] and "/srv" not in response.text and "FileNotFoundError" not in response.text
    incident = error["message"].split("error id ")[1].split(";")[0]
    assert any(incident in record.getMessage() and record.exc_info for record in caplog.records)  # the log has it
