"""The bodies of result lines, in the API's response shapes: chat and text completions, Responses API responses,
embeddings, and vLLM's scores, reranks and classes.

The top of the format layer: it reads parsed requests (`_requests`, `_embeddings`) and wraps each
body in a result line (`_results`). A request's url gives its task (`_endpoints.py`), and the task its
answerer (`_GENERATION_BODIES`, `_ENCODER_BODIES`).
"""

from __future__ import annotations

import array
import base64
import hashlib
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from flyteplugins_batcher import __version__
from flyteplugins_batcher.batch_api._embeddings import EmbeddingRequest, EncodingFormat
from flyteplugins_batcher.batch_api._endpoints import ENDPOINT_TABLE, Task
from flyteplugins_batcher.batch_api._lines import output_line
from flyteplugins_batcher.batch_api._pooling import pooling_body
from flyteplugins_batcher.batch_api._requests import BatchRequest

if TYPE_CHECKING:
    from flyteplugins_batcher.engines import Completion, Sample


def response_line(request: BatchRequest, completion: Completion, *, model: str, request_number: int) -> dict[str, Any]:
    """The output line for a chat, completion or responses request that succeeded (`response.status_code` 200).

    Its body is `completion_body`'s, with an id numbered by `request_number`.
    """
    prefix = ID_PREFIXES[ENDPOINT_TABLE[request.endpoint].task]
    body = completion_body(request, completion, model=model, response_id=f"{prefix}-{request_number}")
    return output_line(request.custom_id, request_number, body)


SYSTEM_FINGERPRINT = f"flyteplugins-batcher-{__version__}"
"""What every answer's `system_fingerprint` says: the backend that made it (vLLM writes `vllm-<version>-<hash>`)."""


ID_PREFIXES: dict[Task, str] = {
    "chat": "chatcmpl",
    "completion": "cmpl",
    "responses": "resp",
    "embed": "embd",
    "score": "score",
    "rerank": "rerank",
    "classify": "classify",
}
"""What an answer's id starts with, by task (as the OpenAI API's and vLLM's ids do)."""


def completion_body(request: BatchRequest, completion: Completion, *, model: str, response_id: str) -> dict[str, Any]:
    """The answer to a generation request: a `chat.completion`, a `text_completion` or a `response` object.

    A Responses API request gets `responses_body`'s; a chat or completion request the object below.
    """
    return _GENERATION_BODIES[ENDPOINT_TABLE[request.endpoint].task](
        request, completion, model=model, response_id=response_id
    )


_VLLM_FIELDS: dict[str, tuple[str, ...]] = {
    "chat": (
        "prompt_logprobs",
        "prompt_token_ids",
        "prompt_text",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
    ),
    "text": ("kv_transfer_params", "ec_transfer_params", "metrics"),
    "chat choice": ("token_ids", "routed_experts"),
    "text choice": ("token_ids", "prompt_logprobs", "prompt_token_ids", "routed_experts"),
}
"""The fields of vLLM's answers that say what this server never returns (token ids, disaggregated serving's
parameters, per-request metrics): written `null`, as vLLM writes them when not asked for them."""


def chat_completion_body(
    request: BatchRequest, completion: Completion, *, model: str, response_id: str
) -> dict[str, Any]:
    """A `chat.completion` or `text_completion` object, as the OpenAI API (and vLLM) answers the request.

    One choice per sample (`choices[0..n-1]`, each with its own `finish_reason` and `stop_reason`, the
    stop string that ended it): chat requests get `choices[i].message.content` (and the reasoning a
    reasoning parser took out of it, in `reasoning_content` and vLLM's `reasoning`), completion
    requests `choices[i].text`; each with its `logprobs` when the request asked for them. A chat
    request with tools has its answer read for tool calls (`choices[i].message.tool_calls`,
    `content` then what is left of the text or null; `finish_reason` `"tool_calls"`, or `"stop"` for
    a named tool choice, as vLLM answers). `model` is the request's LoRA adapter when it named one,
    else `model`. `usage` counts the prompt once and every sample's tokens, in
    `prompt_tokens_details.cached_tokens` the prompt tokens the engine found in its prefix cache and in
    `completion_tokens_details.reasoning_tokens` the reasoning's (as OpenAI and vLLM write them).
    The fields vLLM adds that this server has nothing for are `null` (`_VLLM_FIELDS`). The server's
    online answers and the usage event that ends a stream are this body's too.
    """
    kind = "chat" if request.chat else "text"
    choices = [_choice(request, sample, index, response_id) for index, sample in enumerate(completion.samples)]
    return {
        "id": response_id,
        "object": "chat.completion" if request.chat else "text_completion",
        "created": int(time.time()),
        "model": request.adapter or model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": {
            "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
            "total_tokens": completion.prompt_tokens + completion.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": completion.cached_tokens},
            "completion_tokens_details": {
                "reasoning_tokens": sum(sample.reasoning_tokens for sample in completion.samples)
            },
        },
        **dict.fromkeys(_VLLM_FIELDS[kind]),
    }


def _choice(request: BatchRequest, sample: Sample, index: int, response_id: str) -> dict[str, Any]:
    logprobs = request.logprobs_object(sample.logprobs) if sample.logprobs is not None else None
    if not request.chat:
        choice = {"index": index, "text": sample.text, "logprobs": logprobs, "finish_reason": sample.finish_reason}
        return {**choice, "stop_reason": sample.stop_reason, **dict.fromkeys(_VLLM_FIELDS["text choice"])}
    finish_reason = sample.finish_reason
    content = None if sample.reasoning is not None and not sample.text else sample.text  # vLLM: only reasoning
    message: dict[str, Any] = {"role": "assistant", "content": content, **_MESSAGE_NULLS}
    tools = request.tools
    if tools is not None and tools.calls_expected and content is not None:
        content, calls = tools.read(content, f"{response_id}-{index}")
        if calls:
            message.update(content=content, tool_calls=calls)
            if tools.choice != "named" and sample.finish_reason == "stop":
                finish_reason = "tool_calls"
    message.update(reasoning=sample.reasoning, reasoning_content=sample.reasoning)
    choice = {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}
    return {**choice, "stop_reason": sample.stop_reason, **dict.fromkeys(_VLLM_FIELDS["chat choice"])}


_MESSAGE_NULLS = dict.fromkeys(("refusal", "annotations", "audio", "function_call"))
"""A chat message's fields of OpenAI's that this server never fills (vLLM writes them `null` too)."""


def embedding_response_line(
    request: EmbeddingRequest,
    vectors: Sequence[Sequence[float]],
    *,
    prompt_tokens: int,
    model: str,
    request_number: int,
    labels: Sequence[str | None] = (),
) -> dict[str, Any]:
    """The output line for an encoder's request that succeeded: embeddings, scores, a rerank or classes.

    For embeddings, `response.body` is OpenAI's `{"object": "list", "data": [{"object": "embedding",
    "index": i, "embedding": ...}], "model", "usage": {"prompt_tokens", "total_tokens"}}`; each
    embedding is a list of floats, or with `encoding_format="base64"` the base64 text of its
    little-endian float32 bytes. Score, rerank and classify lines get vLLM's `ScoreResponse`,
    `RerankResponse` and `ClassificationResponse` (`_pooling.pooling_body`).

    Args:
        request: The parsed line.
        vectors: One output per input, in order (lists, tuples or 1-D numpy arrays): a text's vector,
            a pair's score (a vector of one), a text's class probabilities.
        prompt_tokens: Tokens the model read for all the inputs together.
        model: The model that answered.
        request_number: Numbers the response's ids (the input line number, say).
        labels: A classify line's label per text (its most likely class's name).

    Raises:
        ValueError: The number of outputs is not the number of inputs.
    """
    response_id = f"{ID_PREFIXES[request.task]}-{request_number}"
    body = embeddings_body(
        request, vectors, prompt_tokens=prompt_tokens, model=model, labels=labels, response_id=response_id
    )
    return output_line(request.custom_id, request_number, body)


def embeddings_body(
    request: EmbeddingRequest,
    vectors: Sequence[Sequence[float]],
    *,
    prompt_tokens: int,
    model: str,
    labels: Sequence[str | None] = (),
    response_id: str = "",
) -> dict[str, Any]:
    """An encoder's answer: the embeddings `list` object the OpenAI API answers with, or vLLM's score,
    rerank or classify answer (see `embedding_response_line`).

    Raises:
        ValueError: The number of outputs is not the number of inputs.
    """
    if request.task != "embed":
        identifier = response_id or f"{ID_PREFIXES[request.task]}-{secrets.token_hex(12)}"
        return pooling_body(
            request, vectors, prompt_tokens=prompt_tokens, model=model, response_id=identifier, labels=labels
        )
    if len(vectors) != len(request.inputs):
        raise ValueError(f"{request.custom_id}: {len(request.inputs)} texts but {len(vectors)} vectors")
    data = [
        {"object": "embedding", "index": index, "embedding": encode_vector(vector, request.encoding_format)}
        for index, vector in enumerate(vectors)
    ]
    return {
        "id": response_id or f"embd-{secrets.token_hex(12)}",
        "object": "list",
        "created": int(time.time()),
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def encode_vector(vector: Sequence[float], encoding_format: EncodingFormat) -> list[float] | str:
    """A vector as OpenAI returns it: a list of floats, or base64 of its little-endian float32 bytes.

    Example:
        ```python
        assert encode_vector([1.0], "base64") == "AACAPw=="
        ```
    """
    if encoding_format == "float":
        return [float(value) for value in vector]
    packed = array.array("f", (float(value) for value in vector))
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


def responses_body(request: BatchRequest, completion: Completion, *, model: str, response_id: str) -> dict[str, Any]:
    """A Responses API `response` object for a request read from `/v1/responses` (`_responses_api.py`).

    Its `output` is the answer's message (one `output_text` part) and, when the request gave tools and
    the answer calls them, a `function_call` item per call (the message then only when text is left
    besides them). The message's id is the response's with `msg` for its `resp` (a stream names it so
    before the text is known). A `length` finish is `"status": "incomplete"` with
    `incomplete_details.reason` `max_output_tokens`. `usage` counts `input_tokens` (and in
    `input_tokens_details.cached_tokens` those found in the prefix cache) and `output_tokens`
    (`output_tokens_details.reasoning_tokens`: none are told apart here). The request's settings are
    echoed; `store` is false: responses are not stored.
    """
    sample = completion.samples[0]
    incomplete = sample.finish_reason == "length"
    echo = request.request_echo or {}
    usage = {
        "input_tokens": completion.prompt_tokens,
        "input_tokens_details": {"cached_tokens": completion.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": completion.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
    }
    tools = [{"parameters": None, "strict": None, **tool} for tool in echo.get("tools") or []]
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if incomplete else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "model": request.adapter or model,
        "output": _output_items(request, sample, response_id, incomplete=incomplete),
        "usage": usage,
        "instructions": echo.get("instructions"),
        "max_output_tokens": echo.get("max_output_tokens"),
        "metadata": echo.get("metadata") or {},
        "parallel_tool_calls": echo.get("parallel_tool_calls") is not False,
        "temperature": echo.get("temperature"),
        "top_p": echo.get("top_p"),
        "text": echo.get("text") or {"format": {"type": "text"}},
        "tool_choice": echo.get("tool_choice") or "auto",
        "tools": tools,
        "store": False,
        "background": False,
        "truncation": "disabled",
        "previous_response_id": None,
    }


def message_id(response_id: str) -> str:
    """The id of a response's message item: the response's, `msg` for its `resp`."""
    return "msg" + response_id.removeprefix("resp")


def _output_items(request: BatchRequest, sample: Sample, response_id: str, *, incomplete: bool) -> list[dict[str, Any]]:
    """A response's output: its message, or the tool calls its text holds (and the text left beside them)."""
    content: str | None = sample.text
    calls: list[dict[str, Any]] = []
    if request.tools is not None and request.tools.calls_expected:
        content, calls = request.tools.read(sample.text, f"{response_id}-0")
    items: list[dict[str, Any]] = []
    if content or not calls:
        part = {"type": "output_text", "text": content or "", "annotations": [], "logprobs": []}
        status = "incomplete" if incomplete else "completed"
        items.append(
            {"type": "message", "id": message_id(response_id), "status": status, "role": "assistant", "content": [part]}
        )
    for call in calls:
        function = call["function"]
        digest = hashlib.sha256(call["id"].encode()).hexdigest()[:24]
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{digest}",
                "call_id": call["id"],
                "name": function["name"],
                "arguments": function["arguments"],
                "status": "completed",
            }
        )
    return items


_GENERATION_BODIES: dict[Task, Callable[..., dict[str, Any]]] = {
    "chat": chat_completion_body,
    "completion": chat_completion_body,
    "responses": responses_body,
}
"""Each generation task's answerer (the endpoint table gives a url's task)."""
