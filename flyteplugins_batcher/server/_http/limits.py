"""Every request body bounded while it streams: uploads by `max_upload_mb`, every other body by `max_request_mb`.

A limit checked once the body is read comes too late: the server has already held it (a 400 MB
JSON body once cost a gigabyte of memory) or spooled it to disk (a chunked upload, which declares
no length, was read to its end before the 413). `BodyLimit` wraps the app's `receive` and counts
each request's bytes as they arrive, with or without `Content-Length`: a declared length over the
limit is refused before a byte is read, and a body that passes the limit stops being read there.
The app never sees more than the limit, so neither memory nor the multipart parser's spool file
(python-multipart through Starlette spools a file part to a temporary file past 1 MiB) ever holds
more. The 413 closes the connection (`Connection: close`), so the client stops sending the rest.
A request's head (its line and headers) is bounded below the app, in uvicorn's protocol
(`http_protocol`, `_head_limit`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flyteplugins_batcher.server._http.errors import APIError
from flyteplugins_batcher.server._settings import ServerSettings

MULTIPART_OVERHEAD = 64 * 1024
"""Space for the multipart framing and the other fields of an upload, beyond the file itself."""


UPLOAD_PATH = "/v1/files"


@dataclass(frozen=True)
class Limit:
    """A request's largest body, and what the 413 says when it is passed."""

    max_bytes: int
    message: str
    code: str

    def refusal(self) -> APIError:
        return APIError(413, self.message, code=self.code, headers={"Connection": "close"})


def limit_for(scope: Scope, settings: ServerSettings) -> Limit:
    """A body's limit: the upload limit (and the multipart framing) for `POST /v1/files`, else the request limit."""
    if scope["method"] == "POST" and scope["path"] == UPLOAD_PATH:
        message = f"The file is larger than the limit of {settings.max_upload_mb} MiB."
        return Limit(settings.max_upload_bytes + MULTIPART_OVERHEAD, message, "file_too_large")
    message = f"The request body is larger than the limit of {settings.max_request_mb} MiB."
    return Limit(settings.max_request_bytes, message, "request_too_large")


def http_protocol() -> type[asyncio.Protocol] | str:
    """The HTTP protocol for uvicorn: httptools' with each request's head bounded, else h11 (which bounds its own).

    Pass `h11_max_incomplete_event_size=MAX_HEAD_BYTES` too, for the h11 case.
    """
    try:
        from flyteplugins_batcher.server._http.head_limit import HeadLimitedHttpTools
    except ImportError:  # no httptools: uvicorn's h11 protocol bounds a head itself
        return "h11"
    return HeadLimitedHttpTools


class BodyLimit:
    """ASGI middleware: bound every request's body as it arrives (see the module notes).

    Args:
        app: The app it guards.
        settings: The limits.
    """

    def __init__(self, app: ASGIApp, settings: ServerSettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = limit_for(scope, self.settings)
        declared = _declared_length(scope)
        if declared is not None and declared > limit.max_bytes:
            await limit.refusal().response()(scope, receive, send)  # refused unread
            return
        stream = _CountedStream(limit, receive, send)
        try:
            await self.app(scope, stream.receive, stream.send)
        except Exception:
            if not stream.over:
                raise
            # Past the limit, whatever the app made of the 413 `receive` raised is replaced by the 413 itself.
        if stream.over and not stream.started:
            await limit.refusal().response()(scope, receive, send)


class _CountedStream:
    """One request's `receive` and `send`: bytes counted, and the app's answer dropped once the limit is passed.

    Past the limit, `receive` raises the limit's refusal (an `APIError` 413) to the app.
    """

    def __init__(self, limit: Limit, receive: Receive, send: Send) -> None:
        self.limit = limit
        self.read = 0
        self.over = False
        self.started = False
        self._receive = receive
        self._send = send

    async def receive(self) -> Message:
        if self.over:
            raise self.limit.refusal()
        message = await self._receive()
        if message["type"] == "http.request":
            self.read += len(message.get("body", b""))
            if self.read > self.limit.max_bytes:
                self.over = True
                raise self.limit.refusal()
        return message

    async def send(self, message: Message) -> None:
        if self.over and not self.started:
            return  # the app's answer to the error it met; BodyLimit sends the 413 instead
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


def _declared_length(scope: Scope) -> int | None:
    """The request's `Content-Length`, if it sends one that is a number (one of 19 digits or more: "too large")."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit():
            return int(value) if len(value) < 19 else 10**18
    return None
