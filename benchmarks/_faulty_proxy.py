"""A proxy in front of an OpenAI-compatible endpoint that answers a share of requests 429 or drops the connection.

The remote engine's tests and its benchmark put it between the engine and a real endpoint (vLLM's server, ours):
`FaultyProxy(upstream, rate_limited=0.3).start()` serves on a free loopback port, in a thread of its own, and
counts what it did. A request it lets through goes to the upstream unchanged, and its answer comes back unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class FaultyProxy:
    """Forwards to `upstream`, but answers `rate_limited` of the requests 429 and drops `dropped` of the connections.

    Attributes:
        upstream: The endpoint's root URL (`http://127.0.0.1:8000`): paths are kept.
        rate_limited: Share of POSTs answered 429 at once (with `Retry-After: retry_after` when that is set).
        dropped: Share of POSTs whose connection is closed with no answer.
        garbage: Share of POSTs answered 200 with a body that is not JSON.
        hang_s: When set, every POST waits this long before anything (an endpoint that hangs).
        seed: The draw's seed, so a run can be repeated.
        seen: What it did: "forwarded", "429", "dropped", "garbage", by count.
    """

    upstream: str
    rate_limited: float = 0.0
    dropped: float = 0.0
    garbage: float = 0.0
    retry_after: str = ""
    hang_s: float = 0.0
    seed: int = 0
    seen: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._draw = random.Random(self.seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    @contextlib.contextmanager
    def running(self) -> Iterator[FaultyProxy]:
        """The proxy for the `with` block."""
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def start(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), name="faulty-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the proxy did not start")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=30)

    async def _serve(self) -> None:
        from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        session = ClientSession(timeout=ClientTimeout(total=None), connector=TCPConnector(limit=0))

        async def handle(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            if request.method == "POST":
                if self.hang_s:
                    await asyncio.sleep(self.hang_s)
                fault = self._fault()
                self.seen[fault] += 1
                if fault == "429":
                    headers = {"Retry-After": self.retry_after} if self.retry_after else {}
                    return web.json_response(
                        {"error": {"message": "rate limited", "code": 429}}, status=429, headers=headers
                    )
                if fault == "dropped":
                    assert request.transport is not None
                    request.transport.abort()
                    return web.Response()
                if fault == "garbage":
                    return web.Response(text="<html>upstream exploded</html>", content_type="text/html")
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
            async with session.request(
                request.method, self.upstream + request.path_qs, data=body, headers=headers
            ) as up:
                payload = await up.read()
                kept = {k: v for k, v in up.headers.items() if k.lower() in ("content-type", "retry-after")}
                return web.Response(body=payload, status=up.status, headers=kept)

        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()
        await session.close()

    def _fault(self) -> str:
        draw = self._draw.random()
        for name, share in (("429", self.rate_limited), ("dropped", self.dropped), ("garbage", self.garbage)):
            if draw < share:
                return name
            draw -= share
        return "forwarded"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
