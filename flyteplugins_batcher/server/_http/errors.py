"""Every failure as the OpenAI API reports it: a status code and `{"error": {"message", "type", "param", "code"}}`.

Clients (the official `openai` package among them) read these bodies to raise their own typed
errors (`BadRequestError`, `NotFoundError`, `RateLimitError`, ...), so nothing leaves the server in
another shape: not FastAPI's validation errors, not a bare 500. A client's mistake is a 4xx naming
it; what the server did not expect is a 500 with a generic message and an error id, whose traceback
goes to the server's log only: no body carries a path, an exception's name or a traceback.
"""

from __future__ import annotations

import logging
import math
import secrets
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from flyteplugins_batcher import BatcherError, BatcherSettings, QueueFullError
from flyteplugins_batcher.batch_api import RequestLineError
from flyteplugins_batcher.server._admission import OnlineOverloadedError
from flyteplugins_batcher.server._state.errors import NotFound, StateError, TooLarge

if TYPE_CHECKING:
    from flyteplugins_batcher.server._service import Service

logger = logging.getLogger("flyteplugins_batcher.server")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error"}

MAX_RETRY_AFTER_S = 60
"""The longest `Retry-After` a 429 gives: the official clients honour one up to a minute, past it they guess."""


class APIError(BatcherError):
    """A request the server answers with an error.

    Args:
        status: The HTTP status.
        message: What went wrong, for a person.
        code: What went wrong, for a program (`model_not_found`, `rate_limit_exceeded`, ...).
        param: The request field at fault, if one is.
        headers: Extra response headers (`Retry-After` on a 429).
        queue_full: The `QueueFullError` behind a 429 (`busy`), which the handler words with the server's numbers.

    Example:
        ```python
        raise APIError(404, f"No such file: {file_id}", code="file_not_found", param="file_id")
        ```
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        queue_full: QueueFullError | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}
        self.queue_full = queue_full

    @property
    def type(self) -> str:
        if self.status == 429:
            return "rate_limit_error"
        return _TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)

    @classmethod
    def from_state(cls, error: StateError) -> APIError:
        """What the state refused, with its status: 404 for what does not exist, 413 for a file too large, else 400."""
        status = 404 if isinstance(error, NotFound) else 413 if isinstance(error, TooLarge) else 400
        return cls(status, error.message, code=error.code, param=error.param)

    @classmethod
    def from_line_error(cls, error: RequestLineError) -> APIError:
        """A request that fails as its batch line would: 400, with the line error's code and the field at fault.

        The request was parsed as a batch line's `body`, whose fields its messages name `body.<field>`;
        a client sent the field itself.
        """
        message = error.message.removeprefix("body.")
        field = message.split(" ", 1)[0].rstrip(":") if error.message.startswith("body.") else None
        return cls(400, message.replace(" body.", " "), code=error.code, param=field)

    @classmethod
    def busy(
        cls, error: QueueFullError, *, drained_per_s: float = 0.0, limits: BatcherSettings | None = None
    ) -> APIError:
        """The queue is full: 429 with `Retry-After`, not an unbounded wait.

        `Retry-After` is the time the waiting records take to leave at the rate records left the
        batcher lately (`drained_per_s`, from `DrainRate`), else the batcher's own estimate; from 1
        to `MAX_RETRY_AFTER_S` seconds. With the batcher's settings (`limits`) the message tells the
        queue from the batch being assembled, whose sum is what waits. The error handler calls it
        again with both, for the batcher the request went to.
        """
        seconds = error.queue_depth / drained_per_s if drained_per_s > 0 else error.retry_after_s
        retry_after = min(MAX_RETRY_AFTER_S, max(1, math.ceil(seconds)))
        message = f"The server is at capacity: {_waiting(error.queue_depth, limits)}; retry after {retry_after} s."
        headers = {"Retry-After": str(retry_after)}
        return cls(429, message, code="rate_limit_exceeded", headers=headers, queue_full=error)

    @classmethod
    def over_target(cls, error: OnlineOverloadedError) -> APIError:
        """Online requests alone are more than the online latency target allows: 429 with its `Retry-After`.

        The message gives the target, the online requests' arrival rate and the rate that meets the target.
        """
        headers = {"Retry-After": str(error.retry_after_s)}
        return cls(429, str(error), code="rate_limit_exceeded", headers=headers)

    @classmethod
    def engine_unavailable(cls, error: BaseException, where: str) -> APIError:
        """The engine failed while it generated (it died, say): 503, with an error id its log has.

        The engine's own message may name paths, devices or its internals: it goes to the log, under
        the error id, and never into the body. The model is loaded again for the next request.
        """
        incident = log_incident(f"{where}: the engine failed", error)
        return cls(503, engine_failed_message(incident), code="engine_unavailable")


def log_incident(what: str, error: BaseException) -> str:
    """Log `error`, its traceback included, under a new error id; the id is what a client is told.

    Returns:
        The error id (12 hex digits).
    """
    incident = secrets.token_hex(6)
    logger.error("%s (error id %s)", what, incident, exc_info=error)
    return incident


def engine_failed_message(incident: str) -> str:
    """What a client is told when the engine failed under its request (no detail of the engine's)."""
    return (
        "The model failed while generating this answer and is being restarted; retry the request "
        f"(error id {incident}; its log has it)."
    )


def _waiting(depth: int, limits: BatcherSettings | None) -> str:
    """Who waits, in the batcher's terms: its queue (`max_queue_size`) waits behind the batch being assembled."""
    if limits is None or limits.max_queue_size <= 0:
        return f"{depth} requests wait for the model"
    assembling = min(depth, limits.max_batch_size)
    queued = depth - assembling
    queue = f"{queued} requests wait in its queue of {limits.max_queue_size}"
    return f"{queue}, behind {assembling} in the batch being assembled"


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error the app can meet in OpenAI's shape."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> JSONResponse:
        service: Service | None = getattr(request.app.state, "service", None)
        if error.queue_full is not None and service is not None:
            batcher = "embeddings" if request.url.path == "/v1/embeddings" else "llm"
            drain = service.metrics.drain.get(batcher)
            limits = service.batcher_settings(batcher)
            error = APIError.busy(error.queue_full, drained_per_s=drain.per_s() if drain else 0.0, limits=limits)
        return error.response()

    @app.exception_handler(StateError)
    async def refused(_request: Request, error: StateError) -> JSONResponse:
        return APIError.from_state(error).response()

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, error: RequestValidationError) -> JSONResponse:
        problems = "; ".join(_validation_message(problem) for problem in error.errors())
        return APIError(400, problems or "invalid request").response()

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, error: HTTPException) -> JSONResponse:
        code = "not_found" if error.status_code == 404 else None
        return APIError(error.status_code, str(error.detail), code=code, headers=error.headers).response()

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        # The traceback goes to the log only: a body never carries a path, an exception's name or its text.
        incident = log_incident(f"{request.method} {request.url.path} failed", error)
        message = f"The server had an error while processing your request (error id {incident}; its log has it)."
        return APIError(500, message, code="server_error").response()


def _validation_message(problem: dict[str, Any]) -> str:
    where = ".".join(str(part) for part in problem.get("loc", ()) if part not in ("body", "query", "path"))
    return f"{where}: {problem.get('msg', 'invalid')}" if where else str(problem.get("msg", "invalid"))
