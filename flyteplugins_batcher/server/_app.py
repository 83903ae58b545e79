"""The FastAPI app: the OpenAI-compatible routes, `/health`, `/metrics`, the optional API key, and the lifespan.

The settings are read when the app starts, not when it is built, so that the app object can be
built at import (as `flyte.app` needs) and still honour `BATCH_SERVE_*` set by whoever starts it.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from flyteplugins_batcher.server import _batch_api_routes, _online
from flyteplugins_batcher.server._errors import APIError, install_error_handlers
from flyteplugins_batcher.server._service import Service
from flyteplugins_batcher.server._settings import ServerSettings

MULTIPART_OVERHEAD = 64 * 1024
"""Room for the multipart framing and the other fields of an upload, beyond the file itself."""


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
    app.include_router(_online.router)
    app.include_router(_batch_api_routes.router)
    app.middleware("http")(_checked_and_counted)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        """200 once the models are loaded and the server answers; 503 before (and when the LLM engine died)."""
        service: Service | None = getattr(request.app.state, "service", None)
        engine = service.inference.engine if service is not None else None
        healthy = service is not None and service.ready and engine is not None and engine.is_healthy
        model = service.inference.served_model if service is not None else ""
        return JSONResponse({"status": "ok" if healthy else "unavailable", "model": model}, 200 if healthy else 503)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        """The Prometheus metrics (see `flyteplugins_batcher.server._metrics`)."""
        body = request.app.state.service.metrics.render()
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


async def _checked_and_counted(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """Refuse what must not be read (`_refusal`), and count each `/v1` request by its outcome.

    `/health` and `/metrics` stay open, for probes and scrapers.
    """
    service: Service | None = getattr(request.app.state, "service", None)
    started = time.perf_counter()
    refusal = _refusal(request, service) if service is not None else None
    response = refusal.response() if refusal is not None else await call_next(request)
    if service is not None and request.url.path.startswith("/v1"):
        endpoint = _endpoint(request)
        service.metrics.request_done(endpoint, response.status_code, time.perf_counter() - started)
    return response


def _refusal(request: Request, service: Service) -> APIError | None:
    """Why a request is refused before it is read: a wrong API key (401), or an upload over the limit (413)."""
    if not _authorized(request, service.settings.api_key):
        return APIError(401, "Incorrect API key provided.", code="invalid_api_key")
    declared = int(request.headers.get("content-length") or 0)
    if request.url.path == "/v1/files" and declared > service.files.max_bytes + MULTIPART_OVERHEAD:
        limit = service.settings.max_upload_mb
        return APIError(413, f"The file is larger than the limit of {limit} MiB.", code="file_too_large")
    return None


def _authorized(request: Request, api_key: str) -> bool:
    if not api_key or not request.url.path.startswith("/v1"):
        return True
    sent = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    return secrets.compare_digest(sent.encode(), api_key.encode())


def _endpoint(request: Request) -> str:
    """The route's path template (`/v1/batches/{batch_id}`), so that ids do not make a label each."""
    route = request.scope.get("route")
    return getattr(route, "path", "unmatched")
