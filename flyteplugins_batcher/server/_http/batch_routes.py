"""The Batch API's endpoints: `/v1/files` and `/v1/batches`, in OpenAI's shapes."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Form, Query, Request, UploadFile
from fastapi.responses import FileResponse

from flyteplugins_batcher.batch_api import EmbeddingRequest
from flyteplugins_batcher.server._http.errors import APIError
from flyteplugins_batcher.server._http.online import json_body
from flyteplugins_batcher.server._service import Service, ServiceDep
from flyteplugins_batcher.server._state.batches import batch_creation, new_batch
from flyteplugins_batcher.server._state.files import file_object
from flyteplugins_batcher.server._state.statuses import ACTIVE
from flyteplugins_batcher.server._state.store import Page

router = APIRouter(prefix="/v1")


@router.post("/files")
async def upload(
    service: ServiceDep,
    file: UploadFile,
    purpose: Annotated[str, Form()],
) -> dict[str, Any]:
    """Keep an uploaded JSONL file (`purpose="batch"`); 413 over the size limit (refused unread when declared)."""
    row = await asyncio.to_thread(
        service.files.save_upload, file.file, filename=file.filename or "upload.jsonl", purpose=purpose
    )
    return file_object(row)


@router.get("/files")
async def list_files(
    service: ServiceDep,
    purpose: str | None = None,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",
) -> dict[str, Any]:
    page = service.store.files(purpose=purpose, after=after, limit=limit, newest_first=order == "desc")
    return _list([file_object(row) for row in page.rows], page)


@router.get("/files/{file_id}")
async def get_file(file_id: str, service: ServiceDep) -> dict[str, Any]:
    return file_object(service.files.get(file_id))


@router.get("/files/{file_id}/content")
async def file_content(file_id: str, service: ServiceDep) -> FileResponse:
    row = service.files.get(file_id)
    path = await asyncio.to_thread(service.files.content, file_id)  # it may come from the object store first
    return FileResponse(path, media_type="application/jsonl", filename=row["filename"])


@router.delete("/files/{file_id}")
async def delete_file(file_id: str, service: ServiceDep) -> dict[str, Any]:
    users = service.store.batches_reading(file_id, ACTIVE)
    if users:
        message = f"File {file_id} is the input of batch {users[0]}, which has not finished."
        raise APIError(400, message, param="file_id")  # an id the store knows: safe to repeat
    service.files.delete(file_id)
    return {"id": file_id, "object": "file", "deleted": True}


@router.post("/batches")
async def create_batch(request: Request, service: ServiceDep) -> dict[str, Any]:
    """A batch over an uploaded file; it runs in the background, from `validating` on.

    Its body is checked whole first (fields, window, metadata: 400 naming the field), then its
    input file (404 when it is not there, its bytes included).
    """
    creation = batch_creation(await json_body(request), short_windows=service.settings.short_windows)
    model = _model_for(creation.endpoint, service)
    input_file = service.files.get(creation.input_file_id, param="input_file_id")
    await asyncio.to_thread(service.files.content, creation.input_file_id, param="input_file_id")  # its bytes too
    batch = new_batch(creation, input_file=input_file, model=model or "")
    service.store.insert_batch(batch)
    service.runner.start(batch["id"])
    return batch


def _model_for(endpoint: str, service: Service) -> str:
    """The model that answers a batch's lines (its object's `model`); 400 for an endpoint no served model answers."""
    inference = service.inference
    if endpoint not in EmbeddingRequest.URLS:
        if inference.classifier is not None:
            message = f"The model {inference.served_model!r} is a classifier: it does not generate text ({endpoint})."
            raise APIError(400, message, param="endpoint")
        return inference.served_model
    if endpoint == "/v1/embeddings" or inference.classifier is None:
        if inference.embedding_model is None:
            raise APIError(400, f"This server serves no encoder model for {endpoint}.", param="endpoint")
        return inference.embedding_model
    return inference.classifier.model.name


@router.get("/batches")
async def list_batches(
    service: ServiceDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    """The batches, newest first, `limit` at a time after the batch `after`."""
    page = service.store.batches(after=after, limit=limit)
    return _list(page.rows, page)


@router.get("/batches/{batch_id}")
async def get_batch(batch_id: str, service: ServiceDep) -> dict[str, Any]:
    return service.runner.get(batch_id)


@router.post("/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, service: ServiceDep) -> dict[str, Any]:
    return service.runner.cancel(batch_id)


def _list(data: list[dict[str, Any]], page: Page) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": page.has_more,
    }
