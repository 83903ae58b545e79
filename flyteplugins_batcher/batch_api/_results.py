"""Writing result lines in the OpenAI Batch API's output shape: one per request, keyed by `custom_id`."""

from __future__ import annotations

import time
from typing import Any

from flyteplugins_batcher.batch_api._requests import BatchRequest, RequestLineError
from flyteplugins_batcher.engines import Completion


def response_line(request: BatchRequest, completion: Completion, *, model: str, request_number: int) -> dict[str, Any]:
    """The output line for a request that succeeded (`response.status_code` 200).

    Chat requests get `choices[0].message.content`, completion requests `choices[0].text`; both
    carry `finish_reason`, `usage` and `model`.
    """
    chat = request.endpoint == "/v1/chat/completions"
    choice: dict[str, Any] = {"index": 0, "finish_reason": completion.finish_reason}
    if chat:
        choice["message"] = {"role": "assistant", "content": completion.text}
    else:
        choice["text"] = completion.text
    request_id = f"req_{request_number}"
    body = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{request_number}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
            "total_tokens": completion.prompt_tokens + completion.completion_tokens,
        },
    }
    return {
        "id": f"batch_{request_id}",
        "custom_id": request.custom_id,
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
