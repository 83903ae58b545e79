"""The FastAPI app: the OpenAI-compatible routes, `/health`, `/metrics`, the layers before them, the lifespan.

The settings are read when the app starts, not when it is built, so that the app object can be
built at import (as `flyte.app` needs) and still honour `BATCH_SERVE_*` set by whoever starts it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flyteplugins_batcher.server._http import batch_routes, online
from flyteplugins_batcher.server._http.errors import install_error_handlers
from flyteplugins_batcher.server._http.guards import AccessGuard, HostGuard, cors, is_api_path
from flyteplugins_batcher.server._http.limits import BodyLimit
from flyteplugins_batcher.server._metrics import ServerMetrics
from flyteplugins_batcher.server._service import Service
from flyteplugins_batcher.server._settings import ServerSettings


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    """The server's app; `settings=None` reads them from the environment when the app starts.

    Example:
        ```python
        app = create_app(ServerSettings(engine=EngineSettings(engine="simulated"), embeddings=False))
        uvicorn.run(app, host="127.0.0.1", port=8000)
        ```
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = Service(settings or ServerSettings.from_environment())
        app.state.service = service
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(title="flyteplugins-batcher: OpenAI-compatible batch inference", lifespan=lifespan)
    install_error_handlers(app)
    app.include_router(online.router)
    app.include_router(online.pooling_router)
    app.include_router(batch_routes.router)
    app.add_middleware(ServerLayers)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        """200 once the models are loaded and the server answers; 503 before (and when the LLM engine died). A server
        whose model is a classifier has no LLM: it is healthy once the classifier is loaded."""
        service: Service | None = getattr(request.app.state, "service", None)
        engine = service.inference.engine if service is not None else None
        llm_healthy = engine is not None and engine.is_healthy
        healthy = service is not None and service.ready and (llm_healthy or service.inference.classifier is not None)
        model = service.inference.served_model if service is not None else ""
        return JSONResponse({"status": "ok" if healthy else "unavailable", "model": model}, 200 if healthy else 503)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        """The Prometheus metrics (see `flyteplugins_batcher.server._metrics`)."""
        body = request.app.state.service.metrics.render()
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


class ServerLayers:
    """ASGI middleware: the layers every HTTP request passes before the routes, outermost first.

    `RequestCounter` (every `/v1` request counted by outcome, refusals included), `HostGuard` (400
    for a `Host` not answered, 403 for a foreign `Origin`), `cors` (with `cors_origins` only),
    `AccessGuard` (401 without the API key, 415 for a body of the wrong type), `BodyLimit` (413 past
    the size limits, as the body arrives). They are built from the settings the service started
    with, on its first request (the app is built before the settings are read).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._built: tuple[Service, ASGIApp] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        service: Service | None = getattr(scope["app"].state, "service", None) if scope["type"] == "http" else None
        if service is None:
            await self.app(scope, receive, send)
            return
        if self._built is None or self._built[0] is not service:
            self._built = (service, self._layers(service))
        await self._built[1](scope, receive, send)

    def _layers(self, service: Service) -> ASGIApp:
        settings = service.settings
        inner = AccessGuard(BodyLimit(self.app, settings), settings)
        return RequestCounter(HostGuard(cors(inner, settings), settings), service.metrics)


class RequestCounter:
    """ASGI middleware: count each `/v1` request by its route and outcome, and time it to its response's start.

    Args:
        app: The app whose requests it counts.
        metrics: Where they are counted.
    """

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_api_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.request_done(_endpoint(scope), message["status"], time.perf_counter() - started)
            await send(message)

        await self.app(scope, receive, counted)


def _endpoint(scope: Scope) -> str:
    """The route's path template (`/v1/batches/{batch_id}`), so that ids do not make a label each.

    A request refused before routing (by a guard) is labelled with the route it asked for too.
    """
    route = scope.get("route")
    if route is None:
        for candidate in scope["app"].router.routes:
            if candidate.matches(scope)[0] is not Match.NONE:
                route = candidate
                break
    return getattr(route, "path", "unmatched")
