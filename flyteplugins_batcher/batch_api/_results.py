"""Writing result lines in the OpenAI Batch API's output shape: one per request, keyed by `custom_id`."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from flyteplugins_batcher.batch_api._line_errors import RequestLineError

if TYPE_CHECKING:
    from flyteplugins_batcher.batch_api._requests import BatchRequest
    from flyteplugins_batcher.engines import Completion


def response_line(request: BatchRequest, completion: Completion, *, model: str, request_number: int) -> dict[str, Any]:
    """The output line for a chat or completion request that succeeded (`response.status_code` 200).

    One choice per sample (`choices[0..n-1]`, each with its own `finish_reason`): chat requests
    get `choices[i].message.content`, completion requests `choices[i].text`. `usage` counts the
    prompt once and every sample's tokens.
    """
    chat = request.endpoint == "/v1/chat/completions"
    choices: list[dict[str, Any]] = []
    for index, sample in enumerate(completion.samples):
        choice: dict[str, Any] = {"index": index, "finish_reason": sample.finish_reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": sample.text}
        else:
            choice["text"] = sample.text
        choices.append(choice)
    body = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{request_number}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
            "total_tokens": completion.prompt_tokens + completion.completion_tokens,
        },
    }
    return output_line(request.custom_id, request_number, body)


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
