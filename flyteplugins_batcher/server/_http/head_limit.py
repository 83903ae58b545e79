"""A request's head (its line and headers) bounded: uvicorn's httptools protocol holds a head whole, however large.

uvicorn runs httptools when it is installed, and neither bounds a head: a 200 MB header line
was read whole (the server's memory grew by 400 MB) and answered. `HeadLimitedHttpTools` counts
the bytes that arrive before a request's headers are complete and, past `MAX_HEAD_BYTES`, answers
431 and closes the connection: the parser holds at most the limit and one read more. (uvicorn's
other protocol, h11, bounds a head itself: `h11_max_incomplete_event_size`, which
`BatcherAppEnvironment` sets to the same limit.) Importing this module needs httptools:
`_limits.http_protocol` picks the protocol that is there.
"""

from __future__ import annotations

import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from flyteplugins_batcher.server._settings import MAX_HEAD_BYTES

_REFUSAL = json.dumps(
    {
        "error": {
            "message": f"The request's line and headers are larger than the limit of {MAX_HEAD_BYTES // 1024} KiB.",
            "type": "invalid_request_error",
            "param": None,
            "code": "headers_too_large",
        }
    }
).encode()


class HeadLimitedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol, answering 431 to a request whose head passes `MAX_HEAD_BYTES`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        self._heads = 0  # heads completed on this connection
        self._in_body = False

    def data_received(self, data: bytes) -> None:
        in_head, heads = not self._in_body, self._heads
        super().data_received(data)
        if not in_head or self._heads != heads or self.transport.is_closing():
            return  # the head was complete before this read, or is now (one read may hold a head, a body, more)
        self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD_BYTES:
            self.logger.warning("Refused a request whose head passed %d bytes.", MAX_HEAD_BYTES)
            status = b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            headers = b"content-type: application/json\r\nconnection: close\r\n"
            length = b"content-length: %d\r\n\r\n" % len(_REFUSAL)
            self.transport.write(status + headers + length + _REFUSAL)
            self.transport.close()

    def on_headers_complete(self) -> None:
        self._in_body, self._head_bytes, self._heads = True, 0, self._heads + 1
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_body = False
        super().on_message_complete()
