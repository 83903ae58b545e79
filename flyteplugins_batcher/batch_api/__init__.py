"""Batch jobs in the OpenAI Batch API's file format: read request lines, write result and error lines.

The de-facto standard for offline LLM jobs (OpenAI and Anthropic batches, vLLM's `run-batch`): one
JSON request per line in, one JSON result per request out, keyed by `custom_id`. A bad line fails
alone, with an error line that says why. `workflows/batch_jsonl.py` runs whole files on Flyte; use
these pieces in your own tasks.

Example:
    ```python
    from flyteplugins_batcher.batch_api import RequestLineError, error_line, parse_request_line, response_line
    from flyteplugins_batcher.engines import Request

    try:
        request = parse_request_line(line, number, served_model=engine.model_name)
    except RequestLineError as error:
        errors.write(json.dumps(error_line(error, request_number=number)) + "\\n")
    else:
        generation = request.generation(engine.generation)  # the line's own settings over the engine's
        [completion] = engine.generate([Request(request.prompt, generation, id=request.custom_id)])
        results.write(json.dumps(response_line(request, completion, model=engine.model_name, request_number=number)))
    ```
"""

from __future__ import annotations

from flyteplugins_batcher.batch_api._ids import SeenIds
from flyteplugins_batcher.batch_api._requests import (
    ENDPOINTS,
    BatchRequest,
    Endpoint,
    ModelMismatch,
    RequestLineError,
    parse_request_line,
)
from flyteplugins_batcher.batch_api._results import error_line, response_line

__all__ = [
    "ENDPOINTS",
    "BatchRequest",
    "Endpoint",
    "ModelMismatch",
    "RequestLineError",
    "SeenIds",
    "error_line",
    "parse_request_line",
    "response_line",
]
