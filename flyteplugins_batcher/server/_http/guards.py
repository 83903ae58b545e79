"""Who may call the server, and how: the `Host` it answers, the web origins it serves, the API key, the body types.

A server on 127.0.0.1 is reachable by every web page its user opens. A page may send a "simple"
cross-origin POST (a `text/plain` or form body, or none) that the browser sends without asking
the server first, and it may rebind its own name to 127.0.0.1 (DNS rebinding) to read the answers.
So, outermost first:

- `HostGuard` answers only the `Host` names the server is bound to: 127.0.0.1, localhost, [::1],
  the bound host, on the bound port (or none), and those of `allowed_hosts` (400 otherwise); a
  0.0.0.0 bind answers any. It refuses a request whose `Origin` is neither the server's own nor
  one of `cors_origins` (403): browsers send `Origin` on every cross-origin request.
- `cors` (only with `cors_origins`): Starlette's `CORSMiddleware` for those origins, so that a
  web app you name may call the API from a browser.
- `AccessGuard`: `Authorization: Bearer <api_key>` on `/v1` when a key is set (401), and the body
  type each endpoint reads: `application/json` (UTF-8) for the JSON endpoints, `multipart/form-data`
  for uploads (415 otherwise). Neither can be sent without a CORS preflight, which a server without
  `cors_origins` never grants.

`/health` and `/metrics` need no key, for probes and scrapers; the `Host` check applies to them too.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from flyteplugins_batcher.batch_api import ENDPOINTS
from flyteplugins_batcher.server._http.errors import APIError
from flyteplugins_batcher.server._settings import ServerSettings

LOCAL_NAMES = ("127.0.0.1", "localhost", "[::1]")
"""Names of this machine that the server always answers (on its port)."""

ANY_ADDRESS = ("0.0.0.0", "::", "[::]")
"""Binds that listen on every address: the server then answers any `Host` (a deployment behind its ingress)."""

JSON_ENDPOINTS = frozenset({*ENDPOINTS, "/v1/batches"})
"""The endpoints whose `POST` body is JSON: every request url of the batch format (vLLM's `/score`, `/rerank`,
`/v2/rerank` and `/classify` among them), and batches."""

UPLOAD_ENDPOINTS = frozenset({"/v1/files"})
"""The endpoints whose `POST` body is `multipart/form-data`."""


def is_api_path(path: str) -> bool:
    """Whether a path is the API's (a key guards it, the metrics count it): `/v1/...`, and vLLM's pooling routes
    outside `/v1` (`/score`, `/rerank`, `/v2/rerank`, `/classify`)."""
    return path.startswith("/v1") or path in ENDPOINTS


def listed(text: str) -> tuple[str, ...]:
    """The entries of a comma-separated setting, trimmed and lowercased, empty ones dropped."""
    return tuple(entry.strip().lower().rstrip("/") for entry in text.split(",") if entry.strip())


def split_host(value: str) -> tuple[str, str]:
    """A `Host` header as its name and port (`""` when none): `[::1]:8000` -> (`[::1]`, `8000`)."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        after = value[end + 1 :] if end > 0 else ""
        return value[: end + 1] if end > 0 else value, after[1:] if after.startswith(":") else ""
    name, colon, port = value.rpartition(":")
    return (name, port) if colon and port.isdigit() else (value, "")


@dataclass(frozen=True)
class HostPolicy:
    """The `Host` headers a server answers, from its bind and `allowed_hosts`."""

    any_host: bool
    port: str
    bound_names: frozenset[str]  # answered without a port or on the bound port
    any_port_names: frozenset[str]  # `allowed_hosts` entries without a port
    host_ports: frozenset[str]  # `allowed_hosts` entries with theirs

    @classmethod
    def of(cls, settings: ServerSettings) -> HostPolicy:
        extra = listed(settings.allowed_hosts)
        bound = settings.host.strip().lower()
        bound = f"[{bound}]" if ":" in bound and not bound.startswith("[") else bound
        with_port = {entry for entry in extra if split_host(entry)[1]}
        return cls(
            any_host="*" in extra or bound in ANY_ADDRESS or not bound,
            port=str(settings.port),
            bound_names=frozenset({*LOCAL_NAMES, bound}),
            any_port_names=frozenset(set(extra) - with_port),
            host_ports=frozenset(with_port),
        )

    def allows(self, host: str) -> bool:
        if self.any_host:
            return True
        name, port = split_host(host)
        if name in self.any_port_names or (name in self.bound_names and port in ("", self.port)):
            return True
        return f"{name}:{port}" in self.host_ports


class HostGuard:
    """ASGI middleware: refuse a `Host` the server does not answer (400) and a foreign `Origin` (403).

    Args:
        app: The app it guards.
        settings: The bind, `allowed_hosts` and `cors_origins`.
    """

    def __init__(self, app: ASGIApp, settings: ServerSettings) -> None:
        self.app = app
        self.hosts = HostPolicy.of(settings)
        self.origins = frozenset(listed(settings.cors_origins))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self.refusal(Headers(scope=scope)) if scope["type"] == "http" else None
        if refusal is not None:
            await refusal.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def refusal(self, headers: Headers) -> APIError | None:
        host = headers.get("host", "")
        if not self.hosts.allows(host):
            message = (
                f"This server does not answer the host {host[:100]!r}; start it with --allowed-hosts to add a name "
                "(a check against DNS rebinding)."
            )
            return APIError(400, message, code="invalid_host")
        origin = headers.get("origin")
        if origin is None or _same_origin(origin, host) or "*" in self.origins or origin.lower() in self.origins:
            return None
        message = (
            f"Requests from the web origin {origin[:100]!r} are not allowed; start the server with --cors-origins "
            "to allow a web app."
        )
        return APIError(403, message, code="origin_not_allowed")


def _same_origin(origin: str, host: str) -> bool:
    """Whether `Origin` is the page the server itself served (`http://<the Host header>`)."""
    scheme, separator, authority = origin.lower().partition("://")
    return bool(separator) and scheme in ("http", "https") and authority == host.lower()


class AccessGuard:
    """ASGI middleware: the API key on `/v1` (401) and each endpoint's body type (415).

    Args:
        app: The app it guards.
        settings: The API key.
    """

    def __init__(self, app: ASGIApp, settings: ServerSettings) -> None:
        self.app = app
        self.api_key = settings.api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = None
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            refusal = key_refusal(scope["path"], headers, self.api_key) or media_refusal(scope, headers)
        if refusal is not None:
            await refusal.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)


def key_refusal(path: str, headers: Headers, api_key: str) -> APIError | None:
    """401 for an API request (`is_api_path`) without `Authorization: Bearer <api_key>` when a key is set."""
    if not api_key or not is_api_path(path):
        return None
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        message = "You didn't provide an API key: send it as the header `Authorization: Bearer <key>`."
        return APIError(401, message, code="invalid_api_key")
    if not secrets.compare_digest(token.strip().encode(), api_key.encode()):
        return APIError(401, "Incorrect API key provided.", code="invalid_api_key")
    return None


def media_refusal(scope: Scope, headers: Headers) -> APIError | None:
    """415 for a `POST` whose body is not the type its endpoint reads (JSON in UTF-8, or a multipart upload)."""
    path = scope["path"]
    if scope["method"] != "POST" or (path not in JSON_ENDPOINTS and path not in UPLOAD_ENDPOINTS):
        return None
    wanted = "application/json" if path in JSON_ENDPOINTS else "multipart/form-data"
    sent = headers.get("content-type", "")
    media, _, parameters = sent.partition(";")
    if media.strip().lower() != wanted:
        got = f"got {sent[:100]!r}" if sent else "got none"
        return APIError(415, f"Content-Type must be {wanted}; {got}.", code="unsupported_media_type")
    charset = _parameter(parameters, "charset")
    if wanted == "application/json" and charset not in (None, "utf-8", "utf8"):
        return APIError(415, f"A JSON body must be UTF-8; got charset {charset[:40]!r}.", code="unsupported_media_type")
    return None


def _parameter(parameters: str, name: str) -> str | None:
    for parameter in parameters.split(";"):
        key, _, value = parameter.partition("=")
        if key.strip().lower() == name:
            return value.strip().strip('"').lower()
    return None


def cors(app: ASGIApp, settings: ServerSettings) -> ASGIApp:
    """Starlette's `CORSMiddleware` for the `cors_origins` (the app itself when there are none)."""
    origins = list(listed(settings.cors_origins))
    if not origins:
        return app
    return CORSMiddleware(
        app,
        allow_origins=origins,
        allow_methods=["GET", "POST", "DELETE"],
        allow_headers=["*"],
        expose_headers=["Retry-After"],
        max_age=600,
    )
