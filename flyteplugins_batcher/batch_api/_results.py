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


def line_id(line: int) -> str:
    """The `custom_id` of a line that gives none: a plain line's, and the error line of one that has no string id."""
    return f"line-{line}"


def error_line(error: RequestLineError, *, request_number: int) -> dict[str, Any]:
    """The errors-file line for a request that failed (`error.code`, `error.message`, and its input line).

    Its `custom_id` is always a string, as OpenAI's and vLLM's output types require: the line's own, or
    `line_id(line)` for a line without one (not JSON, no `custom_id`, or one that is not a string).
    """
    return {
        "id": f"batch_req_{request_number}",
        "custom_id": error.custom_id if error.custom_id is not None else line_id(error.line),
        "response": None,
        "error": {"code": error.code, "message": error.message, "line": error.line},
    }
