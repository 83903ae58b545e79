"""Batch objects: OpenAI's fields, how a batch is created, and the transitions its status may take.

    validating ──► in_progress ──► finalizing ──► completed
        │               │ │
        ▼               │ └──────────► expired     (its completion window passed: unanswered lines fail)
      failed            ▼
    (not runnable)  cancelling ──────► cancelled   (lines already answered stay in the output)

A batch always ends with an output file and an error file (either may be empty), so a client never
meets an `output_file_id` of `null` after a batch whose every line failed. `request_counts` counts
every line once it has its output: at the end, `completed + failed == total`.
"""

from __future__ import annotations

import re
import time
from typing import Any

from flyteplugins_batcher.server._errors import APIError
from flyteplugins_batcher.server._files import new_id

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
"""What a batch may run (the endpoints this server answers)."""

TRANSITIONS: dict[str, frozenset[str]] = {
    "validating": frozenset({"in_progress", "failed", "cancelling"}),
    "in_progress": frozenset({"finalizing", "cancelling", "expired", "failed"}),
    "finalizing": frozenset({"completed", "failed"}),
    "cancelling": frozenset({"cancelled"}),
}
"""The statuses a batch may move to from each status; the others (completed, failed, expired, cancelled) are final."""

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
"""Statuses of a batch that is not finished: the server resumes them when it starts."""

_TIMESTAMP_OF = {
    "in_progress": "in_progress_at",
    "finalizing": "finalizing_at",
    "completed": "completed_at",
    "failed": "failed_at",
    "expired": "expired_at",
    "cancelling": "cancelling_at",
    "cancelled": "cancelled_at",
}
_WINDOW = re.compile(r"^(\d+)([hms])$")
_SECONDS_PER = {"h": 3600, "m": 60, "s": 1}
MAX_METADATA_PAIRS = 16


def new_batch(body: dict[str, Any], *, input_file: dict[str, Any], model: str) -> dict[str, Any]:
    """A batch object for a `POST /v1/batches` body, in status `validating`.

    Raises:
        APIError: 400 naming the field at fault.
    """
    endpoint = body.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise APIError(400, f"endpoint must be one of {list(ENDPOINTS)}, got {endpoint!r}", param="endpoint")
    if input_file["purpose"] != "batch":
        raise APIError(400, f"file {input_file['id']} has purpose {input_file['purpose']!r}, not 'batch'")
    window = body.get("completion_window", "24h")
    created = int(time.time())
    return {
        "id": new_id("batch_"),
        "object": "batch",
        "endpoint": endpoint,
        "model": model,
        "errors": None,
        "input_file_id": input_file["id"],
        "completion_window": window,
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": created,
        "expires_at": created + window_seconds(window),
        **dict.fromkeys(_TIMESTAMP_OF.values()),
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "usage": {
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0,
        },
        "metadata": checked_metadata(body.get("metadata")),
    }


def window_seconds(window: object) -> int:
    """Seconds in a completion window: OpenAI's `"24h"`, or any other `<n>h`, `<n>m` or `<n>s`.

    Raises:
        APIError: 400 for another form.
    """
    match = _WINDOW.match(window) if isinstance(window, str) else None
    if match is None or int(match.group(1)) < 1:
        raise APIError(400, f"completion_window must be like '24h', got {window!r}", param="completion_window")
    return int(match.group(1)) * _SECONDS_PER[match.group(2)]


def checked_metadata(metadata: object) -> dict[str, str] | None:
    """Metadata as the API allows it: up to 16 string pairs, keys up to 64 characters, values up to 512.

    Raises:
        APIError: 400 naming what is wrong.
    """
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA_PAIRS:
        raise APIError(400, f"metadata must be an object of at most {MAX_METADATA_PAIRS} pairs", param="metadata")
    for key, value in metadata.items():
        if not isinstance(value, str) or len(key) > 64 or len(value) > 512:
            message = f"metadata[{key!r}]: keys up to 64 characters, string values up to 512"
            raise APIError(400, message, param="metadata")
    return dict(metadata)


def moved(batch: dict[str, Any], status: str, **fields: Any) -> dict[str, Any]:
    """The batch in `status` (its timestamp set now), with `fields` changed.

    Raises:
        ValueError: The batch cannot move from its status to `status`.
    """
    if status not in TRANSITIONS.get(batch["status"], frozenset()):
        raise ValueError(f"batch {batch['id']}: cannot go from {batch['status']} to {status}")
    return {**batch, **fields, "status": status, _TIMESTAMP_OF[status]: int(time.time())}


def validation_errors(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The `errors` field of a batch that failed validation."""
    return {"object": "list", "data": errors}
