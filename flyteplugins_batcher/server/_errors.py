"""Every failure as the OpenAI API reports it: a status code and `{"error": {"message", "type", "param", "code"}}`.

Clients (the official `openai` package among them) read these bodies to raise their own typed
errors (`BadRequestError`, `NotFoundError`, `RateLimitError`, ...), so nothing leaves the server in
another shape: not FastAPI's validation errors, not a bare 500.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from flyteplugins_batcher import QueueFullError
from flyteplugins_batcher.batch_api import RequestLineError

logger = logging.getLogger("flyteplugins_batcher.server")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error"}


class APIError(Exception):
    """A request the server answers with an error.

    Args:
        status: The HTTP status.
        message: What went wrong, for a person.
        code: What went wrong, for a program (`model_not_found`, `rate_limit_exceeded`, ...).
        param: The request field at fault, if one is.
        headers: Extra response headers (`Retry-After` on a 429).

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
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}

    @property
    def type(self) -> str:
        if self.status == 429:
            return "rate_limit_error"
        return _TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)

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
    def busy(cls, error: QueueFullError) -> APIError:
        """The queue is full: 429 with `Retry-After`, not an unbounded wait."""
        retry_after = max(1, math.ceil(error.retry_after_s))
        message = f"The server is at capacity ({error.queue_depth} requests wait); retry after {retry_after} s."
        return cls(429, message, code="rate_limit_exceeded", headers={"Retry-After": str(retry_after)})


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error the app can meet in OpenAI's shape."""

    @app.exception_handler(APIError)
    async def api_error(_request: Request, error: APIError) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, error: RequestValidationError) -> JSONResponse:
        problems = "; ".join(_validation_message(problem) for problem in error.errors())
        return APIError(400, problems or "invalid request").response()

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, error: HTTPException) -> JSONResponse:
        code = "not_found" if error.status_code == 404 else None
        return APIError(error.status_code, str(error.detail), code=code).response()

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        logger.exception("%s %s failed", request.method, request.url.path)
        return APIError(500, f"The server failed: {type(error).__name__}: {error}", code="server_error").response()


def _validation_message(problem: dict[str, Any]) -> str:
    where = ".".join(str(part) for part in problem.get("loc", ()) if part not in ("body", "query", "path"))
    return f"{where}: {problem.get('msg', 'invalid')}" if where else str(problem.get("msg", "invalid"))
