"""Batch objects: OpenAI's fields, how a batch is created, and the transitions its status may take.

    validating ──► in_progress ──► finalizing ──► completed
        │               │ │
        ▼               │ └──────────► expired     (its completion window passed: unanswered lines fail)
      failed            ▼
    (not runnable)  cancelling ──────► cancelled   (lines already answered stay in the output)

A batch always ends with an output file and an error file (either may be empty), so a client never
meets an `output_file_id` of `null` after a batch whose every line failed. `request_counts` counts
every line once it has its output: at the end, `completed + failed == total`. A batch whose every
line has its output is `completed`, even when its window closed while its files were written;
`expired` is for a batch with lines left unanswered when its window closed.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any

from flyteplugins_batcher.batch_api import ENDPOINTS
from flyteplugins_batcher.server._state.errors import Refused
from flyteplugins_batcher.server._state.statuses import BATCH_TRANSITIONS, TIMESTAMP_OF
from flyteplugins_batcher.server._state.store import new_id

_WINDOW = re.compile(r"([0-9]{1,6})([hms])")  # ASCII digits only (`\d` takes any script's), matched whole
_SECONDS_PER = {"h": 3600, "m": 60, "s": 1}
MAX_WINDOW_HOURS = 168
"""The longest completion window taken: a week (OpenAI takes `24h`)."""
MAX_METADATA_PAIRS = 16
CREATE_FIELDS = ("input_file_id", "endpoint", "completion_window", "metadata")
"""The fields of a `POST /v1/batches` body; another is refused, as OpenAI refuses it."""


@dataclass(frozen=True)
class BatchCreation:
    """A `POST /v1/batches` body, checked: what a new batch is made of."""

    input_file_id: str
    endpoint: str
    completion_window: str
    window_s: int
    metadata: dict[str, str] | None


def batch_creation(body: dict[str, Any], *, short_windows: bool = False) -> BatchCreation:
    """The fields of a `POST /v1/batches` body, checked whole, as OpenAI checks them.

    `input_file_id`, `endpoint` and `completion_window` are required, `metadata` is optional, and
    no other field is taken.

    Args:
        body: The request's body.
        short_windows: Also take windows in minutes and seconds (`ServerSettings.short_windows`).

    Raises:
        Refused: naming the first field at fault.
    """
    unknown = [key for key in body if key not in CREATE_FIELDS]
    if unknown:
        name = unknown[0][:64]
        raise Refused(f"Unrecognized request argument supplied: {name}", param=name)
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        problem = "is required" if file_id is None else f"must be a file id (a string), got {repr(file_id)[:40]}"
        raise Refused(f"input_file_id {problem}", param="input_file_id")
    endpoint = body.get("endpoint")
    if endpoint not in ENDPOINTS:
        problem = "is required" if endpoint is None else f"must be one of {list(ENDPOINTS)}, got {repr(endpoint)[:80]}"
        raise Refused(f"endpoint {problem}", param="endpoint")
    window = body.get("completion_window")
    window_s = window_seconds(window, short_windows=short_windows)
    return BatchCreation(file_id, endpoint, window, window_s, checked_metadata(body.get("metadata")))


def new_batch(creation: BatchCreation, *, input_file: dict[str, Any], model: str) -> dict[str, Any]:
    """A batch object for a checked `POST /v1/batches` body, in status `validating`.

    Args:
        creation: The body, checked (`batch_creation`).
        input_file: The row of its input file.
        model: The model that answers its lines.

    Raises:
        Refused: for an input file whose purpose is not `batch`.
    """
    if input_file["purpose"] != "batch":
        message = f"file {input_file['id']} has purpose {input_file['purpose']!r}, not 'batch'"
        raise Refused(message, param="input_file_id")
    now = time.time()
    created = int(now)
    return {
        "id": new_id("batch_"),
        "object": "batch",
        "endpoint": creation.endpoint,
        "model": model,
        "errors": None,
        "input_file_id": input_file["id"],
        "completion_window": creation.completion_window,
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": created,
        "expires_at": math.ceil(now + creation.window_s),  # never shorter than asked: `created_at` is rounded down
        **dict.fromkeys(TIMESTAMP_OF.values()),
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "usage": {  # summed as lines are answered (`Store.record_lines`)
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0,
        },
        "metadata": creation.metadata,
    }


def window_seconds(window: object, *, short_windows: bool = False) -> int:
    """Seconds in a completion window: OpenAI's form, `<n>h` (ASCII digits), from 1h to 168h.

    With `short_windows`, `<n>m` and `<n>s` too (up to the same week), for tests and demos of expiry.

    Raises:
        Refused: for another form, or a window out of range.
    """
    match = _WINDOW.fullmatch(window) if isinstance(window, str) else None
    units = "hms" if short_windows else "h"
    if match is None or match.group(2) not in units:
        forms = "'<n>h', '<n>m' or '<n>s'" if short_windows else "'<n>h'"
        problem = "is required" if window is None else f"must be {forms} (like '24h'), got {repr(window)[:40]}"
        raise Refused(f"completion_window {problem}", param="completion_window")
    seconds = int(match.group(1)) * _SECONDS_PER[match.group(2)]
    if not 1 <= seconds <= MAX_WINDOW_HOURS * 3600:
        message = f"completion_window must be from 1{units[-1]} to {MAX_WINDOW_HOURS}h, got {window!r}"
        raise Refused(message, param="completion_window")
    return seconds


def checked_metadata(metadata: object) -> dict[str, str] | None:
    """Metadata as the API allows it: up to 16 string pairs, keys up to 64 characters, values up to 512.

    Raises:
        Refused: naming what is wrong.
    """
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA_PAIRS:
        raise Refused(f"metadata must be an object of at most {MAX_METADATA_PAIRS} pairs", param="metadata")
    for key, value in metadata.items():
        if not isinstance(value, str) or len(key) > 64 or len(value) > 512:
            message = f"metadata[{key!r}]: keys up to 64 characters, string values up to 512"
            raise Refused(message, param="metadata")
    return dict(metadata)


def moved(batch: dict[str, Any], status: str, **fields: Any) -> dict[str, Any]:
    """The batch in `status` (its timestamp set now), with `fields` changed.

    Raises:
        ValueError: The batch cannot move from its status to `status`.
    """
    if status not in BATCH_TRANSITIONS.get(batch["status"], frozenset()):
        raise ValueError(f"batch {batch['id']}: cannot go from {batch['status']} to {status}")
    return {**batch, **fields, "status": status, TIMESTAMP_OF[status]: int(time.time())}


def validation_errors(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The `errors` field of a batch that failed validation."""
    return {"object": "list", "data": errors}
