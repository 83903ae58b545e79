"""The bodies of result lines, in the OpenAI API's response shapes: chat and text completions, embeddings.

The top of the format layer: it reads parsed requests (`_requests`, `_embeddings`) and wraps each
body in a result line (`_results`).
"""

from __future__ import annotations

import array
import base64
import secrets
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from flyteplugins_batcher import __version__
from flyteplugins_batcher.batch_api._embeddings import EmbeddingRequest, EncodingFormat
from flyteplugins_batcher.batch_api._requests import BatchRequest
from flyteplugins_batcher.batch_api._results import output_line

if TYPE_CHECKING:
    from flyteplugins_batcher.engines import Completion, Sample


def response_line(request: BatchRequest, completion: Completion, *, model: str, request_number: int) -> dict[str, Any]:
    """The output line for a chat or completion request that succeeded (`response.status_code` 200).

    Its body is `completion_body`'s, with an id numbered by `request_number`.
    """
    prefix = "chatcmpl" if request.endpoint == "/v1/chat/completions" else "cmpl"
    body = completion_body(request, completion, model=model, response_id=f"{prefix}-{request_number}")
    return output_line(request.custom_id, request_number, body)


SYSTEM_FINGERPRINT = f"flyteplugins-batcher-{__version__}"
"""What every answer's `system_fingerprint` says: the backend that made it (vLLM writes `vllm-<version>-<hash>`)."""

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


def completion_body(request: BatchRequest, completion: Completion, *, model: str, response_id: str) -> dict[str, Any]:
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
) -> dict[str, Any]:
    """The output line for an embeddings request that succeeded, in OpenAI's embeddings response shape.

    `response.body` is `{"object": "list", "data": [{"object": "embedding", "index": i, "embedding": ...}],
    "model", "usage": {"prompt_tokens", "total_tokens"}}`; each embedding is a list of floats, or
    with `encoding_format="base64"` the base64 text of its little-endian float32 bytes.

    Args:
        request: The parsed line.
        vectors: One vector per input text, in order (lists, tuples or 1-D numpy arrays).
        prompt_tokens: Tokens the model read for all the texts together.
        model: The model that answered.
        request_number: Numbers the response's ids (the input line number, say).

    Raises:
        ValueError: The number of vectors is not the number of texts.
    """
    body = embeddings_body(
        request, vectors, prompt_tokens=prompt_tokens, model=model, response_id=f"embd-{request_number}"
    )
    return output_line(request.custom_id, request_number, body)


def embeddings_body(
    request: EmbeddingRequest,
    vectors: Sequence[Sequence[float]],
    *,
    prompt_tokens: int,
    model: str,
    response_id: str = "",
) -> dict[str, Any]:
    """The embeddings `list` object the OpenAI API answers with (see `embedding_response_line`), with vLLM's `id`
    (`response_id`; empty: a random `embd-...`) and `created`.

    Raises:
        ValueError: The number of vectors is not the number of texts.
    """
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
