"""The lines of the output files in the OpenAI Batch API's shape: a result or an error, keyed by `custom_id`.

What goes inside a result line (a chat completion, embeddings) is `_responses`' business.
"""

from __future__ import annotations

from typing import Any

from flyteplugins_batcher.batch_api._line_errors import RequestLineError


def output_line(custom_id: str, request_number: int, body: dict[str, Any]) -> dict[str, Any]:
    """A batch output line around a response body (`response.status_code` 200, no error)."""
    request_id = f"req_{request_number}"
    return {
        "id": f"batch_{request_id}",
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": request_id, "body": body},
        "error": None,
    }


def error_line(error: RequestLineError, *, request_number: int) -> dict[str, Any]:
    """The errors-file line for a request that failed (`error.code`, `error.message`, and its input line)."""
    return {
        "id": f"batch_req_{request_number}",
        "custom_id": error.custom_id,
        "response": None,
        "error": {"code": error.code, "message": error.message, "line": error.line},
    }
