"""The online endpoints: `/v1/chat/completions`, `/v1/completions`, `/v1/responses`, `/v1/embeddings`,
`/v1/models[/{id}]`, and vLLM's pooling routes (`/score`, `/v1/score`, `/rerank`, `/v1/rerank`, `/v2/rerank`,
`/classify`).

A request body is parsed exactly as a batch line's body is (`flyteplugins_batcher.batch_api`), so
per-request settings, `response_format` and `n` behave as in batch files and fail with the same
messages, here as 400s. Each request is then one record in the replica's shared batcher, batched
with every other client's (and with batch lines, behind them). A client that leaves before its
answer cancels its record (`_live`), streamed (`_streaming`) or not. A Responses API request is the
chat request it means (`batch_api`), answered as a `response` object, or streamed as the Responses
API's typed events (`response_events.py`). A score, rerank or classify request runs on the encoder that
does its task (the classifier the server serves as its model, else the embedding model), each of its
pairs or texts batched with every other request's by tokens.
"""

from __future__ import annotations

import functools
import secrets
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from flyteplugins_batcher import QueueFullError
from flyteplugins_batcher.batch_api import (
    BatchRequest,
    EmbeddingRequest,
    JSONBoundsError,
    ParsedRequest,
    RequestLineError,
    completion_body,
    embeddings_body,
    error_code,
    loads_bounded,
    parse_request,
)
from flyteplugins_batcher.engines import (
    Completion,
    EmptyDocumentError,
    EngineDeadError,
    InvalidPromptError,
    InvalidResponseFormatError,
    Sample,
)
from flyteplugins_batcher.server._admission import OnlineOverloadedError
from flyteplugins_batcher.server._http.deltas import CLIENT_CLOSED_REQUEST, completion_unless_gone
from flyteplugins_batcher.server._http.errors import APIError
from flyteplugins_batcher.server._http.response_events import ResponseEvents
from flyteplugins_batcher.server._http.streaming import ChunkEvents, streamed_answer
from flyteplugins_batcher.server._service import Service, ServiceDep

router = APIRouter(prefix="/v1")
pooling_router = APIRouter()
"""vLLM's pooling routes, inside `/v1` and outside it, as vLLM serves them."""


@router.get("/models")
async def models(service: ServiceDep) -> dict[str, Any]:
    """The served models: the LLM, its LoRA adapters (each with the LLM as its `parent`), and the embedding model."""
    return {"object": "list", "data": [_model_object(service, name) for name in _served_models(service)]}


@router.get("/models/{model_id:path}")
async def model(model_id: str, service: ServiceDep) -> dict[str, Any]:
    """One served model (`client.models.retrieve`); 404 for a model this server does not serve.

    The id may hold slashes (`Qwen/Qwen2.5-7B-Instruct`), as hub ids do.
    """
    if model_id not in _served_models(service):
        message = f"The model {model_id!r} does not exist; this server serves {_served_models(service)}."
        raise APIError(404, message, code="model_not_found", param="model")
    return _model_object(service, model_id)


def _served_models(service: Service) -> list[str]:
    inference = service.inference
    names = [inference.served_model, *inference.adapters, inference.embedding_model]
    return list(dict.fromkeys(name for name in names if name))


def _model_object(service: Service, name: str) -> dict[str, Any]:
    card: dict[str, Any] = {
        "id": name,
        "object": "model",
        "created": service.started_at,
        "owned_by": "flyteplugins-batcher",
    }
    if name in service.inference.adapters:
        card["parent"] = service.inference.served_model  # as vLLM lists a LoRA adapter
    return card


@router.post("/chat/completions", response_model=None)
async def chat_completions(request: Request, service: ServiceDep) -> Response:
    return await _generate(request, service, "/v1/chat/completions", "chatcmpl-")


@router.post("/completions", response_model=None)
async def completions(request: Request, service: ServiceDep) -> Response:
    return await _generate(request, service, "/v1/completions", "cmpl-")


@router.post("/responses", response_model=None)
async def responses(request: Request, service: ServiceDep) -> Response:
    return await _generate(request, service, "/v1/responses", "resp_")


@router.post("/embeddings")
async def embeddings(request: Request, service: ServiceDep) -> dict[str, Any]:
    if service.inference.embedding_model is None:
        raise APIError(404, "This server does not serve embeddings.", code="model_not_found", param="model")
    body = await json_body(request)
    inference = service.inference
    parsed = _parse(body, "/v1/embeddings", service, served=inference.embedding_model)
    assert isinstance(parsed, EmbeddingRequest)
    try:
        vectors = await inference.embed(parsed)
    except QueueFullError as error:
        raise APIError.busy(error) from None
    except EmptyDocumentError as error:  # the text's fault; any other failure is the server's (a 500)
        raise APIError(400, str(error), code="invalid_request", param="input") from None
    tokens = sum(vector.tokens for vector in vectors)
    model = service.inference.embedding_model
    return embeddings_body(parsed, [vector.vector for vector in vectors], prompt_tokens=tokens, model=model)


async def _generate(request: Request, service: Service, url: str, id_prefix: str) -> Response:
    """The answer, or its events as they are made (`stream`); a client that leaves first cancels its record (499)."""
    arrived = time.monotonic()
    body = await json_body(request)
    if service.inference.classifier is not None:
        message = f"The model {service.inference.served_model!r} is a classifier: it does not generate text ({url})."
        raise APIError(400, message, code="invalid_url")
    parsed = _parse(body, url, service)
    assert isinstance(parsed, BatchRequest)
    model, response_id = service.inference.served_model, f"{id_prefix}{secrets.token_hex(12)}"

    def answer(completion: Completion) -> dict[str, Any]:
        return completion_body(parsed, completion, model=model, response_id=response_id)

    try:
        if body.get("stream"):
            return await _streamed(service, parsed, answer, body, arrived=arrived, response_id=response_id)
        completion = await completion_unless_gone(request, service.inference, parsed)
    except QueueFullError as error:
        raise APIError.busy(error) from None
    except OnlineOverloadedError as error:
        raise APIError.over_target(error) from None
    except InvalidResponseFormatError as error:
        where = "text.format" if url == "/v1/responses" else "response_format"  # the message names it as written
        raise APIError(400, str(error), code=error_code(error), param=where) from None
    except InvalidPromptError as error:
        raise APIError(400, str(error), code=error_code(error)) from None
    except EngineDeadError as error:
        raise APIError.engine_unavailable(error, f"{request.method} {url}") from None
    if completion is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return JSONResponse(answer(completion))


async def _streamed(
    service: Service,
    parsed: BatchRequest,
    answer: Callable[[Completion], dict[str, Any]],
    body: dict[str, Any],
    *,
    arrived: float,
    response_id: str,
) -> Response:
    """The answer as server-sent events: chunks for chat and completions, typed events for the Responses API."""
    options = body.get("stream_options") or {}
    include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
    if parsed.endpoint == "/v1/responses":
        started = {**answer(Completion.from_samples(0, [Sample("", 0, "stop")])), "status": "in_progress"}
        events: Callable[..., Any] = functools.partial(ResponseEvents, {**started, "output": [], "usage": None})
    else:
        chat = parsed.endpoint == "/v1/chat/completions"
        events = functools.partial(ChunkEvents, response_id, service.inference.served_model, chat=chat)
    return await streamed_answer(
        service.inference,
        parsed,
        answer,
        events,
        include_usage=include_usage,
        keepalive_s=service.settings.stream_keepalive_s,
        on_headers=lambda: service.metrics.online_first_byte(time.monotonic() - arrived),
    )


def _pooling_route(url: str) -> Callable[[Request, Service], Any]:
    async def route(request: Request, service: ServiceDep) -> dict[str, Any]:
        return await _pool(request, service, url)

    route.__name__ = route.__qualname__ = "pool_" + url.strip("/").replace("/", "_")
    return route


for _url in EmbeddingRequest.URLS:
    if _url != "/v1/embeddings":
        pooling_router.post(_url)(_pooling_route(_url))


async def _pool(request: Request, service: Service, url: str) -> dict[str, Any]:
    """A score, rerank or classify request's answer in vLLM's shape, from the encoder that does its task."""
    body = await json_body(request)
    inference = service.inference
    tasks = inference.encoder_tasks()
    model = body.get("model")
    if model is not None and model not in tasks and model != inference.served_model:
        message = f"The model {model!r} does not exist; this server serves {list(tasks)} for {url} (GET /v1/models)."
        raise APIError(404, message, code="model_not_found", param="model")
    line = {"custom_id": "online", "url": url, "body": body}
    try:
        parsed = parse_request(line, 0, served_model=inference.served_model, encoder_tasks=tasks, endpoints=(url,))
    except RequestLineError as error:
        raise APIError.from_line_error(error) from None
    assert isinstance(parsed, EmbeddingRequest)
    try:
        result, name = await inference.pool(parsed)
    except QueueFullError as error:
        raise APIError.busy(error) from None
    if result.error_code:
        raise APIError(400, result.error_message, code=result.error_code)
    return embeddings_body(
        parsed,
        result.outputs(),
        prompt_tokens=result.prompt_tokens,
        model=name,
        labels=[label or None for label in result.labels],
        response_id=f"{parsed.task}-{secrets.token_hex(12)}",
    )


def _parse(body: dict[str, Any], url: str, service: Service, *, served: str | None = None) -> ParsedRequest:
    """The request in `body`, as a batch line's body would be read; 404 for a model this server does not serve.

    A chat or completion request's `model` may name the LLM or one of its LoRA adapters. A
    `max_tokens` that fills the model's context (0: not checked here) is refused here, before the
    request is a record (a record is costed, and its cost counted in the metrics, once it is submitted).

    Raises:
        APIError: 400 naming what is wrong; 404 for another model.
    """
    inference = service.inference
    served_model = served or inference.served_model
    adapters = () if url == "/v1/embeddings" else inference.adapters
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise APIError(400, f"model must be a string, got {model!r}", code="invalid_request", param="model")
    if model is not None and model != served_model and model not in adapters:
        served_text = ", ".join(map(repr, [served_model, *adapters]))
        message = f"The model {model!r} does not exist; this server serves {served_text} (GET /v1/models)."
        raise APIError(404, message, code="model_not_found", param="model")
    line = {"custom_id": "online", "url": url, "body": body}
    try:
        return parse_request(
            line,
            0,
            served_model=served_model,
            endpoints=(url,),
            context_length=inference.context_length,
            adapters=adapters,
            tool_parser=service.settings.engine.tool_call_parser,
        )
    except RequestLineError as error:
        raise APIError.from_line_error(error) from None


async def json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object, decoded within bounds (`batch_api.loads_bounded`: depth, numbers, UTF-8).

    Its size is bounded before it is read (`_limits.BodyLimit`), its type by `_guards.AccessGuard`.

    Raises:
        APIError: 400 naming why the body is not a JSON object the server takes; 499 when the client
            left before sending all of it (nobody is there to read the answer; nothing is logged as a failure).
    """
    try:
        body = loads_bounded(await request.body())
    except ClientDisconnect:
        raise APIError(499, "The client closed the request before sending its body.", code="client_closed") from None
    except JSONBoundsError as error:
        message = f"We could not parse the JSON body of your request: {error}."
        raise APIError(400, message, code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object.", code="invalid_json")
    return body
