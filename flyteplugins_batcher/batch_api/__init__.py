"""Batch jobs in the OpenAI Batch API's file format: read request lines, write result and error lines.

The de-facto standard for offline LLM jobs (the OpenAI Batch API, vLLM's `run-batch`): one JSON
request per line in, one JSON result per request out, keyed by `custom_id`. A bad line fails alone,
with an error line that says why. Use these pieces to run such files in your own tasks.

Reading: `read_request_lines` decodes a file opened in binary mode line by line. A UTF-8 BOM at the
start of the file is accepted; a line with bytes that are not UTF-8 fails alone as `invalid_json`,
naming the byte offset (it is never run on a mangled prompt); blank lines are skipped.

Accepted lines, one JSON object each:

- OpenAI batch, `{"custom_id", "method": "POST", "url", "body"}`, with `url`:
  - `/v1/chat/completions`: `body.messages` (text content, or text content parts), each with one
    of OpenAI's roles (`system`, `developer`, `user`, `assistant`, `tool`, `function`);
  - `/v1/completions`: `body.prompt`, one string;
  - `/v1/embeddings`: `body.input`, a string or a list of up to 2048 strings (none empty;
    token-id arrays are refused), optional `encoding_format` (`"float"`, the default, or
    `"base64"`: little-endian float32, as OpenAI encodes it). It parses to an `EmbeddingRequest`;
    answer it with `embedding_response_line`. Accepted only by a job that says it serves
    embeddings (`parse_request_line(..., endpoints=ENDPOINTS)`); by default an embeddings line
    fails as `invalid_url`, naming the urls the job serves.
- Plain: `{"custom_id"?, "prompt": "..."}` or `{"custom_id"?, "messages": [...]}`, with the same
  optional settings beside them; a plain line without a `custom_id` gets `line-<n>`.

Settings of a chat or completion request, for it alone, checked as the OpenAI API checks them and
named as the line wrote them: `max_tokens` or `max_completion_tokens` (>= 1), `temperature` (0 to
2), `top_p` (0 to 1; 0 keeps only the most likely token, which is greedy decoding, so it runs as
temperature 0), `n` (1 to 128 samples, answered as `choices[0..n-1]`; greedy samples are
identical), `seed` (an integer), `stop` (a string or up to 4), `presence_penalty` and
`frequency_penalty` (-2 to 2), `logit_bias` (token ids to -100..100), logprobs (chat: `logprobs`
true with `top_logprobs` 0 to 20; completions: `logprobs` 0 to 20; answered in OpenAI's shapes),
and one output constraint: `response_format` (`{"type": "text"}`, `{"type": "json_object"}`, or
`{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`, always enforced), vLLM's
`structured_outputs` (`json`, `json_object`, `regex`, `choice`, `grammar`) or their older names
`guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`. A chat request may give `tools`
and `tool_choice` (`"none"`, `"auto"` with a tool parser, `"required"`, a named function: the last
two constrain the output to the tools' schemas, and the answer's calls come back as
`message.tool_calls`), `chat_template_kwargs`, and assistant `tool_calls` and `tool` messages in
its conversation. The flags `stream`, `echo`, `store`, `parallel_tool_calls` and
`stream_options.include_usage` (and a chat request's `logprobs`) must be JSON booleans when given
(`"yes"` is refused, not read as true). Other body fields are ignored. A `model` that is neither
the served one nor one of its LoRA adapters (`adapters`) fails the line, unless the job is told to
ignore it (`model_mismatch="ignore"`); one naming an adapter runs with it, and its answer names it.

Each line is decoded with `loads_bounded`: nested at most 64 levels deep (`MAX_DEPTH`), integers
of at most 100 digits, finite numbers, no `NaN` or `Infinity`, no lone surrogate escapes; a line
outside these bounds fails alone as `invalid_json`, naming the bound.

Error codes (`RequestLineError.code`, `ErrorCode`); an error line's `custom_id` is the line's, or
`line-<n>` for a line without a string one (OpenAI's and vLLM's output types require a string):

- `invalid_json`: not JSON, not a JSON object, not UTF-8, or outside `loads_bounded`'s bounds.
- `missing_custom_id`: an OpenAI batch line without a `custom_id`.
- `invalid_custom_id`: a `custom_id` that is not a string (the API requires one: `7` is refused,
  `"7"` is fine) or is empty.
- `duplicate_custom_id`: a `custom_id` already used on an earlier line (the driver checks, with `SeenIds`).
- `invalid_url`: a `url` the job does not serve (see `endpoints`).
- `invalid_body`: no messages, prompt or input, or of the wrong shape.
- `invalid_request`: a setting out of range or of the wrong type, or a JSON schema the engine
  cannot compile (`error_code` maps the engine's `InvalidResponseFormatError` here).
- `model_mismatch`: `body.model` is not the served model.
- `context_length_exceeded`: prompt + `max_tokens` over the model's context.
- `invalid_prompt`: a prompt the engine refuses (empty, or a conversation its chat template rejects).
- `inference_failed`: the model call failed.

Example:
    ```python
    from flyteplugins_batcher.batch_api import (
        BatchRequest, RequestLineError, error_code, error_line, parse_request_line, read_request_lines, response_line,
    )

    with open("requests.jsonl", "rb") as file:
        for number, text in read_request_lines(file):
            try:
                if isinstance(text, RequestLineError):
                    raise text
                request = parse_request_line(text, number, served_model=engine.model_name)
            except RequestLineError as error:
                errors.write(json.dumps(error_line(error, request_number=number)) + "\\n")
                continue
            [outcome] = engine.generate([request.engine_request(engine.generation)])
            if isinstance(outcome, Exception):
                failure = RequestLineError(error_code(outcome), str(outcome), line=number, custom_id=request.custom_id)
                errors.write(json.dumps(error_line(failure, request_number=number)) + "\\n")
            else:
                line = response_line(request, outcome, model=engine.model_name, request_number=number)
                results.write(json.dumps(line) + "\n")
    ```
"""

from __future__ import annotations

from flyteplugins_batcher.batch_api._embeddings import EMBEDDINGS_ENDPOINT, EmbeddingRequest
from flyteplugins_batcher.batch_api._json import JSONBoundsError, loads_bounded
from flyteplugins_batcher.batch_api._line_errors import RequestLineError, error_code
from flyteplugins_batcher.batch_api._lines import SeenIds, error_line, read_request_lines
from flyteplugins_batcher.batch_api._requests import (
    ENDPOINTS,
    BatchRequest,
    ModelMismatch,
    ParsedRequest,
    parse_request,
    parse_request_line,
)
from flyteplugins_batcher.batch_api._responses import (
    completion_body,
    embedding_response_line,
    embeddings_body,
    encode_vector,
    response_line,
)

__all__ = [
    "EMBEDDINGS_ENDPOINT",
    "ENDPOINTS",
    "BatchRequest",
    "EmbeddingRequest",
    "JSONBoundsError",
    "ModelMismatch",
    "ParsedRequest",
    "RequestLineError",
    "SeenIds",
    "completion_body",
    "embedding_response_line",
    "embeddings_body",
    "encode_vector",
    "error_code",
    "error_line",
    "loads_bounded",
    "parse_request",
    "parse_request_line",
    "read_request_lines",
    "response_line",
]
